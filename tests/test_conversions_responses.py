"""relay/convert/responses*.py as pure functions: the parts the end-to-end
tests do not reach one by one (namespaced tools, merged assistant turns,
allowed_tools, images, refusals of what a chat channel cannot carry)."""
from __future__ import annotations

import json

from relay.convert import responses as conv
from relay.convert.responses_stream import ChunksToEvents, EventsToChunks
from relay.convert.responses_upstream import request_from_chat


def test_items_become_one_chat_conversation():
    doc = {"model": "m", "instructions": "sys", "input": [
        {"role": "developer", "content": "dev"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                              "text": "Calling."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "close_agent", "namespace": "ma",
         "arguments": "{\"id\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "two"}]}]}
    b = conv.request_to_chat(doc)
    msgs = b.body["messages"]
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert msgs[2]["content"][1] == {"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AA", "detail": "low"}}
    assert msgs[3]["content"] == "Calling."
    assert [c["function"]["name"] for c in msgs[3]["tool_calls"]] == ["f", "ma__close_agent"]
    assert msgs[5]["content"] == "two" and b.problems == []


def test_namespaced_tools_flatten_and_come_back():
    doc = {"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ma", "tools": [
        {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
        {"type": "web_search"}], "tool_choice": {"type": "allowed_tools", "mode": "required",
                                                  "tools": [{"type": "function",
                                                             "name": "ma__spawn"}]}}
    b = conv.request_to_chat(doc)
    assert [t["function"]["name"] for t in b.body["tools"]] == ["ma__spawn"]
    assert b.body["tool_choice"] == "required"
    assert b.problems == ["hosted tool 'web_search'"]
    item = conv.call_item("c", "ma__spawn", "{}", b.names)
    assert (item["namespace"], item["name"]) == ("ma", "spawn")


def test_stream_events_are_numbered_and_closed_in_order():
    shell = conv.response_shell({"model": "m"}, "resp_1", "m")
    c = ChunksToEvents(shell, {})
    evs = []
    for delta in ({"reasoning_content": "hmm"}, {"content": "Hi"}, {"content": "!"},
                  {"tool_calls": [{"index": 0, "id": "call_1", "function": {
                      "name": "f", "arguments": "{\"a\""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}):
        evs += c.feed({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    evs += c.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    evs += c.end()
    names = [n for n, _ in evs]
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    assert names.count("response.output_item.added") == names.count(
        "response.output_item.done") == 3
    final = evs[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hi!"
    assert json.loads(final["output"][2]["arguments"]) == {"a": 1}
    assert final["usage"]["input_tokens"] == 5 and final["status"] == "completed"


def test_length_finish_is_incomplete_and_errors_fail():
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "r", "m"), {})
    c.feed({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}]})
    name, doc = c.end()[-1]
    assert name == "response.incomplete"
    assert doc["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "r", "m"), {})
    c.feed({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
    name, doc = c.fail("boom")[-1]
    assert name == "response.failed" and doc["response"]["error"]["message"] == "boom"
    assert c.end() == []


def test_chat_request_to_responses_and_back():
    body = {"model": "m", "stream": True, "max_tokens": 9, "reasoning_effort": "high",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c", "type": "function",
                              "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "response_format": {"type": "json_object"}}
    req = request_from_chat(body, "up")
    assert req["instructions"] == "s" and req["store"] is False
    assert [i["type"] for i in req["input"]] == ["message", "function_call",
                                                 "function_call_output"]
    assert req["reasoning"] == {"effort": "high"} and req["max_output_tokens"] == 9
    assert req["text"] == {"format": {"type": "json_object"}}
    e = EventsToChunks("m")
    out = e.feed({"type": "response.output_item.added", "output_index": 1,
                  "item": {"type": "function_call", "call_id": "c9", "name": "f"}})
    out += e.feed({"type": "response.function_call_arguments.delta", "output_index": 1,
                   "delta": "{}"})
    out += e.feed({"type": "response.completed", "response": {"usage": {
        "input_tokens": 4, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 1},
        "output_tokens_details": {"reasoning_tokens": 1}}}})
    assert out[0]["choices"][0]["delta"]["tool_calls"][0]["id"] == "c9"
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    assert (e.usage.prompt_tokens, e.usage.completion_tokens, e.usage.cached_tokens) == (4, 2, 1)
