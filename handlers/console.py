"""The web console: server-rendered pages (jinja2, ui/templates), static
files (ui/static) and, through default_handlers, its websocket and JSON
endpoints.  Pages carry no data beyond escaped data- attributes; the page
scripts fetch the rest from /api and listen on /console/ws."""
from __future__ import annotations

import os

import jinja2
import tornado.escape
import tornado.web

from console import status as console_status
from console import strings
from handlers import console_api, console_ws
from handlers.base import Base, session_user
from models.records import ROLE_ADMIN

UI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ui")

# (name, path, access): access is "public", "user" or "admin".
PAGES = [
    ("login", "/console/login", "public"),
    ("register", "/console/register", "public"),
    ("dashboard", "/console/", "user"),
    ("keys", "/console/keys", "user"),
    ("chat", "/console/chat", "user"),
    ("usage", "/console/usage", "user"),
    ("topup", "/console/topup", "user"),
    ("notify", "/console/notify", "user"),
    ("account", "/console/account", "user"),
    ("admin_users", "/console/admin/users", "admin"),
    ("admin_codes", "/console/admin/codes", "admin"),
    ("admin_groups", "/console/admin/groups", "admin"),
    ("admin_prices", "/console/admin/prices", "admin"),
    ("admin_channels", "/console/admin/channels", "admin"),
    ("admin_announcements", "/console/admin/announcements", "admin"),
    ("admin_settings", "/console/admin/settings", "admin"),
]
NAV_USER = ["dashboard", "keys", "chat", "usage", "topup", "notify", "account"]
NAV_ADMIN = ["admin_users", "admin_codes", "admin_groups", "admin_prices", "admin_channels",
             "admin_announcements", "admin_settings"]
PATHS = {name: path for name, path, _ in PAGES}


def templates(app) -> jinja2.Environment:
    env = app.settings.get("console_templates")
    if env is None:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(UI, "templates")),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        app.settings["console_templates"] = env
    return env


def csp(handler, bases: list[dict]) -> str:
    host = handler.request.host
    # Both schemes: behind a TLS proxy we see http while the browser uses wss.
    connect = ["'self'", f"ws://{host}", f"wss://{host}"] + sorted(
        {console_status.origin_of(b["url"]) for b in bases})
    return "; ".join([
        "default-src 'self'", "script-src 'self'", "style-src 'self'",
        "img-src 'self' data: blob: https:", "connect-src " + " ".join(connect),
        "font-src 'self'", "object-src 'none'", "base-uri 'none'", "form-action 'self'",
        "frame-ancestors 'none'"])


class PageHandler(Base):
    def initialize(self, name: str, access: str) -> None:
        self.name = name
        self.access = access

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Cache-Control", "no-store")

    async def get(self) -> None:
        user, _ = await session_user(self)
        self.lang = strings.pick(self.request.headers.get("Accept-Language", ""),
                                 self.get_cookie("lang"), user and user.get("language"))
        if self.access != "public" and user is None:
            return self.redirect(PATHS["login"] + "?next=" + tornado.escape.url_escape(
                self.request.uri, plus=False))
        if self.name in ("login", "register") and user is not None:
            return self.redirect(PATHS["dashboard"])
        if user and user.get("must_change_password") and self.name != "account":
            # A password someone else set (a reset) is replaced before anything else.
            return self.redirect(PATHS["account"] + "?next=" + tornado.escape.url_escape(
                self.request.uri, plus=False))
        is_admin = bool(user) and int(user.get("role", 0)) >= ROLE_ADMIN
        if self.access == "admin" and not is_admin:
            raise tornado.web.HTTPError(403)
        status = await console_status.load(self.store, self.config)
        self.set_header("Content-Security-Policy", csp(self, status["base_addresses"]))
        html = templates(self.application).get_template(f"{self.name}.html").render(
            t=strings.translator(self.lang), lang=self.lang, langs=strings.names(),
            page=self.name, paths=PATHS,
            nav_user=NAV_USER if user else [], nav_admin=NAV_ADMIN if is_admin else [],
            user=user and {"id": user["_id"], "username": user.get("username", ""),
                           "must_change_password": bool(user.get("must_change_password"))},
            is_admin=is_admin, status=status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)

    def write_error(self, status_code: int, **kwargs) -> None:
        t = strings.translator(getattr(self, "lang", None) or strings.pick(
            self.request.headers.get("Accept-Language", ""), self.get_cookie("lang")))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(t("err.admin_only") if status_code == 403 else
                    t("err.page", status=status_code, id=self.request_id))


class StaticHandler(tornado.web.StaticFileHandler):
    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")

    @classmethod
    def get_content_type_for(cls, path: str) -> str:
        return "text/javascript; charset=utf-8" if path.endswith(".js") else ""

    def get_content_type(self) -> str:
        return self.get_content_type_for(self.absolute_path) or super().get_content_type()


default_handlers = (
    [(r"/", tornado.web.RedirectHandler, {"url": PATHS["dashboard"]}),
     (r"/console", tornado.web.RedirectHandler, {"url": PATHS["dashboard"]}),
     (r"/static/(.*)", StaticHandler, {"path": os.path.join(UI, "static")})]
    + [(path, PageHandler, {"name": name, "access": access}) for name, path, access in PAGES]
    + console_ws.default_handlers + console_api.default_handlers
)
