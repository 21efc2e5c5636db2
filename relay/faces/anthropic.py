"""The Anthropic face: Messages-format clients (the anthropic SDKs, coding
agents) calling POST /v1/messages, answered in Anthropic's format whatever
the channel speaks.

Like the OpenAI face: `parse_messages` builds a Call in canonical OpenAI
shape (keeping the client's own body for pass-through), `StreamWriter`
writes Anthropic events, `render` converts a whole answer.
"""
from __future__ import annotations

import json

from relay.serving import redact, sse
from relay.money import tokenizer
from relay.adaptors.base import Call, Chunk
from relay.convert import anthropic as conv
from relay.convert.anthropic_stream import ChunksToEvents
from relay.convert.common import converted, renamed, sse_payload
from relay.errors import _ANTHROPIC_TYPE
from relay.faces.openai import load_json, load_passing, require_model

FAMILY = "anthropic"


def _client_query(query: str) -> str:
    """The query to pass on to an Anthropic upstream (`beta=true`): as the
    client sent it, less any credential (a relay key given as ?key=)."""
    return redact.strip_credentials(query)


def _call(request_id: str, raw: bytes, doc: dict, headers, query: str, refs: int,
          body: dict | None = None) -> Call:
    """The Call for a Messages body; its canonical (OpenAI-shaped) body is
    made only if something reads it (Call.canonical): an Anthropic channel
    is sent the client's bytes.  What the reservation reads is noted here
    from the native body instead (relay/bounds.py)."""
    call = Call(request_id=request_id, endpoint="chat", face=FAMILY, model=doc["model"],
                body=body, raw=raw, native_body=doc, stream=bool(doc.get("stream")),
                canonical=None if body is not None else _canonical)
    # Passed on untouched to an Anthropic channel; dropped for any other.
    for name in ("anthropic-version", "anthropic-beta"):
        if headers and headers.get(name):
            call.extra[name.replace("-", "_")] = headers.get(name)
    call.extra["anthropic_query"] = _client_query(query)
    call.extra["references"] = refs  # counted by validate() (relay/bounds.py reads it)
    call.extra["output_asked"] = doc.get("max_tokens")
    return call


def _canonical(doc: dict) -> dict:
    return converted(conv.request_to_openai, doc)


def parse_messages(request_id: str, raw: bytes, headers=None, query: str = "") -> Call:
    """POST /v1/messages -> Call.  `headers` (a mapping) and `query` are the
    client's, for pass-through.  Raises RelayError(400) on a bad body."""
    doc, sent = load_passing(raw)
    require_model(doc)
    call = _call(request_id, sent, doc, headers, query, conv.validate(doc))
    call.derive = load_json
    return call


def parse_count_tokens(request_id: str, raw: bytes, headers=None, query: str = "") -> Call:
    """POST /v1/messages/count_tokens -> Call (max_tokens is not required
    here).  Raises RelayError(400) on a bad body."""
    doc, sent = load_passing(raw)
    require_model(doc)
    refs = conv.validate(dict(doc, max_tokens=1))
    return _call(request_id, sent, doc, headers, query, refs,
                 body=converted(conv.request_to_openai, dict(doc, max_tokens=1)))


def estimate_tokens(call: Call) -> int:
    """Our offline count of a call's input tokens."""
    return tokenizer.count_messages(call.body["messages"], call.model, call.body.get("tools"))


def rename_start(raw: bytes, old: str, new: str) -> bytes:
    """A message_start event naming the public model, byte for byte else."""
    out = renamed(raw, old, new,
                  lambda b: json.loads(sse_payload(b))["message"]["model"] == new)
    if out is not None:
        return out
    doc = json.loads(sse_payload(raw))
    doc.get("message", {})["model"] = new
    return sse.encode(doc, "message_start")


class StreamWriter:
    """OpenAI chunks -> Anthropic SSE events; an Anthropic upstream's own
    events (chunk.raw) are written untouched."""

    def __init__(self, call: Call):
        self.call = call
        self.conv = ChunksToEvents(call.model, int(call.extra.get("prompt_tokens", 0)))
        self.passthrough = False

    def write(self, chunk: Chunk) -> bytes:
        if chunk.raw is not None:
            self.passthrough = True
            if self.call.upstream_model != self.call.model and \
                    chunk.raw.startswith(b"event: message_start"):
                # The model name is the one thing renamed on the way back.
                return rename_start(chunk.raw, self.call.upstream_model, self.call.model)
            return chunk.raw
        if chunk.data is None or self.passthrough:
            return b""
        return b"".join(sse.encode(d, name) for name, d in self.conv.feed(chunk.data))

    def finish(self) -> bytes:
        if self.passthrough:
            return b""
        return b"".join(sse.encode(d, name) for name, d in self.conv.finish())

    def error(self, status: int, message: str) -> bytes:
        """An error after the stream began travels as Anthropic's `error` event."""
        return sse.encode({"type": "error", "error": {
            "type": _ANTHROPIC_TYPE.get(status, "api_error"), "message": message}}, "error")


def render(call: Call, doc: dict) -> dict:
    """The whole answer: an Anthropic upstream's own message (renamed to the
    public model), else the OpenAI-shaped one converted."""
    native = call.extra.get("native_answer")
    if isinstance(native, dict):
        return dict(native, model=call.model)
    return conv.message_from_openai(doc, call.model)
