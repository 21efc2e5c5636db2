"""One attempt at one channel: send the converted request upstream and read
its answer, whole (`attempt_plain`) or as a stream written to the client's
Sink as it comes (`attempt_stream`).  Each returns an Outcome; choosing
channels, retrying and settling are relay/service.py's."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from relay.money import pricing
from relay.adaptors.base import Call
from relay.convert.common import converted
from relay.errors import RelayError
from relay.upstream.client import Cancel

log = logging.getLogger("relay.service")  # the name operators already filter on

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
# A slow reader may hold this much of ours before we stop reading upstream.
MAX_PENDING = 1024 * 1024


class Sink(Protocol):
    started: bool
    closed: bool

    def start(self, status: int, headers: dict) -> None: ...
    def write(self, data: bytes) -> None: ...
    def pending(self) -> int: ...
    async def drain(self) -> None: ...


@dataclass
class Outcome:
    status: int = 200
    usage: pricing.Usage | None = None
    body: dict | None = None        # non-streamed answer, OpenAI-shaped
    raw: bytes | None = None        # non-streamed answer, upstream bytes (pass-through)
    headers: dict | None = None
    error: RelayError | None = None
    channel: object = None
    ttfb: float = 0.0
    streamed_text: str = ""
    started: bool = False
    charged: int = 0                # quota units settled for this call
    # An upstream's refusal before anything reached the client: (status,
    # body, the UpstreamRequest sent), what relay/compat reads it against.
    refusal: tuple | None = None


async def attempt_plain(upstream, call, channel, adaptor, cancel, adjust=None) -> Outcome:
    """`adjust(req)`, when given, returns the request to send instead
    (what the channel was learnt to refuse taken out: relay/compat)."""
    try:
        req = _request_for(adaptor, call, channel, adjust)
    except RelayError as exc:
        return Outcome(error=exc)
    resp = await upstream.send(req.method, req.url, req.headers, req.body,
                                    cancel=cancel, body_producer=req.body_producer)
    out = Outcome(status=resp.status, ttfb=resp.first_byte_at)
    if resp.error is not None:
        out.error = resp.error
        return out
    if resp.status >= 400:
        out.error = adaptor.error(resp.status, resp.body)
        out.refusal = (resp.status, resp.body, req)
        return out
    try:
        doc, out.usage = adaptor.parse(call, resp.body)
    except RelayError as exc:
        # A 200 that refuses the call (Midjourney's reply codes): not billed.
        out.error = exc
        return out
    except (ValueError, KeyError, TypeError) as exc:
        out.error = RelayError(502, f"The upstream sent an answer we could not read: {exc}",
                               "upstream_error", "bad_upstream")
        return out
    out.body = doc
    out.headers = {"Content-Type": resp.header("Content-Type", "application/json")}
    if call.extra["wire"] == call.face:
        # Pass-through: the upstream's bytes, or (a mapped model) the
        # adaptor's copy renamed in place; else the face renders the doc.
        out.raw = resp.body if call.upstream_model == call.model else \
            call.extra.get("native_raw")
    return out

async def attempt_stream(upstream, call, channel, adaptor, sink, face, cancel,
                         adjust=None) -> Outcome:
    try:
        req = _request_for(adaptor, call, channel, adjust)
    except RelayError as exc:
        return Outcome(error=exc)
    s = _Streaming(call, sink, cancel, adaptor.stream(call), face.StreamWriter(call), channel.id)
    sending = upstream.send(req.method, req.url, req.headers, req.body, on_chunk=s.on_chunk,
                            cancel=cancel, on_start=s.on_start if s.named else None,
                            body_producer=req.body_producer)
    # The transfer holds what it sends; a long stream need not keep this as
    # well.  Only a refusal (which comes before any stream) reads it again:
    # the stream lets go of it once it begins.
    s.sent, req = req, None
    # And the parsed body goes now, not when the answer begins: an agent's
    # call waits seconds for its first byte while the upstream reads the
    # prompt, and freed here, just after it was read, it costs a third of
    # what it does once the cache has moved on.  A retry parses it again.
    call.shelve()
    resp = await sending
    out, reader, writer = s.out, s.reader, s.writer
    out.status = resp.status
    out.usage = reader.usage
    if resp.error is None and resp.status >= 400:
        out.error = adaptor.error(resp.status, resp.body)
        if not out.started and s.sent is not None:
            out.refusal = (resp.status, resp.body, s.sent)
    elif resp.error is not None:
        out.error = resp.error
    if out.error is None:
        s.emit(b"".join(writer.write(c) for c in reader.finish()))
        out.usage = reader.usage
        s.emit(writer.finish())
    elif out.started and not sink.closed:
        s.emit(writer.error(out.error.status, out.error.message))
    measure = getattr(reader, "measure", None)
    if measure is not None and out.started:
        # What was delivered, measured off the event loop (speech: the audio's length).
        out.usage = await measure()
    # The text is needed only to estimate a call that lost its usage.
    if out.usage is None:
        out.streamed_text = reader.text
    return out


class _Streaming:
    """One stream's state while it runs: upstream chunks are read, rewritten
    for the client's format and written to the Sink.  One small object
    rather than closures over a coroutine's locals: at 10,000 open streams
    the difference is several megabytes."""

    __slots__ = ("call", "sink", "cancel", "reader", "writer", "channel_id", "out", "t0", "named",
                 "upstream_headers", "sent")

    def __init__(self, call, sink, cancel, reader, writer, channel_id):
        self.call = call
        self.sink = sink
        self.cancel = cancel
        self.reader = reader
        self.writer = writer
        self.channel_id = channel_id
        self.out = Outcome()
        self.t0 = time.monotonic()
        # Only a face whose stream is not SSE (speech audio) names its own
        # headers, from the upstream's.
        self.named = hasattr(writer, "headers")
        self.upstream_headers = None
        self.sent = None

    def on_start(self, _status, headers) -> None:
        self.upstream_headers = headers

    def on_chunk(self, data: bytes) -> None:
        if self.cancel.left:   # read on for the usage only (Cancel.drain)
            self.cancel.read_on(len(data))
        try:
            chunks = self.reader.feed(data)
        except ValueError as exc:
            log.warning("unreadable stream from channel %s: %s", self.channel_id, exc)
            self.cancel.cancelled = True
            return
        write = self.writer.write
        self.emit(b"".join(write(c) for c in chunks))

    def emit(self, data: bytes) -> None:
        sink = self.sink
        if not data or sink.closed:
            return
        if not sink.started:
            sink.start(200, self.writer.headers(self.upstream_headers) if self.named
                       else dict(SSE_HEADERS))
            self.out.started = True
            self.sent = None
            self.out.ttfb = time.monotonic() - self.t0
        sink.write(data)
        cancel = self.cancel
        if sink.pending() > MAX_PENDING and not cancel.paused:
            cancel.pause()
            _drain_then_resume(sink, cancel)


def _request_for(adaptor, call: Call, channel, adjust=None):
    """The upstream request: a client body whose parts have shapes the
    conversion for this channel cannot take is the client's 400, not a 500."""
    req = converted(adaptor.prepare, call, channel)
    return adjust(req) if adjust is not None else req


def _drain_then_resume(sink: Sink, cancel: Cancel) -> None:
    async def run():
        try:
            await sink.drain()
        finally:
            cancel.resume()
    asyncio.get_running_loop().create_task(run())
