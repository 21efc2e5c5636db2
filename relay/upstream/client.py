"""The only code that makes outbound HTTP calls to upstream channels.

It uses Tornado's curl-based AsyncHTTPClient (relay/upstream/curl_client.py):
libcurl keeps connections to each upstream alive and reuses them, and
multiplexes streams over HTTP/2 where the upstream offers it.  Responses
below 400 can be streamed chunk by chunk to a callback as they arrive;
error responses are collected (they are small) so that the caller can map
and possibly retry them.

Each kind of work (plain calls, streams, uploads) passes its own Gate: a
limit on concurrent calls with a bounded wait, so that thousands of open
streams never make a plain call queue behind them.  Streams also have a
client, and so connections, of their own, whose work takes a bounded share
of each loop turn (STREAM_TURN).

New connections are paced per upstream address (relay/upstream/pacer.py):
a call that needs a new connection while its address's window of
connections still connecting is full waits for a place, within its
connect timeout; a connect whose SYN the kernel still sees unanswered long
after connects to that address usually complete (a full accept backlog
dropped it) is given up and made again, having sent nothing.

Three deadlines, none of which costs a Python call per libcurl event:
- the first response byte: checked once a second for all calls (504);
- silence once the answer has begun: no byte for `idle_timeout` (504; a
  transfer we paused is exempt), checked by the same sweep, a bounded slice
  of the open transfers each second.  Not libcurl's low-speed check: that
  re-arms a one-second timer on every transfer each time it runs, so with
  10,000 streams open libcurl ran ten thousand transfers a second from its
  timers, outside STREAM_TURN, and each read its connection's waiting
  chunks for all its streams: loop turns of 40-70 ms (bench/streams.py);
- our own client going away: setting `Cancel.cancelled` aborts the
  transfer on the next loop turn.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import pycurl
from tornado.httputil import HTTPHeaders
from tornado.ioloop import PeriodicCallback

from relay.errors import RelayError
from relay.upstream.cancel import Cancel
from relay.upstream.curl_client import CurlClient
from relay.upstream.failures import ABORTED as _ABORTED
from relay.upstream.failures import COULDNT_CONNECT as _COULDNT_CONNECT
from relay.upstream.failures import TIMEOUT as _TIMEOUT
from relay.upstream.failures import map_error, map_reason
from relay.upstream.gate import Gate, busy
from relay.upstream.pacer import Pacer
from relay.upstream.transfer import SYN_SENT, Transfer

log = logging.getLogger("relay.upstream")

# Seconds of each loop turn the streams' sockets may take (chunks read,
# rewritten and written to their clients); what is left waits for the next
# turn, in the kernel's buffers, after new requests and plain calls.
STREAM_TURN = 0.001
# ... once this many streams are open.  With fewer, a turn's chunks are few,
# and cutting turns short only costs CPU (about a tenth a stream, with
# twenty open under load); at 10,000 the budget halves a plain call's p99.
STREAM_CROWD = 256
# Answering transfers looked at for silence each second, at the least.
SILENCE_SLICE = 2000


class Response:
    """What came back.  `headers` are parsed on first use (most calls read
    one header at most: use `header(name)` for that)."""

    __slots__ = ("status", "_headers", "_source", "body", "streamed", "first_byte_at", "error",
                 "broken")

    def __init__(self, status: int, headers: HTTPHeaders | None = None, body: bytes = b"",
                 streamed: bool = False, first_byte_at: float = 0.0,
                 error: RelayError | None = None, broken: bool = False,
                 source: Transfer | None = None):
        self.status = status
        self._headers = headers
        self._source = source
        self.body = body
        self.streamed = streamed
        self.first_byte_at = first_byte_at
        self.error = error
        # True when the transfer broke after the upstream started answering.
        self.broken = broken

    @property
    def headers(self) -> HTTPHeaders:
        if self._headers is None:
            self._headers = self._source.headers if self._source is not None else HTTPHeaders()
            self._source = None
        return self._headers

    def header(self, name: str, default: str | None = None) -> str | None:
        if self._headers is None and self._source is not None:
            return self._source.header(name, default)
        return self.headers.get(name, default)


class _Watch:
    """The deadlines of one transfer, and why it was stopped."""

    __slots__ = ("first_byte_timeout", "cancel", "t", "started", "reason", "seen", "quiet")

    def __init__(self, first_byte_timeout: float, cancel: Cancel, t: Transfer):
        self.first_byte_timeout = first_byte_timeout
        self.cancel = cancel
        self.t = t
        self.started = 0.0
        self.reason = ""
        self.seen = 0        # bytes received at the last look
        self.quiet = 0.0     # since when no byte has come (or it was paused)


class Upstream:
    def __init__(self, connect_timeout: float = 10.0, first_byte_timeout: float = 120.0,
                 idle_timeout: float = 120.0, max_calls: int = 2000, max_streams: int = 20000,
                 max_uploads: int = 200, queue_wait: float = 10.0, ca_file: str = "",
                 max_body_size: int = 512 * 1024 * 1024, h2_streams: int = 50,
                 connect_window: int = 64):
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.max_body_size = max_body_size
        self.gates = {"call": Gate("call", max_calls, queue_wait),
                      "stream": Gate("stream", max_streams, queue_wait),
                      "upload": Gate("upload", max_uploads, queue_wait)}
        # New connections are paced per upstream address (relay/upstream/pacer.py):
        # both clients open connections to the same backlogs.
        self.pacer = Pacer(max_window=connect_window)
        self._waiting: set[_Watch] = set()   # calls yet to see their first byte
        self._answering: set[_Watch] = set()  # calls whose answer has begun
        self._to_look: list[_Watch] = []      # what this round of silence checks has left
        self._sweeper: PeriodicCallback | None = None
        self._dialer: PeriodicCallback | None = None
        # force_instance: our pools are ours alone, whatever else in the
        # process uses AsyncHTTPClient (e.g. notification webhooks).
        # Streams have connections of their own: a plain call multiplexed
        # onto an HTTP/2 connection with fifty streams waited for the loop
        # to get through their chunks before its answer was read, and the
        # streams' share of each loop turn is bounded (STREAM_TURN).
        self.client = CurlClient(force_instance=True, max_body_size=max_body_size,
                                 ca_file=ca_file, h2_streams=h2_streams)
        self.streams = CurlClient(force_instance=True, max_body_size=max_body_size,
                                  ca_file=ca_file, h2_streams=h2_streams,
                                  turn_budget=STREAM_TURN, budget_from=STREAM_CROWD)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
        if self._dialer is not None:
            self._dialer.stop()
        self.client.close()
        self.streams.close()

    async def send(self, method: str, url: str, headers: dict, body: bytes | None = None, *,
                   on_start: Callable[[int, HTTPHeaders], None] | None = None,
                   on_chunk: Callable[[bytes], None] | None = None,
                   cancel: Cancel | None = None,
                   first_byte_timeout: float | None = None,
                   body_producer=None) -> Response:
        """Make one call.  Never raises for HTTP or network failures: the
        returned Response carries `error` (a RelayError with our status).

        Its kind (upload, stream, plain call) decides which gate it passes;
        one that finds its kind full for the gate's whole wait gets 503
        with a Retry-After."""
        kind = "upload" if body_producer is not None else "stream" if on_chunk else "call"
        gate = self.gates[kind]
        if not gate.try_enter() and not await gate.enter():
            return Response(0, HTTPHeaders(), error=busy(kind, gate))
        try:
            t = self._transfer(method, url, headers, body, on_start, on_chunk,
                               cancel or Cancel(), first_byte_timeout, body_producer)
            if isinstance(t, Response):
                return t
            t0 = time.monotonic()
            t.watch.started = t0
            errnum, message = await self._run(t, self.streams if kind == "stream" else self.client,
                                              t0)
        finally:
            gate.leave()
        try:
            return self._response(t, errnum, message, t0)
        finally:
            # Break the transfer <-> watch cycle and drop the callbacks, so
            # that a finished call is freed by reference counting: a stream
            # left to the cyclic collector costs it a full pass at scale.
            t.release()

    async def _run(self, t: Transfer, client: CurlClient, t0: float) -> tuple[int, str]:
        """Run the transfer; a connect that sent nothing (refused a place
        in its address's window, or timed out connecting) waits for a
        place and is made again, within the call's connect timeout."""
        watch = t.watch
        pacer = self.pacer
        origin = t.origin = pacer.origin(t.url)
        t.pacer = pacer
        deadline = t0 + self.connect_timeout
        if self._dialer is None:
            self._dialer = PeriodicCallback(self._look_at_dialing, 100)
            self._dialer.start()
        while True:
            t.connect_timeout = deadline - time.monotonic()
            client.start(t)
            watch.cancel._transfer = t
            if watch.cancel.cancelled:  # our client left while we queued
                t.client.abort(t)
            self._waiting.add(watch)
            if self._sweeper is None:
                self._sweeper = PeriodicCallback(self._sweep, 1000)
                self._sweeper.start()
            try:
                errnum, message = await t.done
            finally:
                # libcurl handles are pooled: never touch this one again.
                watch.cancel._transfer = None
                self._waiting.discard(watch)
                self._answering.discard(watch)
            if t.connected or watch.reason or watch.cancel.cancelled:
                return errnum, message
            if errnum == _ABORTED and t.dropped:
                t.drops += 1
            elif errnum != _COULDNT_CONNECT or not t.paced:
                return errnum, message
            left = deadline - time.monotonic()
            if left < 0.001:
                return _TIMEOUT, "connect timed out"
            if pacer.full(origin):
                watch.reason = "crowded"
                return _ABORTED, "too many connections waiting to open"
            if not await pacer.wait(origin, left):
                return _TIMEOUT, "connect timed out waiting for a place to connect"
            t.slot = True
            t.again()
            if watch.cancel.cancelled:
                t.let_go(False)
                return _ABORTED, "cancelled"

    def _look_at_dialing(self) -> None:
        """Ten times a second: a connect whose SYN has gone unanswered for
        far longer than connects to its address take was dropped by a full
        accept queue; it is given up and made again at once (it sent
        nothing), not when the kernel resends it (1 s, then 3 s, 7 s), and
        its address's window halves.  Connects the kernel completed but the
        loop has not got to yet are left alone."""
        now = time.monotonic()
        for origin in self.pacer.origins.values():
            for t in list(origin.dialing):
                state = t.tcp_state()
                if state != SYN_SENT:
                    t.if_established()
                elif t.curl is not None and now - t.opened > origin.attempt_timeout(t.drops):
                    t.dropped = True
                    t.client.abort(t)

    def _sweep(self) -> None:
        """Once a second: stop calls whose upstream has not begun to answer
        within their first-byte timeout, and look at a slice of those
        answering for silence.  (A timer per call costs more than the rest
        of the call's upstream side together.)"""
        now = time.monotonic()
        for watch in list(self._waiting):
            t = watch.t
            if t.curl is None:
                self._waiting.discard(watch)
            elif t.final or t.last_data:  # answering: silence is timed from now
                self._waiting.discard(watch)
                watch.seen, watch.quiet = t.size, now
                self._answering.add(watch)
            elif now - watch.started > watch.first_byte_timeout:
                # (an upload still coming in keeps moving `started` on)
                self._waiting.discard(watch)
                watch.reason = "first_byte"
                t.client.abort(t)
        self._look_for_silence(now)

    def _look_for_silence(self, now: float) -> None:
        # All of them each second up to SILENCE_SLICE; beyond, an eighth a
        # second, so that no turn of the loop walks ten thousand of them.
        todo = self._to_look
        if not todo:
            todo = self._to_look = list(self._answering)
        n = max(SILENCE_SLICE, len(self._answering) // 8 + 1)
        batch = todo[-n:]
        del todo[-n:]
        idle, answering = self.idle_timeout, self._answering
        for watch in batch:
            t = watch.t
            if watch not in answering or t.curl is None:
                continue
            if t.size != watch.seen or watch.cancel.paused:
                watch.seen, watch.quiet = t.size, now
            elif now - max(watch.quiet, watch.cancel.resumed) > idle:
                answering.discard(watch)
                watch.reason = "idle"
                t.client.abort(t)

    def _transfer(self, method, url, headers, body, on_start, on_chunk, cancel,
                  first_byte_timeout, body_producer) -> Transfer | Response:
        lines = [b"Expect:", b"Pragma:"]
        for k, v in headers.items():
            line = f"{k}: {v}".encode("latin1")
            if b"\r" in line or b"\n" in line:
                return Response(0, HTTPHeaders(), error=RelayError(
                    502, f"A header for the upstream holds a line break: {k}", "upstream_error",
                    "bad_upstream"))
            lines.append(line)
        t = Transfer(method, url, lines, body)
        t.on_start = on_start
        t.on_chunk = on_chunk
        t.connect_timeout = self.connect_timeout
        t.max_body = self.max_body_size
        watch = _Watch(first_byte_timeout or self.first_byte_timeout, cancel, t)
        t.watch = watch
        if body_producer is not None:
            if body_producer.length is None:
                lines.append(b"Transfer-Encoding: chunked")
            t.producer = self._stream_upload(t, body_producer, watch)
        return t

    def _response(self, t: Transfer, errnum: int, message: str, t0: float) -> Response:
        watch, cancel, on_chunk = t.watch, t.watch.cancel, t.on_chunk
        t.begin()
        status = t.status
        first = (t.last_data - t0) if t.last_data else 0.0
        if watch.reason or errnum == _ABORTED and cancel.cancelled:
            return Response(status, None, b"", streamed=t.started, source=t,
                            error=map_reason(watch.reason or "cancelled"),
                            broken=t.started)
        if errnum:
            return Response(status, None, b"".join(t.chunks)[:1024 * 1024],
                            streamed=t.started, source=t, error=map_error(errnum, message, status),
                            broken=t.started)
        body = b"".join(t.chunks)
        if status >= 400:
            body = body[:1024 * 1024]  # error bodies are small
        resp = Response(status, None, body, streamed=status < 400 and on_chunk is not None,
                        first_byte_at=first, source=t)
        if status == 599 or status == 0:
            resp.error = RelayError(502, "The upstream closed the connection without answering.",
                                    "upstream_error", "bad_upstream")
        return resp

    def _stream_upload(self, t: Transfer, producer, watch: "_Watch"):
        """Feed the request body from `producer` as its bytes arrive.

        libcurl's read callback hands it what the producer has, pauses the
        upload when the producer has nothing yet, and is woken by the
        producer when more arrives.  The producer (relay/upstream/upload.py) has:
        `length` (int, or None for chunked), `start(wake)` (called once per
        attempt; a retry starts again from the first byte), `read(n)` (bytes,
        b"" at the end, None when nothing is there yet) and `aborted`.
        """
        state = {"paused": False}
        cancel = watch.cancel

        def wake() -> None:
            curl = t.curl
            if state["paused"] and curl is not None:
                state["paused"] = False
                try:
                    curl.pause(pycurl.PAUSE_RECV if cancel.paused else pycurl.PAUSE_CONT)
                except pycurl.error:
                    return
                t.client._set_timeout(0)

        def read(size: int):
            if producer.aborted or cancel.cancelled:
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
        t.upload_size = producer.length if producer.length is not None else -1
        return read
