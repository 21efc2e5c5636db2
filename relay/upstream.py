"""The only code that makes outbound HTTP calls to upstream channels.

It uses Tornado's curl-based AsyncHTTPClient: libcurl keeps connections to
each upstream alive and reuses them (the simple client opens one per
request).  Responses below 400 can be streamed chunk by chunk to a callback
as they arrive; error responses are collected (they are small) so that the
caller can map and possibly retry them.

Three things libcurl's own timeouts cannot express are done with its
progress callback, which libcurl calls at least once a second per transfer:
- a deadline for the first response byte (504),
- a limit on silence in the middle of a stream,
- cancellation when our own client has gone away.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import pycurl
from tornado.curl_httpclient import CurlAsyncHTTPClient, CurlError
from tornado.httpclient import HTTPRequest
from tornado.httputil import HTTPHeaders

from relay.errors import RelayError

log = logging.getLogger("relay.upstream")

# libcurl error codes we tell apart
_COULDNT_RESOLVE, _COULDNT_CONNECT, _TIMEOUT, _ABORTED = 6, 7, 28, 42


class Cancel:
    """Control of one transfer from outside.

    `cancelled = True` aborts it (the client left).  `pause()`/`resume()`
    stop and restart reading from the upstream socket: a slow reader of ours
    then backs up into TCP instead of into our memory.
    """

    def __init__(self):
        self.cancelled = False
        self.paused = False
        self._curl = None
        self._client = None

    def pause(self) -> None:
        if self._curl is not None and not self.paused:
            try:
                self._curl.pause(pycurl.PAUSE_RECV)
                self.paused = True
            except pycurl.error:
                pass

    def resume(self) -> None:
        if self._curl is not None and self.paused:
            self.paused = False
            try:
                self._curl.pause(pycurl.PAUSE_CONT)
            except pycurl.error:
                pass
            # Ask libcurl to act now instead of on its next timer.
            self._client._set_timeout(0)


@dataclass
class Response:
    status: int
    headers: HTTPHeaders
    body: bytes = b""
    streamed: bool = False
    first_byte_at: float = 0.0
    error: RelayError | None = None
    # True when the transfer broke after the upstream started answering.
    broken: bool = False


@dataclass
class _Watch:
    first_byte_timeout: float
    idle_timeout: float
    cancel: Cancel
    started: float = field(default_factory=time.monotonic)
    last_data: float = 0.0
    reason: str = ""


class Upstream:
    def __init__(self, connect_timeout: float = 10.0, first_byte_timeout: float = 120.0,
                 idle_timeout: float = 120.0, max_clients: int = 512,
                 max_body_size: int = 512 * 1024 * 1024):
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        # force_instance: our pool is ours alone, whatever else in the
        # process uses AsyncHTTPClient (e.g. notification webhooks).
        self.client = CurlAsyncHTTPClient(force_instance=True, max_clients=max_clients,
                                          max_body_size=max_body_size)

    def close(self) -> None:
        self.client.close()

    async def send(self, method: str, url: str, headers: dict, body: bytes | None = None, *,
                   on_start: Callable[[int, HTTPHeaders], None] | None = None,
                   on_chunk: Callable[[bytes], None] | None = None,
                   cancel: Cancel | None = None,
                   first_byte_timeout: float | None = None,
                   body_producer=None) -> Response:
        """Make one call.  Never raises for HTTP or network failures: the
        returned Response carries `error` (a RelayError with our status)."""
        watch = _Watch(first_byte_timeout or self.first_byte_timeout, self.idle_timeout,
                       cancel or Cancel())
        resp_headers = HTTPHeaders()
        state = {"status": 0, "started": False, "final": False, "err_body": bytearray(), "body": []}

        def header_line(raw: bytes) -> None:
            # Runs inside libcurl (synchronously, before any body chunk is
            # delivered), unlike Tornado's header_callback, which is queued
            # and may arrive after the body.  So it only records.
            line = raw.decode("latin1").rstrip("\r\n")
            if line.startswith("HTTP/"):
                resp_headers.clear()
                parts = line.split(" ", 2)
                try:
                    state["status"] = int(parts[1])
                except (IndexError, ValueError):
                    state["status"] = 502
            elif line.strip():
                try:
                    resp_headers.parse_line(line)
                except Exception:
                    pass
            elif state["status"] >= 200:
                state["final"] = True

        def begin() -> None:
            if not state["started"] and state["final"]:
                state["started"] = True
                watch.last_data = time.monotonic()
                if on_start is not None and state["status"] < 400:
                    on_start(state["status"], resp_headers)

        def chunk_cb(chunk: bytes) -> None:
            begin()
            watch.last_data = time.monotonic()
            if state["status"] >= 400:
                if len(state["err_body"]) < 1024 * 1024:  # error bodies are small
                    state["err_body"] += chunk
            elif on_chunk is None:
                state["body"].append(chunk)
            else:
                on_chunk(chunk)

        def progress(_dltotal, _dlnow, _ultotal, _ulnow) -> int:
            now = time.monotonic()
            if watch.cancel.cancelled:
                watch.reason = "cancelled"
                return 1
            if not watch.last_data and now - watch.started > watch.first_byte_timeout:
                watch.reason = "first_byte"
                return 1
            if (watch.last_data and not watch.cancel.paused
                    and now - watch.last_data > watch.idle_timeout):
                watch.reason = "idle"
                return 1
            return 0

        def prepare(curl) -> None:
            watch.cancel._curl = curl
            watch.cancel._client = self.client
            curl.setopt(pycurl.HEADERFUNCTION, header_line)
            curl.setopt(pycurl.NOPROGRESS, 0)
            curl.setopt(pycurl.XFERINFOFUNCTION, progress)
            # The low-speed check makes libcurl wake this transfer every
            # second even when the socket is silent; without it the progress
            # callback (our deadlines and cancellation) may never run.
            curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)
            curl.setopt(pycurl.LOW_SPEED_TIME, max(1, int(watch.idle_timeout)))
            if body_producer is not None:
                self._stream_upload(curl, body_producer, watch)

        if body_producer is not None and body_producer.length is None:
            headers = dict(headers, **{"Transfer-Encoding": "chunked"})
        req = HTTPRequest(url, method=method, headers=headers,
                          body=body if body_producer is None else None,
                          body_producer=body_producer,
                          allow_nonstandard_methods=True,
                          connect_timeout=self.connect_timeout,
                          request_timeout=24 * 3600,
                          # A whole answer is collected by libcurl's own buffer: no
                          # per-chunk hop through the IOLoop for it.
                          streaming_callback=chunk_cb if on_chunk is not None else None,
                          prepare_curl_callback=prepare,
                          decompress_response=True, follow_redirects=False)
        t0 = time.monotonic()
        try:
            try:
                whole = await self.client.fetch(req, raise_error=False)
            finally:
                # libcurl handles are pooled: never touch this one again.
                watch.cancel._curl = None
        except (CurlError, OSError) as exc:  # network-level failure
            return Response(state["status"], resp_headers, bytes(state["err_body"]),
                            streamed=state["started"], error=self._map_exc(exc, watch, state),
                            broken=state["started"])
        begin()
        status = state["status"]
        if watch.reason:
            return Response(status, resp_headers, b"", streamed=state["started"],
                            error=self._map_reason(watch.reason), broken=state["started"])
        if on_chunk is None:
            body = whole.body or b""
            watch.last_data = watch.last_data or time.monotonic()
        else:
            body = bytes(state["err_body"]) if status >= 400 else b"".join(state["body"])
        resp = Response(status, resp_headers, body,
                        streamed=status < 400 and on_chunk is not None,
                        first_byte_at=(watch.last_data - t0) if watch.last_data else 0.0)
        if status == 599 or status == 0:
            resp.error = RelayError(502, "The upstream closed the connection without answering.",
                                    "upstream_error", "bad_upstream")
        return resp

    def _stream_upload(self, curl, producer, watch: _Watch) -> None:
        """Feed the request body from `producer` as its bytes arrive.

        Tornado's curl client takes only a whole body, so the read callback
        is replaced: it hands libcurl what the producer has, pauses the
        upload when the producer has nothing yet, and is woken by the
        producer when more arrives.  The producer (relay/upload.py) has:
        `length` (int, or None for chunked), `start(wake)` (called once per
        attempt; a retry starts again from the first byte), `read(n)` (bytes,
        b"" at the end, None when nothing is there yet) and `aborted`.
        """
        state = {"paused": False}

        def wake() -> None:
            if state["paused"] and watch.cancel._curl is curl:
                state["paused"] = False
                try:
                    curl.pause(pycurl.PAUSE_RECV if watch.cancel.paused else pycurl.PAUSE_CONT)
                except pycurl.error:
                    return
                self.client._set_timeout(0)

        def read(size: int):
            if producer.aborted or watch.cancel.cancelled:
                # Our client left or sent a bad body: its call ends as 499.
                watch.reason = "cancelled"
                return pycurl.READFUNC_ABORT
            data = producer.read(size)
            if data is None:
                state["paused"] = True
                return pycurl.READFUNC_PAUSE
            # The wait for a first answer byte starts when the upload ends,
            # not while a slow client is still sending.
            watch.started = time.monotonic()
            return data

        producer.start(wake)
        curl.setopt(pycurl.READFUNCTION, read)
        curl.setopt(pycurl.POSTFIELDSIZE_LARGE,
                    producer.length if producer.length is not None else -1)

    @staticmethod
    def _map_reason(reason: str) -> RelayError:
        if reason == "first_byte":
            return RelayError(504, "The upstream did not answer in time.", "upstream_error",
                              "upstream_timeout")
        if reason == "idle":
            return RelayError(504, "The upstream stopped sending mid-stream.", "upstream_error",
                              "upstream_timeout")
        return RelayError(499, "The client closed the request.", "client_closed", "client_closed")

    def _map_exc(self, exc: Exception, watch: _Watch, state: dict) -> RelayError:
        if watch.reason:
            return self._map_reason(watch.reason)
        code = getattr(exc, "errno", None)
        msg = str(exc)
        low = msg.lower()
        if code == _TIMEOUT or "timed out" in low:
            if "connect" in low or not state["status"]:
                return RelayError(524, "Connecting to the upstream timed out.", "upstream_error",
                                  "upstream_connect_timeout")
            return RelayError(504, "The upstream did not answer in time.", "upstream_error",
                              "upstream_timeout")
        if code in (_COULDNT_CONNECT, _COULDNT_RESOLVE) or "connect" in low or "resolve" in low:
            return RelayError(502, "Could not connect to the upstream.", "upstream_error",
                              "upstream_unreachable")
        return RelayError(502, f"The upstream connection failed: {msg[:200]}", "upstream_error",
                          "bad_upstream")
