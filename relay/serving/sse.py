"""Server-sent events: an incremental parser and a writer.

The parser is fed raw upstream chunks as they arrive (chunk boundaries fall
anywhere, even inside a UTF-8 sequence or a CRLF) and yields complete events.
Its buffer holds at most one unfinished event, bounded by `max_event`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterator

from relay.serving import jsonin


@dataclass
class Event:
    data: str
    event: str = ""
    id: str = ""

    def json(self) -> Any:
        return json.loads(self.data)


class Splitter:
    """Finds where each event ends in a growing byte stream, scanning every
    byte once: each separator's next place is remembered (or that it is
    absent up to the end scanned so far), so a stream whose events echo 30
    KB of instructions and tools, or a chunk holding a hundred small events,
    costs its own length and not that times the number of events.  The
    buffer is compacted once a feed, not once an event."""

    SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")

    def __init__(self, max_event: int = 16 * 1024 * 1024):
        self.buf = bytearray()
        self.pos = 0  # start of the first event not yet taken
        self.max_event = max_event
        # per separator: its next index at or after pos, or -(end scanned + 1)
        self._next = [-1] * len(self.SEPARATORS)
        # Until a CR arrives only LF LF can end an event: one search, not three.
        self._cr = False

    def feed(self, chunk: bytes) -> None:
        pos = self.pos
        if pos:
            del self.buf[:pos]
            self.pos = 0
            if self._cr:
                self._next = [_moved(n, pos) for n in self._next]
            else:  # only LF LF's place is kept until a CR arrives
                self._next[1] = _moved(self._next[1], pos)
        if not self._cr and b"\r" in chunk:
            self._cr = True
        self.buf += chunk

    def take(self) -> tuple[int, int] | None:
        """(end of the event's text, end past its blank line) of the next
        complete event, relative to `pos`, and moves past it; None when no
        event is complete yet."""
        if not self._cr:
            buf, pos = self.buf, self.pos
            n = self._next[1]
            if n < pos:
                n = buf.find(b"\n\n", max(pos, -n - 2) if n < 0 else pos)
                if n < 0:
                    self._next[1] = -(len(buf) + 1)
                    if len(buf) - pos > self.max_event:
                        raise ValueError("server-sent event larger than the limit")
                    return None
            self.pos = n + 2
            return n - pos, n + 2 - pos
        best, size = -1, 0
        buf, pos = self.buf, self.pos
        for k, sep in enumerate(self.SEPARATORS):
            n = self._next[k]
            if n < pos:
                # absent up to -(n + 1): look again from a little before that
                start = max(pos, -n - 1 - len(sep) + 1) if n < 0 else pos
                n = buf.find(sep, start)
                self._next[k] = n if n >= 0 else -(len(buf) + 1)
            if n >= 0 and (best < 0 or n < best):
                best, size = n, len(sep)
        if best < 0:
            if len(buf) - pos > self.max_event:
                raise ValueError("server-sent event larger than the limit")
            return None
        self.pos = best + size
        return best - pos, best + size - pos

    def whole(self, chunk: bytes) -> bool:
        """Whether `chunk` can be taken as one event without the buffer:
        nothing is held, and its one separator is its end (an upstream
        flushes events one at a time, so most chunks are such)."""
        return self.pos == len(self.buf) and _one_event(chunk)

    def rest(self) -> bytes:
        out = bytes(memoryview(self.buf)[self.pos:])
        self.buf, self.pos, self._next = bytearray(), 0, [-1] * len(self.SEPARATORS)
        self._cr = False
        return out


def _one_event(data: bytes) -> bool:
    """Whether a chunk is exactly one whole event: its one separator (LF LF,
    or CR LF CR LF for Gemini) is its end."""
    if b"\r" not in data:
        return len(data) >= 2 and data.find(b"\n\n") == len(data) - 2
    return (len(data) >= 4 and data.find(b"\r\n\r\n") == len(data) - 4
            and b"\n\n" not in data and b"\r\r" not in data)


def _moved(n: int, pos: int) -> int:
    """A separator's remembered place once the buffer's first `pos` bytes
    are dropped."""
    return n - pos if n >= pos else -1 if n >= 0 else min(-1, n + pos)


class SSEParser:
    def __init__(self, max_event: int = 16 * 1024 * 1024):
        self._split = Splitter(max_event)

    @property
    def max_event(self) -> int:
        return self._split.max_event

    @max_event.setter
    def max_event(self, value: int) -> None:
        self._split.max_event = value

    def feed(self, chunk: bytes) -> Iterator[Event]:
        sp = self._split
        if sp.whole(chunk):
            ev = parse_block(chunk)
            if ev is not None:
                yield ev
            return
        sp.feed(chunk)
        while True:
            start = sp.pos
            got = sp.take()
            if got is None:
                return
            # With its blank line, as parse_block reads the usual frames fastest.
            ev = parse_block(bytes(memoryview(sp.buf)[start:start + got[1]]))
            if ev is not None:
                yield ev

    def flush(self) -> Iterator[Event]:
        """Events left when the stream ends without a final blank line."""
        raw = self._split.rest()
        if raw.strip():
            ev = parse_block(raw)
            if ev is not None:
                yield ev


_EOL = re.compile(rb"\r\n|\r|\n")


def parse_block(raw: bytes) -> Event | None:
    """One event from its bytes (its blank line may follow); None for a
    block of comments only (a keepalive).  Lines end at CR LF, LF or CR
    and nowhere else: models write U+2028 and U+0085 raw inside JSON
    strings, where str.splitlines() ended the line and cut the data.
    Read as bytes, and each value decoded once."""
    cr = b"\r" in raw
    if not cr:
        # The frames upstreams write, `event: <name>\ndata: <json>\n\n` and
        # `data: <json>\n\n`, read without the loop below.
        end = raw.find(b"\n")
        if raw.startswith(b"data: ") and end == len(raw) - 2 and raw[-1] == 10:
            return Event(raw[6:end].decode("utf-8", "replace"))
        if raw.startswith(b"event: ") and raw.startswith(b"data: ", end + 1):
            last = raw.find(b"\n", end + 1)
            if last == len(raw) - 2 and raw[-1] == 10:
                return Event(raw[end + 7:last].decode("utf-8", "replace"),
                             raw[7:end].decode("utf-8", "replace"))
    data, event, ident = [], b"", b""
    for line in (_EOL.split(raw) if cr else raw.split(b"\n")):
        if not line or line[0] == 58:  # a blank line, or a comment (":")
            continue
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
        elif name == b"id":
            ident = value
    if not data and not event:
        return None
    return Event((data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace"),
                 event.decode("utf-8", "replace"), ident.decode("utf-8", "replace"))


def encode(data: Any, event: str | None = None) -> bytes:
    """One event on the wire; dicts are JSON-encoded compactly."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    # The frame is a new bytes of its own size: the JSON need not be copied first.
    return head + b"data: " + (data.encode() if isinstance(data, str)
                               else jsonin.dumps(data, held=False)) + b"\n\n"


DONE = b"data: [DONE]\n\n"
