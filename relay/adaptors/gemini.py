"""Gemini upstreams (type "gemini"): {base}/v1beta/models/{m}:generateContent,
:streamGenerateContent?alt=sse and :batchEmbedContents, key in x-goog-api-key.

A Gemini-format client's body goes through as it came (the model lives in
the URL, so mapping it costs nothing) and streamed responses are passed on
as they arrive; other clients' calls are converted from and to OpenAI's
shape.  Channel options: `api_version` picks the path version (default
v1beta); `max_output_tokens` caps the output limit of converted calls.
"""
from __future__ import annotations

from urllib.parse import quote

from relay.adaptors.base import (Adaptor, Call, Chunk, StreamReader, UpstreamRequest,
                                 cap_output_tokens, generic_error, join_url)
from relay.convert import gemini as conv
from relay.convert import gemini_embed as embed
from relay.convert.common import RawEvents, unreadable_is_value_error
from relay.convert.gemini_stream import StreamToChunks
from relay.errors import RelayError
from relay.money.pricing import Usage
from relay.serving import jsonin


class GeminiStream(StreamReader):
    def __init__(self, call: Call, passthrough: bool):
        super().__init__()
        self.events = RawEvents()
        self.conv = StreamToChunks(call.model, build=not passthrough)
        self.text_parts = self.conv.text_parts
        self.passthrough = passthrough
        self.model = call.upstream_model
        self.queries: set = set()
        self.searches = 0

    def _events(self, events) -> list[Chunk]:
        out = []
        for raw, ev in events:
            try:
                doc = jsonin.loads_answer(ev.data) if ev is not None else None
            except ValueError:
                doc = None
            if isinstance(doc, dict) and doc.get("candidates"):
                self.searches = max(self.searches,
                                    conv.grounding_calls(doc, self.model, self.queries))
            if self.passthrough:
                if isinstance(doc, dict):
                    self.conv.feed(doc)
                    out.append(Chunk(None, raw))
            elif isinstance(doc, dict):
                out += [Chunk(c) for c in self.conv.feed(doc)]
            self.usage = self.conv.usage
            if self.usage is not None and self.searches:
                self.usage.web_search_calls = self.searches
        return out

    def feed(self, data: bytes) -> list[Chunk]:
        return unreadable_is_value_error(self._events, self.events.feed(data))

    def finish(self) -> list[Chunk]:
        out = unreadable_is_value_error(self._events, self.events.flush())
        if not self.passthrough:
            out += [Chunk(c) for c in self.conv.finish()]
        return out


class GeminiAdaptor(Adaptor):
    type = "gemini"
    native = "gemini"
    endpoints = frozenset({"chat", "embeddings"})

    def url(self, channel, model: str, method: str) -> str:
        version = "/" + str((channel.options or {}).get("api_version") or "v1beta").strip("/")
        return join_url(channel.base_url, f"/models/{quote(model, safe='')}:{method}", version)

    def request(self, call: Call, channel) -> UpstreamRequest:
        native = call.face == self.native and call.native_body is not None
        if call.endpoint == "embeddings":
            if native:
                method = call.extra.get("gemini_method", "batchEmbedContents")
                body = dict(call.native_body)
                if method == "batchEmbedContents":
                    body["requests"] = [dict(r, model=f"models/{call.upstream_model}")
                                        for r in body.get("requests") or ()]
                elif "model" in body:
                    body["model"] = f"models/{call.upstream_model}"
            else:
                method, body = "batchEmbedContents", embed.request_from_openai(
                    call.body, call.upstream_model)
            url = self.url(channel, call.upstream_model, method)
        else:
            body = call.native_body if native else conv.request_from_openai(
                cap_output_tokens(call.body, channel.options), call.upstream_model)
            method = "streamGenerateContent" if call.stream else "generateContent"
            url = self.url(channel, call.upstream_model, method)
            if call.stream:
                url += "?alt=sse"
        headers = {"Content-Type": "application/json", "x-goog-api-key": channel.key}
        if native and call.raw and (call.endpoint == "chat" or call.upstream_model == call.model):
            data = call.raw  # the client's own bytes (a chat body names no model)
        else:
            data = jsonin.dumps(body)
        return UpstreamRequest("POST", url, headers, data)

    def stream(self, call: Call) -> StreamReader:
        return GeminiStream(call, passthrough=call.face == self.native)

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        doc = jsonin.loads_answer(body)
        if not isinstance(doc, dict):
            raise ValueError("the answer is not a JSON object")
        if call.endpoint == "embeddings":
            out = (embed.response_to_openai(doc, call.model, call.body.get("encoding_format"),
                                            int(call.extra.get("prompt_tokens", 0))), None)
        else:
            usage = conv.usage_from(doc.get("usageMetadata"))
            if usage is not None:
                usage.web_search_calls = conv.grounding_calls(doc, call.upstream_model)
            out = conv.response_to_openai(doc, call.model), usage
        if call.face == self.native:  # only once readable: a failed attempt leaves none
            call.extra["native_answer"] = doc  # rendered as it is, only renamed
        return out

    def error(self, status: int, body: bytes) -> RelayError:
        # Google answers a wrong key with 400 INVALID_ARGUMENT: that is the
        # channel's fault, not the caller's, so treat it like a 401.
        if status == 400 and (b"API_KEY_INVALID" in body or b"API key not valid" in body):
            status = 401
        return generic_error(status, body)
