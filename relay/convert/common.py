"""Small helpers shared by the format converters."""
from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Callable

from relay.serving import jsonin, sse
from relay.errors import bad_request


class _RandomBytes:
    """os.urandom's bytes, read 4 KB at a time: converting an agent's
    history makes an id for every tool call that came without one, and a
    system call each was 5% of such a call's CPU.  Bytes are never handed
    out twice (a lock: ids may be made off the event loop too)."""

    def __init__(self, size: int = 4096):
        self._size = size
        self._buf = b""
        self._at = 0
        self._lock = threading.Lock()

    def hex(self, n: int) -> str:
        with self._lock:
            if self._at + n > len(self._buf):
                self._buf, self._at = os.urandom(self._size), 0
            at = self._at
            self._at = at + n
            return self._buf[at:at + n].hex()


_random = _RandomBytes()


def new_id(prefix: str) -> str:
    """prefix + 24 random hex digits (96 bits, as secrets.token_hex(12))."""
    return prefix + _random.hex(12)


def chunk(cid: str, model: str, delta: dict | None = None, finish: str | None = None,
          created: int | None = None) -> dict:
    """One OpenAI chat.completion.chunk with a single choice."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created or int(time.time()),
            "model": model, "choices": [{"index": 0, "delta": delta or {},
                                         "finish_reason": finish}]}


def usage_chunk(cid: str, model: str, usage: dict, created: int | None = None) -> dict:
    """The trailing OpenAI chunk that carries only usage (choices empty)."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created or int(time.time()),
            "model": model, "choices": [], "usage": usage}


def error_chunk(message: str, type_: str = "upstream_error", code=None) -> dict:
    """An error in the middle of a stream, as OpenAI itself sends one (a
    chunk with an `error` object); each face's writer renders it in its own
    format and ends the stream there."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def openai_usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def text_of(content: Any) -> str:
    """The plain text of OpenAI message content (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") in ("text", "input_text"))
    return str(content)


def parse_args(arguments: Any) -> Any:
    """Tool-call arguments as an object; OpenAI sends a JSON string that may be
    empty or (from weak models) not JSON at all."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    if not isinstance(arguments, (str, bytes, bytearray)):
        return {"_raw": str(arguments)}
    try:
        if isinstance(arguments, str) and not _may_be_json(arguments):
            # a tool's output is mostly text (code, logs): json would fail,
            # after building an error to say where
            raise ValueError
        value = jsonin.loads_answer(arguments)
    except ValueError:
        return {"_raw": str(arguments)}
    return value if isinstance(value, dict) else {"value": value}


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_BY_FIRST = {"{": "}", "[": "]", '"': '"'}


def _may_be_json(text: str) -> bool:
    """False for a text the json module surely refuses: one that cannot be
    a JSON value by its ends (NaN and Infinity count as json reads them).
    str.strip() takes more than JSON's whitespace, but a value wrapped in
    any other space is one json refuses too."""
    s = text.strip()
    if len(s) < 2:
        return s.isdigit()
    end = _BY_FIRST.get(s[0])
    if end is not None:
        return s[-1] == end
    if s[0] in "-0123456789":
        return s == "-Infinity" or _NUMBER.fullmatch(s) is not None
    return s in ("true", "false", "null", "NaN", "Infinity")


# The canonical (OpenAI chat) reasoning efforts.  Vendors' own scales map
# onto these: Anthropic's output_config.effort (xhigh and max are "high"
# here), thinking budgets in tokens (Anthropic, Gemini 2.5), Gemini 3's
# thinkingLevel.
EFFORTS = ("minimal", "low", "medium", "high")
_EFFORT_ALIASES = {"none": "minimal", "xhigh": "high", "max": "high"}


def canonical_effort(value: Any) -> str | None:
    """A reasoning effort from any vendor's scale -> one of EFFORTS, or None."""
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    value = _EFFORT_ALIASES.get(value, value)
    return value if value in EFFORTS else None


def effort_from_budget(budget: Any) -> str | None:
    """A thinking budget in tokens -> a canonical effort.  The thresholds
    sit between the budgets the converters send for each effort, so an
    effort survives a round trip through a budget.  None for no number or
    Gemini's -1 (dynamic: the model decides)."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        return None
    if budget < 1024:  # Anthropic's smallest budget; Gemini's 0 turns thinking off
        return "minimal"
    if budget < 2048:
        return "low"
    if budget <= 8192:
        return "medium"
    return "high"


def split_data_url(url: str) -> tuple[str, str] | None:
    """'data:image/png;base64,AAAA' -> ('image/png', 'AAAA'); None if not one."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return (head or "application/octet-stream"), data


def dumps(doc: Any) -> str:
    """Compact JSON text, for a value that travels inside a string (tool
    arguments, a tool's output): orjson's, as every body we write; an
    agent's history holds a thousand of them."""
    return jsonin.dumps(doc, held=False).decode()


def renamed(raw: bytes, old: str, new: str,
            check: Callable[[bytes], bool] | None) -> bytes | None:
    """`raw` with its first `"model": "<old>"` member naming `new` instead
    and every other byte as the upstream sent it (pass-through renames
    nothing else).  `check(result)` confirms the member was the right one
    when a glance cannot tell it is the outermost object's; None when it
    was not, or there is none, or there is no check: the caller
    re-encodes."""
    m = _member(old).search(raw)
    if m is None:
        return None
    if _top_level_at(raw, m.start(2)):
        # The body's own member: no need to parse 100 KB to be sure.
        return _spliced(raw, m, new)
    if check is None:
        return None
    out = _spliced(raw, m, new)
    try:
        return out if check(out) else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


# Model names every JSON encoder writes as they are: no quote, backslash,
# control or non-ASCII character, and none of what some escape (Go: < > &;
# PHP: / unless told otherwise, which a body without "\/" was not).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._:@+/-]+")


def renamed_member(raw: bytes, old: str, new: str) -> bytes | None:
    """`raw` with its one `"model": "<old>"` member naming `new` instead,
    when the document (whose parse named `old` somewhere) holds exactly one:
    a name written plainly appears so wherever the encoder wrote it, and a
    member cannot be inside a string (its quotes would be escaped).  None
    when there are none or several, or the name may have been escaped: the
    caller re-encodes.  For events that echo a request (Responses lifecycle
    events carry its instructions and tools): no second parse, no
    re-encoding of 30 KB."""
    if not _PLAIN_NAME.fullmatch(old) or ("/" in old and b"\\/" in raw):
        return None
    pattern = _member(old)
    m = pattern.search(raw)
    if m is None or pattern.search(raw, m.end()) is not None:
        return None
    return _spliced(raw, m, new)


def _member(name: str) -> re.Pattern:
    """A `"model": "<name>"` member: the key after the `{` or `,` that opens
    it, so that the bytes standing inside a key that ends in an escaped
    quote and `model` (`"a\\"model": ...`) are not taken for one: renamed
    there, the upstream would run the client's model name, billed as the
    mapped one's."""
    return re.compile(rb'([{,]\s*)("model"\s*:\s*)' + re.escape(json.dumps(name).encode()))


def _spliced(raw: bytes, m: re.Match, new: str) -> bytes:
    """raw with the value of the member _member() found naming `new`."""
    return raw[:m.start(2)] + m.group(2) + json.dumps(new).encode() + raw[m.end():]


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _top_level_at(raw: bytes, i: int) -> bool:
    """Whether raw[i] stands directly inside the outermost object (a cheap
    look at what precedes it; the body's "model" leads in what every SDK
    writes).  False when unsure, long or not: the caller then checks."""
    head = raw[:i]
    if len(head) > 4096 or not head.lstrip().startswith(b"{"):
        return False
    bare = _STRING.sub(b"", head)
    return (bare.count(b"{") + bare.count(b"[") - bare.count(b"}") - bare.count(b"]")) == 1


def sse_payload(raw: bytes) -> bytes:
    """The data of one event's bytes, its data lines joined."""
    out = []
    for ln in raw.split(b"\n"):
        ln = ln.rstrip(b"\r")
        if ln.startswith(b"data:"):
            ln = ln[5:]
            out.append(ln[1:] if ln.startswith(b" ") else ln)
    return b"\n".join(out)


class RawEvents:
    """Splits a byte stream into server-sent events like sse.SSEParser, but
    keeps each event's exact bytes, so that a pass-through stream reaches
    the client byte for byte (framing, spacing, CRLFs and all)."""

    def __init__(self, max_event: int = 16 * 1024 * 1024):
        self._split = sse.Splitter(max_event)

    def feed(self, data: bytes) -> list[tuple[bytes, "sse.Event | None"]]:
        """Complete events so far as (exact bytes, parsed event); comment-only
        blocks (keepalives) come back with their bytes and event None."""
        sp = self._split
        if sp.whole(data):  # its bytes are the event's
            return [(data, sse.parse_block(data))]
        sp.feed(data)
        out = []
        while True:
            start = sp.pos
            got = sp.take()
            if got is None:
                return out
            raw = bytes(memoryview(sp.buf)[start:start + got[1]])
            out.append((raw, sse.parse_block(raw)))

    def flush(self) -> list[tuple[bytes, "sse.Event | None"]]:
        """What is left when the stream ends without a final blank line."""
        raw = self._split.rest()
        return [(raw, sse.parse_block(raw))] if raw.strip() else []


def unreadable_is_value_error(fn, *args):
    """Run a stream conversion step; an event of an unexpected shape becomes
    the ValueError that StreamReader.feed documents for unreadable streams."""
    try:
        return fn(*args)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"unreadable upstream event: {type(exc).__name__}: {exc}") from None


def converted(fn, *args):
    """Run a request conversion; a body whose parts have the wrong shapes
    (the validators check only the frame) is the caller's 400, not our 500."""
    try:
        return fn(*args)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise bad_request(f"The request body is malformed: {type(exc).__name__}: {exc}",
                          "invalid_request") from None
