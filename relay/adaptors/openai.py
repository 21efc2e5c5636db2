"""OpenAI-format upstreams (type "openai"): chat, embeddings, legacy
completions, moderations, rerank (the Jina/Cohere /v1/rerank that
OpenAI-compatible servers expose), the OpenAI-shaped media endpoints and the
Responses API (the Responses wire is in relay/adaptors/openai_responses.py).

Requests pass through with every field the client sent; the adaptor only
maps the model name, asks for streaming usage, and smooths over reasoning
models' parameter quirks where the channel asks it to.

A `reasoning_effort` converted from another format (Anthropic thinking,
Gemini thinkingConfig) goes only to models that take it (o-series, gpt-5);
channel option `reasoning_effort`: "auto" (that rule), "always" (an
OpenAI-compatible upstream whose other models take it too) or "never".
Channel option `max_output_tokens` caps the output limit of calls converted
from another format (see base.cap_output_tokens).
"""
from __future__ import annotations

import json
import math
import re

from relay.serving import jsonin, sse
from relay.adaptors import openai_answers
from relay.adaptors import openai_responses as wire
from relay.adaptors.base import (Adaptor, Call, Chunk, StreamReader, UpstreamRequest,
                                 cap_output_tokens, generic_error, join_url)
from relay.convert import responses_upstream as rconv
from relay.convert.openai_usage import usage_from
from relay.errors import RelayError
from relay.adaptors.openai_speech import BinaryStream
from relay.money.pricing import Usage


_PATHS = {"chat": "/chat/completions", "embeddings": "/embeddings",
          "images": "/images/generations", "transcriptions": "/audio/transcriptions",
          "speech": "/audio/speech", "completions": "/completions",
          "moderations": "/moderations", "rerank": "/rerank", "image_edits": "/images/edits",
          "translations": "/audio/translations", "responses": "/responses",
          "responses_compact": "/responses/compact"}
RESPONSES = ("responses", "responses_compact")

# o1, o3, o4-mini, gpt-5...: want max_completion_tokens, reject temperature.
REASONING = re.compile(r"^(o\d|gpt-5)")
# o-series models know low, medium and high; gpt-5 also minimal.
O_SERIES = re.compile(r"^o\d")
# The first o1 models reject the system role outright.
NO_SYSTEM = re.compile(r"^o1(-mini|-preview)?(-\d{4}-\d{2}-\d{2})?$")


def transcript_usage(call: Call, body: bytes) -> tuple[dict, Usage | None]:
    """A transcription answer (JSON, or text/srt/vtt) -> (doc, usage).

    Token usage wins where the upstream reports it; otherwise the audio's
    length in seconds: the upstream's own `duration` (verbose_json), else
    what relay/upstream/upload.py read from the file.  None when neither is known:
    the call is then billed once, per call.
    """
    try:
        doc = jsonin.loads_answer(body)
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


# The string fields delta_text() reads, as they appear in a chunk's JSON (`text`: a legacy
# completion chunk).
# The string's body is the unrolled form of ((?:[^"\\]|\\.)*): the same strings, matched
# in runs rather than a character at a time (half the time, on every streamed event).
_DELTA_TEXT = re.compile(r'"(?:content|reasoning_content|name|arguments|text)"\s*:\s*"'
                         r'([^"\\]*(?:\\.[^"\\]*)*)"')
_DELTA_TEXT_B = re.compile(_DELTA_TEXT.pattern.encode())
# An event ends at a blank line (relay/serving/sse.py's three line endings).
_EVENT_END = (b"\n\n", b"\r\n\r\n", b"\r\r")


def _events_end(buf: bytes, before: int) -> int:
    """Where the last event that ends within buf[:before] ends; 0 if none."""
    if b"\r" not in buf:  # nearly every upstream: only one ending is possible
        i = buf.rfind(b"\n\n", 0, before)
        return i + 2 if i >= 0 else 0
    end = 0
    for sep in _EVENT_END:
        i = buf.rfind(sep, 0, before)
        if i >= 0 and i + len(sep) > end:
            end = i + len(sep)
    return end


def delta_text(chunk: dict) -> str:
    out = []
    for choice in chunk.get("choices") or ():
        if isinstance(choice.get("text"), str):  # a legacy completion chunk
            out.append(choice["text"])
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


def ask_stream_usage(body: dict, channel_options: dict) -> dict:
    """Ask for streaming usage even when the client did not (we bill from
    it), unless the channel says its upstream rejects stream_options."""
    if body.get("stream") and channel_options.get("stream_usage", True):
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    return body


def _reasoning_effort(body: dict, upstream_model: str, mode: str, converted: bool) -> None:
    """A client's own reasoning_effort passes as sent (pass-through); one
    converted from another format is dropped where the model takes none
    (OpenAI refuses it there with a 400)."""
    if "reasoning_effort" not in body:
        return
    if mode == "never" or (mode != "always" and converted and not REASONING.match(upstream_model)):
        body.pop("reasoning_effort")
    elif converted and O_SERIES.match(upstream_model) and body["reasoning_effort"] == "minimal":
        body["reasoning_effort"] = "low"


def limit_converted(body: dict, upstream_model: str, channel_options: dict,
                    converted: bool) -> dict:
    """A copy of a canonical chat body with the output cap and the
    reasoning_effort rule applied; `converted` when the call came in another
    format (its fields were set by a converter, not the client)."""
    body = dict(cap_output_tokens(body, channel_options) if converted else body)
    _reasoning_effort(body, upstream_model, channel_options.get("reasoning_effort") or "auto",
                      converted)
    return body


def prepare_chat_body(body: dict, upstream_model: str, channel_options: dict,
                      converted: bool = False) -> dict:
    """The chat body for the upstream (see limit_converted for `converted`)."""
    body = limit_converted(body, upstream_model, channel_options, converted)
    body["model"] = upstream_model
    ask_stream_usage(body, channel_options)
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
    complete events go out as the bytes that came, unparsed, unless they may
    carry usage or end the stream; the generated text, needed only to
    estimate a call that lost its usage, is kept JSON-escaped and decoded on
    demand (a tenth of the memory of the events, for an open stream).
    """

    def __init__(self, keep_raw: bool, lazy: bool = False):
        super().__init__()
        self.parser = sse.SSEParser()
        self.keep_raw = keep_raw
        self.lazy = lazy and keep_raw
        self._escaped: list[bytes] = []
        self._tail = b""  # lazy: an event not yet complete

    def _events(self, events) -> list[Chunk]:
        out = []
        for ev in events:
            if ev.data == "[DONE]":
                out.append(Chunk(None, sse.DONE if self.keep_raw else None))
                continue
            raw = sse.encode(ev.data, ev.event or None) if self.keep_raw else None
            if self.lazy and '"usage"' not in ev.data:
                self._keep_text(b"".join(_DELTA_TEXT_B.findall(ev.data.encode())))
                out.append(Chunk(None, raw))
                continue
            try:
                doc = jsonin.loads_answer(ev.data)
            except ValueError:
                continue
            if doc.get("usage"):
                self.usage = usage_from(doc["usage"])
                if self.usage is not None:  # the tier the call ran in, beside it
                    self.usage.service_tier = str(doc.get("service_tier") or "")
            self.text_parts.append(delta_text(doc))
            out.append(Chunk(doc, raw))
        return out

    def _keep_text(self, escaped: bytes) -> None:
        if escaped:
            self._escaped.append(escaped)
            if len(self._escaped) >= 64:
                self._escaped = [b"".join(self._escaped)]

    @property
    def text(self) -> str:
        if self._escaped:
            escaped = b"".join(self._escaped).decode("utf-8", "replace")
            self._escaped.clear()
            try:
                self.text_parts.append(json.loads('"' + escaped + '"'))
            except ValueError:
                pass
        return "".join(self.text_parts)

    def feed(self, data: bytes) -> list[Chunk]:
        if self.lazy:
            return self._pass(data)
        return self._events(self.parser.feed(data))

    def _pass(self, data: bytes) -> list[Chunk]:
        buf = self._tail + data if self._tail else data
        end = _events_end(buf, len(buf))
        self._tail = buf[end:]
        if len(self._tail) > self.parser.max_event:
            raise ValueError("server-sent event larger than the limit")
        if not end:
            return []
        done = buf[:end] if end < len(buf) else buf
        usage, last = done.find(b'"usage"'), done.find(b"[DONE]")
        if usage < 0 and last < 0:
            return self._forward(done)
        # The events before the first that may carry usage or end the
        # stream still leave as they came; from there on they are read.
        start = _events_end(done, last if usage < 0 else usage if last < 0 else min(usage, last))
        return (self._forward(done[:start]) if start else []) + \
            self._events(self.parser.feed(done[start:]))

    def _forward(self, events: bytes) -> list[Chunk]:
        self._keep_text(b"".join(_DELTA_TEXT_B.findall(events)))
        return [Chunk(None, events)]

    def finish(self) -> list[Chunk]:
        if self._tail:
            tail, self._tail = self._tail, b""
            return self._events(self.parser.feed(tail)) + self._events(self.parser.flush())
        return self._events(self.parser.flush())


class OpenAIAdaptor(Adaptor):
    type = "openai"
    native = "openai"
    endpoints = frozenset(_PATHS)
    default_wire = "both"

    def url(self, channel, call: Call, endpoint: str | None = None) -> str:
        return join_url(channel.base_url, _PATHS[endpoint or call.endpoint])

    def responses_url(self, channel, path: str) -> str:
        """A Responses route (e.g. "/responses/{id}/cancel") on this channel."""
        return join_url(channel.base_url, path)

    def speaks_responses(self, channel) -> bool:
        return wire.wire_api(channel, self.default_wire) != "chat"

    def wire(self, call: Call, channel) -> str:
        """What this attempt sends upstream: "responses" or "openai" (chat).
        Channel option `compact_api: "chat"`: the upstream serves
        /v1/responses but not /v1/responses/compact (vLLM, Azure), so
        compactions are bridged (relay/compat learns it when unset)."""
        if call.endpoint == "responses_compact" and (channel.options or {}).get(
                "compact_api") == "chat":
            return "openai"
        if call.endpoint in RESPONSES:
            return "responses" if self.speaks_responses(channel) else "openai"
        if call.endpoint == "chat" and wire.wire_api(channel, self.default_wire) == "responses":
            return "responses"
        return "openai"

    def headers(self, channel) -> dict:
        return {"Authorization": f"Bearer {channel.key}"}

    def request(self, call: Call, channel) -> UpstreamRequest:
        headers = self.headers(channel)
        if "upload" in call.extra:
            # The multipart upload streams through (relay/upstream/upload.py), with
            # its model field rewritten to this channel's model name.
            upload = call.extra["upload"]
            headers["Content-Type"] = upload.content_type
            return UpstreamRequest("POST", self.url(channel, call), headers,
                                   body_producer=upload.producer(call.upstream_model))
        headers["Content-Type"] = "application/json"
        if call.extra.setdefault("wire", self.wire(call, channel)) == "responses":
            return self._responses_request(call, channel, headers)
        body = dict(call.body)
        if call.endpoint in ("chat", *RESPONSES):  # a Responses call bridged to chat
            body = prepare_chat_body(body, call.upstream_model, channel.options,
                                     converted=call.face != self.native)
            endpoint = "chat"
        else:
            body["model"] = call.upstream_model
            endpoint = call.endpoint
            if call.endpoint == "completions":
                ask_stream_usage(body, channel.options)
        return UpstreamRequest("POST", self.url(channel, call, endpoint), headers,
                               jsonin.dumps(body))

    def _responses_request(self, call: Call, channel, headers: dict) -> UpstreamRequest:
        if call.face == "responses":  # pass-through
            for name, value in (call.extra.get("client_headers") or {}).items():
                headers[name] = value
            data = wire.upstream_body(call)
        else:  # a chat call (OpenAI's or converted) to a Responses-only channel
            body = limit_converted(call.body, call.upstream_model, channel.options,
                                   converted=call.face != self.native)
            data = jsonin.dumps(rconv.request_from_chat(body, call.upstream_model))
        path = "/responses/compact" if call.endpoint == "responses_compact" else "/responses"
        return UpstreamRequest("POST", self.responses_url(channel, path), headers, data)

    def stream(self, call: Call) -> StreamReader:
        if call.endpoint == "speech":
            return BinaryStream(call)
        if call.extra.get("wire") == "responses":
            return wire.ResponsesStream(call, passthrough=call.face == "responses")
        raw = call.face == "openai"
        return OpenAIStream(keep_raw=raw, lazy=raw and call.upstream_model == call.model)

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        if call.endpoint in ("transcriptions", "translations"):
            return transcript_usage(call, body)
        if call.extra.get("wire") == "responses":
            if call.face == "responses":
                return wire.parse_passthrough(call, body)
            return wire.parse_for_chat(call, body)
        doc = jsonin.loads_answer(body)
        usage = usage_from(doc.get("usage")) if isinstance(doc, dict) else None
        if usage is not None:
            usage.service_tier = str(doc.get("service_tier") or "")
        if call.endpoint in openai_answers.PARSERS:
            if not isinstance(doc, dict):
                raise ValueError("the answer is not a JSON object")
            return openai_answers.PARSERS[call.endpoint](call, doc, usage)
        return doc, usage

    def error(self, status: int, body: bytes) -> RelayError:
        err = generic_error(status, body)
        low = err.message.lower()
        if err.status == 400 and "system" in low and "role" in low:
            err.message += (" This model does not accept the system role: send the instructions "
                            "as a user message, or ask an administrator to set the channel "
                            "option system_role to 'developer' or 'user'.")
            err.code = "system_role_unsupported"
        return err
