"""Server-sent events: an incremental parser and a writer.

The parser is fed raw upstream chunks as they arrive (chunk boundaries fall
anywhere, even inside a UTF-8 sequence or a CRLF) and yields complete events.
Its buffer holds at most one unfinished event, bounded by `max_event`.
"""
from __future__ import annotations

import json
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


class SSEParser:
    def __init__(self, max_event: int = 16 * 1024 * 1024):
        self._buf = b""
        self.max_event = max_event

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buf += chunk
        while True:
            idx, sep = _find_boundary(self._buf)
            if idx < 0:
                if len(self._buf) > self.max_event:
                    raise ValueError("server-sent event larger than the limit")
                return
            raw, self._buf = self._buf[:idx], self._buf[idx + sep:]
            ev = _parse_block(raw)
            if ev is not None:
                yield ev

    def flush(self) -> Iterator[Event]:
        """Events left when the stream ends without a final blank line."""
        raw, self._buf = self._buf, b""
        if raw.strip():
            ev = _parse_block(raw)
            if ev is not None:
                yield ev


def _find_boundary(buf: bytes) -> tuple[int, int]:
    best, size = -1, 0
    for sep in (b"\r\n\r\n", b"\n\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best < 0 or i < best):
            best, size = i, len(sep)
    return best, size


def _parse_block(raw: bytes) -> Event | None:
    data, event, ident = [], "", ""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            ident = value
    if not data and not event:
        return None
    return Event("\n".join(data), event, ident)


def encode(data: Any, event: str | None = None) -> bytes:
    """One event on the wire; dicts are JSON-encoded compactly."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    # The frame is a new bytes of its own size: the JSON need not be copied first.
    return head + b"data: " + (data.encode() if isinstance(data, str)
                               else jsonin.dumps(data, held=False)) + b"\n\n"


DONE = b"data: [DONE]\n\n"
