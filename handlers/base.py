"""Handler bases: every handler's, and the JSON management API's
(handlers/relay_base.py has the relay route families').

Collaborators come from `self.application.settings` (store, catalog,
billing, service, bus, vault, settings), never from module globals.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import time
from typing import Any

import tornado
import tornado.web
from tornado import httputil

from handlers.refusals import HTTP_CODES, RELAY_CODES, ApiError  # noqa: F401 (shared from here)
from handlers.sessions import SessionMixin, session_user  # noqa: F401 (shared from here)
from models.passwords import PasswordsBusy
from models.records import ROLE_ADMIN, USER_ENABLED
from relay.serving import jsonin
from relay.serving.buglog import log_bug
from relay.catalog import MAX_KEY_LENGTH
from relay.errors import RelayError

log = logging.getLogger("relay.handlers")

CSRF_HEADER = "X-CSRF-Token"
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
# /api bodies are small JSON documents; a bigger one is read and dropped (up
# to four times this, so that the client reads our 413 rather than a reset)
# and answered with 413.
API_MAX_BODY_MB = 8
API_MAX_BODY = API_MAX_BODY_MB * 1024 * 1024


def log_unexpected(handler, value) -> None:
    """One uncaught exception (a bug): relay/serving/buglog.py decides how much to log."""
    log_bug(log, f"{handler.request.method} {handler.request.path} ({handler.request_id})", value)


def ident(value, field: str = "id") -> int:
    """A record id from a path or a body: a whole number MongoDB can hold."""
    return jsonin.whole(value, field, 0, jsonin.INT64_MAX)


def is_intended(value) -> bool:
    """An error raised on purpose (a refusal, an upstream that failed), as
    opposed to a bug: its answer says all there is; the access log has its line."""
    return isinstance(value, (ApiError, RelayError, jsonin.BadInput, tornado.web.HTTPError,
                              PasswordsBusy))


_random = bytearray()


def new_request_id() -> str:
    """24 random hex digits: the call's id, and its usage record's _id, so it
    must never repeat.  Drawn from the system's generator 4 KB at a time (a
    system call per request was 1% of a relayed call); a forked child starts
    a pool of its own, so no two processes share one."""
    global _random
    if len(_random) < 12:
        _random = bytearray(os.urandom(4092))
    piece = _random[-12:]
    del _random[-12:]
    return "req_" + piece.hex()


def _forget_random() -> None:
    global _random
    _random = bytearray()


os.register_at_fork(after_in_child=_forget_random)

_SERVER = "TornadoServer/%s" % tornado.version
_fresh: list = [0, None]


def answer_headers() -> httputil.HTTPHeaders:
    """The headers Tornado's clear() starts an answer with, copied from a
    set made once a second: building them through HTTPHeaders' checks for
    every answer (and formatting Date with email.utils) was 3% of a relayed
    call.  Copied by their own fields, whatever this Tornado keeps
    (tests/relay/serving/test_process.py compares the result with Tornado's clear())."""
    now = int(time.time())
    if now != _fresh[0]:
        _fresh[1] = httputil.HTTPHeaders({"Server": _SERVER,
                                          "Content-Type": "text/html; charset=UTF-8",
                                          "Date": httputil.format_timestamp(now)})
        _fresh[0] = now
    h = httputil.HTTPHeaders()
    for field, kept in vars(_fresh[1]).items():
        setattr(h, field, {k: v[:] if type(v) is list else v for k, v in kept.items()})
    return h


class Base(tornado.web.RequestHandler):
    def clear(self) -> None:
        # Tornado's own clear(), but for how the headers are made
        # (tests/relay/serving/test_process.py compares the two).
        self._headers = answer_headers()
        self.set_default_headers()
        self._write_buffer: list[bytes] = []
        self._status_code = 200
        self._reason = httputil.responses[200]

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
        # Straight in: set_header() would check values we made ourselves.
        self._headers["X-Request-Id"] = self.request_id
        self._headers["X-Content-Type-Options"] = "nosniff"

    def check_xsrf_cookie(self) -> None:
        # Tornado's own check is replaced per family below.
        return None

    def log_exception(self, typ, value, tb) -> None:
        # A refusal is already one line in the access log; only bugs go on.
        if not is_intended(value):
            log_unexpected(self, value)


HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def _not_allowed(self, *args, **kwargs):
    raise tornado.web.HTTPError(405)


_not_allowed._not_allowed = True


def _after_body(method):
    """Wraps each HTTP method of an ApiHandler.  prepare() runs before the
    body is read, and an answer sent then would leave the client writing
    into a closed connection; so its refusals wait here, until the body is
    in (a body over the limit was read and dropped, and gets 413)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._oversized:
            raise ApiError(413, f"The request body is larger than the limit of "
                                f"{API_MAX_BODY_MB} MB for /api.", code="body_too_large",
                           max_mb=API_MAX_BODY_MB)
        if self._refused is not None:
            raise self._refused
        return method(self, *args, **kwargs)
    wrapper._sized = True
    return wrapper


@tornado.web.stream_request_body
class ApiHandler(SessionMixin, Base):
    """JSON under /api: every reply is {"success", "message", "data"}.

    The body is streamed in (and kept in memory up to API_MAX_BODY), so that
    a body over the limit gets a 413 envelope rather than a closed connection.
    """

    auth_method = ""  # "session" or "token", set by get_current_user
    # A user whose password was reset by someone else may only use handlers
    # that set this (their own account), until they choose a new password.
    open_before_password_change = False
    # The HTTP methods this handler answers (the others get 405).
    ALLOWED_METHODS: tuple = ()
    # What a call costs of the caller's /api rate limit (handlers/api_rate.py),
    # and whether it is one of the heavy ones (exports, statistics) that may
    # run only a few at a time per user.
    API_COST = 1
    HEAVY = False
    # Takes its body only as application/json: a form on another site can
    # post text/plain without asking (no CORS preflight), so a sign-in
    # that reads any body could be made from there (login CSRF).
    JSON_ONLY = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = [m for m in HTTP_METHODS if m in cls.__dict__ and
               not getattr(cls.__dict__[m], "_not_allowed", False)]
        # A handler that names its own methods answers only those: a subclass
        # made for a route with an id must not inherit its parent's methods
        # (POST /api/user/5 is no "create a user" with a stray argument).
        # One that names none (AllLogHandler) answers what its parent does.
        # The 405 is raised by the method, after the body is read (Tornado's
        # own check would answer before and drop the connection unannounced).
        if own:
            cls.ALLOWED_METHODS = tuple(m.upper() for m in own)
            for name in HTTP_METHODS:
                if name not in own:
                    setattr(cls, name, _not_allowed)
        for name in own:
            fn = cls.__dict__[name]
            if not getattr(fn, "_sized", False):
                setattr(cls, name, _after_body(fn))

    def initialize(self, **kwargs) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._oversized = False
        self._refused: ApiError | None = None
        self._heavy_user: int | None = None

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > API_MAX_BODY:
            self._oversized = True
            self._chunks = []
        elif not self._oversized:
            self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        if len(self._chunks) != 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0]

    def ok(self, data: Any = None, message: str = "") -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"success": True, "message": message, "data": data},
                               ensure_ascii=False, default=str))

    def fail(self, status: int, message: str, data: Any = None) -> None:
        if getattr(self, "_close", False):
            self.set_header("Connection", "close")
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"success": False, "message": message, "data": data},
                               ensure_ascii=False, default=str))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        # Every refusal's data carries a code (and its values) for the
        # console's words; the message stays English.
        if isinstance(exc, ApiError):
            if exc.status == 429 and exc.retry_after:
                self.set_header("Retry-After", str(exc.retry_after))
            return self.fail(exc.status, exc.message, exc.data())
        if isinstance(exc, jsonin.BadInput):
            return self.fail(exc.status, exc.message, {"code": exc.code, **exc.values})
        if isinstance(exc, PasswordsBusy):
            self.set_header("Retry-After", "1")
            return self.fail(429, "Too many sign-ins and password changes at once: try again "
                                  "in a second.", {"retry_after": 1, "code": "passwords_busy"})
        if isinstance(exc, RelayError):   # billing or the catalog refusing a change (503)
            if exc.retry_after:
                self.set_header("Retry-After", str(exc.retry_after))
            code = exc.code if exc.code in RELAY_CODES else "unavailable"
            return self.fail(exc.status, exc.message,
                             {"code": code, **({"retry_after": exc.retry_after}
                                               if exc.retry_after else {})})
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            return self.fail(status_code, exc.log_message,
                             {"code": HTTP_CODES.get(status_code, "http_error"),
                              "status": status_code})
        if status_code >= 500:
            return self.fail(500, f"Internal error (request id: {self.request_id}).",
                             {"code": "internal", "id": self.request_id})
        return self.fail(status_code, self._reason,
                         {"code": HTTP_CODES.get(status_code, "http_error"),
                          "status": status_code})

    def body_json(self) -> dict:
        """The body as a JSON object ({} when empty), through relay/jsonin."""
        raw = self.body
        if not raw.strip():
            return {}
        return jsonin.parse_object(raw)

    # ---- typed query parameters (the same checks as JSON fields) -----------
    def int_arg(self, name: str, default: int | None = None, lo: int = jsonin.INT64_MIN,
                hi: int = jsonin.INT64_MAX) -> int | None:
        raw = self.get_argument(name, "")
        if raw == "":
            return default
        return jsonin.whole(raw, name, lo, hi)

    def float_arg(self, name: str, default: float | None = None, lo: float = -1e15,
                  hi: float = 1e15) -> float | None:
        raw = self.get_argument(name, "")
        if raw == "":
            return default
        return jsonin.number(raw, name, lo, hi)

    def str_arg(self, name: str, default: str = "", max_len: int = 1000) -> str:
        return jsonin.text(self.get_argument(name, default), name, max_len)

    def flag_arg(self, name: str, default: bool = False) -> bool:
        raw = self.get_argument(name, "")
        return default if raw == "" else jsonin.flag(raw, name)

    # ---- who is calling -----------------------------------------------------
    async def prepare(self) -> None:
        length = self.request.headers.get("Content-Length", "")
        declared = int(length) if length.isdigit() and len(length) < 19 else 0
        if declared > API_MAX_BODY:
            self._oversized = True
            if declared > 4 * API_MAX_BODY:
                # Answered before the body is read: the connection cannot be
                # used again, and the client must be told.
                self._close = True
                raise ApiError(413, f"The request body is larger than the limit of "
                                    f"{API_MAX_BODY_MB} MB for /api.", code="body_too_large",
                               max_mb=API_MAX_BODY_MB)
        self.request.connection.set_max_body_size(4 * API_MAX_BODY)
        if self.JSON_ONLY and self.request.method in UNSAFE:
            ctype = self.request.headers.get("Content-Type", "").split(";", 1)[0]
            if ctype.strip().lower() != "application/json":
                self._refused = ApiError(415, "Send the body as JSON, with the header "
                                              "Content-Type: application/json.",
                                         code="json_only")
        self.current_user = await self._authenticate()
        if self.auth_method == "session" and self.request.method in UNSAFE:
            sent = self.request.headers.get(CSRF_HEADER, "")
            if not sent or not secrets.compare_digest(sent, self._session.get("csrf", "")):
                self._refused = ApiError(403, "Missing or wrong CSRF token: send the "
                                              "X-CSRF-Token header from the login reply.",
                                         code="csrf")
        if self.current_user and self._refused is None and not self.is_admin():
            self._refused = self._rate_limited()

    def api_cost(self) -> int:
        """This call's cost of the rate limit (a handler may weigh its arguments)."""
        return self.API_COST

    def _rate_limited(self) -> ApiError | None:
        limiter = self.ctx.get("api_rate")
        if limiter is None:
            return None
        uid = self.current_user["_id"]
        try:
            cost = self.api_cost()
        except jsonin.BadInput:
            cost = self.API_COST  # the handler refuses the argument itself
        wait = limiter.take(uid, cost)
        if wait:
            return ApiError(429, f"Too many requests: try again in {wait} s (each account may "
                                 f"use {limiter.per_minute} units of /api a minute).",
                            retry_after=wait, code="rate_limited", wait=wait,
                            per_minute=limiter.per_minute)
        if self.HEAVY:
            if not limiter.enter_heavy(uid):
                return ApiError(429, "Two exports or statistics of yours are running already: "
                                     "try again when they are done.", retry_after=2,
                                code="heavy_running")
            self._heavy_user = uid
        return None

    def on_finish(self) -> None:
        self._leave_heavy()

    def on_connection_close(self) -> None:
        self._leave_heavy()

    def _leave_heavy(self) -> None:
        if self._heavy_user is not None:
            self.ctx["api_rate"].leave_heavy(self._heavy_user)
            self._heavy_user = None

    async def _authenticate(self):
        self._session = {}
        auth = self.request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
            if len(token) > MAX_KEY_LENGTH:
                return None  # no access token is this long: not looked up
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

    def require_user(self) -> dict:
        if not self.current_user:
            raise ApiError(401, "Not signed in.", code="not_signed_in")
        if self.current_user.get("must_change_password") and not self.open_before_password_change:
            raise ApiError(403, "Choose a new password first: PUT /api/user/self with "
                                "original_password and password (the console's Account page).",
                           code="change_password_first")
        return self.current_user

    def require_admin(self) -> dict:
        user = self.require_user()
        if int(user.get("role", 0)) < ROLE_ADMIN:
            raise ApiError(403, "Administrators only.", code="admin_only")
        return user

    def is_admin(self) -> bool:
        return bool(self.current_user) and int(self.current_user.get("role", 0)) >= ROLE_ADMIN
