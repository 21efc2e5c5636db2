"""A stream drops the parsed request (Call.shelve) once its request is
made and keeps only the client's bytes; anything that reads the body later
(a retry on another channel) gets it parsed again, equal to what it was.
The stream's own path never reads it again: that is what makes shelving
free in CPU."""
from __future__ import annotations

import asyncio
import json

from relay import attempts, registry
from relay.faces import anthropic as anthropic_face
from relay.faces import openai as openai_face
from relay.faces import responses as responses_face
from relay.upstream.client import Cancel, Response
from models.records import Channel

CHAT = {"model": "gpt-4o-mini", "stream": True,
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "héllo"}]}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}}}}]}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": True,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}]}


def _raw(doc) -> bytes:
    return json.dumps(doc).encode()


def test_an_openai_call_parsed_again_equals_the_first_parse():
    call = openai_face.parse_chat("req_1", _raw(CHAT))
    body = call.body
    call.shelve()
    assert "body" not in call.__dict__ and "native_body" not in call.__dict__
    assert call.body == body == CHAT
    assert call.native_body is call.body  # one object, as the face made it


def test_an_anthropic_call_parsed_again_equals_both_first_parses():
    call = anthropic_face.parse_messages("req_2", _raw(MESSAGES))
    body, native = call.body, call.native_body
    call.shelve()
    assert call.native_body == native == MESSAGES
    assert call.body == body  # the OpenAI-shaped copy, converted again
    assert call.body["messages"][0] == {"role": "system", "content": "be brief"}


def test_a_call_whose_body_is_not_its_bytes_keeps_it():
    # The Responses face's body is a bridge built later (and stored
    # conversations change it): nothing may be parsed again from the bytes.
    call = responses_face.parse_create("req_3", _raw({"model": "m", "input": "hi"}))
    call.body = {"messages": [{"role": "user", "content": "changed"}]}
    call.shelve()
    assert call.body == {"messages": [{"role": "user", "content": "changed"}]}
    # And a call with no bytes left (re-encoded) keeps its body too.
    call = openai_face.parse_chat("req_4", _raw(CHAT))
    call.raw = b""
    call.shelve()
    assert "body" in call.__dict__


def test_other_missing_attributes_still_raise():
    call = openai_face.parse_chat("req_5", _raw(CHAT))
    call.shelve()
    try:
        call.no_such_thing
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


class _Sink:
    def __init__(self):
        self.started = self.closed = False
        self.data = []

    def start(self, status, headers):
        self.started = True

    def write(self, data):
        self.data.append(data)

    def pending(self):
        return 0

    async def drain(self):
        return None


class _Upstream:
    """Answers with a real upstream's SSE, split across chunks; the body is
    never read again once the first chunk is out (derive would count it)."""

    def __init__(self, events: bytes):
        self.events = events

    async def send(self, method, url, headers, body, *, on_chunk, **kw):
        for i in range(0, len(self.events), 40):
            on_chunk(self.events[i:i + 40])
            await asyncio.sleep(0)
        return Response(200, None, streamed=True)


def _sse(*docs) -> bytes:
    return b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs) + \
        b"data: [DONE]\n\n"


def test_a_streamed_call_is_shelved_once_started_and_never_parsed_again():
    call = openai_face.parse_chat("req_6", _raw(CHAT))
    parsed = []
    derive = call.derive
    call.derive = lambda raw: parsed.append(1) or derive(raw)
    channel = Channel(id=1, name="c", type="openai", base_url="http://127.0.0.1:9", key="k",
                      models=("gpt-4o-mini",), groups=("default",), priority=0, weight=1,
                      model_mapping={})
    call.upstream_model = call.model
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
             "choices": [{"index": 0, "delta": {"content": "hello there"}}]}
    usage = dict(chunk, choices=[], usage={"prompt_tokens": 9, "completion_tokens": 2,
                                           "total_tokens": 11})
    sink = _Sink()
    out = asyncio.run(attempts.attempt_stream(_Upstream(_sse(chunk, usage)), call, channel,
                                              registry.adaptor_for("openai"), sink,
                                              openai_face, Cancel()))
    assert out.error is None and out.started
    assert out.usage.prompt_tokens == 9 and out.usage.completion_tokens == 2
    assert b"hello there" in b"".join(sink.data)
    assert "body" not in call.__dict__  # shelved
    assert parsed == []  # and nothing on the way read it back



def _anthropic_sse() -> bytes:
    events = [("message_start", {"type": "message_start", "message": {
                  "id": "msg_1", "type": "message", "role": "assistant", "model":
                  "claude-sonnet-4-5", "content": [], "stop_reason": None,
                  "usage": {"input_tokens": 9, "output_tokens": 1}}}),
              ("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "hello there"}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 0}),
              ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                 "usage": {"output_tokens": 2}}),
              ("message_stop", {"type": "message_stop"})]
    return b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)


def test_a_messages_call_passed_through_is_never_converted():
    """Bounded, sent and streamed to an Anthropic channel, a Messages call's
    canonical (OpenAI-shaped) body is never made, nor its bytes parsed
    again: both only when something reads call.body."""
    from decimal import Decimal

    from relay import bounds
    from relay.asks import hides_reasoning
    from models.records import Price
    doc = dict(MESSAGES, thinking={"type": "disabled"},
               messages=[{"role": "user", "content": [
                   {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                   {"type": "tool_result", "tool_use_id": "t", "content": [
                       {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}])
    call = anthropic_face.parse_messages("req_7", _raw(doc))
    parsed, converted = [], []
    derive, canonical = call.derive, call.canonical
    call.derive = lambda raw: parsed.append(1) or derive(raw)
    call.canonical = lambda native: converted.append(1) or canonical(native)
    channel = Channel(id=1, name="c", type="anthropic", base_url="http://127.0.0.1:9", key="k",
                      models=("claude-sonnet-4-5",), groups=("default",), priority=0, weight=1,
                      model_mapping={})
    call.upstream_model = call.model
    price = Price(model="claude-sonnet-4-5", group="default", input_price=Decimal(3),
                  output_price=Decimal(15))
    worst = bounds.worst_case(call, channel, price, Decimal(1), False, 4096)
    assert bounds.prompt_bound(call, channel) == len(call.raw) + 2 * bounds.REFERENCE_TOKENS + \
        bounds.TOOLS_TOKENS
    assert bounds.output_bound(call, channel, 4096) == 100
    assert worst > 0 and not hides_reasoning(call)
    sink = _Sink()
    out = asyncio.run(attempts.attempt_stream(_Upstream(_anthropic_sse()), call, channel,
                                              registry.adaptor_for("anthropic"), sink,
                                              anthropic_face, Cancel()))
    assert out.error is None and out.usage.prompt_tokens == 9
    assert b"hello there" in b"".join(sink.data)
    assert parsed == [] and converted == []
    # Read at last, it is made from the bytes, as the face would have made it.
    assert {"type": "image_url", "image_url": {"url": "https://x/a.png"}} in \
        call.body["messages"][-1]["content"]
    assert parsed == [1] and converted == [1]


class _Refusing:
    """Looks at the call when its request is sent, then refuses it before
    any byte of an answer (as an upstream's 5xx or a failed connect does)."""

    def __init__(self, call):
        self.call = call
        self.held_at_send = None

    async def send(self, method, url, headers, body, *, on_chunk, **kw):
        await asyncio.sleep(0)
        self.held_at_send = "body" in self.call.__dict__ or "native_body" in self.call.__dict__
        return Response(503, None, body=b'{"error": {"message": "busy", "type": "overloaded_error"}}')


def _channel(kind: str, model: str) -> Channel:
    return Channel(id=1, name="c", type=kind, base_url="http://127.0.0.1:9", key="k",
                   models=(model,), groups=("default",), priority=0, weight=1, model_mapping={})


def test_the_parsed_body_is_dropped_once_sent_and_a_retry_reads_it_again():
    """A coding agent's call waits seconds for its first byte (the upstream
    reads 100 KB of prompt first): its parsed body (240 KB for a Claude Code
    body) is dropped as the request goes out, not held until the answer
    begins.  A retry on another channel, converted or not, gets the body
    parsed again from the bytes, equal to the first."""
    doc = dict(MESSAGES, messages=[{"role": "user", "content": [
        {"type": "text", "text": "héllo"},
        {"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}])
    call = anthropic_face.parse_messages("req_8", _raw(doc))
    canonical = call.body   # made, as a converted channel reads it
    call.upstream_model = call.model
    refusing = _Refusing(call)
    out = asyncio.run(attempts.attempt_stream(refusing, call, _channel("openai", "gpt-4o"),
                                              registry.adaptor_for("openai"), _Sink(),
                                              anthropic_face, Cancel()))
    assert out.error is not None and not out.started
    assert refusing.held_at_send is False
    assert call.native_body == doc and call.body == canonical
    # The next channel speaks Messages: sent the client's bytes, and streamed.
    sink = _Sink()
    out = asyncio.run(attempts.attempt_stream(_Upstream(_anthropic_sse()), call,
                                              _channel("anthropic", "claude-sonnet-4-5"),
                                              registry.adaptor_for("anthropic"), sink,
                                              anthropic_face, Cancel()))
    assert out.error is None and b"hello there" in b"".join(sink.data)
    assert "body" not in call.__dict__ and "native_body" not in call.__dict__


def test_a_gemini_call_is_dropped_once_sent_and_parsed_again_alike():
    """The Gemini face's native body is its bytes parsed, as the Messages
    face's: a streamed call lets go of it (an agent's 90 KB is 200 KB
    parsed, held for the whole stream), and reads it back equal."""
    from relay.faces import gemini as gemini_face
    doc = {"contents": [{"role": "user", "parts": [
               {"text": "héllo"}, {"fileData": {"fileUri": "https://x.test/a.pdf",
                                                "mimeType": "application/pdf"}}]}],
           "tools": [{"functionDeclarations": [{"name": "f"}]}],
           "generationConfig": {"maxOutputTokens": 50}}
    call = gemini_face.parse("req_9", _raw(doc), "gemini-2.5-pro", "streamGenerateContent", True)
    canonical = call.body
    call.upstream_model = call.model
    refusing = _Refusing(call)
    out = asyncio.run(attempts.attempt_stream(refusing, call, _channel("openai", "gpt-4o"),
                                              registry.adaptor_for("openai"), _Sink(),
                                              gemini_face, Cancel()))
    assert out.error is not None and refusing.held_at_send is False
    assert call.native_body == doc and call.body == canonical
    assert call.extra["references"] == 1 and call.extra["output_asked"] == 50
