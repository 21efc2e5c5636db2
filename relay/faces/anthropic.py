"""The Anthropic face: Messages-format clients (the anthropic SDKs, coding
agents) calling POST /v1/messages, answered in Anthropic's format whatever
the channel speaks.

Like the OpenAI face: `parse_messages` builds a Call in canonical OpenAI
shape (keeping the client's own body for pass-through), `StreamWriter`
writes Anthropic events, `render` converts a whole answer.
"""
from __future__ import annotations

import json

from relay import sse, tokenizer
from relay.adaptors.base import Call, Chunk
from relay.convert import anthropic as conv
from relay.convert.anthropic_stream import ChunksToEvents
from relay.convert.common import converted, sse_payload
from relay.errors import _ANTHROPIC_TYPE
from relay.faces.openai import load_json, require_model

FAMILY = "anthropic"


def parse_messages(request_id: str, raw: bytes, beta: str | None = None) -> Call:
    """POST /v1/messages -> Call.  Raises RelayError(400) on a bad body."""
    doc = load_json(raw)
    model = require_model(doc)
    conv.validate(doc)
    body = converted(conv.request_to_openai, doc)
    call = Call(request_id=request_id, endpoint="chat", face=FAMILY, model=model, body=body,
                raw=raw, native_body=doc, stream=bool(doc.get("stream")))
    if beta:
        call.extra["anthropic_beta"] = beta
    return call


def count_tokens(raw: bytes) -> tuple[str, int]:
    """POST /v1/messages/count_tokens -> (model, offline estimate of the
    prompt's input tokens).  max_tokens is not required here."""
    doc = load_json(raw)
    model = require_model(doc)
    conv.validate(dict(doc, max_tokens=1))
    body = converted(conv.request_to_openai, dict(doc, max_tokens=1))
    return model, tokenizer.count_messages(body["messages"], model, body.get("tools"))


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
                doc = json.loads(sse_payload(chunk.raw))
                doc.get("message", {})["model"] = self.call.model
                return sse.encode(doc, "message_start")
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
