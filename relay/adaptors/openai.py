"""OpenAI-format upstreams (type "openai"): chat, embeddings, and the
OpenAI-shaped media endpoints.

Requests pass through with every field the client sent; the adaptor only
maps the model name, asks for streaming usage, and smooths over reasoning
models' parameter quirks where the channel asks it to.
"""
from __future__ import annotations

import json
import math
import re

from relay import sse
from relay.adaptors.base import (Adaptor, Call, Chunk, StreamReader, UpstreamRequest, generic_error,
                                 join_url)
from relay.errors import RelayError
from relay.pricing import Usage

_PATHS = {"chat": "/chat/completions", "embeddings": "/embeddings",
          "images": "/images/generations", "transcriptions": "/audio/transcriptions",
          "speech": "/audio/speech"}

# o1, o3, o4-mini, gpt-5...: want max_completion_tokens, reject temperature.
REASONING = re.compile(r"^(o\d|gpt-5)")
# The first o1 models reject the system role outright.
NO_SYSTEM = re.compile(r"^o1(-mini|-preview)?(-\d{4}-\d{2}-\d{2})?$")


def usage_from(doc: dict | None) -> Usage | None:
    if not isinstance(doc, dict):
        return None
    if doc.get("type") == "duration":  # transcriptions billed by time
        return Usage(units=math.ceil(float(doc.get("seconds") or 0)))
    if "input_tokens" in doc and "prompt_tokens" not in doc:
        # images and transcriptions report input/output tokens
        details = doc.get("input_tokens_details") or doc.get("input_token_details") or {}
        return Usage(prompt_tokens=int(doc.get("input_tokens") or 0),
                     completion_tokens=int(doc.get("output_tokens") or 0),
                     cached_tokens=int((details or {}).get("cached_tokens") or 0))
    details = doc.get("prompt_tokens_details") or {}
    return Usage(prompt_tokens=int(doc.get("prompt_tokens") or 0),
                 completion_tokens=int(doc.get("completion_tokens") or 0),
                 cached_tokens=int((details or {}).get("cached_tokens") or 0))


def transcript_usage(call: Call, body: bytes) -> tuple[dict, Usage | None]:
    """A transcription answer (JSON, or text/srt/vtt) -> (doc, usage).

    Token usage wins where the upstream reports it; otherwise the audio's
    length in seconds: the upstream's own `duration` (verbose_json), else
    what relay/upload.py read from the file.  None when neither is known:
    the call is then billed once, per call.
    """
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = {"text": body.decode(errors="replace")}
    usage = usage_from(doc.get("usage"))
    if usage is not None and (usage.prompt_tokens or usage.completion_tokens or usage.units):
        return doc, usage
    seconds = doc.get("duration")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        return doc, Usage(units=math.ceil(seconds))
    if call.extra.get("audio_seconds"):
        return doc, Usage(units=math.ceil(call.extra["audio_seconds"]))
    return doc, None


class BinaryStream(StreamReader):
    """Speech audio: bytes pass through as they are; billed by characters."""

    def __init__(self, call: Call):
        super().__init__()
        self.call = call

    def feed(self, data: bytes) -> list[Chunk]:
        return [Chunk(None, data)]

    def finish(self) -> list[Chunk]:
        self.usage = Usage(prompt_tokens=int(self.call.extra.get("prompt_tokens") or 0),
                           units=int(self.call.extra.get("units") or 1))
        return []


# The string fields delta_text() reads, as they appear in a chunk's JSON.
_DELTA_TEXT = re.compile(r'"(?:content|reasoning_content|name|arguments)"\s*:\s*"((?:[^"\\]|\\.)*)"')


def delta_text(chunk: dict) -> str:
    out = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            out.append(delta["content"])
        if delta.get("reasoning_content"):
            out.append(delta["reasoning_content"])
        for tc in delta.get("tool_calls") or ():
            fn = tc.get("function") or {}
            out.append(fn.get("name") or "")
            out.append(fn.get("arguments") or "")
    return "".join(out)


def prepare_chat_body(body: dict, upstream_model: str, channel_options: dict) -> dict:
    body = dict(body)
    body["model"] = upstream_model
    # Ask for streaming usage even when the client did not (we bill from it),
    # unless the channel says its upstream rejects stream_options.
    if body.get("stream") and channel_options.get("stream_usage", True):
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    if REASONING.match(upstream_model):
        if "max_tokens" in body and "max_completion_tokens" not in body:
            body["max_completion_tokens"] = body.pop("max_tokens")
        if channel_options.get("drop_temperature"):
            body.pop("temperature", None)
    role = channel_options.get("system_role")
    if role in ("developer", "user") and REASONING.match(upstream_model):
        body["messages"] = [dict(m, role=role) if isinstance(m, dict) and m.get("role") == "system"
                            else m for m in body.get("messages") or ()]
    return body


class OpenAIStream(StreamReader):
    """OpenAI SSE from the upstream.

    `lazy` is the pass-through fast path (an OpenAI client, no model rename):
    events go out as they came and are only parsed when they may carry usage;
    the generated text, needed only to estimate a call that lost its usage,
    is parsed from the kept event data on demand.
    """

    def __init__(self, keep_raw: bool, lazy: bool = False):
        super().__init__()
        self.parser = sse.SSEParser()
        self.keep_raw = keep_raw
        self.lazy = lazy and keep_raw
        self._unparsed: list[str] = []

    def _events(self, events) -> list[Chunk]:
        out = []
        for ev in events:
            if ev.data == "[DONE]":
                out.append(Chunk(None, sse.DONE if self.keep_raw else None))
                continue
            raw = sse.encode(ev.data, ev.event or None) if self.keep_raw else None
            if self.lazy and '"usage"' not in ev.data:
                # Only the generated text is kept (still JSON-escaped), not
                # the event: a tenth of the memory for an open stream.
                frags = _DELTA_TEXT.findall(ev.data)
                if frags:
                    self._unparsed.append("".join(frags))
                    if len(self._unparsed) >= 64:
                        self._unparsed = ["".join(self._unparsed)]
                out.append(Chunk(None, raw))
                continue
            try:
                doc = json.loads(ev.data)
            except ValueError:
                continue
            if doc.get("usage"):
                self.usage = usage_from(doc["usage"])
            self.text_parts.append(delta_text(doc))
            out.append(Chunk(doc, raw))
        return out

    @property
    def text(self) -> str:
        if self._unparsed:
            try:
                self.text_parts.append(json.loads('"' + "".join(self._unparsed) + '"'))
            except ValueError:
                pass
            self._unparsed.clear()
        return "".join(self.text_parts)

    def feed(self, data: bytes) -> list[Chunk]:
        return self._events(self.parser.feed(data))

    def finish(self) -> list[Chunk]:
        return self._events(self.parser.flush())


class OpenAIAdaptor(Adaptor):
    type = "openai"
    native = "openai"
    endpoints = frozenset(_PATHS)

    def url(self, channel, call: Call) -> str:
        return join_url(channel.base_url, _PATHS[call.endpoint])

    def headers(self, channel) -> dict:
        return {"Authorization": f"Bearer {channel.key}"}

    def request(self, call: Call, channel) -> UpstreamRequest:
        headers = self.headers(channel)
        if call.endpoint == "transcriptions":
            # The multipart upload streams through (relay/upload.py), with
            # its model field rewritten to this channel's model name.
            upload = call.extra["upload"]
            headers["Content-Type"] = upload.content_type
            return UpstreamRequest("POST", self.url(channel, call), headers,
                                   body_producer=upload.producer(call.upstream_model))
        body = dict(call.body)
        if call.endpoint == "chat":
            body = prepare_chat_body(body, call.upstream_model, channel.options)
        else:
            body["model"] = call.upstream_model
        headers["Content-Type"] = "application/json"
        return UpstreamRequest("POST", self.url(channel, call), headers,
                               json.dumps(body, ensure_ascii=False).encode())

    def stream(self, call: Call) -> StreamReader:
        if call.endpoint == "speech":
            return BinaryStream(call)
        raw = call.face == "openai"
        return OpenAIStream(keep_raw=raw, lazy=raw and call.upstream_model == call.model)

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        if call.endpoint == "transcriptions":
            return transcript_usage(call, body)
        doc = json.loads(body)
        return doc, usage_from(doc.get("usage")) if isinstance(doc, dict) else None

    def error(self, status: int, body: bytes) -> RelayError:
        err = generic_error(status, body)
        low = err.message.lower()
        if err.status == 400 and "system" in low and "role" in low:
            err.message += (" This model does not accept the system role: send the instructions "
                            "as a user message, or ask an administrator to set the channel "
                            "option system_role to 'developer' or 'user'.")
            err.code = "system_role_unsupported"
        return err
