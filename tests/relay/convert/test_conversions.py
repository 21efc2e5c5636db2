"""Pure tests of the format converters (no sockets): OpenAI <-> Anthropic
requests, answers, streams, usage, and the shared SSE plumbing.  The Gemini
converters are in test_conversions_gemini.py."""
from __future__ import annotations

import json

import pytest

from relay.adaptors.base import Call, Chunk
from relay.convert import anthropic as ac
from relay.convert.anthropic_stream import ChunksToEvents, EventsToChunks
from relay.convert.common import RawEvents, chunk, sse_payload
from relay.convert.gemini_stream import ChunksToStream
from relay.errors import RelayError
from relay.faces import anthropic as aface
from relay.money.pricing import Usage


# ---- Anthropic requests --------------------------------------------------------
def test_anthropic_request_to_openai():
    doc = {"model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}],
           "stop_sequences": ["X"], "temperature": 0.5, "top_p": 0.9, "top_k": 3,
           "metadata": {"user_id": "u1"},
           "tools": [{"name": "f", "input_schema": {"type": "object"}},
                     {"type": "web_search_20250305", "name": "web_search"}],
           "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
           "messages": [
               {"role": "user", "content": "q"},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "hmm", "signature": "s"},
                   {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                   {"type": "tool_use", "id": "t2", "name": "f", "input": {}}]},
               {"role": "user", "content": [
                   {"type": "text", "text": "after"},
                   {"type": "tool_result", "tool_use_id": "t1", "content": [
                       {"type": "text", "text": "r1"}]},
                   {"type": "tool_result", "tool_use_id": "t2", "content": "boom",
                    "is_error": True}]}]}
    ac.validate(doc)
    body = ac.request_to_openai(doc)
    assert body["max_tokens"] == 10 and body["stop"] == ["X"] and body["user"] == "u1"
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9 and "top_k" not in body
    # Tool results first (OpenAI wants them right after the calls), then the text.
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool",
                                                     "tool", "user"]
    assert body["messages"][0]["content"] == "a\nb"
    assert body["messages"][2]["content"] is None
    assert [c["id"] for c in body["messages"][2]["tool_calls"]] == ["t1", "t2"]
    assert body["messages"][4] == {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"}
    assert body["messages"][3]["content"] == "r1"
    # Server tools (no input_schema) cannot be served by another vendor: dropped.
    assert [t["function"]["name"] for t in body["tools"]] == ["f"]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False


@pytest.mark.parametrize("doc, msg", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
     "messages.0.role"),
    ({"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]},
     "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]},
     "messages.0.content.0.input"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"text": "x"}]}]}]},
     "messages.0.content.0.content.0"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "system"}]}, "messages.0.content"),
    ({"model": "m", "max_tokens": 5, "thinking": {"type": "enabled"},
      "messages": [{"role": "user", "content": "x"}]}, "thinking.budget_tokens"),
    ({"model": "m", "max_tokens": 5, "tools": [{"name": "f"}],
      "messages": [{"role": "user", "content": "x"}]}, "tools.0.input_schema"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, "content"),
    ({"model": "m", "max_tokens": 5, "system": 3,
      "messages": [{"role": "user", "content": "x"}]}, "system"),
])
def test_anthropic_validation(doc, msg):
    with pytest.raises(RelayError) as ei:
        ac.validate(doc)
    assert ei.value.status == 400 and msg in ei.value.message


def test_openai_request_to_anthropic():
    body = {"model": "x", "max_completion_tokens": 9, "stop": "END", "temperature": 1.7,
            "parallel_tool_calls": False, "user": "u",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {}}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "messages": [
                {"role": "developer", "content": "dev"},
                {"role": "system", "content": [{"type": "text", "text": "sys"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
                {"role": "assistant", "content": "ok", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r1"},
                {"role": "tool", "tool_call_id": "c2", "content": "r2"},
                {"role": "user", "content": "next"}]}
    out = ac.request_from_openai(body, "claude-x")
    assert out["model"] == "claude-x" and out["max_tokens"] == 9
    assert out["system"] == "dev\nsys" and out["stop_sequences"] == ["END"]
    assert out["temperature"] == 1.0 and out["metadata"] == {"user_id": "u"}
    assert out["tool_choice"] == {"type": "tool", "name": "f", "disable_parallel_tool_use": True}
    msgs = out["messages"]
    # Roles alternate: both tool results and the next user text share one turn.
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0]["content"][1]["source"] == {"type": "base64", "media_type": "image/jpeg",
                                               "data": "QUJD"}
    assert msgs[0]["content"][2]["source"] == {"type": "url", "url": "https://x/y.png"}
    assert msgs[1]["content"][1]["input"] == {"a": 1}
    assert msgs[1]["content"][2]["input"] == {"_raw": "not json"}
    assert [b["type"] for b in msgs[2]["content"]] == ["tool_result", "tool_result", "text"]
    assert ac.request_from_openai({"messages": [{"role": "user", "content": "x"}]}, "m",
                                  1234)["max_tokens"] == 1234


def test_anthropic_answers_both_ways():
    msg = {"id": "msg_1", "model": "up", "stop_reason": "max_tokens",
           "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                       {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                       {"type": "tool_use", "id": "tu", "name": "f", "input": {"k": "v"}}],
           "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 3,
                     "cache_creation_input_tokens": 1}}
    o = ac.message_to_openai(msg, "pub")
    assert o["model"] == "pub" and o["choices"][0]["finish_reason"] == "length"
    m = o["choices"][0]["message"]
    assert m["content"] == "ab" and m["reasoning_content"] == "t"
    assert json.loads(m["tool_calls"][0]["function"]["arguments"]) == {"k": "v"}
    assert o["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
                          "prompt_tokens_details": {"cached_tokens": 3}}
    back = ac.message_from_openai(o, "pub")
    assert back["stop_reason"] == "max_tokens" and back["model"] == "pub"
    assert [b["type"] for b in back["content"]] == ["thinking", "text", "tool_use"]
    assert back["usage"] == {"input_tokens": 6, "output_tokens": 2,
                             "cache_read_input_tokens": 3, "cache_creation_input_tokens": 0}
    empty = ac.message_from_openai({"choices": [{"message": {"content": None},
                                                 "finish_reason": "content_filter"}]}, "m")
    assert empty["content"] == [{"type": "text", "text": ""}] and empty["stop_reason"] == "refusal"


def test_anthropic_usage():
    assert ac.usage_from({"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 6,
                          "cache_creation_input_tokens": 2}) == Usage(18, 4, 6,
                                                                      cache_write_5m_tokens=2)
    assert ac.usage_from(None) is None


# ---- Anthropic streams -----------------------------------------------------------
def test_events_to_chunks():
    conv = EventsToChunks("pub")
    evs = [("message_start", {"type": "message_start", "message": {"usage": {
               "input_tokens": 7, "output_tokens": 1, "cache_read_input_tokens": 2}}}),
           ("content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "thinking", "thinking": ""}}),
           ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "thinking_delta", "thinking": "hm"}}),
           ("content_block_start", {"type": "content_block_start", "index": 1,
                                    "content_block": {"type": "text", "text": ""}}),
           ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                    "delta": {"type": "text_delta", "text": "Hi"}}),
           ("content_block_start", {"type": "content_block_start", "index": 2,
                                    "content_block": {"type": "tool_use", "id": "tu", "name": "f",
                                                      "input": {}}}),
           ("content_block_delta", {"type": "content_block_delta", "index": 2,
                                    "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
           ("ping", {"type": "ping"}),
           ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                              "usage": {"output_tokens": 9, "input_tokens": 8}}),
           ("message_stop", {"type": "message_stop"})]
    out = [c for name, data in evs for c in conv.feed(name, data)]
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in out]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"reasoning_content": "hm"} and deltas[2] == {"content": "Hi"}
    assert deltas[3]["tool_calls"][0]["id"] == "tu" and deltas[3]["tool_calls"][0]["index"] == 0
    assert deltas[4]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert out[5]["choices"][0]["finish_reason"] == "tool_calls"
    # message_delta's totals replace message_start's; cache reads stay.
    assert out[6]["usage"]["prompt_tokens"] == 10 and out[6]["usage"]["completion_tokens"] == 9
    assert conv.usage == Usage(10, 9, 2)
    err = conv.feed("error", {"type": "error", "error": {"type": "overloaded_error",
                                                         "message": "Overloaded"}})
    assert err[0]["error"]["type"] == "overloaded_error" and "Overloaded" in err[0]["error"]["message"]


def test_chunks_to_events_blocks_and_indexes():
    conv = ChunksToEvents("pub", input_tokens=42)
    feed = [chunk("c", "m", {"role": "assistant", "content": ""}),
            chunk("c", "m", {"reasoning_content": "r"}),
            chunk("c", "m", {"content": "He"}), chunk("c", "m", {"content": "llo"}),
            chunk("c", "m", {"tool_calls": [{"index": 0, "id": "a", "function": {
                "name": "f", "arguments": ""}}]}),
            chunk("c", "m", {"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\""}}]}),
            chunk("c", "m", {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
            chunk("c", "m", {"tool_calls": [{"index": 1, "id": "b", "function": {
                "name": "g", "arguments": "{}"}}]}),
            chunk("c", "m", {}, "tool_calls"),
            {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 6,
                                      "prompt_tokens_details": {"cached_tokens": 8}}}]
    evs = [e for c in feed for e in conv.feed(c)] + conv.finish()
    names = [n for n, _ in evs]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert evs[0][1]["message"]["usage"]["input_tokens"] == 42
    starts = [d for n, d in evs if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2, 3]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text", "tool_use",
                                                            "tool_use"]
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "a", "name": "f", "input": {}}
    js = "".join(d["delta"]["partial_json"] for n, d in evs
                 if n == "content_block_delta" and d["index"] == 2)
    assert json.loads(js) == {"x": 1}
    delta = evs[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 32, "output_tokens": 6,
                              "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0}


def test_error_chunk_ends_converted_streams():
    conv = ChunksToEvents("m")
    evs = conv.feed(chunk("c", "m", {"content": "x"}))
    evs += conv.feed({"error": {"message": "boom", "type": "rate_limit_error"}})
    assert evs[-1] == ("error", {"type": "error", "error": {"type": "rate_limit_error",
                                                           "message": "boom"}})
    assert conv.feed(chunk("c", "m", {"content": "y"})) == [] and conv.finish() == []
    g = ChunksToStream("m")
    assert g.feed({"error": {"message": "boom"}})[0]["error"]["message"] == "boom"
    assert g.finish() == []


def test_chunks_to_events_empty_stream_is_still_complete():
    names = [n for n, _ in ChunksToEvents("m").finish()]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


def test_anthropic_writer_error_and_passthrough():
    call = Call("r", "chat", "anthropic", "pub", {}, upstream_model="pub")
    w = aface.StreamWriter(call)
    raw = b'event: ping\ndata: {"type": "ping"}\n\n'
    assert w.write(Chunk({"choices": []}, raw)) == raw
    assert w.write(Chunk(chunk("c", "m", {"content": "x"}))) == b""  # never mixed
    assert w.finish() == b""
    err = w.error(429, "slow down")
    assert err.startswith(b"event: error\n")
    assert json.loads(sse_payload(err)) == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "slow down"}}


def test_anthropic_count_tokens_offline():
    call = aface.parse_count_tokens("r", json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello world"}]}).encode(),
        {"anthropic-beta": "b1"}, "beta=true&key=sk-secret")
    assert call.model == "m" and 5 < aface.estimate_tokens(call) < 30
    # Passed on as the client sent them, less a relay key in the query.
    assert call.extra["anthropic_beta"] == "b1" and call.extra["anthropic_query"] == "beta=true"
    assert "max_tokens" not in call.native_body
    with pytest.raises(RelayError):
        aface.parse_count_tokens("r", b'{"model": "m"}')


def test_message_start_renamed_in_place():
    raw = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m",'
           b'"content":[],"model":"up-model" ,"usage":{"input_tokens":1}}}\n\n')
    assert aface.rename_start(raw, "up-model", "public") == raw.replace(b'"up-model"',
                                                                        b'"public"')
    # A first "model" key that is not the message's: re-encoded instead.
    odd = (b'event: message_start\ndata: {"type":"message_start","x":{"model":"up-model"},'
           b'"message":{"model":"up-model"}}\n\n')
    out = json.loads(sse_payload(aface.rename_start(odd, "up-model", "public")))
    assert out["message"]["model"] == "public" and out["x"]["model"] == "up-model"


def test_raw_events_keep_exact_bytes_across_any_split():
    stream = (b'event: message_start\ndata: {"a":\ndata: 1}\n\n'
              b': keepalive\n\n'
              b'data: {"b": 2}\r\n\r\n'
              b'data: {"c": 3}')
    for cut in range(1, len(stream)):
        r = RawEvents()
        got = r.feed(stream[:cut]) + r.feed(stream[cut:]) + r.flush()
        assert b"".join(raw for raw, _ in got) == stream
        evs = [ev for _, ev in got]
        assert evs[0].event == "message_start" and evs[0].data == '{"a":\n1}'
        assert evs[1] is None and evs[2].data == '{"b": 2}' and evs[3].data == '{"c": 3}'
    assert sse_payload(b'event: x\r\ndata: {"a":\r\ndata: 1}\r\n\r\n') == b'{"a":\n1}'
    with pytest.raises(ValueError):
        RawEvents(max_event=10).feed(b"data: " + b"x" * 20)


def test_malformed_blocks_are_400_not_500():
    bad = json.dumps({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": "not-an-object"}]}]}).encode()
    with pytest.raises(RelayError) as ei:
        aface.parse_messages("r", bad)
    assert ei.value.status == 400 and "messages.0.content.0.source" in ei.value.message
    # A shape the validator does not look into is still the caller's 400,
    # where the conversion is made: when a channel of another format reads
    # the canonical body (an Anthropic channel is sent the bytes as they are).
    bad = json.dumps({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "document",
                                      "source": {"type": "content", "content": 5}}]}]}).encode()
    call = aface.parse_messages("r", bad)
    with pytest.raises(RelayError) as ei:
        call.body
    assert ei.value.status == 400 and "malformed" in ei.value.message
