"""Pure tests of the Gemini converters (no sockets): OpenAI <-> Gemini
requests, answers, schemas, streams, writers and embeddings."""
from __future__ import annotations

import json

import pytest

from relay.adaptors.base import Call, Chunk
from relay.convert import gemini as gc
from relay.convert import gemini_embed as ge
from relay.convert.common import chunk
from relay.convert.gemini_stream import ChunksToStream, StreamToChunks
from relay.errors import RelayError
from relay.faces import gemini as gface
from relay.money.pricing import Usage
from tests.helpers import interleaved


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
    assert gc.usage_from(resp["usageMetadata"]) == Usage(9, 5, 4, reasoning_tokens=3)
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


def test_malformed_parts_are_400_not_500():
    # Where the conversion is made: when a channel of another format reads
    # the canonical body (a Gemini channel is sent the bytes as they are).
    bad = json.dumps({"contents": [{"parts": [{"inlineData": "x"}]}]}).encode()
    call = gface.parse("r", bad, "m", "generateContent", True)
    with pytest.raises(RelayError) as ei:
        call.body
    assert ei.value.status == 400


def test_unreadable_stream_event_is_value_error():
    from relay.adaptors.gemini import GeminiStream
    reader = GeminiStream(Call("r", "chat", "openai", "m", {}), passthrough=False)
    with pytest.raises(ValueError):
        reader.feed(b'data: {"candidates": [{"content": {"parts": ["not-a-part"]}}]}\n\n')


def test_int_enums_from_the_legacy_library():
    doc = {"contents": [{"parts": [{"text": "q"}]}],
           "tools": [{"functionDeclarations": [{"name": "f", "parameters": {
               "type": 6, "properties": {"n": {"type": 3}, "xs": {"type": 5, "items": {
                   "type": 1}}}}}]}],
           "toolConfig": {"functionCallingConfig": {"mode": 3}}}
    b = gc.request_to_openai(doc, "m")
    assert b["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {
        "n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "string"}}}}
    assert b["tool_choice"] == "none"


def test_tool_parameters_kept_by_their_text_and_bounded():
    from relay.convert import gemini_config
    gemini_config._converted.clear()
    schema = {"type": "object", "$schema": "x", "properties": {
        "path": {"type": ["string", "null"], "description": "where"}}, "required": ["path"]}
    first = gc.tool_schema(gc.schema_from_openai, schema)
    assert first == gc.schema_from_openai(schema)
    # the next call's schema is another object with the same text: the same answer
    assert gc.tool_schema(gc.schema_from_openai, json.loads(json.dumps(schema))) is first
    # another text, another answer (key order is part of the text, and of the answer)
    reordered = {"required": ["path"], **schema}
    assert list(gc.tool_schema(gc.schema_from_openai, reordered)) == ["required", "type", "properties"]
    assert gc.tool_schema(gc.schema_from_openai, {**schema, "required": []}) is not first
    # a schema past the bound is converted each time, and not kept
    big = {"type": "object", "description": "d" * gemini_config._CACHED_BELOW}
    assert gc.tool_schema(gc.schema_from_openai, big) == gc.schema_from_openai(big)
    assert gc.tool_schema(gc.schema_from_openai, big) is not gc.tool_schema(gc.schema_from_openai, big)
    # what orjson will not write (an int past 64 bits) is kept by json's text
    huge = {"type": "integer", "maximum": 2 ** 70}
    assert gc.tool_schema(gc.schema_from_openai, huge) == {"type": "INTEGER", "maximum": 2 ** 70}
    # the texts kept never pass the cache's size in bytes
    for n in range(3000):
        gc.tool_schema(gc.schema_from_openai, {"type": "object", "description": f"{n:04d}" + "x" * 1000})
    assert gemini_config._converted.currsize <= gemini_config._converted.maxsize
    assert len(gemini_config._converted) < 3000
    # each way keeps its own answers
    back = {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}}
    assert gc.tool_schema(gc.schema_to_openai, back) == gc.schema_to_openai(back)
    assert gc.tool_schema(gc.schema_from_openai, back) == gc.schema_from_openai(back)


def test_tool_schemas_kept_from_several_threads():
    """A Gemini countTokens or a cut stream's estimate converts off the loop
    (relay/money/tokenizer.off_loop) while the loop converts other calls:
    the schemas kept are shared by both threads, and stay whole."""
    from relay.convert import gemini_config
    errors = []

    def convert(n):
        try:
            for i in range(400):
                schema = {"type": "object", "description": f"{n}-{i % 50}-" + "x" * 9000}
                assert gc.tool_schema(gc.schema_from_openai, schema)["description"] \
                    == schema["description"]
        except Exception as exc:  # noqa: BLE001 - what a broken cache raises
            errors.append(repr(exc))

    interleaved(convert, [(n,) for n in range(6)])
    assert errors == []
    cache = gemini_config._converted
    assert cache.currsize == sum(kept[0] for kept in cache.values()) <= cache.maxsize
