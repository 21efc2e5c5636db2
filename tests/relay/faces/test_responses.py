"""POST /v1/responses with the official openai SDK (create, stream, function
calling) against every kind of channel: passed through to a channel that
speaks Responses, bridged to chat-only OpenAI, Anthropic and Gemini
channels; stored responses and previous_response_id; billing to the unit."""
from __future__ import annotations

import json
import time

import openai
import pytest
import requests

from tests.helpers import USER_PASSWORD, Api
from tests.vendor_env import Env, expected_units

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]
# (public model, fake, what the fake counts for one plain answer: prompt, completion, cached)
BRIDGES = {"chatonly-model": ("openai", (10, 3, 0)), "anthropic-model": ("anthropic", (25, 7, 4)),
           "gemini-model": ("gemini", (12, 5, 3))}


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("openai", "resp-model")  # unmapped: bytes pass untouched
    e.channel("openai", "chatonly-model", mode="chatonly", options={"wire_api": "chat"})
    # A reasoning model behind a chat-only channel: it takes reasoning_effort.
    e.channel("openai", "chatonly-reasoner", mode="chatonly", upstream="o4-mini",
              options={"wire_api": "chat"})
    e.channel("openai", "responsesonly-model", mode="responsesonly",
              options={"wire_api": "responses"})
    yield e
    e.stop()


def client(env, tok) -> openai.OpenAI:
    return openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)


def post(env, tok, body, path="/v1/responses", **kw):
    return requests.post(env.relay.url + path, json=body, timeout=30,
                         headers={"Authorization": f"Bearer {tok['key']}"}, **kw)


def streamed(oc: openai.OpenAI, **kw) -> tuple[list, object]:
    """client.responses.stream(**kw) -> (its events, the final Response),
    the events framed as OpenAI frames them."""
    with oc.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, final


def check(env, tok, counts, n=1):
    prompt, completion, cached = counts
    return env.check_billed(tok, prompt, completion, cached, n=n)


# ---- pass-through -------------------------------------------------------------
def test_passthrough_create_and_stream(env):
    tok = env.token()
    oc = client(env, tok)
    r = oc.responses.create(model="resp-model", input="Hello", instructions="Be brief.")
    assert r.output_text == "Hello from the fake Responses upstream."
    assert r.model == "resp-model" and r.usage.input_tokens == 30
    sent = env.openai.requests[-1]
    assert sent["path"] == "/v1/responses" and sent["body"]["instructions"] == "Be brief."
    rec = check(env, tok, (30, 6, 10))
    assert rec["endpoint"] == "responses"

    with oc.responses.stream(model="openai-model", input="Hi", tools=TOOLS,
                             metadata={"fake_reasoning": "1"}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert env.openai.requests[-1]["body"]["model"] == "openai-upstream-model"
    assert final.model == "openai-model"  # the mapped name is renamed back
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    check(env, tok, (30, 6, 10), n=2)
    # The second turn sends the tool's output back; the fake answers with it.
    r = oc.responses.create(model="resp-model", input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21C"}],
        tools=TOOLS)
    assert r.output_text == "The tool returned: Sunny, 21C"


def test_passthrough_bytes_untouched(env):
    tok = env.token()
    raw = b'{"model":"resp-model","input":"Hi",  "stream":true, "store":false}'
    r = requests.post(env.relay.url + "/v1/responses", data=raw, timeout=30,
                      headers={"Authorization": f"Bearer {tok['key']}",
                               "Content-Type": "application/json"})
    assert r.status_code == 200
    assert env.openai.requests[-1]["raw"] == raw
    events = [ln for ln in r.text.split("\n") if ln.startswith("event: ")]
    assert events[0] == "event: response.created" and events[-1] == "event: response.completed"
    check(env, tok, (30, 6, 10))


@pytest.mark.parametrize("fail,status,counts,estimated", [
    ("incomplete", "incomplete", (30, 6, 10), False),
    ("failed", "failed", (30, 6, 10), False)])
def test_passthrough_final_events_billed(env, fail, status, counts, estimated):
    tok = env.token()
    r = post(env, tok, {"model": "resp-model", "input": "Hi", "stream": True,
                        "metadata": {"fake_fail": fail, "fake_usage": "40,8,12,3"}})
    assert f"event: response.{status}" in r.text
    rec = check(env, tok, (40, 12, 8))
    assert rec["status"] == 200


def test_passthrough_cut_mid_stream_is_estimated(env):
    tok = env.token()
    r = post(env, tok, {"model": "resp-model", "input": "Hi there", "stream": True,
                        "metadata": {"fake_fail": "cut"}})
    assert "response.completed" not in r.text and "response.output_text.delta" in r.text, r.text[-1500:]
    rec = env.logs(tok["id"])[0]
    assert rec["estimated"] is True and rec["completion_tokens"] > 0
    assert rec["prompt_tokens"] > 0 and rec["quota"] == expected_units(
        rec["prompt_tokens"], rec["completion_tokens"])
    assert env.used(tok["id"]) == rec["quota"]


# ---- the bridge ---------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(BRIDGES))
def test_bridge_create(env, model):
    kind, counts = BRIDGES[model]
    tok = env.token()
    before = len(env.openai.requests)
    r = client(env, tok).responses.create(model=model, input="Hello", instructions="Be brief.",
                                          max_output_tokens=50)
    assert r.status == "completed" and r.output_text
    assert r.usage.input_tokens == counts[0] and r.usage.output_tokens == counts[1]
    assert r.id.startswith("resp_") and r.model == model
    if kind == "openai":
        sent = env.openai.requests[-1]
        assert sent["path"].endswith("/chat/completions")
        assert sent["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
        assert sent["body"]["max_tokens"] == 50
        assert not any(q["path"].endswith("/responses") for q in env.openai.requests[before:])
    rec = check(env, tok, counts)
    assert rec["endpoint"] == "responses"


@pytest.mark.parametrize("model", sorted(BRIDGES))
def test_bridge_stream_function_call_round_trip(env, model):
    tok = env.token()
    oc = client(env, tok)
    events, final = streamed(oc, model=model, input="Weather in Paris?", tools=TOOLS,
                             parallel_tool_calls=False)
    kinds = [e.type for e in events]
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    assert "response.function_call_arguments.delta" in kinds
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    check(env, tok, BRIDGES[model][1])
    # Turn two, continued by previous_response_id (stored here by the bridge).
    with oc.responses.stream(model=model, previous_response_id=final.id, tools=TOOLS,
                             tool_choice="none", input=[{
                                 "type": "function_call_output", "call_id": calls[0].call_id,
                                 "output": "Sunny"}]) as s:
        text_events = [e for e in s if e.type == "response.output_text.delta"]
        second = s.get_final_response()
    assert text_events and second.output_text and second.previous_response_id == final.id
    check(env, tok, BRIDGES[model][1], n=2)


def test_bridge_carries_history_and_settings(env):
    """What the chat channel receives for a stored conversation continued by
    id, with json_schema output and reasoning effort (which only a reasoning
    model gets: OpenAI refuses it elsewhere, so it is dropped there)."""
    tok = env.token()
    oc = client(env, tok)
    first = oc.responses.create(model="chatonly-model", input="Remember: 42.",
                                instructions="You are terse.")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for model in ("chatonly-reasoner", "chatonly-model"):
        oc.responses.create(model=model, previous_response_id=first.id, input="Which?",
                            reasoning={"effort": "low"},
                            text={"format": {"type": "json_schema", "name": "n",
                                             "schema": schema, "strict": True}})
        body = env.openai.requests[-1]["body"]
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
        # instructions are not carried over
        assert body["messages"][1]["content"] == first.output_text
        assert body.get("reasoning_effort") == ("low" if model == "chatonly-reasoner" else None)
        assert body["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "n", "schema": schema, "strict": True}}


def test_stored_responses_retrieve_delete_and_ownership(env):
    tok, other = env.token(), env.token()
    oc = client(env, tok)
    for model in ("anthropic-model", "resp-model"):
        r = oc.responses.create(model=model, input="Keep this.")
        got = oc.responses.retrieve(r.id)
        assert got.id == r.id and got.output_text == r.output_text and got.model == model
        items = oc.responses.input_items.list(r.id)
        assert items.data[0].content[0].text == "Keep this."
        # another key of the same user: 404, for the id and as previous_response_id
        with pytest.raises(openai.NotFoundError):
            client(env, other).responses.retrieve(r.id)
        bad = post(env, other, {"model": model, "input": "x", "previous_response_id": r.id})
        assert bad.status_code == 404 and bad.json()["error"]["param"] == "previous_response_id"
        oc.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            oc.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        oc.responses.retrieve("resp_unknown")
    unstored = oc.responses.create(model="anthropic-model", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        oc.responses.retrieve(unstored.id)


def test_passthrough_follow_ups_go_to_the_serving_channel(env):
    tok = env.token()
    oc = client(env, tok)
    r = oc.responses.create(model="resp-model", input="One.")
    follow = oc.responses.create(model="resp-model", previous_response_id=r.id, input="Two.")
    assert follow.output_text.endswith(f"(continuing {r.id})")
    with pytest.raises(openai.BadRequestError):  # not a background response
        oc.responses.cancel(r.id)
    # background is refused (tests/relay/faces/test_responses_background.py): a
    # cancel forwarded upstream answers as OpenAI does for a finished response.


def test_chat_clients_reach_a_responses_only_channel(env):
    tok = env.token()
    oc = client(env, tok)
    r = oc.chat.completions.create(model="responsesonly-model", max_tokens=20, messages=[
        {"role": "system", "content": "sys"}, {"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content == "Hello from the fake Responses upstream."
    sent = env.openai.requests[-1]
    assert sent["path"] == "/mode/responsesonly/v1/responses"
    assert sent["body"]["instructions"] == "sys" and sent["body"]["store"] is False
    assert sent["body"]["max_output_tokens"] == 20
    check(env, tok, (30, 6, 10))
    stream = oc.chat.completions.create(
        model="responsesonly-model", stream=True, messages=[{"role": "user", "content": "Hi"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}])
    chunks = list(stream)
    calls = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather"
    args = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "tool_calls"
    check(env, tok, (30, 6, 10), n=2)


def test_anthropic_client_reaches_a_responses_only_channel(env):
    import anthropic
    tok = env.token()
    ac = anthropic.Anthropic(api_key=tok["key"], base_url=env.relay.url, max_retries=0)
    with ac.messages.stream(model="responsesonly-model", max_tokens=64,
                            messages=[{"role": "user", "content": "Hi"}]) as s:
        text = s.get_final_text()
    assert text == "Hello from the fake Responses upstream."
    check(env, tok, (30, 6, 10))


def test_compact_and_input_tokens(env):
    tok = env.token()
    inp = [{"role": "user", "content": "Build it."},
           {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}]
    r = post(env, tok, {"model": "resp-model", "input": inp}, "/v1/responses/compact")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "response.compaction" and doc["output"][-1]["type"] == "compaction"
    check(env, tok, (30, 6, 10))
    r = post(env, tok, {"model": "anthropic-model", "input": inp}, "/v1/responses/compact")
    assert r.status_code == 200, r.text
    out = r.json()["output"]
    assert out[0]["content"] == "Build it." and out[-1]["role"] == "user"
    assert out[-1]["content"][0]["text"]
    check(env, tok, BRIDGES["anthropic-model"][1], n=2)
    for model in ("resp-model", "anthropic-model"):
        r = post(env, tok, {"model": model, "input": inp}, "/v1/responses/input_tokens")
        assert r.status_code == 200 and r.json()["input_tokens"] > 0
        assert r.json()["object"] == "response.input_tokens"
    assert len(env.logs(tok["id"], 2)) == 2  # counting is not billed


TRIGGERED = [{"role": "user", "content": "Build it."},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
             {"type": "compaction_trigger"}]


def test_a_compaction_trigger_passes_through(env):
    tok = env.token()
    r = post(env, tok, {"model": "resp-model", "input": TRIGGERED, "store": False})
    assert r.status_code == 200, r.text
    assert [o["type"] for o in r.json()["output"]] == ["compaction"]
    assert env.openai.requests[-1]["body"]["input"][-1] == {"type": "compaction_trigger"}
    check(env, tok, (30, 6, 10))


@pytest.mark.parametrize("stream", [False, True])
def test_a_compaction_trigger_on_the_bridge_is_answered_as_compact_does(env, stream):
    """One compaction item carrying the model's summary (asked for as
    /v1/responses/compact asks, without tools); sent back in the next call,
    it reaches a chat channel as that summary."""
    tok = env.token()
    fake = env.anthropic
    body = {"model": "anthropic-model", "input": TRIGGERED, "tools": TOOLS, "store": False}
    if stream:
        oc = client(env, tok)
        events, final = streamed(oc, **{k: v for k, v in body.items()})
        items = [o.model_dump() for o in final.output]
        kinds = [e.type for e in events]
        assert "response.output_text.delta" not in kinds
        assert kinds[-3:] == ["response.output_item.added", "response.output_item.done",
                              "response.completed"]
    else:
        r = post(env, tok, body)
        assert r.status_code == 200, r.text
        items = r.json()["output"]
    assert [i["type"] for i in items] == ["compaction"]
    sent = fake.requests[-1]["body"]
    assert "tools" not in sent and "Summarise the conversation" in json.dumps(
        sent["messages"][-1])
    check(env, tok, BRIDGES["anthropic-model"][1])
    # The next turn starts from the compaction: the upstream reads its summary.
    r = post(env, tok, {"model": "anthropic-model", "store": False,
                        "input": [items[0], {"role": "user", "content": "Go on."}]})
    assert r.status_code == 200, r.text
    first = fake.requests[-1]["body"]["messages"][0]
    assert first["role"] == "user" and fake.text in json.dumps(first["content"])


# ---- bad input ----------------------------------------------------------------
@pytest.mark.parametrize("model", ["resp-model", "anthropic-model"])
def test_bad_input_gets_openai_errors(env, model):
    tok = env.token()
    cases = [
        ({"input": [{"type": "bogus_item"}]}, 400, "input[0].type"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "nope"}]},
         400, "tools[0].parameters"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, 400,
         "tools[0].name"),
        ({"input": "x", "previous_response_id": "resp_nobody"}, 404, "previous_response_id"),
        ({"input": 5}, 400, "input"),
    ]
    for body, status, param in cases:
        r = post(env, tok, dict(body, model=model))
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and "request id" in err["message"], err
    env.unbilled(tok["id"])


def test_hosted_tool_on_bridge_is_left_out_or_named(env):
    tok = env.token()
    # Offered: left out of the bridged call (the model there cannot call it).
    r = post(env, tok, {"model": "gemini-model", "input": "x",
                        "tools": [{"type": "web_search"}] + TOOLS})
    assert r.status_code == 200, r.text
    sent = env.gemini.requests[-1]["body"]
    assert "web_search" not in json.dumps(sent["tools"]) and "get_weather" in json.dumps(sent)
    # Forced by tool_choice: the client's 400, naming it.
    r = post(env, tok, {"model": "gemini-model", "input": "x", "tools": [{"type": "web_search"}],
                        "tool_choice": {"type": "web_search"}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "web_search" in err["message"] and err["code"] == "unsupported_tool"
    # On a channel that speaks Responses the same request is the upstream's to run.
    assert post(env, tok, {"model": "resp-model", "input": "x",
                           "tools": [{"type": "web_search"}]}).status_code == 200


def test_stored_responses_go_with_their_key_and_owner(env, relay, admin):
    from pymongo import MongoClient
    db = MongoClient(relay.mongo_url)[relay.db_name]
    tok, tok2 = env.token(), env.token()
    for t in (tok, tok2):
        client(env, t).responses.create(model="anthropic-model", input="Keep.")
        client(env, t).responses.create(model="resp-model", input="Keep.")
    assert db.responses.count_documents({"token_id": tok["id"]}) == 2
    env.user_api.delete(f"/api/token/{tok['id']}")
    assert db.responses.count_documents({"token_id": tok["id"]}) == 0
    assert db.responses.count_documents({"token_id": tok2["id"]}) == 2
    owner = admin.create_user("gone" + tok2["key"][-6:].lower(), quota=10 ** 9)
    api = Api.login(relay.url, owner["username"], USER_PASSWORD)
    t3 = api.create_token(name="k", remain_quota=10 ** 8)
    client(env, t3).responses.create(model="anthropic-model", input="Keep.")
    assert db.responses.count_documents({"user_id": owner["id"]}) == 1
    admin.delete(f"/api/user/{owner['id']}")
    assert db.responses.count_documents({"user_id": owner["id"]}) == 0
    assert db.responses.count_documents({"token_id": tok2["id"]}) == 2


@pytest.mark.parametrize("kind,model", [("openai", "resp-slow"), ("anthropic", "claude-slow-r")])
def test_client_gone_mid_stream_is_billed_for_what_streamed(env, kind, model):
    """Passed through or bridged: the part that streamed is billed, estimated."""
    env.channel(kind, model, mode="slow")
    tok = env.token()
    r = post(env, tok, {"model": model, "input": "hi", "stream": True}, stream=True)
    seen = []
    for line in r.iter_lines():
        if line.startswith(b"event: "):
            seen.append(line[7:].decode())
        if "response.output_text.delta" in seen:
            break
    r.close()  # the client goes away before response.completed
    rec = env.logs(tok["id"])[-1]
    assert rec["status"] == 499 and rec["estimated"] is True, rec
    assert rec["completion_tokens"] >= 1 and rec["prompt_tokens"] > 0
    assert rec["quota"] == expected_units(rec["prompt_tokens"], rec["completion_tokens"],
                                          rec["cached_tokens"])
    deadline = time.monotonic() + 10
    while not env.fakes[kind].requests[-1].get("aborted"):
        assert time.monotonic() < deadline, "the upstream call was not cancelled"
        time.sleep(0.1)
    assert env.used(tok["id"]) == rec["quota"]


def test_azure_channel_passes_responses_through(env):
    tok = env.token()
    oc = client(env, tok)
    r = oc.responses.create(model="azure-model", input="Hi")
    assert r.output_text == "Hello from the fake Responses upstream." and r.model == "azure-model"
    sent = env.azure.requests[-1]
    assert sent["path"] == "/openai/responses" and "api-version=2025-04-01-preview" in sent["query"]
    assert sent["headers"]["Api-Key"] == "upstream-key"
    assert sent["body"]["model"] == "azure-upstream-model"  # the deployment
    assert oc.responses.retrieve(r.id).model == "azure-model"
    assert env.azure.requests[-1]["method"] == "GET"
    check(env, tok, (30, 6, 10))
