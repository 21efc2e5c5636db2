"""Custom (freeform) tools through POST /v1/responses, with the official
openai SDK over real HTTP: Codex's apply_patch tool (a lark grammar) bridged
to chat-only OpenAI, Anthropic and Gemini channels as a function taking one
string, its calls coming back as custom_tool_call items (whole and streamed
as response.custom_tool_call_input.delta/.done), the second turn's
custom_tool_call and custom_tool_call_output reaching the upstream in its
own format; passed through untouched to a channel that speaks Responses.
Billing is checked to the unit after every call."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import requests
from openai.types.responses import (ResponseCustomToolCall, ResponseCustomToolCallInputDeltaEvent,
                                    ResponseCustomToolCallInputDoneEvent)

from tests.relay.faces.test_responses import (BRIDGES, check, client, env, post,  # noqa: F401 (env: fixture)
                                  streamed)

# Codex CLI 0.169's apply_patch tool for gpt-5.5, as it sends it.
LARK = ('start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\n\nhunk: add_hunk | delete_hunk | update_hunk\n'
        'add_hunk: "*** Add File: " filename LF add_line+\n'
        'delete_hunk: "*** Delete File: " filename LF\n'
        'update_hunk: "*** Update File: " filename LF change_move? change?\n\n'
        'filename: /(.+)/\nadd_line: "+" /(.*)/ LF -> line\n\n%import common.LF\n')
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "The `apply_patch` tool can be used to edit files. This is a "
                              "FREEFORM tool, so do not wrap the patch in JSON.",
               "format": {"type": "grammar", "syntax": "lark", "definition": LARK}}
PATCH = ('*** Begin Patch\n*** Add File: hello.txt\n+Hello, "custom" tool\n'
         '+second line\n*** End Patch\n')
RESULT = "Success. Updated the following files:\nA hello.txt\n"


@contextmanager
def patching(fake):
    """The fake model calls apply_patch with PATCH (the JSON its tool asks for)."""
    fake.tool_plan = {"name": "apply_patch", "input": {"input": PATCH}}
    try:
        yield
    finally:
        fake.tool_plan = None


def start(env, model: str):
    """(channel kind, usage counts, its fake, a new key, a client with it)."""
    kind, counts = BRIDGES[model]
    tok = env.token()
    return kind, counts, env.fakes[kind], tok, client(env, tok)


def offered(kind: str, body: dict) -> tuple[str, dict, str]:
    """(name, the `input` parameter's schema, description) of the one tool
    the upstream was offered, read from its own format."""
    if kind == "openai":
        fn = body["tools"][0]["function"]
        return fn["name"], fn["parameters"], fn.get("description", "")
    if kind == "anthropic":
        t = body["tools"][0]
        return t["name"], t["input_schema"], t.get("description", "")
    d = body["tools"][0]["functionDeclarations"][0]
    return d["name"], d["parameters"], d.get("description", "")


def last_exchange(kind: str, body: dict) -> tuple[str, dict, str | None, str]:
    """(tool name, arguments, call id or None, result text) of the tool call
    and result that end the conversation the upstream received."""
    if kind == "openai":
        call = body["messages"][-2]["tool_calls"][-1]
        res = body["messages"][-1]
        assert res["role"] == "tool" and res["tool_call_id"] == call["id"]
        return (call["function"]["name"], json.loads(call["function"]["arguments"]), call["id"],
                res["content"])
    if kind == "anthropic":
        use = [b for b in body["messages"][-2]["content"] if b["type"] == "tool_use"][-1]
        res = [b for b in body["messages"][-1]["content"] if b["type"] == "tool_result"][-1]
        assert res["tool_use_id"] == use["id"]
        text = res["content"] if isinstance(res["content"], str) else "".join(
            b.get("text", "") for b in res["content"])
        return use["name"], use["input"], use["id"], text
    fc = [p for p in body["contents"][-2]["parts"] if "functionCall" in p][-1]["functionCall"]
    fr = [p for p in body["contents"][-1]["parts"] if "functionResponse" in p][-1][
        "functionResponse"]
    assert fr["name"] == fc["name"]
    return fc["name"], fc["args"], None, fr["response"].get("content", json.dumps(fr["response"]))


@pytest.mark.parametrize("model", sorted(BRIDGES))
def test_bridge_custom_tool_whole_answer_and_second_turn(env, model):
    kind, counts, fake, tok, oc = start(env, model)
    with patching(fake):
        r = oc.responses.create(model=model, input="Add hello.txt", tools=[APPLY_PATCH],
                                tool_choice={"type": "custom", "name": "apply_patch"})
    name, schema, description = offered(kind, fake.requests[-1]["body"])
    assert name == "apply_patch" and description == APPLY_PATCH["description"]
    assert [k for k in schema["properties"]] == ["input"] and schema["required"] == ["input"]
    assert schema["properties"]["input"]["type"].lower() == "string"
    assert LARK in schema["properties"]["input"]["description"]
    calls = [o for o in r.output if o.type == "custom_tool_call"]
    assert len(calls) == 1 and isinstance(calls[0], ResponseCustomToolCall), r.output
    call = calls[0]
    assert call.name == "apply_patch" and call.input == PATCH and call.call_id
    assert call.id.startswith("ctc_") and not any(o.type == "function_call" for o in r.output)
    assert r.tools[0].type == "custom"  # the Response echoes the client's tools
    check(env, tok, counts)
    # Turn two, the whole conversation sent again (as Codex does, store=false).
    r2 = oc.responses.create(model=model, tools=[APPLY_PATCH], store=False, input=[
        {"role": "user", "content": "Add hello.txt"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch",
         "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": RESULT}])
    assert r2.output_text == "The tool returned: " + RESULT
    name, args, call_id, result = last_exchange(kind, fake.requests[-1]["body"])
    assert (name, args, result) == ("apply_patch", {"input": PATCH}, RESULT)
    assert call_id in (None, call.call_id)
    check(env, tok, counts, n=2)


@pytest.mark.parametrize("model", sorted(BRIDGES))
def test_bridge_custom_tool_streamed_and_continued_by_id(env, model):
    kind, counts, fake, tok, oc = start(env, model)
    with patching(fake):
        events, final = streamed(oc, model=model, input="Add hello.txt", tools=[APPLY_PATCH])
    kinds = [e.type for e in events]
    added = next(i for i, e in enumerate(events) if e.type == "response.output_item.added"
                 and e.item.type == "custom_tool_call")
    item = events[added].item
    assert item.name == "apply_patch" and item.input == "" and item.status == "in_progress"
    deltas = [e for e in events if e.type == "response.custom_tool_call_input.delta"]
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert all(isinstance(e, ResponseCustomToolCallInputDeltaEvent) for e in deltas)
    assert len(done) == 1 and isinstance(done[0], ResponseCustomToolCallInputDoneEvent)
    assert "".join(e.delta for e in deltas) == PATCH and done[0].input == PATCH
    assert {e.item_id for e in deltas + done} == {item.id}
    assert {e.output_index for e in deltas + done} == {events[added].output_index}
    closed = next(i for i, e in enumerate(events) if e.type == "response.output_item.done"
                  and e.item.id == item.id)
    assert added < kinds.index("response.custom_tool_call_input.delta") < kinds.index(
        "response.custom_tool_call_input.done") < closed
    assert events[closed].item.input == PATCH and events[closed].item.status == "completed"
    assert "response.function_call_arguments.delta" not in kinds
    call = next(o for o in final.output if o.type == "custom_tool_call")
    assert call.input == PATCH and call.call_id == item.call_id
    check(env, tok, counts)
    # Turn two by previous_response_id: the stored custom_tool_call is replayed.
    second = oc.responses.create(model=model, previous_response_id=final.id, tools=[APPLY_PATCH],
                                 input=[{"type": "custom_tool_call_output",
                                         "call_id": call.call_id,
                                         "output": [{"type": "input_text", "text": RESULT}]}])
    assert second.output_text == "The tool returned: " + RESULT
    name, args, call_id, result = last_exchange(kind, fake.requests[-1]["body"])
    assert (name, args, result) == ("apply_patch", {"input": PATCH}, RESULT)
    assert call_id in (None, call.call_id)
    check(env, tok, counts, n=2)


def test_passthrough_keeps_custom_tools_and_their_events(env):
    tok = env.token()
    oc = client(env, tok)
    raw = json.dumps({"model": "resp-model", "input": "Add hello.txt", "stream": True,
                      "tools": [APPLY_PATCH]}).encode()
    with patching(env.openai):
        r = requests.post(env.relay.url + "/v1/responses", data=raw, timeout=30,
                          headers={"Authorization": f"Bearer {tok['key']}",
                                   "Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        sent = env.openai.requests[-1]
        assert sent["path"] == "/v1/responses" and sent["raw"] == raw
        with oc.responses.stream(model="resp-model", input="Add hello.txt",
                                 tools=[APPLY_PATCH]) as s:
            kinds = [e.type for e in s]
            final = s.get_final_response()
    assert "event: response.custom_tool_call_input.delta" in r.text
    assert "response.custom_tool_call_input.done" in kinds
    call = next(o for o in final.output if o.type == "custom_tool_call")
    assert call.input == PATCH
    check(env, tok, (30, 6, 10), n=2)
    r = oc.responses.create(model="resp-model", tools=[APPLY_PATCH], input=[
        {"role": "user", "content": "Add hello.txt"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch",
         "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": RESULT}])
    assert r.output_text == "The tool returned: " + RESULT
    assert env.openai.requests[-1]["body"]["input"][1]["input"] == PATCH
    check(env, tok, (30, 6, 10), n=3)


def test_refusal_names_only_what_the_channel_cannot_run(env):
    """On a channel set to refuse hosted tools (`refuse_hosted_tools`; by
    default offered ones are left out)."""
    if "gemini-strict" not in env.models.values():
        env.channel("gemini", "gemini-strict", options={"refuse_hosted_tools": True})
        env.models["gemini-strict"] = "gemini-strict"
    tok = env.token()
    r = post(env, tok, {"model": "gemini-strict", "input": "x",
                        "tools": [APPLY_PATCH, {"type": "shell"}, {"type": "web_search"}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_tool" and err["param"] == "tools"
    assert "hosted tool 'web_search'" in err["message"]
    assert "OpenAI built-in tool 'shell'" in err["message"]
    assert "custom" not in err["message"] and "apply_patch" not in err["message"]
    # Refused once the channel was chosen, after the reservation: logged,
    # with the error, and free.
    [rec] = env.unbilled(tok["id"], records=1)
    assert rec["status"] == 400 and "cannot run" in rec["error"], rec


@pytest.mark.parametrize("model", ["resp-model", "anthropic-model"])
def test_bad_custom_items_get_openai_errors(env, model):
    tok = env.token()
    cases = [
        ([{"type": "custom_tool_call_output", "output": "x"}], "input[0].call_id"),
        ([{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": 5}],
         "input[0].input"),
    ]
    for items, param in cases:
        r = post(env, tok, {"model": model, "input": items, "tools": [APPLY_PATCH]})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "request id" in err["message"], err
    r = post(env, tok, {"model": model, "input": "x", "tools": [dict(APPLY_PATCH, format="lark")]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].format"
    env.unbilled(tok["id"])
