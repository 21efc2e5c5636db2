"""Pure tests of the format converters (no sockets): OpenAI <-> Anthropic
and OpenAI <-> Gemini requests, answers, streams, usage and embeddings."""
from __future__ import annotations

import json

import pytest

from relay import sse
from relay.adaptors.base import Call, Chunk
from relay.convert import anthropic as ac
from relay.convert import gemini as gc
from relay.convert import gemini_embed as ge
from relay.convert.anthropic_stream import ChunksToEvents, EventsToChunks
from relay.convert.common import RawEvents, chunk, sse_payload
from relay.convert.gemini_stream import ChunksToStream, StreamToChunks
from relay.errors import RelayError
from relay.faces import anthropic as aface
from relay.faces import gemini as gface
from relay.pricing import Usage


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
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
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
                          "cache_creation_input_tokens": 2}) == Usage(18, 4, 6)
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
    model, n = aface.count_tokens(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "hello world"}]}).encode())
    assert model == "m" and 5 < n < 30
    with pytest.raises(RelayError):
        aface.count_tokens(b'{"model": "m"}')


# ---- Gemini requests -------------------------------------------------------------
def test_schemas_both_ways():
    js = {"type": "object", "$schema": "x", "additionalProperties": False,
          "properties": {"a": {"type": ["string", "null"], "description": "d"},
                         "b": {"type": "array", "items": {"type": "integer"}}},
          "required": ["a"]}
    g = gc.schema_from_openai(js)
    assert g == {"type": "OBJECT", "properties": {
        "a": {"nullable": True, "type": "STRING", "description": "d"},
        "b": {"type": "ARRAY", "items": {"type": "INTEGER"}}}, "required": ["a"]}
    assert gc.schema_to_openai(g)["properties"]["b"] == {"type": "array",
                                                         "items": {"type": "integer"}}


def test_gemini_request_to_openai_matches_calls_by_name():
    doc = {"systemInstruction": {"parts": [{"text": "s1"}, {"text": "s2"}]},
           "contents": [
               {"role": "user", "parts": [{"text": "q"},
                                          {"inlineData": {"mimeType": "image/png", "data": "AA"}},
                                          {"fileData": {"mimeType": "image/png",
                                                        "fileUri": "gs://b/x.png"}}]},
               {"role": "model", "parts": [{"text": "thinking...", "thought": True},
                                           {"functionCall": {"name": "f", "args": {"i": 1}}},
                                           {"functionCall": {"name": "f", "args": {"i": 2}}}]},
               {"role": "user", "parts": [
                   {"functionResponse": {"name": "f", "response": {"r": 1}}},
                   {"functionResponse": {"name": "f", "response": {"r": 2}}}]}],
           "generationConfig": {"maxOutputTokens": 5, "topP": 0.5, "candidateCount": 1,
                                "stopSequences": ["S"], "responseMimeType": "application/json"},
           "tools": [{"functionDeclarations": [{"name": "f", "parameters": {
               "type": "OBJECT", "properties": {"i": {"type": "INTEGER"}}}}]}],
           "toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                                    "allowedFunctionNames": ["f"]}}}
    gc.validate(doc)
    b = gc.request_to_openai(doc, "pub")
    roles = [m["role"] for m in b["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assert b["messages"][0]["content"] == "s1\ns2"
    assert b["messages"][1]["content"][1]["image_url"]["url"] == "data:image/png;base64,AA"
    assert b["messages"][1]["content"][2]["image_url"]["url"] == "gs://b/x.png"
    ids = [c["id"] for c in b["messages"][2]["tool_calls"]]
    assert [b["messages"][3]["tool_call_id"], b["messages"][4]["tool_call_id"]] == ids
    assert json.loads(b["messages"][4]["content"]) == {"r": 2}
    assert b["max_tokens"] == 5 and b["top_p"] == 0.5 and b["stop"] == ["S"]
    assert b["response_format"] == {"type": "json_object"}
    assert b["tools"][0]["function"]["parameters"]["properties"]["i"]["type"] == "integer"
    assert b["tool_choice"] == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize("doc", [{}, {"contents": []}, {"contents": [{"parts": "x"}]},
                                 {"contents": [{"role": "system", "parts": []}]}])
def test_gemini_validation(doc):
    with pytest.raises(RelayError) as ei:
        gc.validate(doc)
    assert ei.value.status == 400


def test_openai_request_to_gemini():
    body = {"messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": "q"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c9", "type": "function",
                              "function": {"name": "look", "arguments": '{"a": 1}'}}]},
                         {"role": "tool", "tool_call_id": "c9", "content": "plain text"},
                         {"role": "user", "content": "more"}],
            "max_tokens": 20, "temperature": 0.1, "stop": "Z", "n": 2, "seed": 4,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {
                "type": "object", "properties": {"k": {"type": "string"}}}}},
            "tools": [{"type": "function", "function": {"name": "look"}}],
            "tool_choice": "required"}
    g = gc.request_from_openai(body)
    assert g["systemInstruction"] == {"parts": [{"text": "s"}]}
    assert [c["role"] for c in g["contents"]] == ["user", "model", "user"]
    assert g["contents"][1]["parts"] == [{"functionCall": {"name": "look", "args": {"a": 1}}}]
    assert g["contents"][2]["parts"] == [
        {"functionResponse": {"name": "look", "response": {"content": "plain text"}}},
        {"text": "more"}]
    cfg = g["generationConfig"]
    assert cfg["maxOutputTokens"] == 20 and cfg["stopSequences"] == ["Z"]
    assert cfg["candidateCount"] == 2 and cfg["seed"] == 4
    assert cfg["responseMimeType"] == "application/json"
    assert cfg["responseSchema"]["properties"]["k"] == {"type": "STRING"}
    assert g["tools"][0]["functionDeclarations"][0]["parameters"] == {"type": "OBJECT",
                                                                      "properties": {}}
    assert g["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


def test_gemini_answers_both_ways():
    resp = {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "why", "thought": True}, {"text": "A"}, {"text": "B"}]},
        "finishReason": "MAX_TOKENS"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2,
                          "thoughtsTokenCount": 3, "cachedContentTokenCount": 4}}
    o = gc.response_to_openai(resp, "pub")
    assert o["choices"][0]["message"]["content"] == "AB"
    assert o["choices"][0]["message"]["reasoning_content"] == "why"
    assert o["choices"][0]["finish_reason"] == "length"
    assert o["usage"]["prompt_tokens"] == 9 and o["usage"]["completion_tokens"] == 5
    assert gc.usage_from(resp["usageMetadata"]) == Usage(9, 5, 4)
    blocked = gc.response_to_openai({"promptFeedback": {"blockReason": "SAFETY"}}, "p")
    assert blocked["choices"][0]["finish_reason"] == "content_filter"
    calls = gc.response_to_openai({"candidates": [{"content": {"parts": [
        {"functionCall": {"name": "f", "args": {}}}]}, "finishReason": "STOP"}]}, "p")
    assert calls["choices"][0]["finish_reason"] == "tool_calls"
    back = gc.response_from_openai({"choices": [{"message": {
        "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        "pub")
    assert back["candidates"][0]["content"]["parts"] == [{"text": "hi"},
                                                         {"functionCall": {"name": "f", "args": {}}}]
    assert back["candidates"][0]["finishReason"] == "STOP"
    assert back["usageMetadata"] == {"promptTokenCount": 3, "candidatesTokenCount": 1,
                                     "totalTokenCount": 4}


# ---- Gemini streams ----------------------------------------------------------------
def test_gemini_stream_to_chunks():
    conv = StreamToChunks("pub")
    a = conv.feed({"candidates": [{"content": {"parts": [{"text": "He"}]}}],
                   "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1}})
    b = conv.feed({"candidates": [{"content": {"parts": [
        {"functionCall": {"name": "f", "args": {"q": 1}}}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 4}})
    assert a[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert a[1]["choices"][0]["delta"] == {"content": "He"}
    tc = b[0]["choices"][0]["delta"]["tool_calls"][0]
    assert tc["index"] == 0 and json.loads(tc["function"]["arguments"]) == {"q": 1}
    assert b[1]["choices"][0]["finish_reason"] == "tool_calls"
    end = conv.finish()
    assert end[0]["choices"] == [] and end[0]["usage"]["completion_tokens"] == 4
    err = conv.feed({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}})
    assert "overloaded" in err[0]["error"]["message"] and err[0]["error"]["code"] == "UNAVAILABLE"


def test_chunks_to_gemini_stream_holds_tool_calls_until_complete():
    conv = ChunksToStream("pub")
    out = conv.feed(chunk("c", "m", {"content": "x"}))
    assert out[0]["candidates"][0]["content"]["parts"] == [{"text": "x"}]
    assert conv.feed(chunk("c", "m", {"tool_calls": [{"index": 0, "function": {
        "name": "f", "arguments": '{"a"'}}]})) == []
    conv.feed(chunk("c", "m", {"tool_calls": [{"index": 0, "function": {"arguments": ":2}"}}]}))
    conv.feed(chunk("c", "m", {}, "tool_calls"))
    conv.feed({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    last = conv.finish()[0]
    assert last["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "f", "args": {"a": 2}}}]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"]["totalTokenCount"] == 6


def test_gemini_writer_json_array_and_error():
    call = Call("r", "chat", "gemini", "pub", {}, upstream_model="pub")
    call.extra["sse"] = False
    w = gface.StreamWriter(call)
    out = w.write(Chunk(chunk("c", "m", {"content": "a"})))
    out += w.write(Chunk(chunk("c", "m", {"content": "b"})))
    out += w.error(503, "gone")
    arr = json.loads(out)
    assert [d.get("error", {}).get("status") for d in arr] == [None, None, "UNAVAILABLE"]
    w2 = gface.StreamWriter(call)
    assert json.loads(w2.finish())[0]["candidates"][0]["finishReason"] == "STOP"
    # A Gemini upstream's own SSE event becomes an array element unchanged.
    w3 = gface.StreamWriter(call)
    raw = b'data: {"candidates": [], "modelVersion": "pub"}\r\n\r\n'
    assert json.loads(w3.write(Chunk(None, raw)) + w3.finish()) == [
        {"candidates": [], "modelVersion": "pub"}]


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


# ---- embeddings --------------------------------------------------------------------
def test_embeddings_both_ways():
    b = ge.request_to_openai({"requests": [
        {"content": {"parts": [{"text": "a"}, {"text": "b"}]}, "outputDimensionality": 4},
        {"content": {"parts": [{"text": "c"}]}}]}, "batchEmbedContents", "pub")
    assert b == {"model": "pub", "input": ["ab", "c"], "dimensions": 4}
    g = ge.request_from_openai({"input": "x", "dimensions": 3}, "up")
    assert g == {"requests": [{"model": "models/up", "content": {"parts": [{"text": "x"}]},
                               "outputDimensionality": 3}]}
    with pytest.raises(RelayError):
        ge.request_from_openai({"input": [[1, 2, 3]]}, "up")
    answer = {"embeddings": [{"values": [0.5, -1.0]}, {"values": [0.25, 2.0]}]}
    o = ge.response_to_openai(answer, "pub", "base64", 7)
    assert o["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert ge.response_from_openai(o, "batchEmbedContents") == answer
    single = ge.response_from_openai(ge.response_to_openai({"embedding": {"values": [1.0]}},
                                                           "p", None, 1), "embedContent")
    assert single == {"embedding": {"values": [1.0]}}
    with pytest.raises(RelayError):
        ge.requests_of({"requests": []}, "batchEmbedContents")
