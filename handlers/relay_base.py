"""The base of every relay route family (OpenAI, Anthropic, Gemini,
Midjourney): the body streamed in under a limit, a refusal answered once the
body is in, and the Sink the relay service writes an answer to.

Collaborators come from `self.application.settings`, as for every handler
(handlers/base.py).
"""
from __future__ import annotations

import asyncio
import functools
import json

import tornado.web
from tornado.iostream import IOStream, StreamClosedError
from tornado.web import _HandlerDelegate

from handlers.base import Base
from relay.serving import jsonin
from relay.errors import RelayError, render
from relay.sessions import client_session
from relay.upstream.client import Cancel


def _refuse_after_body(prepare):
    """Wraps a relay handler's own prepare(): a refusal there (no key, a
    wrong key, an unknown path, a malformed upload header) is answered once
    the body is in, the body dropped meanwhile.  Answering while the client
    is still sending would close the connection under it, and the client
    would see a reset instead of our answer.  413, and a wrong key with a
    large body (RelayHandler.prepare), are still answered at once: that body
    is not going to be read."""
    @functools.wraps(prepare)
    async def wrapper(self):
        try:
            result = prepare(self)
            if result is not None:
                await result
        except RelayError as err:
            if err.status == 413 or getattr(self, "_close", False):
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
    # A body that is not read whole before the handler runs (over EAGER_BODY,
    # or chunked) is read only once the key is known to be valid: a stranger
    # may make us hold EAGER_BODY at most.  False for routes that need no key.
    key_first = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "prepare" in cls.__dict__:
            cls.prepare = _refuse_after_body(cls.__dict__["prepare"])

    def initialize(self) -> None:
        # No templates here: Tornado's per-request UI namespace (and the
        # reference cycle it makes with the handler) would only be carried
        # for the whole life of a stream.
        self.ui = None
        self.cancel = Cancel()
        self._chunks: list[bytes] = []
        self._size = 0
        self.started = False
        self.closed = False
        self._flush_due = False
        self._call_soon = None
        self._auth = None

    async def prepare(self) -> None:
        limit = self.config.max_body_bytes
        self.request.connection.set_max_body_size(limit + 1)
        length = self.request.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > limit:
            self._close = True  # answered unread: the client must not reuse the connection
            raise RelayError(413, f"The request body is larger than the limit of "
                                  f"{self.config.max_body_mb} MB.", "invalid_request_error",
                             "request_too_large")
        if self.key_first and self._body_streams():
            try:
                self._auth = await self.auth()
            except RelayError:
                # Answered now, unread, and the connection closed after it:
                # a caller without a valid key does not get to send us megabytes.
                self._close = True
                raise

    def _body_streams(self) -> bool:
        """Whether the body comes in after prepare() (BodyFirst did not read it)."""
        headers = self.request.headers
        if "Transfer-Encoding" in headers:
            return True
        length = headers.get("Content-Length", "")
        return length.isdigit() and int(length) > EAGER_BODY

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
        if not self._chunks:  # read whole before the handler was made (BodyFirst), or empty
            return self.request.body
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
        """The caller's Auth (once a request: prepare() may have asked already)."""
        if self._auth is None:
            self._auth = await self.ctx["service"].authenticate(self.api_key(), self.client_ip(),
                                                                self.request.host)
        return self._auth

    async def run_relay(self, auth, call, face, after=None) -> None:
        """Relay one call through the service and write its answer in the
        face's format (streams were written as they came).  `after(out)`,
        if given, runs once the call is settled, before the answer is
        finished."""
        # The call holds what it needs: a long stream need not keep the
        # request's bytes as well (coding agents send 100 KB and more).
        self._chunks = []
        self.request.body = b""
        call.extra["client_session"] = client_session(self.request.headers, call)
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
            if self._call_soon is None:
                # Once a stream: on Python 3.11 each get_running_loop() is a
                # getpid() system call, too dear for every chunk.
                self._call_soon = asyncio.get_running_loop().call_soon
            self._call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        if self.closed or self._finished:
            return
        if self._headers_written:
            if not self._send_now():
                self.flush().add_done_callback(self._flushed)
            return
        self.flush().add_done_callback(self._flushed)
        if self._headers_written:
            self._shed_headers()

    def _shed_headers(self) -> None:
        """Once an answer has begun, neither the client's headers nor ours
        are read again: Tornado settled keep-alive when the request came in,
        and has written ours.  Both are emptied for the rest of the stream;
        an SDK's request brings fifteen to twenty-five headers, and these
        were about 2 KB of every open stream in bench/streams.py, whose
        client sends four.  Emptied where they are, by their own fields as
        answer_headers() copies them: Tornado's reading coroutine keeps the
        request's in a local of its own."""
        for headers in (self.request.headers, self._headers):
            for held in vars(headers).values():
                if type(held) is dict:
                    held.clear()

    def _send_now(self) -> bool:
        """A stream's next piece straight to the socket when nothing is
        queued before it.  Tornado's flush makes three futures and two loop
        callbacks a write; with 10,000 streams open this saves about 5% of
        the relay's CPU (bench/streams.py, 37.6 against 39.7 s for the
        step).  What the socket does not take goes to the stream's buffer,
        as Tornado's write would leave it, and back-pressure weighs it.
        False (nothing done) unless the connection is plain HTTP/1.1 with
        nothing queued."""
        conn = self.request.connection
        stream = getattr(conn, "stream", None)
        if (type(stream) is not IOStream or stream.closed() or self.pending()
                or self._transforms or self.request.method == "HEAD"):
            return False
        data = b"".join(self._write_buffer)
        self._write_buffer = []
        if not data:
            return True
        data = conn._format_chunk(data)
        try:
            sent = stream.socket.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:  # the client went away
            self._client_left()
            stream.close(exc)
            return True
        if sent < len(data):
            stream.write(data[sent:]).add_done_callback(self._flushed)
        return True

    def _flushed(self, fut) -> None:
        if fut.exception() is not None:  # the client went away mid-write
            self._client_left()

    def _client_left(self) -> None:
        self.closed = True
        self.cancel.leave()

    def pending(self) -> int:
        """Bytes written to the client's connection that the socket has
        not taken yet (what back-pressure in relay/attempts.py weighs)."""
        stream = self.request.connection.stream
        if stream is None:
            return 0
        return stream._total_write_index - stream._total_write_done_index

    async def drain(self) -> None:
        while self.pending() > 0 and not self.closed:
            try:
                await self.flush()
            except StreamClosedError:
                self.closed = True

    def on_connection_close(self) -> None:
        self._client_left()


_REASONS = {524: "A Timeout Occurred", 499: "Client Closed Request"}

# A body of at most this many bytes, with a Content-Length, is read whole
# before its relay handler is made (BodyFirst).
EAGER_BODY = 256 * 1024
_DONE: asyncio.Future | None = None


class BodyFirst(_HandlerDelegate):
    """Tornado's delegate for a relay handler, reading a small request's
    body before the handler runs.

    A relay handler streams its body in (stream_request_body), so that one
    over the limit is refused unread and an upload passes on as it arrives.
    For the usual request, a JSON body of a few KB with a Content-Length,
    that costs three turns of the loop before post() runs (prepare() in a
    task of its own, the connection resumed once it is done, the body
    awaited after it), and a turn lasts milliseconds with thousands of
    streams open.  Read first, the body is in `request.body` when the
    handler is made, and prepare() and post() run in its first turn.  Large
    or chunked bodies, and handlers that consume their own (uploads), stream
    in as before."""

    whole = False

    def headers_received(self, start_line, headers):
        if self.stream_request_body and "Transfer-Encoding" not in headers:
            length = headers.get("Content-Length")
            if length is None or (length.isdigit() and int(length) <= EAGER_BODY):
                self.stream_request_body = False
                self.whole = True
        return super().headers_received(start_line, headers)

    def finish(self) -> None:
        if self.whole:
            # RequestHandler._execute awaits this for a streaming class; a
            # future already done is awaited without touching its loop, so
            # one serves every request.
            global _DONE
            if _DONE is None:
                _DONE = asyncio.Future()
                _DONE.set_result(None)
            self.request._body_future = _DONE
        super().finish()
        # Tornado copied the body to request.body; this delegate lives as
        # long as the request (a whole stream), and need not hold it twice.
        self.chunks = bytearray()


class BodyFirstRouting:
    """Application mixin: relay handlers that buffer their body get BodyFirst."""

    def get_handler_delegate(self, request, target_class, target_kwargs=None, path_args=None,
                             path_kwargs=None):
        if isinstance(target_class, type) and issubclass(target_class, RelayHandler) \
                and target_class.buffer_body:
            return BodyFirst(self, request, target_class, target_kwargs, path_args, path_kwargs)
        return super().get_handler_delegate(request, target_class, target_kwargs, path_args,
                                            path_kwargs)
