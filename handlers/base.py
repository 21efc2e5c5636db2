"""Handler bases: the JSON management API and the relay route families.

Collaborators come from `self.application.settings` (store, catalog,
billing, service, bus, vault, settings), never from module globals.
"""
from __future__ import annotations

import functools
import json
import logging
import secrets
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError

from handlers.sessions import SessionMixin, session_user  # noqa: F401 (shared from here)
from models.records import ROLE_ADMIN, USER_ENABLED
from relay import jsonin
from relay.buglog import log_bug
from relay.errors import RelayError, render
from relay.upstream import Cancel

log = logging.getLogger("relay.handlers")

CSRF_HEADER = "X-CSRF-Token"
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
# /api bodies are small JSON documents; a bigger one is read and dropped (up
# to four times this, so that the client reads our 413 rather than a reset)
# and answered with 413.
API_MAX_BODY_MB = 8
API_MAX_BODY = API_MAX_BODY_MB * 1024 * 1024


def log_unexpected(handler, value) -> None:
    """One uncaught exception (a bug): relay/buglog.py decides how much to log."""
    log_bug(log, f"{handler.request.method} {handler.request.path} ({handler.request_id})", value)


def ident(value, field: str = "id") -> int:
    """A record id from a path or a body: a whole number MongoDB can hold."""
    return jsonin.whole(value, field, 0, jsonin.INT64_MAX)


def is_intended(value) -> bool:
    """An error raised on purpose (a refusal, an upstream that failed), as
    opposed to a bug: its answer says all there is; the access log has its line."""
    return isinstance(value, (ApiError, RelayError, jsonin.BadInput, tornado.web.HTTPError))


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


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
                                f"{API_MAX_BODY_MB} MB for /api.")
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
        if isinstance(exc, ApiError):
            if exc.status == 429 and exc.retry_after:
                self.set_header("Retry-After", str(exc.retry_after))
                return self.fail(429, exc.message, {"retry_after": exc.retry_after})
            return self.fail(exc.status, exc.message)
        if isinstance(exc, jsonin.BadInput):
            return self.fail(exc.status, exc.message)
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            return self.fail(status_code, exc.log_message)
        if status_code >= 500:
            return self.fail(500, f"Internal error (request id: {self.request_id}).")
        return self.fail(status_code, self._reason)

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
                                    f"{API_MAX_BODY_MB} MB for /api.")
        self.request.connection.set_max_body_size(4 * API_MAX_BODY)
        self.current_user = await self._authenticate()
        if self.auth_method == "session" and self.request.method in UNSAFE:
            sent = self.request.headers.get(CSRF_HEADER, "")
            if not sent or not secrets.compare_digest(sent, self._session.get("csrf", "")):
                self._refused = ApiError(403, "Missing or wrong CSRF token: send the "
                                              "X-CSRF-Token header from the login reply.")

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

    def require_user(self) -> dict:
        if not self.current_user:
            raise ApiError(401, "Not signed in.")
        if self.current_user.get("must_change_password") and not self.open_before_password_change:
            raise ApiError(403, "Choose a new password first: PUT /api/user/self with "
                                "original_password and password (the console's Account page).")
        return self.current_user

    def require_admin(self) -> dict:
        user = self.require_user()
        if int(user.get("role", 0)) < ROLE_ADMIN:
            raise ApiError(403, "Administrators only.")
        return user

    def is_admin(self) -> bool:
        return bool(self.current_user) and int(self.current_user.get("role", 0)) >= ROLE_ADMIN


class ApiError(Exception):
    def __init__(self, status: int, message: str, retry_after: int = 0):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def _refuse_after_body(prepare):
    """Wraps a relay handler's own prepare(): a refusal there (no key, a
    wrong key, an unknown path, a malformed upload header) is answered once
    the body is in, the body dropped meanwhile.  Answering while the client
    is still sending would close the connection under it, and the client
    would see a reset instead of our answer.  413 is still answered at once:
    that body is not going to be read."""
    @functools.wraps(prepare)
    async def wrapper(self):
        try:
            result = prepare(self)
            if result is not None:
                await result
        except RelayError as err:
            if err.status == 413:
                raise
            self.data_received = _drop
            setattr(self, self.request.method.lower(), functools.partial(_raise, err))
    return wrapper


def _drop(chunk: bytes) -> None:
    return None


def _raise(err: Exception, *args, **kwargs):
    raise err


@tornado.web.stream_request_body
class RelayHandler(Base):
    """Base of every relay route family.

    The body is streamed in, so that a body over the limit is refused with
    413 before it is read, and so that uploads can be passed on as they come.
    Subclasses set `family` ("openai", "anthropic", "gemini", "mj").
    """

    family = "openai"
    buffer_body = True  # False: the subclass consumes data_received itself

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "prepare" in cls.__dict__:
            cls.prepare = _refuse_after_body(cls.__dict__["prepare"])

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
            self._close = True  # answered unread: the client must not reuse the connection
            raise RelayError(413, f"The request body is larger than the limit of "
                                  f"{self.config.max_body_mb} MB.", "invalid_request_error",
                             "request_too_large")

    def data_received(self, chunk: bytes) -> None:
        if not self.buffer_body:
            return
        self._size += len(chunk)
        # Raising here would drop the connection without an answer (and log
        # a traceback): the body is dropped instead, and `body` says 413.
        if self._size > self.config.max_body_bytes:
            self._chunks = []
        else:
            self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        if self._size > self.config.max_body_bytes:
            raise RelayError(413, f"The request body is larger than the limit of "
                                  f"{self.config.max_body_mb} MB.", "invalid_request_error",
                             "request_too_large")
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

    async def run_relay(self, auth, call, face, after=None) -> None:
        """Relay one call through the service and write its answer in the
        face's format (streams were written as they came).  `after(out)`,
        if given, runs once the call is settled, before the answer is
        finished."""
        out = await self.ctx["service"].relay(call, auth, self, face, self.cancel)
        if after is not None:
            await after(out)
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
        if isinstance(exc, jsonin.BadInput):
            exc = jsonin.relay_error(exc)
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
        if getattr(self, "_close", False):
            self.set_header("Connection", "close")
        self.set_status(err.status, _REASONS.get(err.status))
        self.set_header("Content-Type", "application/json; charset=utf-8")
        for k, v in getattr(err, "headers", {}).items():
            self.set_header(k, v)
        self.finish(json.dumps(render(self.family, err, self.request_id), ensure_ascii=False))

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
