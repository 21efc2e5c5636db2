"""Handler bases: the JSON management API and the relay route families.

Collaborators come from `self.application.settings` (store, catalog,
billing, service, bus, vault, settings), never from module globals.
"""
from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError

from models.records import ROLE_ADMIN, USER_ENABLED
from relay.errors import RelayError, render
from relay.upstream import Cancel

log = logging.getLogger("relay.handlers")

SESSION_COOKIE = "session"
CSRF_HEADER = "X-CSRF-Token"
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


async def session_user(handler: tornado.web.RequestHandler) -> tuple[dict | None, dict]:
    """The enabled user behind the signed `session` cookie, and the session.

    Shared by the /api handlers, the console pages and the console
    websocket.  Returns (None, {}) when there is no valid session: no or a
    forged cookie, expired, user disabled, or signed out everywhere.
    """
    raw = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=30)
    if not raw:
        return None, {}
    try:
        sess = json.loads(raw)
    except ValueError:
        return None, {}
    if not isinstance(sess, dict) or sess.get("exp", 0) < time.time():
        return None, {}
    doc = await handler.application.settings["store"].db.users.find_one({"_id": sess.get("uid")})
    if not doc or doc.get("status", USER_ENABLED) != USER_ENABLED:
        return None, {}
    if doc.get("session_epoch", 0) != sess.get("epoch", 0):
        return None, {}  # signed out everywhere, or password changed
    return doc, sess


class Base(tornado.web.RequestHandler):
    @property
    def ctx(self) -> dict:
        return self.application.settings

    @property
    def store(self):
        return self.ctx["store"]

    @property
    def config(self):
        return self.ctx["config"]

    def client_ip(self) -> str:
        return self.request.remote_ip or ""

    def set_default_headers(self) -> None:
        self.request_id = getattr(self, "request_id", None) or new_request_id()
        self.set_header("X-Request-Id", self.request_id)
        self.set_header("X-Content-Type-Options", "nosniff")

    def check_xsrf_cookie(self) -> None:
        # Tornado's own check is replaced per family below.
        return None


class ApiHandler(Base):
    """JSON under /api: every reply is {"success", "message", "data"}."""

    auth_method = ""  # "session" or "token", set by get_current_user

    def ok(self, data: Any = None, message: str = "") -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"success": True, "message": message, "data": data},
                               ensure_ascii=False, default=str))

    def fail(self, status: int, message: str, data: Any = None) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"success": False, "message": message, "data": data},
                               ensure_ascii=False, default=str))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            return self.fail(exc.status, exc.message)
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            return self.fail(status_code, exc.log_message)
        if status_code >= 500:
            return self.fail(500, f"Internal error (request id: {self.request_id}).")
        return self.fail(status_code, self._reason)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, ApiError):
            return
        super().log_exception(typ, value, tb)

    def body_json(self) -> dict:
        if not self.request.body:
            return {}
        try:
            doc = json.loads(self.request.body)
        except ValueError:
            raise ApiError(400, "The request body is not valid JSON.") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return doc

    # ---- who is calling -----------------------------------------------------
    async def prepare(self) -> None:
        self.current_user = await self._authenticate()
        if self.auth_method == "session" and self.request.method in UNSAFE:
            sent = self.request.headers.get(CSRF_HEADER, "")
            if not sent or not secrets.compare_digest(sent, self._session.get("csrf", "")):
                raise ApiError(403, "Missing or wrong CSRF token: send the X-CSRF-Token header "
                                    "from the login reply.")

    async def _authenticate(self):
        self._session = {}
        auth = self.request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
            if token and not token.startswith("sk-"):
                doc = await self.store.db.users.find_one(
                    {"access_token_hash": self.ctx["vault"].lookup_hash(token)})
                if doc and doc.get("status", USER_ENABLED) == USER_ENABLED:
                    self.auth_method = "token"
                    return doc
                return None
        doc, sess = await session_user(self)
        if doc is None:
            return None
        self._session = sess
        self.auth_method = "session"
        return doc

    def start_session(self, user: dict, days: int = 7) -> str:
        csrf = secrets.token_urlsafe(24)
        sess = {"uid": user["_id"], "csrf": csrf, "epoch": user.get("session_epoch", 0),
                "exp": time.time() + days * 86400}
        self.set_signed_cookie(SESSION_COOKIE, json.dumps(sess), expires_days=days, httponly=True,
                               samesite="Lax", secure=self.config.secure_cookies, path="/")
        self.set_cookie("csrf_token", csrf, expires_days=days, samesite="Lax",
                        secure=self.config.secure_cookies, path="/")
        return csrf

    def end_session(self) -> None:
        self.clear_cookie(SESSION_COOKIE, path="/")
        self.clear_cookie("csrf_token", path="/")

    def require_user(self) -> dict:
        if not self.current_user:
            raise ApiError(401, "Not signed in.")
        return self.current_user

    def require_admin(self) -> dict:
        user = self.require_user()
        if int(user.get("role", 0)) < ROLE_ADMIN:
            raise ApiError(403, "Administrators only.")
        return user

    def is_admin(self) -> bool:
        return bool(self.current_user) and int(self.current_user.get("role", 0)) >= ROLE_ADMIN


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@tornado.web.stream_request_body
class RelayHandler(Base):
    """Base of every relay route family.

    The body is streamed in, so that a body over the limit is refused with
    413 before it is read, and so that uploads can be passed on as they come.
    Subclasses set `family` ("openai", "anthropic", "gemini", "mj").
    """

    family = "openai"
    buffer_body = True  # False: the subclass consumes data_received itself

    def initialize(self) -> None:
        self.cancel = Cancel()
        self._chunks: list[bytes] = []
        self._size = 0
        self.started = False
        self.closed = False
        self._flush_due = False

    async def prepare(self) -> None:
        limit = self.config.max_body_bytes
        self.request.connection.set_max_body_size(limit + 1)
        length = self.request.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > limit:
            raise RelayError(413, f"The request body is larger than the limit of "
                                  f"{self.config.max_body_mb} MB.", "invalid_request_error",
                             "request_too_large")

    def data_received(self, chunk: bytes) -> None:
        if not self.buffer_body:
            return
        self._size += len(chunk)
        if self._size > self.config.max_body_bytes:
            raise RelayError(413, f"The request body is larger than the limit of "
                                  f"{self.config.max_body_mb} MB.", "invalid_request_error",
                             "request_too_large")
        self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        if len(self._chunks) != 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0]

    # ---- the key ------------------------------------------------------------
    def api_key(self) -> str | None:
        h = self.request.headers
        auth = h.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
            if key:
                return key
        for name in ("x-api-key", "x-goog-api-key", "mj-api-secret"):
            if h.get(name):
                return h.get(name).strip()
        key = self.get_query_argument("key", None)
        return key.strip() if key else None

    async def auth(self):
        return await self.ctx["service"].authenticate(self.api_key(), self.client_ip(),
                                                      self.request.host)

    async def run_relay(self, auth, call, face) -> None:
        """Relay one call through the service and write its answer in the
        face's format (streams were written as they came)."""
        out = await self.ctx["service"].relay(call, auth, self, face, self.cancel)
        if out.error is not None:
            return self.send_error_body(out.error)
        if call.stream:
            if not self.closed:
                self.finish()
            return
        self.set_header("Content-Type", "application/json")
        if out.raw is not None:
            self.finish(out.raw)
        else:
            self.finish(json.dumps(face.render(call, out.body), ensure_ascii=False))

    # ---- errors -------------------------------------------------------------
    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if not isinstance(exc, RelayError):
            if isinstance(exc, tornado.web.HTTPError) and status_code < 500:
                exc = RelayError(status_code, exc.log_message or self._reason)
            else:
                exc = RelayError(500, "Internal error.", "server_error", "internal_error")
        self.send_error_body(exc)

    def send_error_body(self, err: RelayError) -> None:
        if self.started:
            self.finish()
            return
        self.clear()
        self.set_default_headers()
        self.set_status(err.status, _REASONS.get(err.status))
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if err.retry_after:
            self.set_header("Retry-After", str(err.retry_after))
        self.finish(json.dumps(render(self.family, err, self.request_id), ensure_ascii=False))

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, RelayError) and value.status < 500:
            return
        super().log_exception(typ, value, tb)

    # ---- the Sink the service writes to ------------------------------------
    def start(self, status: int, headers: dict) -> None:
        self.started = True
        self.set_status(status)
        for k, v in headers.items():
            self.set_header(k, v)

    def write(self, data) -> None:  # noqa: D401 - also tornado's write
        if self.closed:
            return
        super().write(data)
        if self.started and not isinstance(data, dict) and not self._flush_due:
            # One socket write per event-loop turn, however many chunks the
            # upstream delivered in it.
            self._flush_due = True
            IOLoop.current().add_callback(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        if not self.closed and not self._finished:
            self.flush().add_done_callback(self._flushed)

    def _flushed(self, fut) -> None:
        if fut.exception() is not None:  # the client went away mid-write
            self.closed = True
            self.cancel.cancelled = True

    def pending(self) -> int:
        stream = self.request.connection.stream
        return getattr(stream, "_write_buffer_size", 0) if stream is not None else 0

    async def drain(self) -> None:
        while self.pending() > 0 and not self.closed:
            try:
                await self.flush()
            except StreamClosedError:
                self.closed = True

    def on_connection_close(self) -> None:
        self.closed = True
        self.cancel.cancelled = True


_REASONS = {524: "A Timeout Occurred", 499: "Client Closed Request"}
