"""relay/convert/responses*.py as pure functions: the parts the end-to-end
tests do not reach one by one (namespaced tools, merged assistant turns,
allowed_tools, images, refusals of what a chat channel cannot carry, custom
(freeform) tools both ways)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from openai.types.responses import (ResponseCustomToolCall, ResponseCustomToolCallInputDeltaEvent,
                                    ResponseCustomToolCallInputDoneEvent)

from relay.adaptors.base import Call, refuse_unbridgeable
from relay.convert import responses as conv
from relay.convert.responses_stream import ChunksToEvents, EventsToChunks
from relay.convert.responses_tools import ToolNames, call_item
from relay.convert.responses_upstream import request_from_chat
from relay.errors import RelayError


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
    item = call_item("c", "ma__spawn", "{}", b.names)
    assert (item["namespace"], item["name"]) == ("ma", "spawn")


def test_stream_events_are_numbered_and_closed_in_order():
    shell = conv.response_shell({"model": "m"}, "resp_1", "m")
    c = ChunksToEvents(shell, ToolNames())
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
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "r", "m"), ToolNames())
    c.feed({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}]})
    name, doc = c.end()[-1]
    assert name == "response.incomplete"
    assert doc["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "r", "m"), ToolNames())
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


# ---- custom (freeform) tools on the bridge ----------------------------------
# Codex's freeform apply_patch tool, as Codex 0.169 sends it for gpt-5.5.
LARK = ('start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\n%import common.LF\n')
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Use `apply_patch` to edit files. This is a FREEFORM tool.",
               "format": {"type": "grammar", "syntax": "lark", "definition": LARK}}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi \"there\"\n*** End Patch\n"


def test_custom_tool_becomes_a_function_taking_one_string():
    doc = {"model": "m", "input": "x", "tools": [
        APPLY_PATCH, {"type": "custom", "name": "note"},
        {"type": "custom", "name": "sql", "format": {"type": "grammar", "syntax": "regex",
                                                     "definition": "SELECT .+"}},
        {"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "custom", "name": "apply_patch"}}
    b = conv.request_to_chat(doc)
    assert b.problems == []
    fns = {t["function"]["name"]: t["function"] for t in b.body["tools"]}
    assert list(fns) == ["apply_patch", "note", "sql", "f"]
    ap = fns["apply_patch"]
    assert ap["description"] == APPLY_PATCH["description"]
    params = ap["parameters"]
    assert params["type"] == "object" and params["required"] == ["input"]
    assert params["additionalProperties"] is False and list(params["properties"]) == ["input"]
    hint = params["properties"]["input"]["description"]
    assert params["properties"]["input"]["type"] == "string"
    assert "lark" in hint and LARK in hint  # the grammar, whole, for the model to follow
    assert "regex" in fns["sql"]["parameters"]["properties"]["input"]["description"]
    assert "SELECT .+" in fns["sql"]["parameters"]["properties"]["input"]["description"]
    assert "description" not in fns["note"]
    assert fns["f"]["parameters"] == {"type": "object"}
    assert b.body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert b.names.custom == {"apply_patch", "note", "sql"}


def test_a_huge_grammar_is_cut_and_says_so():
    big = dict(APPLY_PATCH, format={"type": "grammar", "syntax": "lark",
                                    "definition": "rule: " + "x" * 200_000})
    hint = conv.request_to_chat({"model": "m", "input": "x", "tools": [big]}).body[
        "tools"][0]["function"]["parameters"]["properties"]["input"]["description"]
    assert len(hint) < 20_000 and "truncated" in hint


def test_custom_tools_in_a_namespace_come_back_named_and_custom():
    doc = {"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ed", "tools": [
        dict(APPLY_PATCH), {"type": "function", "name": "ls"}]}]}
    b = conv.request_to_chat(doc)
    assert [t["function"]["name"] for t in b.body["tools"]] == ["ed__apply_patch", "ed__ls"]
    item = call_item("c1", "ed__apply_patch", json.dumps({"input": PATCH}), b.names)
    assert item["type"] == "custom_tool_call" and item["namespace"] == "ed"
    assert item["name"] == "apply_patch" and item["input"] == PATCH
    assert call_item("c2", "ed__ls", "{}", b.names)["type"] == "function_call"


def test_custom_tool_items_become_chat_calls_and_results():
    doc = {"model": "m", "tools": [APPLY_PATCH], "input": [
        {"type": "message", "role": "user", "content": "Add a.txt"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch",
         "input": PATCH},
        {"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done."},
        {"type": "function_call_output", "call_id": "call_2", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch",
         "namespace": "ed", "input": ""},
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": [
            {"type": "input_text", "text": "Also "}, {"type": "input_text", "text": "done."}]}]}
    b = conv.request_to_chat(doc)
    msgs = b.body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant",
                                         "tool"]
    calls = msgs[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1", "call_2"]
    assert calls[0]["function"]["name"] == "apply_patch"
    assert json.loads(calls[0]["function"]["arguments"]) == {"input": PATCH}
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "content": "Done."}
    assert msgs[4]["tool_calls"][0]["function"]["name"] == "ed__apply_patch"
    assert json.loads(msgs[4]["tool_calls"][0]["function"]["arguments"]) == {"input": ""}
    assert msgs[5]["content"] == "Also done." and b.problems == []


def test_custom_tool_items_are_validated():
    for item, param in (
            ({"type": "custom_tool_call_output", "output": "x"}, "input[0].call_id"),
            ({"type": "custom_tool_call", "call_id": "c", "name": "n", "input": 5},
             "input[0].input"),
            ({"type": "custom_tool_call", "call_id": "c", "input": "x"}, "input[0].name")):
        with pytest.raises(RelayError) as got:
            conv.validate({"model": "m", "input": [item]})
        assert got.value.status == 400 and got.value.param == param, item


def test_a_message_whose_content_is_neither_text_nor_parts_is_refused():
    """OpenAI refuses it; the bridge read an object's keys as parts and sent
    the model an empty turn, billed as an answer to it."""
    for content in ({"type": "input_text", "text": "hi"}, 5, True):
        for item in ({"type": "message", "role": "user", "content": content},
                     {"role": "user", "content": content}):
            with pytest.raises(RelayError) as got:
                conv.validate({"model": "m", "input": [{"role": "user", "content": "a"}, item]})
            assert got.value.status == 400 and got.value.param == "input[1].content", item
            assert "expected one of a string or an array" in got.value.message
    for content in ("hi", [{"type": "input_text", "text": "hi"}], []):
        conv.validate({"model": "m", "input": [{"role": "user", "content": content}]})


def test_whole_answer_calls_a_custom_tool_with_its_raw_input():
    b = conv.request_to_chat({"model": "m", "input": "x", "tools": [
        APPLY_PATCH, {"type": "function", "name": "f"}]})
    completion = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {
                "name": "apply_patch", "arguments": json.dumps({"input": PATCH})}},
            {"id": "call_b", "type": "function", "function": {
                "name": "apply_patch", "arguments": "*** Begin Patch (not JSON)"}},
            {"id": "call_c", "type": "function", "function": {
                "name": "f", "arguments": "{\"a\":1}"}}]}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 4}}
    shell = conv.response_shell({"model": "m"}, "resp_1", "m")
    out = conv.response_from_chat(completion, shell, b.names)["output"]
    assert [o["type"] for o in out] == ["custom_tool_call", "custom_tool_call", "function_call"]
    first = out[0]
    assert first["id"].startswith("ctc_") and first["status"] == "completed"
    assert (first["call_id"], first["name"], first["input"]) == ("call_a", "apply_patch", PATCH)
    assert "arguments" not in first
    assert out[1]["input"] == "*** Begin Patch (not JSON)"  # passed on as the model wrote it
    assert out[2]["arguments"] == "{\"a\":1}"
    assert ResponseCustomToolCall.model_validate(first).input == PATCH


def test_streamed_custom_call_is_buffered_and_sent_unwrapped_at_close():
    b = conv.request_to_chat({"model": "m", "input": "x", "tools": [
        APPLY_PATCH, {"type": "function", "name": "f"}]})
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "resp_1", "m"), b.names)
    wrapped = json.dumps({"input": PATCH})
    evs = []
    pieces = [wrapped[:5], wrapped[5:17], wrapped[17:]]
    evs += c.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "apply_patch", "arguments": ""}}]}, "finish_reason": None}]})
    for p in pieces:
        evs += c.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "function": {"arguments": p}}]}, "finish_reason": None}]})
    evs += c.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 1, "id": "call_2", "function": {"name": "f", "arguments": "{}"}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    evs += c.end()
    names = [n for n, _ in evs]
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert names == ["response.created", "response.in_progress",
                     "response.output_item.added",
                     "response.custom_tool_call_input.delta",
                     "response.custom_tool_call_input.done",
                     "response.output_item.done",
                     "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, delta, done, item_done = (d for _, d in evs[2:6])
    item = added["item"]
    assert (item["type"], item["status"], item["input"], item["call_id"], item["name"]) == (
        "custom_tool_call", "in_progress", "", "call_1", "apply_patch")
    assert item["id"].startswith("ctc_")
    assert delta == {"type": "response.custom_tool_call_input.delta",
                     "sequence_number": 3, "item_id": item["id"], "output_index": 0,
                     "delta": PATCH}
    assert done == {"type": "response.custom_tool_call_input.done", "sequence_number": 4,
                    "item_id": item["id"], "output_index": 0, "input": PATCH}
    assert item_done["item"] == dict(item, status="completed", input=PATCH)
    final = evs[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["custom_tool_call", "function_call"]
    assert final["output"][0]["input"] == PATCH
    # The SDK's own event types parse them.
    assert ResponseCustomToolCallInputDeltaEvent.model_validate(delta).delta == PATCH
    assert ResponseCustomToolCallInputDoneEvent.model_validate(done).input == PATCH


def test_streamed_custom_call_with_no_input_has_no_delta():
    b = conv.request_to_chat({"model": "m", "input": "x", "tools": [APPLY_PATCH]})
    c = ChunksToEvents(conv.response_shell({"model": "m"}, "r", "m"), b.names)
    evs = c.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "id": "call_1", "function": {"name": "apply_patch"}}]},
        "finish_reason": "tool_calls"}]}) + c.end()
    names = [n for n, _ in evs]
    assert "response.custom_tool_call_input.delta" not in names
    done = next(d for n, d in evs if n == "response.custom_tool_call_input.done")
    assert done["input"] == ""


def test_only_truly_hosted_tools_are_called_hosted():
    doc = {"model": "m", "input": "x", "tools": [
        APPLY_PATCH, {"type": "web_search"}, {"type": "file_search", "vector_store_ids": []},
        {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"},
        {"type": "mcp", "server_label": "s"}, {"type": "computer_use_preview"},
        {"type": "shell"}, {"type": "local_shell"}, {"type": "apply_patch"},
        {"type": "tool_search", "execution": "client"}]}
    b = conv.request_to_chat(doc)
    assert [t["function"]["name"] for t in b.body["tools"]] == ["apply_patch"]
    hosted = [p for p in b.problems if p.startswith("hosted tool")]
    assert hosted == ["hosted tool 'web_search'", "hosted tool 'file_search'",
                      "hosted tool 'code_interpreter'", "hosted tool 'image_generation'",
                      "hosted tool 'mcp'", "hosted tool 'computer_use_preview'"]
    rest = [p for p in b.problems if not p.startswith("hosted tool")]
    assert rest == ["OpenAI built-in tool 'shell'", "OpenAI built-in tool 'local_shell'",
                    "OpenAI built-in tool 'apply_patch'", "OpenAI built-in tool 'tool_search'"]
    assert not any("custom" in p for p in b.problems)


def test_offered_tools_are_left_out_and_the_channel_option_refuses_them():
    b = conv.request_to_chat({"model": "m", "input": "x", "tools": [
        APPLY_PATCH, {"type": "web_search"}, {"type": "shell"}]})
    call = Call(request_id="r1", endpoint="responses", face="responses", model="m",
                body=b.body, extra={"bridge": b})
    # Offered only: the model on a chat channel cannot call them, and is not offered them.
    refuse_unbridgeable(call, SimpleNamespace(options={}))
    assert [t["function"]["name"] for t in b.body["tools"]] == ["apply_patch"]
    with pytest.raises(RelayError) as got:
        refuse_unbridgeable(call, SimpleNamespace(options={"refuse_hosted_tools": True}))
    exc = got.value
    assert exc.status == 400 and exc.code == "unsupported_tool" and exc.param == "tools"
    assert "hosted tool 'web_search'" in exc.message
    assert "OpenAI built-in tool 'shell'" in exc.message
    assert "custom" not in exc.message and "apply_patch" not in exc.message


def test_a_tool_choice_forcing_a_hosted_tool_is_refused_unless_dropped():
    b = conv.request_to_chat({"model": "m", "input": "x", "tools": [{"type": "web_search"}],
                              "tool_choice": {"type": "web_search"}})
    call = Call(request_id="r1", endpoint="responses", face="responses", model="m",
                body=b.body, extra={"bridge": b})
    with pytest.raises(RelayError) as got:
        refuse_unbridgeable(call, SimpleNamespace(options={}))
    assert got.value.code == "unsupported_tool" and "tool_choice 'web_search'" in got.value.message
    refuse_unbridgeable(call, SimpleNamespace(options={"drop_hosted_tools": True}))
