"""Anthropic Messages upstreams (type "anthropic"): POST {base}/v1/messages
with x-api-key and anthropic-version.

An Anthropic-format client's call goes through as it came: its body (only
the model is mapped), its anthropic-version and anthropic-beta headers and
its query (`?beta=true`); its stream events are passed on byte for byte.
Any other client's call is converted from and to the OpenAI shape.
POST /v1/messages/count_tokens is passed through the same way.

Channel options: `anthropic_version` (default 2023-06-01; a client's own
version wins); `auth: "bearer"` for Anthropic-compatible upstreams that
want `Authorization: Bearer` instead of `x-api-key`; `anthropic_beta` (sent
on every call, added to the client's own); `default_max_tokens` for
converted calls that name none (Anthropic requires one; default 4096);
`max_output_tokens` caps converted calls' max_tokens.
"""
from __future__ import annotations

from dataclasses import replace

from relay.money import tokenizer
from relay.adaptors.base import (Adaptor, Call, Chunk, StreamReader, UpstreamRequest,
                                 cap_output_tokens, join_url)
from relay.convert import anthropic as conv
from relay.convert.anthropic_stream import EventsToChunks
from relay.convert.common import RawEvents, renamed, unreadable_is_value_error
from relay.money.pricing import Usage
from relay.serving import jsonin

DEFAULT_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


def _dumps(doc: dict) -> bytes:
    return jsonin.dumps(doc)


class AnthropicStream(StreamReader):
    def __init__(self, call: Call, passthrough: bool):
        super().__init__()
        self.events = RawEvents()
        self.conv = EventsToChunks(call.model, build=not passthrough)
        self.text_parts = self.conv.text_parts
        self.passthrough = passthrough

    @property
    def usage(self) -> Usage | None:
        """Exact once message_delta arrived.  A stream cut before it (client
        gone, upstream reset) has the exact input from message_start, and
        the output is counted from what was actually streamed."""
        u = self.conv.usage
        if u is None or self.conv.final:
            return u
        out = max(u.completion_tokens, tokenizer.count_text(self.text, self.conv.model))
        return replace(u, completion_tokens=out, estimated=True)

    @usage.setter
    def usage(self, value) -> None:
        pass  # derived from the events, see above

    def _events(self, events) -> list[Chunk]:
        out = []
        for raw, ev in events:
            data = None
            if ev is not None:
                try:
                    data = jsonin.loads_answer(ev.data)
                except ValueError:
                    pass
            if self.passthrough:
                if isinstance(data, dict):
                    self.conv.feed(ev.event, data)  # the usage and the text, noted
                out.append(Chunk(None, raw))
            elif isinstance(data, dict):
                out += [Chunk(c) for c in self.conv.feed(ev.event, data)]
        return out

    def feed(self, data: bytes) -> list[Chunk]:
        return unreadable_is_value_error(self._events, self.events.feed(data))

    def finish(self) -> list[Chunk]:
        return unreadable_is_value_error(self._events, self.events.flush())


class AnthropicAdaptor(Adaptor):
    type = "anthropic"
    native = "anthropic"
    endpoints = frozenset({"chat"})

    def _native(self, call: Call) -> bool:
        return call.face == self.native and call.native_body is not None

    def _headers(self, call: Call, channel) -> dict:
        """The client's anthropic-version (else the channel's) and its betas
        as sent, followed by any the channel adds."""
        opts = channel.options or {}
        headers = {"Content-Type": "application/json",
                   "anthropic-version": call.extra.get("anthropic_version")
                   or opts.get("anthropic_version") or DEFAULT_VERSION}
        if opts.get("auth") == "bearer":
            headers["Authorization"] = f"Bearer {channel.key}"
        else:
            headers["x-api-key"] = channel.key
        beta = call.extra.get("anthropic_beta") or ""
        sent = {b.strip() for b in beta.split(",")}
        added = [b.strip() for b in str(opts.get("anthropic_beta") or "").split(",")
                 if b.strip() and b.strip() not in sent]
        beta = ",".join([beta] + added) if beta else ",".join(added)
        if beta:
            headers["anthropic-beta"] = beta
        return headers

    def _url(self, call: Call, channel, path: str) -> str:
        query = call.extra.get("anthropic_query") if self._native(call) else ""
        return join_url(channel.base_url, path) + (f"?{query}" if query else "")

    def _native_bytes(self, call: Call) -> bytes:
        """The client's own bytes, the model renamed in place when mapped."""
        if call.upstream_model == call.model and call.raw:
            return call.raw
        out = renamed(call.raw, call.model, call.upstream_model,
                      lambda b: jsonin.loads_answer(b).get("model") == call.upstream_model)
        return out or _dumps(dict(call.native_body, model=call.upstream_model))

    def request(self, call: Call, channel) -> UpstreamRequest:
        if self._native(call):
            data = self._native_bytes(call)
        else:
            # Anthropic requires max_tokens; OpenAI and Gemini clients may omit it.
            opts = channel.options or {}
            default = int(opts.get("default_max_tokens") or DEFAULT_MAX_TOKENS)
            data = _dumps(conv.request_from_openai(cap_output_tokens(call.body, opts),
                                                   call.upstream_model, default))
        return UpstreamRequest("POST", self._url(call, channel, "/messages"),
                               self._headers(call, channel), data)

    def count_tokens_request(self, call: Call, channel) -> UpstreamRequest:
        """POST /v1/messages/count_tokens for an Anthropic client's call,
        passed through like request() (only the model mapped)."""
        return UpstreamRequest("POST", self._url(call, channel, "/messages/count_tokens"),
                               self._headers(call, channel), self._native_bytes(call))

    def stream(self, call: Call) -> StreamReader:
        return AnthropicStream(call, passthrough=call.face == self.native)

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        doc = jsonin.loads_answer(body)
        if not isinstance(doc, dict):
            raise ValueError("the answer is not a JSON object")
        out = conv.message_to_openai(doc, call.model), conv.usage_from(doc.get("usage"))
        if call.face == self.native:  # only once readable: a failed attempt leaves none
            call.extra["native_answer"] = doc  # rendered as it is, only renamed
            if call.upstream_model != call.model:
                call.extra["native_raw"] = renamed(
                    body, call.upstream_model, call.model,
                    lambda b: jsonin.loads_answer(b).get("model") == call.model)
        return out
