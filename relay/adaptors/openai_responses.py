"""The Responses wire of OpenAI-format channels (openai, azure).

Channel option `wire_api` says what the upstream serves: "both" (the
default: OpenAI itself, Azure), "responses" (only /v1/responses: chat calls
are converted to it) or "chat" (only /chat/completions: Responses calls are
bridged through the canonical chat shape, like on anthropic and gemini
channels).

A Responses client on a channel that speaks it is passed through: its body
goes as it came (only a mapped model is rewritten), its events come back
byte for byte, and only the lifecycle events are parsed, for the usage in
response.completed / .incomplete / .failed and the response id.
"""
from __future__ import annotations


from relay.adaptors.base import Call, Chunk, StreamReader
from relay.convert import responses as conv
from relay.convert import responses_upstream as upstream
from relay.serving import sse
from relay.convert.common import RawEvents, renamed, renamed_member, unreadable_is_value_error
from relay.convert.responses_stream import LIFECYCLE, EventsToChunks
from relay.money.pricing import Usage
from relay.serving import jsonin

WIRES = ("both", "responses", "chat")
# Client headers that belong to the Responses wire and mean the same upstream.
FORWARD_HEADERS = ("openai-beta", "x-codex-beta-features")


def wire_api(channel, default: str = "both") -> str:
    wire = str((channel.options or {}).get("wire_api") or default)
    return wire if wire in WIRES else default


def upstream_body(call: Call) -> bytes:
    """The client's Responses body for the upstream: its own bytes when
    nothing changes, else re-encoded with the channel's model name (and, for
    a conversation continued from a response stored here, its history)."""
    doc = call.extra.get("upstream_doc")
    if doc is None and call.raw:
        if call.upstream_model == call.model:
            return call.raw
        # Renamed in place when the member is plainly the body's own (Codex
        # writes it first); else re-encoded, which costs less than the
        # parse that would make sure of a member found further on.
        out = renamed(call.raw, call.model, call.upstream_model, None)
        if out is not None:
            return out
    doc = dict(doc if doc is not None else call.native_body, model=call.upstream_model)
    return jsonin.dumps(doc)


def _event_kind(raw: bytes) -> bytes:
    """The event's name from its `event:` line, or b"" (cheap: no JSON)."""
    if raw.startswith(b"event:"):
        return raw[6:raw.find(b"\n")].strip()
    return b""


class ResponsesStream(StreamReader):
    """Responses SSE from the upstream.

    passthrough (a Responses client): every event goes on as it came;
    lifecycle events also carry their parsed data, for the usage and for
    the face (response id, model rename).  The deltas are parsed only if the
    text is needed to estimate a call that lost its usage.
    Otherwise the events are converted to canonical chunks."""

    def __init__(self, call: Call, passthrough: bool):
        super().__init__()
        self.events = RawEvents()
        self.conv = EventsToChunks(call.model)
        self.passthrough = passthrough
        self._deltas: list[bytes] = []

    def _events(self, events) -> list[Chunk]:
        out = []
        for raw, ev in events:
            if ev is None:  # a keepalive comment
                if self.passthrough:
                    out.append(Chunk(None, raw))
                continue
            kind = _event_kind(raw).decode() or None
            if self.passthrough and kind is not None and kind not in LIFECYCLE:
                if kind.endswith(".delta"):
                    self._deltas.append(ev.data.encode())
                out.append(Chunk(None, raw))
                continue
            try:
                data = jsonin.loads_answer(ev.data)
            except ValueError:
                if self.passthrough:
                    out.append(Chunk(None, raw))
                continue
            if not isinstance(data, dict):
                continue
            got = self.conv.feed(data)
            if self.conv.usage is not None:
                self.usage = self.conv.usage
            if self.passthrough:
                out.append(Chunk(data if data.get("type") in LIFECYCLE else None, raw))
            else:
                out += [Chunk(c) for c in got]
        return out

    @property
    def text(self) -> str:
        for data in self._deltas:
            try:
                self.conv.feed(jsonin.loads_answer(data))
            except ValueError:
                pass
        self._deltas.clear()
        return "".join(self.conv.text_parts)

    def feed(self, data: bytes) -> list[Chunk]:
        return unreadable_is_value_error(self._events, self.events.feed(data))

    def finish(self) -> list[Chunk]:
        return unreadable_is_value_error(self._events, self.events.flush())


def parse_passthrough(call: Call, body: bytes) -> tuple[dict, Usage | None]:
    doc = jsonin.loads_answer(body)
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    call.extra["native_answer"] = doc
    return doc, conv.billed_usage(doc)


def parse_for_chat(call: Call, body: bytes) -> tuple[dict, Usage | None]:
    """A Responses-only channel's whole answer to a chat call."""
    doc = jsonin.loads_answer(body)
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    return upstream.response_to_chat(doc, call.model), conv.billed_usage(doc)


def rename_model(raw: bytes, data: dict, model: str) -> bytes:
    """A lifecycle event with the public model name (the one rewrite): in
    its own bytes when the name can be found there for certain
    (renamed_member), else re-encoded."""
    was = (data.get("response") or {}).get("model")
    if isinstance(was, str):
        out = renamed_member(raw, was, model)
        if out is not None:
            return out
    resp = dict(data.get("response") or {}, model=model)
    name = _event_kind(raw).decode() or None
    return sse.encode(dict(data, response=resp), name)
