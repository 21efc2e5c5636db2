"""The Responses API over a WebSocket (relay/responses_socket.py), driven by
a client speaking the protocol as Codex CLI does (websocket-client, frames
of JSON): a tool round trip whose second request continues the first by
`previous_response_id` with only the new items and `store: false`, a
warm-up, errors as frames, the handshake's 401 and 426, a client that
leaves mid-response, each response billed as one call; on a channel that
speaks Responses (passed through) and on bridged ones."""
from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
import websocket

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually
from tests.vendor_env import PRICE, expected_units

BETA = "responses_websockets=2026-02-06"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
# model -> (prompt, completion, cached) its fake reports per call
MODELS = {"ws-resp": (30, 6, 10), "ws-chatonly": (10, 3, 0), "ws-anthropic": (25, 7, 4)}


@pytest.fixture(scope="module")
def env(relay, admin):
    fakes = {"openai": FakeOpenAI(slow_delay=0.4).start(),
             "anthropic": FakeAnthropic().start()}
    admin.create_channel(fakes["openai"].url, ["ws-resp"], name="ws-resp")
    admin.create_channel(fakes["openai"].mode_url("chatonly"), ["ws-chatonly"],
                         name="ws-chatonly")  # default settings: learnt to be chat only
    admin.create_channel(fakes["anthropic"].url, ["ws-anthropic"], name="ws-anthropic",
                         type="anthropic")
    admin.create_channel(fakes["openai"].mode_url("slow"), ["ws-slow"], name="ws-slow")
    for m in list(MODELS) + ["ws-slow"]:
        admin.set_price(m, **PRICE)
    name = "ws" + uuid.uuid4().hex[:6]
    admin.create_user(name, quota=10 ** 12)
    user = Api.login(relay.url, name, USER_PASSWORD)
    yield {"relay": relay, "admin": admin, "user": user, "fakes": fakes}
    for f in fakes.values():
        f.stop()


def token(env) -> dict:
    return env["user"].create_token(name="k" + uuid.uuid4().hex[:4], remain_quota=10 ** 10)


def connect(base: str, key: str, **headers) -> websocket.WebSocket:
    url = base.replace("http://", "ws://") + "/v1/responses"
    hdrs = [f"Authorization: Bearer {key}", f"OpenAI-Beta: {BETA}",
            "session_id: " + headers.pop("session", "s-" + uuid.uuid4().hex)]
    hdrs += [f"{k}: {v}" for k, v in headers.items()]
    return websocket.create_connection(url, header=hdrs, timeout=30)


def create(ws, **body) -> list[dict]:
    """Send a response.create; every event frame until the response ends."""
    ws.send(json.dumps({"type": "response.create", **body}))
    events = []
    while True:
        doc = json.loads(ws.recv())
        events.append(doc)
        if doc["type"] in ("response.completed", "response.incomplete", "response.failed",
                           "error"):
            return events


def records(env, tok, n):
    def got():
        items = env["admin"].get(f"/api/log/?token_id={tok['id']}&size=50")["data"]["items"]
        assert len(items) == n, items
        return sorted(items, key=lambda r: r["created_at"])
    return eventually(got, timeout=15)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_tool_round_trip_over_one_socket_billed_per_response(env, model):
    tok = token(env)
    ws = connect(env["relay"].url, tok["key"])
    try:
        first = create(ws, model=model, store=False, tools=[WEATHER],
                       instructions="Be brief.", input=[
                           {"type": "message", "role": "user", "content": [
                               {"type": "input_text", "text": "Weather in Paris?"}]}])
        assert first[0]["type"] == "response.created"
        assert first[-1]["type"] == "response.completed"
        done = first[-1]["response"]
        calls = [o for o in done["output"] if o["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
        assert any(e["type"] == "response.function_call_arguments.delta" for e in first)
        # As Codex continues: the last response's id, and only the new item.
        second = create(ws, model=model, store=False, tools=[WEATHER],
                        instructions="Be brief.", previous_response_id=done["id"], input=[
                            {"type": "function_call_output", "call_id": calls[0]["call_id"],
                             "output": "Sunny, 21C"}])
        text = "".join(e["delta"] for e in second if e["type"] == "response.output_text.delta")
        assert text == "The tool returned: Sunny, 21C"
        assert second[-1]["type"] == "response.completed"
    finally:
        ws.close()
    recs = records(env, tok, 2)
    for r in recs:
        assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) == MODELS[model]
        assert r["quota"] == expected_units(*MODELS[model]) and r["status"] == 200
        assert r["stream"] is True and r["endpoint"] == "responses" and not r["estimated"]
    assert recs[0]["request_id"] != recs[1]["request_id"]
    assert recs[0]["session"] == recs[1]["session"]
    used = env["user"].get(f"/api/token/{tok['id']}")["data"]["used_quota"]
    assert used == sum(r["quota"] for r in recs)


def test_the_upstream_sees_the_whole_conversation(env):
    """On a channel that speaks Responses the events pass through, and the
    continuation reaches it whole (the upstream holds nothing: store false)."""
    fake = env["fakes"]["openai"]
    tok = token(env)
    ws = connect(env["relay"].url, tok["key"], **{"OpenAI-Beta": f"{BETA},other=1"})
    try:
        first = create(ws, model="ws-resp", store=False, tools=[WEATHER], input="Weather?")
        call = next(o for o in first[-1]["response"]["output"] if o["type"] == "function_call")
        create(ws, model="ws-resp", store=False, tools=[WEATHER],
               previous_response_id=first[-1]["response"]["id"],
               input=[{"type": "function_call_output", "call_id": call["call_id"],
                       "output": "Rain"}])
    finally:
        ws.close()
    sent = [r for r in fake.requests if r["path"] == "/v1/responses"][-2:]
    assert "previous_response_id" not in sent[1]["body"]
    kinds = [i.get("type", "message") for i in sent[1]["body"]["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert sent[1]["body"]["stream"] is True and "generate" not in sent[1]["body"]
    # Its own beta header does not travel to an HTTP upstream; the others do.
    assert sent[0]["headers"].get("Openai-Beta") == "other=1"


def test_a_warm_up_is_answered_at_once_and_continued(env):
    fake = env["fakes"]["openai"]
    tok = token(env)
    n = len(fake.requests)
    ws = connect(env["relay"].url, tok["key"])
    try:
        warm = create(ws, model="ws-resp", generate=False, store=False, input="Hello")
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert len(fake.requests) == n  # nothing sent upstream
        out = create(ws, model="ws-resp", store=False, input=[],
                     previous_response_id=warm[-1]["response"]["id"])
        assert out[-1]["type"] == "response.completed"
    finally:
        ws.close()
    assert fake.requests[-1]["body"]["input"] == [
        {"type": "message", "role": "user", "content": "Hello"}]
    records(env, tok, 1)  # the warm-up is not billed


def test_errors_are_frames_and_the_socket_goes_on(env):
    tok = token(env)
    ws = connect(env["relay"].url, tok["key"])
    try:
        ws.send("{not json")
        err = json.loads(ws.recv())
        assert err["type"] == "error" and err["status"] == 400
        ws.send(json.dumps({"type": "session.update"}))
        assert json.loads(ws.recv())["error"]["param"] == "type"
        err = create(ws, model="no-such-model", input="x")[-1]
        assert err["type"] == "error" and err["status"] == 404
        assert "request id" in err["error"]["message"]
        err = create(ws, model="ws-resp", input=5)[-1]
        assert err["status"] == 400 and err["error"]["param"] == "input"
        ws.send(json.dumps({"type": "response.processed", "response_id": "resp_x"}))
        assert create(ws, model="ws-resp", input="x")[-1]["type"] == "response.completed"
    finally:
        ws.close()
    records(env, tok, 1)


def test_the_handshake_is_authenticated(env):
    with pytest.raises(websocket.WebSocketBadStatusException) as got:
        connect(env["relay"].url, "sk-wrong")
    assert got.value.status_code == 401
    body = json.loads(got.value.resp_body)
    assert body["error"]["code"] == "invalid_api_key"


def test_a_get_without_the_upgrade_is_426(env):
    tok = token(env)
    r = requests.get(env["relay"].url + "/v1/responses", timeout=10,
                     headers={"Authorization": f"Bearer {tok['key']}"})
    assert r.status_code == 426 and r.headers["Upgrade"] == "websocket"
    assert r.json()["error"]["code"] == "upgrade_required"


@pytest.mark.parametrize("how", ["close", "shutdown"])
def test_a_client_that_leaves_mid_response_is_billed_as_a_cut_stream(env, how):
    fake = env["fakes"]["openai"]
    tok = token(env)
    cut = sum(1 for r in fake.requests if r.get("aborted"))
    ws = connect(env["relay"].url, tok["key"])
    ws.send(json.dumps({"type": "response.create", "model": "ws-slow", "store": False,
                        "input": "Say a lot."}))
    while json.loads(ws.recv())["type"] != "response.output_text.delta":
        pass
    # With the closing handshake, or gone as a killed client is.
    ws.close(timeout=1) if how == "close" else ws.shutdown()
    [rec] = records(env, tok, 1)
    assert rec["status"] == 499 and rec["quota"] > 0, rec
    assert rec["estimated"] and rec["prompt_tokens"] > 0 and rec["completion_tokens"] > 0
    eventually(lambda: _aborted(fake, cut), timeout=10)  # the upstream call was cut too
    used = env["user"].get(f"/api/token/{tok['id']}")["data"]["used_quota"]
    assert used == rec["quota"]


def _aborted(fake, before: int):
    assert sum(1 for r in fake.requests if r.get("aborted")) == before + 1


@pytest.mark.slow
def test_three_relays_on_one_database_bill_every_response(env, mongo_url, tmp_path):
    others = [RelayProcess(mongo_url, str(tmp_path / f"r{i}"), db_name=env["relay"].db_name)
              .start() for i in range(2)]
    tok = token(env)
    try:
        bases = [env["relay"].url] + [o.url for o in others]
        sockets = [connect(b, tok["key"], session="three") for b in bases]
        for turn in range(6):
            out = create(sockets[turn % 3], model="ws-anthropic", input=f"turn {turn}")
            assert out[-1]["type"] == "response.completed", out[-1]
        for s in sockets:
            s.close()
    finally:
        for o in others:
            o.stop()
    recs = records(env, tok, 6)
    assert all(r["quota"] == expected_units(*MODELS["ws-anthropic"]) for r in recs)
    used = env["user"].get(f"/api/token/{tok['id']}")["data"]["used_quota"]
    assert used == sum(r["quota"] for r in recs)


@pytest.mark.slow
def test_with_sockets_off_the_handshake_is_426(fresh_relay):
    relay = fresh_relay(args=["--responses-websocket", "false"])
    admin = Api.login(relay.url)
    admin.create_user("wsoff", quota=10 ** 9)
    key = Api.login(relay.url, "wsoff", USER_PASSWORD).create_token(name="k",
                                                                     remain_quota=10 ** 8)
    with pytest.raises(websocket.WebSocketBadStatusException) as got:
        connect(relay.url, key["key"])
    assert got.value.status_code == 426
    assert json.loads(got.value.resp_body)["error"]["code"] == "websocket_unavailable"
    time.sleep(0)
