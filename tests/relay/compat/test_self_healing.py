"""Self-healing compatibility end to end: fake upstreams that refuse, one
at a time, each beta and field coding agents send (in the vendors' own
words: Anthropic, Vertex, Bedrock, OpenAI), the relay retrying once on the
same channel without it, remembering it, listing it on the channel, and
forgetting it on request; a second relay on the same database learns it
from the first."""
from __future__ import annotations

import copy
import json
import os
import uuid

import pytest
import requests

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import ROOT, USER_PASSWORD, Api, RelayProcess, eventually
from tests.vendor_env import PRICE

FIXTURE = json.load(open(os.path.join(ROOT, "tests", "fixtures", "claude_code_requests.json")))
FIRST, SECOND = FIXTURE["requests"][:2]
SCOPE = "prompt-caching-scope-2026-01-05"


@pytest.fixture(scope="module")
def env(relay, admin):
    fakes = {"anthropic": FakeAnthropic().start(), "openai": FakeOpenAI().start(),
             "signed": FakeAnthropic().start()}
    fakes["signed"].signed_per_key = True
    name = "heal" + uuid.uuid4().hex[:6]
    admin.create_user(name, quota=10 ** 12)
    user = Api.login(relay.url, name, USER_PASSWORD)
    token = user.create_token(name="k", remain_quota=10 ** 11)
    yield {"relay": relay, "admin": admin, "fakes": fakes, "user": user, "token": token}
    for f in fakes.values():
        f.stop()


def channel(env, fake_name: str, refuses: dict) -> tuple[dict, str, str]:
    """A channel of its own (its own upstream key, so its own refusals) for a
    model of its own."""
    key, model = "sk-" + uuid.uuid4().hex[:12], "m-" + uuid.uuid4().hex[:8]
    fake = env["fakes"][fake_name]
    fake.refuses[key] = refuses
    kind = "openai" if fake_name == "openai" else "anthropic"
    ch = env["admin"].create_channel(fake.url, [model], name=model, type=kind, key=key)
    env["admin"].set_price(model, **PRICE)
    return ch, key, model


def sent_with(fake, key: str) -> list[dict]:
    return [r for r in fake.requests if key in (r["headers"].get("X-Api-Key"),
                                                 r["headers"].get("Authorization", "")[7:])]


def claude_code(env, model: str, base: str | None = None, extra_beta: str = "",
                examples: bool = False, rec: dict = FIRST) -> requests.Response:
    body = copy.deepcopy(rec["body"])
    body["model"] = model
    if examples:
        body["tools"][0]["input_examples"] = [{"description": "an example"}]
    headers = dict(rec["headers"], **{"x-api-key": env["token"]["key"]})
    if extra_beta:
        headers["Anthropic-Beta"] += "," + extra_beta
    r = requests.post(f"{base or env['relay'].url}/v1/messages?beta=true", json=body,
                      headers=headers, timeout=60)
    return r


def learned(env, ch: dict) -> list[dict]:
    return env["admin"].get(f"/api/channel/{ch['id']}")["data"]["learned"]


CASES = [
    pytest.param({"betas": ["context-management-2025-06-27"]}, "beta",
                 "context-management-2025-06-27", {}, id="beta-context-management"),
    pytest.param({"betas": ["advanced-tool-use-2025-11-20"]}, "beta",
                 "advanced-tool-use-2025-11-20", {}, id="beta-advanced-tool-use"),
    pytest.param({"betas": [SCOPE]}, "beta", SCOPE, {"extra_beta": SCOPE},
                 id="beta-prompt-caching-scope"),
    pytest.param({"betas": ["context-management-2025-06-27"], "wording": "bedrock"}, "beta",
                 "context-management-2025-06-27", {}, id="beta-bedrock-named"),
    pytest.param({"fields": ["context_management"], "wording": "bedrock"}, "field",
                 "context_management", {}, id="field-context-management-bedrock"),
    pytest.param({"fields": ["context_management"]}, "field", "context_management", {},
                 id="field-context-management"),
    pytest.param({"fields": ["tools.*.input_examples"]}, "field",
                 "tools.*.custom.input_examples", {"examples": True}, id="field-input-examples"),
]


@pytest.mark.parametrize("refuses, kind, name, how", CASES)
def test_a_refused_beta_or_field_is_stripped_retried_and_remembered(env, refuses, kind, name,
                                                                     how):
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", refuses)
    r = claude_code(env, model, **how)
    assert r.status_code == 200, r.text
    first = sent_with(fake, key)
    assert len(first) == 2 and first[0].get("refused") and not first[1].get("refused")
    if kind == "beta":
        assert name in first[0]["headers"]["Anthropic-Beta"]
        assert name not in first[1]["headers"]["Anthropic-Beta"]
        # Only that one: the rest of the client's betas still go.
        assert "claude-code-20250219" in first[1]["headers"]["Anthropic-Beta"]
    elif name == "context_management":
        assert "context_management" in first[0]["body"]
        assert "context_management" not in first[1]["body"]
        assert first[1]["body"]["thinking"] == first[0]["body"]["thinking"]
    else:
        assert "input_examples" in first[0]["body"]["tools"][0]
        assert "input_examples" not in first[1]["body"]["tools"][0]
        assert [t["name"] for t in first[1]["body"]["tools"]] == \
            [t["name"] for t in first[0]["body"]["tools"]]
    # The next call needs no retry: what was refused goes out up front.
    r = claude_code(env, model, **how)
    assert r.status_code == 200, r.text
    assert len(sent_with(fake, key)) == 3
    facts = eventually(lambda: _facts(env, ch, 1), timeout=5)
    assert [(f["kind"], f["name"], f["model"]) for f in facts] == [(kind, name, model)]
    assert facts[0]["reason"] and facts[0]["until"] > facts[0]["learned_at"]


def _facts(env, ch, n):
    got = learned(env, ch)
    assert len(got) == n, got
    return got


def test_codex_client_metadata_on_a_responses_channel(env):
    fake = env["fakes"]["openai"]
    ch, key, model = channel(env, "openai", {"fields": ["client_metadata"]})
    body = {"model": model, "input": "hi", "stream": True, "store": False,
            "client_metadata": {"x-codex-installation-id": "abc"}}
    headers = {"Authorization": f"Bearer {env['token']['key']}"}
    for n in (2, 3):
        r = requests.post(env["relay"].url + "/v1/responses", json=body, headers=headers,
                          timeout=30)
        assert r.status_code == 200 and "response.completed" in r.text, r.text
        assert len(sent_with(fake, key)) == n
    sent = sent_with(fake, key)
    assert "client_metadata" in sent[0]["body"] and sent[0].get("refused")
    assert all("client_metadata" not in s["body"] for s in sent[1:])
    assert [f["label"] for f in eventually(lambda: _facts(env, ch, 1))] == ["client_metadata"]


def test_a_beta_and_then_its_body_field_in_one_call(env):
    """Bedrock refuses the context-management beta, then (without it) the
    context_management field: two things, each retried once, one call."""
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {"betas": ["context-management-2025-06-27"],
                                                "fields": ["context_management"],
                                                "wording": "bedrock"})
    assert claude_code(env, model).status_code == 200
    assert len(sent_with(fake, key)) == 3
    assert sorted(f["kind"] for f in eventually(lambda: _facts(env, ch, 2))) == ["beta", "field"]


def test_what_changes_billing_or_safety_is_refused_not_stripped(env):
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {"fields": ["max_tokens"]})
    r = claude_code(env, model)
    assert r.status_code == 400
    assert "max_tokens: Extra inputs are not permitted" in r.json()["error"]["message"]
    assert len(sent_with(fake, key)) == 1
    assert learned(env, ch) == []


def test_a_refusal_naming_nothing_is_not_guessed_at(env):
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {"betas": ["context-management-2025-06-27"],
                                                "wording": "bedrock", "unnamed": True})
    r = claude_code(env, model)
    assert r.status_code == 400 and "invalid beta flag" in r.json()["error"]["message"]
    assert len(sent_with(fake, key)) == 1 and learned(env, ch) == []


def test_forget_one_fact_or_all(env):
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {"betas": ["context-management-2025-06-27"],
                                                "fields": ["context_management"]})
    assert claude_code(env, model).status_code == 200
    facts = eventually(lambda: _facts(env, ch, 2))
    admin = env["admin"]
    one = next(f for f in facts if f["kind"] == "field")
    left = admin.delete(f"/api/channel/{ch['id']}/learned", params={"id": one["id"]})["data"]
    assert [f["kind"] for f in left] == ["beta"]
    admin.delete(f"/api/channel/{ch['id']}/learned", params={"id": one["id"]}, expect=404)
    admin.delete(f"/api/channel/{ch['id']}/learned", params={"id": "7|wire||chat"}, expect=404)
    # Forgotten: the next call meets the refusal again, and learns it again.
    n = len(sent_with(fake, key))
    assert claude_code(env, model).status_code == 200
    assert len(sent_with(fake, key)) == n + 2
    assert admin.delete(f"/api/channel/{ch['id']}/learned")["data"] == []
    assert learned(env, ch) == []
    user = env["user"]
    assert user.get(f"/api/channel/{ch['id']}/learned", expect=None)["success"] is False


@pytest.mark.slow
def test_a_second_relay_on_the_database_learns_it_from_the_first(env, mongo_url, tmp_path):
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {"betas": ["context-management-2025-06-27"]})
    other = RelayProcess(mongo_url, str(tmp_path / "other"), db_name=env["relay"].db_name).start()
    try:
        # The other relay has loaded the channel (and nothing learnt yet).
        eventually(lambda: _other_serves(env, other, model), timeout=10)
        n = len(sent_with(fake, key))
        assert claude_code(env, model).status_code == 200  # the first relay learns it
        assert len(sent_with(fake, key)) == n + 2
        eventually(lambda: _facts(env, ch, 1))
        # The other relay hears of it (its own listing is its memory) ...
        there = Api(other.url, env["admin"].s.headers["Authorization"][7:])
        eventually(lambda: _facts({"admin": there}, ch, 1), timeout=10)
        # ... and its first call to the channel goes out without the beta.
        m = len(sent_with(fake, key))
        assert claude_code(env, model, base=other.url).status_code == 200
        sent = sent_with(fake, key)[m:]
        assert len(sent) == 1 and "context-management" not in sent[0]["headers"]["Anthropic-Beta"]
    finally:
        other.stop()


def _other_serves(env, other, model):
    r = requests.get(other.url + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {env['token']['key']}"})
    assert model in [m["id"] for m in r.json()["data"]]


def test_thinking_from_another_channel_goes_without_thinking_once(env):
    """A conversation that moved here from a converted channel, in a tool
    loop: its last assistant turn has no thinking block, which Anthropic
    refuses with thinking on.  The call goes again without thinking (this
    call only: nothing is learnt, the channel does take thinking)."""
    fake = env["fakes"]["anthropic"]
    ch, key, model = channel(env, "anthropic", {})
    moved = copy.deepcopy(SECOND)
    moved["body"]["messages"][2]["content"] = [
        b for b in moved["body"]["messages"][2]["content"] if b["type"] != "thinking"]
    for n in (2, 4):
        r = claude_code(env, model, rec=moved)
        assert r.status_code == 200, r.text
        sent = sent_with(fake, key)
        assert len(sent) == n and "thinking" in sent[-2]["body"]
        assert "thinking" not in sent[-1]["body"]
        assert "clear_thinking" not in json.dumps(sent[-1]["body"].get("context_management"))
        assert sent[-1]["body"]["messages"][3] == moved["body"]["messages"][3]
    assert learned(env, ch) == []


def test_signatures_of_another_account_go_without_thinking(env):
    fake = env["fakes"]["signed"]
    ch, key, model = channel(env, "signed", {})
    r = claude_code(env, model, rec=SECOND)  # signed by another account: refused
    assert r.status_code == 200, r.text
    sent = sent_with(fake, key)
    assert len(sent) == 2 and "thinking" in sent[0]["body"] and "thinking" not in sent[1]["body"]
    assert all(b["type"] != "thinking" for m in sent[1]["body"]["messages"]
               for b in (m["content"] if isinstance(m["content"], list) else ()))
    # Its own signatures it takes: a turn signed here goes through as it is.
    first = claude_code(env, model)
    assert first.status_code == 200 and f"sig_fake_{key}" in first.text
