"""The Gemini face: google-genai / google-generativeai clients calling
/v1beta (or /v1) /models/{model}:{method}, answered in Gemini's format
whatever the channel speaks.

Streams are SSE with ?alt=sse; without it the answer is one JSON array
written element by element (what the legacy REST transport reads).
"""
from __future__ import annotations

import functools
import json

from relay.money import tokenizer
from relay.adaptors.base import Call, Chunk
from relay.convert import gemini as conv
from relay.convert import gemini_embed as embed
from relay.convert.common import converted, dumps, sse_payload
from relay.convert.gemini_stream import ChunksToStream
from relay.errors import _GEMINI_STATUS, RelayError, bad_request
from relay.faces.openai import load_json, load_passing

FAMILY = "gemini"
CHAT_METHODS = ("generateContent", "streamGenerateContent")
EMBED_METHODS = ("embedContent", "batchEmbedContents")
METHODS = CHAT_METHODS + EMBED_METHODS + ("countTokens",)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise RelayError(404, f"Method '{method}' is not supported here; use one of "
                              f"{', '.join(METHODS)}.", "invalid_request_error", "unknown_method")


def parse(request_id: str, raw: bytes, model: str, method: str, sse_mode: bool) -> Call:
    """POST .../models/{model}:{method} -> Call (not for countTokens)."""
    check_method(method)
    doc, raw = load_passing(raw)
    if method in EMBED_METHODS:
        body = converted(embed.request_to_openai, doc, method, model)
        call = Call(request_id=request_id, endpoint="embeddings", face=FAMILY, model=model,
                    body=body, raw=raw, native_body=doc)
        call.extra["gemini_method"] = method
        return call
    conv.validate(doc)
    stream = method == "streamGenerateContent"
    # The canonical body is made only if something reads it (Call.canonical):
    # a Gemini channel is sent the client's bytes.  What the reservation
    # reads is noted from the native body instead (relay/bounds.py).
    call = Call(request_id=request_id, endpoint="chat", face=FAMILY, model=model, body=None,
                raw=raw, native_body=doc, stream=stream,
                canonical=functools.partial(_canonical, model=model, stream=stream))
    call.extra["gemini_method"] = method
    call.extra["sse"] = sse_mode
    cfg = doc.get("generationConfig") or doc.get("generation_config")
    cfg = cfg if isinstance(cfg, dict) else {}
    call.extra["output_asked"] = _either(cfg, "maxOutputTokens", "max_output_tokens")
    call.extra["choices_asked"] = _either(cfg, "candidateCount", "candidate_count")
    call.extra["references"] = references(doc.get("contents"))
    # Read again from the bytes once a stream has let it go (Call.shelve).
    call.derive = load_json
    return call


def _canonical(doc: dict, model: str, stream: bool) -> dict:
    body = converted(conv.request_to_openai, doc, model)
    if stream:
        body["stream"] = True
    return body


def _either(cfg: dict, camel: str, snake: str):
    """A generation setting in either spelling, as the conversion reads it."""
    return cfg.get(camel) if cfg.get(camel) is not None else cfg.get(snake)


def references(contents) -> int:
    """Files the upstream fetches by reference (fileData parts, by URI):
    their size is not in the body.  Every turn's are counted, which only
    errs on the safe side."""
    n = 0
    for turn in contents if isinstance(contents, list) else ():
        for p in turn.get("parts") or () if isinstance(turn, dict) else ():
            n += isinstance(p, dict) and ("fileData" in p or "file_data" in p)
    return n


def count_tokens(raw: bytes, model: str) -> int:
    """:countTokens -> an offline estimate of the prompt's tokens."""
    doc = load_json(raw)
    inner = doc.get("generateContentRequest") or doc.get("generate_content_request")
    if isinstance(inner, dict):
        doc = inner
    if not doc.get("contents"):
        raise bad_request("* CountTokensRequest.contents: contents is not specified",
                          "missing_contents", "contents")
    conv.validate(doc)
    body = converted(conv.request_to_openai, doc, model)
    return tokenizer.count_messages(body["messages"], model, body.get("tools"))


class StreamWriter:
    """OpenAI chunks (or a Gemini upstream's own events) -> SSE events or
    the elements of one JSON array."""

    def __init__(self, call: Call):
        self.call = call
        self.sse = bool(call.extra.get("sse", True))
        self.conv = ChunksToStream(call.model)
        self.passthrough = False
        self.count = 0

    def headers(self, upstream_headers=None) -> dict:
        """Response headers (the service asks before the first byte): SSE
        with ?alt=sse, else the one JSON array the legacy transport reads."""
        if self.sse:
            return {"Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"}

    def _out(self, payload: bytes) -> bytes:
        if self.sse:
            return b"data: " + payload + b"\r\n\r\n"
        self.count += 1
        return (b"[" if self.count == 1 else b",\r\n") + payload

    def write(self, chunk: Chunk) -> bytes:
        if chunk.raw is not None:
            self.passthrough = True
            if self.call.upstream_model != self.call.model:
                # The model name is the one thing renamed on the way back.
                doc = json.loads(sse_payload(chunk.raw))
                if "modelVersion" in doc:
                    doc["modelVersion"] = self.call.model
                return self._out(dumps(doc).encode())
            return chunk.raw if self.sse else self._out(sse_payload(chunk.raw))
        if chunk.data is None or self.passthrough:
            return b""
        return b"".join(self._out(dumps(d).encode()) for d in self.conv.feed(chunk.data))

    def finish(self) -> bytes:
        out = b"" if self.passthrough else b"".join(
            self._out(dumps(d).encode()) for d in self.conv.finish())
        if not self.sse:
            out += b"[]" if self.count == 0 else b"]"
        return out

    def error(self, status: int, message: str) -> bytes:
        body = dumps({"error": {"code": status, "message": message,
                                "status": _GEMINI_STATUS.get(status, "UNKNOWN")}}).encode()
        out = self._out(body)
        return out + (b"" if self.sse else b"]")


def render(call: Call, doc: dict) -> dict:
    """The whole answer: a Gemini upstream's own (renamed to the public
    model), else the OpenAI-shaped one converted."""
    native = call.extra.get("native_answer")
    if isinstance(native, dict):
        return dict(native, modelVersion=call.model) if "modelVersion" in native else native
    if call.endpoint == "embeddings":
        return embed.response_from_openai(doc, call.extra.get("gemini_method", "embedContent"))
    return conv.response_from_openai(doc, call.model)
