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

from relay import pricing
from relay.adaptors.base import Call
from relay.convert.common import converted
from relay.errors import RelayError
from relay.upstream import Cancel

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


async def attempt_plain(upstream, call, channel, adaptor, cancel) -> Outcome:
    try:
        req = _request_for(adaptor, call, channel)
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

async def attempt_stream(upstream, call, channel, adaptor, sink, face, cancel) -> Outcome:
    try:
        req = _request_for(adaptor, call, channel)
    except RelayError as exc:
        return Outcome(error=exc)
    reader = adaptor.stream(call)
    writer = face.StreamWriter(call)
    out = Outcome()
    t0 = time.monotonic()
    upstream_headers = {}

    def emit(data: bytes) -> None:
        if not data or sink.closed:
            return
        if not sink.started:
            # A face whose stream is not SSE (speech audio) names its own
            # headers from the upstream's.
            sink.start(200, writer.headers(upstream_headers.get("h"))
                       if hasattr(writer, "headers") else dict(SSE_HEADERS))
            out.started = True
            out.ttfb = time.monotonic() - t0
        sink.write(data)
        if sink.pending() > MAX_PENDING and not cancel.paused:
            cancel.pause()
            _drain_then_resume(sink, cancel)

    def on_chunk(data: bytes) -> None:
        try:
            chunks = reader.feed(data)
        except ValueError as exc:
            log.warning("unreadable stream from channel %s: %s", channel.id, exc)
            cancel.cancelled = True
            return
        emit(b"".join(writer.write(c) for c in chunks))

    # Only a face that names its own headers needs the upstream's parsed.
    on_start = ((lambda _s, h: upstream_headers.update(h=h)) if hasattr(writer, "headers")
                else None)
    resp = await upstream.send(req.method, req.url, req.headers, req.body,
                                    on_chunk=on_chunk, cancel=cancel, on_start=on_start,
                                    body_producer=req.body_producer)
    out.status = resp.status
    out.usage = reader.usage
    if resp.error is None and resp.status >= 400:
        out.error = adaptor.error(resp.status, resp.body)
    elif resp.error is not None:
        out.error = resp.error
    if out.error is None:
        emit(b"".join(writer.write(c) for c in reader.finish()))
        out.usage = reader.usage
        emit(writer.finish())
    elif out.started and not sink.closed:
        emit(writer.error(out.error.status, out.error.message))
    # The text is needed only to estimate a call that lost its usage.
    if out.usage is None:
        out.streamed_text = reader.text
    return out


def _request_for(adaptor, call: Call, channel):
    """The upstream request: a client body whose parts have shapes the
    conversion for this channel cannot take is the client's 400, not a 500."""
    return converted(adaptor.prepare, call, channel)


def _drain_then_resume(sink: Sink, cancel: Cancel) -> None:
    async def run():
        try:
            await sink.drain()
        finally:
            cancel.resume()
    asyncio.get_running_loop().create_task(run())
