"""The OpenAI face: how OpenAI-format clients' calls come in and go out.

A face turns the client's request into a `Call` (canonical OpenAI shape)
and writes the adaptor's OpenAI-shaped answers back in the client's format.
Other faces (anthropic, gemini) follow the same shape: `parse_*` functions,
a `StreamWriter` and `render`.
"""
from __future__ import annotations

from relay.serving import jsonin, sse
from relay.adaptors.base import Call, Chunk
from relay.errors import bad_request

FAMILY = "openai"
# The most choices (`n`) OpenAI answers in one chat call.
MAX_N = 128


def load_json(raw: bytes) -> dict:
    """The request body as a JSON object, through the one parser every route
    family shares (relay/serving/jsonin.py); RelayError(400) naming the field."""
    try:
        return jsonin.parse_object(raw or b"")
    except jsonin.BadInput as exc:
        raise jsonin.relay_error(exc) from None


def load_passing(raw: bytes) -> tuple[dict, bytes]:
    """load_json, and the bytes a pass-through channel is sent for the body
    (jsonin.passed_on: the client's own unless a key may be there twice)."""
    try:
        return jsonin.parse_passing(raw or b"")
    except jsonin.BadInput as exc:
        raise jsonin.relay_error(exc) from None


def require_model(doc: dict) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("You must provide a model parameter.", "missing_model", "model")
    return model


def parse_chat(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    model = require_model(doc)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "missing_messages", "messages")
    n = doc.get("n")
    # OpenAI's own bound; every choice is billed, so it bounds the reservation.
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N):
        raise bad_request(f"'n' must be a whole number from 1 to {MAX_N}.", "invalid_value", "n")
    stream = bool(doc.get("stream"))
    options = doc.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", "invalid_type", "stream_options")
    wants_usage = stream and bool(options.get("include_usage"))
    call = Call(request_id=request_id, endpoint="chat", face=FAMILY, model=model, body=doc,
                raw=raw, native_body=doc, stream=stream, client_wants_usage=wants_usage,
                derive=load_json)
    if isinstance(doc.get("web_search_options"), dict):  # settled as one search (relay/settle.py)
        call.extra["web_search_options"] = True
    return call


def parse_embeddings(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    model = require_model(doc)
    inp = doc.get("input")
    if inp is None or inp == "" or inp == []:
        raise bad_request("'input' must be a string or an array.", "missing_input", "input")
    fmt = doc.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'.", "invalid_value",
                          "encoding_format")
    return Call(request_id=request_id, endpoint="embeddings", face=FAMILY, model=model,
                body=doc, raw=raw, native_body=doc)


class StreamWriter:
    """OpenAI chunks -> the OpenAI SSE wire format."""

    def __init__(self, call: Call):
        self.call = call
        self.done = False

    def write(self, chunk: Chunk) -> bytes:
        doc = chunk.data
        if doc is None:  # [DONE] or a raw-only event
            if chunk.raw == sse.DONE:
                self.done = True
            return chunk.raw or b""
        raw = chunk.raw
        if not self.call.client_wants_usage and doc.get("usage"):
            if not doc.get("choices"):
                return b""  # the usage chunk we asked for on our own account
            doc = {k: v for k, v in doc.items() if k != "usage"}
            raw = None
        if raw is not None and self.call.upstream_model == self.call.model:
            return raw
        doc = dict(doc)
        doc["model"] = self.call.model
        return sse.encode(doc)

    def finish(self) -> bytes:
        return b"" if self.done else sse.DONE

    def error(self, status: int, message: str) -> bytes:
        """An error after the stream began: the status line is gone, so it
        travels as an event, as OpenAI itself does."""
        return sse.encode({"error": {"message": message, "type": "upstream_error",
                                     "code": status}}) + self.finish()


def render(call: Call, doc: dict) -> dict:
    if isinstance(doc, dict) and "model" in doc:
        doc["model"] = call.model
    return doc
