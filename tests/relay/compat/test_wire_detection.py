"""Wire detection with no configuration: an OpenAI-format channel left at
`wire_api` "both" that turns out to serve only chat completions (or only
the Responses API, or no /v1/responses/compact) has the same call bridged
at once, and is remembered so: the next call goes straight to what it
serves, the channel's row shows it, it survives a restart, and after
`wire_reprobe_hours` the client's own API is tried again."""
from __future__ import annotations

import time
import uuid

import pytest
import requests
from openai import OpenAI

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually
from tests.vendor_env import PRICE, expected_units


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def user(relay, admin):
    name = "wire" + uuid.uuid4().hex[:6]
    admin.create_user(name, quota=10 ** 12)
    return Api.login(relay.url, name, USER_PASSWORD)


def setup(admin, fake, mode: str, **extra) -> tuple[dict, str]:
    model = "w-" + uuid.uuid4().hex[:8]
    ch = admin.create_channel(fake.mode_url(mode), [model], name=model, **extra)
    admin.set_price(model, **PRICE)
    return ch, model


def paths(fake, model: str) -> list[str]:
    return [r["path"] for r in fake.requests if (r["body"] or {}).get("model") == model]


def facts(admin, ch) -> list[tuple]:
    got = admin.get(f"/api/channel/{ch['id']}")["data"]["learned"]
    return [(f["kind"], f["name"]) for f in got]


def client(relay, user) -> tuple[OpenAI, dict]:
    tok = user.create_token(name="k" + uuid.uuid4().hex[:4], remain_quota=10 ** 10)
    return OpenAI(base_url=relay.url + "/v1", api_key=tok["key"], max_retries=0), tok


def records(admin, tok, n):
    def got():
        items = admin.get(f"/api/log/?token_id={tok['id']}&size=50")["data"]["items"]
        assert len(items) == n, items
        return items
    return eventually(got, timeout=10)


@pytest.mark.parametrize("mode", ["chatonly", "chatonly405"])
def test_a_chat_only_server_is_learnt_and_bridged(relay, admin, user, fake, mode):
    ch, model = setup(admin, fake, mode)
    oc, tok = client(relay, user)
    r = oc.responses.create(model=model, input="Hello")
    assert r.status == "completed" and r.output_text == "Hello from the fake upstream."
    assert paths(fake, model) == ["/mode/%s/v1/responses" % mode,
                                  "/mode/%s/v1/chat/completions" % mode]
    # The next call goes straight to chat, streamed too.
    with oc.responses.stream(model=model, input="Hello") as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
    assert text == "Hello from the fake upstream."
    assert paths(fake, model)[2:] == ["/mode/%s/v1/chat/completions" % mode]
    assert facts(admin, ch) == [("wire", "chat")]
    # Billed once per call, from the chat upstream's usage; the refused try costs nothing.
    for rec in records(admin, tok, 2):
        assert rec["status"] == 200 and rec["quota"] == expected_units(10, 3)


def test_a_responses_only_server_is_learnt_for_chat(relay, admin, user, fake):
    ch, model = setup(admin, fake, "responsesonly")
    oc, _ = client(relay, user)
    for _ in range(2):
        r = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "Hello from the fake Responses upstream."
    assert paths(fake, model) == ["/mode/responsesonly/v1/chat/completions",
                                  "/mode/responsesonly/v1/responses",
                                  "/mode/responsesonly/v1/responses"]
    assert facts(admin, ch) == [("wire", "responses")]


def test_a_missing_compact_route_bridges_only_compactions(relay, admin, user, fake):
    ch, model = setup(admin, fake, "nocompact")
    oc, _ = client(relay, user)
    hdr = {"Authorization": f"Bearer {oc.api_key}"}
    body = {"model": model, "input": [{"role": "user", "content": "Fix the bug."}]}
    for _ in range(2):
        r = requests.post(relay.url + "/v1/responses/compact", json=body, headers=hdr, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["object"] == "response.compaction"
    assert oc.responses.create(model=model, input="Hello").status == "completed"
    assert paths(fake, model) == ["/mode/nocompact/v1/responses/compact",
                                  "/mode/nocompact/v1/chat/completions",
                                  "/mode/nocompact/v1/chat/completions",
                                  "/mode/nocompact/v1/responses"]
    assert facts(admin, ch) == [("wire", "compact")]


def test_an_operators_choice_is_not_overridden(relay, admin, user, fake):
    ch, model = setup(admin, fake, "chatonly", options={"wire_api": "responses"})
    oc, _ = client(relay, user)
    with pytest.raises(Exception) as got:
        oc.responses.create(model=model, input="Hello")
    assert "404" in str(got.value) or "Invalid URL" in str(got.value)
    assert paths(fake, model) == ["/mode/chatonly/v1/responses"]
    assert facts(admin, ch) == []


def test_a_missing_model_is_not_a_missing_api(relay, admin, user, fake):
    """A 404 saying the model does not exist is passed on, not learnt."""
    model = "w-" + uuid.uuid4().hex[:8]
    ch = admin.create_channel(fake.url, [model], name=model,
                              model_mapping={model: "missing-" + model})
    admin.set_price(model, **PRICE)
    oc, _ = client(relay, user)
    r = requests.post(relay.url + "/v1/responses", json={"model": model, "input": "x"},
                      headers={"Authorization": f"Bearer {oc.api_key}"}, timeout=30)
    assert r.status_code == 400 and "does not exist" in r.json()["error"]["message"]
    assert paths(fake, "missing-" + model) == ["/v1/responses"]
    assert facts(admin, ch) == []


def test_a_base_url_serving_neither_is_not_learnt(relay, admin, user, fake):
    """/v1/responses and /v1/chat/completions both 404 (a wrong base URL):
    the bridged retry refutes the guess; nothing is remembered."""
    model = "w-" + uuid.uuid4().hex[:8]
    ch = admin.create_channel(fake.url + "/nowhere", [model], name=model)
    admin.set_price(model, **PRICE)
    oc, _ = client(relay, user)
    with pytest.raises(Exception):
        oc.responses.create(model=model, input="Hello")
    time.sleep(0.5)
    assert facts(admin, ch) == []


@pytest.mark.slow
def test_what_was_learnt_survives_a_restart(mongo_url, tmp_path, fake):
    first = RelayProcess(mongo_url, str(tmp_path / "a")).start()
    try:
        admin = Api.login(first.url)
        ch, model = setup(admin, fake, "chatonly")
        admin.create_user("wr", quota=10 ** 12)
        oc, _ = client(first, Api.login(first.url, "wr", USER_PASSWORD))
        oc.responses.create(model=model, input="Hello")
        eventually(lambda: _learnt(admin, ch), timeout=5)
    finally:
        first.stop()
    second = RelayProcess(mongo_url, str(tmp_path / "b"), db_name=first.db_name).start()
    try:
        oc.base_url = second.url + "/v1"
        n = len(paths(fake, model))
        oc.responses.create(model=model, input="Hello")
        assert paths(fake, model)[n:] == ["/mode/chatonly/v1/chat/completions"]
    finally:
        second.stop()


@pytest.mark.slow
def test_it_is_probed_again_after_wire_reprobe_hours(fresh_relay, fake):
    relay = fresh_relay(args=["--wire-reprobe-hours", "0.002"])  # 7.2 s
    admin = Api.login(relay.url)
    ch, model = setup(admin, fake, "chatonly")
    admin.create_user("wp", quota=10 ** 12)
    oc, _ = client(relay, Api.login(relay.url, "wp", USER_PASSWORD))
    oc.responses.create(model=model, input="Hello")
    oc.responses.create(model=model, input="Hello")
    assert paths(fake, model) == ["/mode/chatonly/v1/responses",
                                  "/mode/chatonly/v1/chat/completions",
                                  "/mode/chatonly/v1/chat/completions"]
    time.sleep(8)  # Responses is tried again, and learnt again
    oc.responses.create(model=model, input="Hello")
    assert paths(fake, model)[3:] == ["/mode/chatonly/v1/responses",
                                      "/mode/chatonly/v1/chat/completions"]
    assert facts(admin, ch) == [("wire", "chat")]


def _learnt(admin, ch):
    assert facts(admin, ch) == [("wire", "chat")]
