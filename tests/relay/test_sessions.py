"""Sticky sessions: a 20-turn Claude Code conversation (the CLI's recorded
requests, replayed turn by turn: tests/clients/agent_session.py) through a
group of two Anthropic channels weighted 1:1 and a third, converted
(OpenAI chat) channel, each a separate upstream account whose fake counts
prompt caching as its vendor does (tests/fakes/prompt_cache.py).

Every turn lands on one channel, and turns 2-20 are cache reads there; then
that channel dies: the conversation moves once, and stays.  The same holds
with three relays on one database behind a round-robin balancer (each turn
to the next relay), which is what makes placement deterministic and
written down (relay/sessions.py)."""
from __future__ import annotations

import uuid

import pytest
from tornado.httputil import HTTPHeaders

from relay.sessions import client_session, conversation_of, score
from tests.clients.agent_session import AgentSession
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually
from tests.vendor_env import PRICE

TURNS = 20


class Group:
    """Three channels serving one model, each its own fake upstream account."""

    def __init__(self, admin, relay):
        self.fakes = {"a1": FakeAnthropic().start(), "a2": FakeAnthropic().start(),
                      "oa": FakeOpenAI().start()}
        self.model = "claude-sticky-" + uuid.uuid4().hex[:6]
        self.channels = {}
        for name, fake in self.fakes.items():
            fake.caching = True
            kind = "openai" if name == "oa" else "anthropic"
            extra = {"model_mapping": {self.model: "gpt-4o-mini"},
                     "options": {"max_output_tokens": 16384}} if kind == "openai" else {}
            ch = admin.create_channel(fake.url, [self.model], name=f"{name}-{self.model}",
                                      type=kind, key=f"acct-{name}", weight=1, **extra)
            self.channels[ch["id"]] = name
        admin.set_price(self.model, **PRICE)
        user = "s" + uuid.uuid4().hex[:6]
        admin.create_user(user, quota=10 ** 12)
        self.api = Api.login(relay.url, user, USER_PASSWORD)
        self.token = self.api.create_token(name="agent", remain_quota=10 ** 11)
        self.admin = admin

    def records(self, n: int) -> list[dict]:
        def got():
            items = self.admin.get(f"/api/log/?token_id={self.token['id']}&size=100")["data"][
                "items"]
            assert len(items) == n, len(items)
            return sorted(items, key=lambda r: r["created_at"])
        return eventually(got, timeout=15)

    def stop(self):
        for f in self.fakes.values():
            f.stop()


def run(group: Group, bases: list[str]):
    session = "sess-" + uuid.uuid4().hex
    agent = AgentSession(group.token["key"], group.model, session)
    for turn in range(TURNS):
        r = agent.send(bases[turn % len(bases)])
        assert r.status_code == 200, r.text
    recs = group.records(TURNS)
    served = {r["channel_id"] for r in recs}
    assert len(served) == 1, [r["channel_id"] for r in recs]  # every turn on one channel
    cid = served.pop()
    name = group.channels[cid]
    assert all(r["session"] == session for r in recs)
    # Turns 2-20 are cache reads in the upstream's own accounting ...
    fake = group.fakes[name]
    seen = [rec["cache"] for rec in fake.requests if rec.get("cache")]
    assert len(seen) == TURNS
    if name == "oa":
        assert all(c["cached_tokens"] > 0 for c in seen[1:]), seen
    else:
        assert seen[0]["cache_read_input_tokens"] == 0
        assert all(c["cache_read_input_tokens"] > c["cache_creation_input_tokens"]
                   for c in seen[1:]), seen
    # ... and in the bill: most of the input was read from the cache.
    prompt = sum(r["prompt_tokens"] for r in recs[1:])
    cached = sum(r["cached_tokens"] for r in recs[1:])
    assert cached / prompt > 0.8, (cached, prompt)
    # The channel dies: the conversation moves once, and stays.
    fake.kill()
    for turn in range(5):
        r = agent.send(bases[turn % len(bases)])
        assert r.status_code == 200, r.text
    after = group.records(TURNS + 5)[TURNS:]
    moved = {r["channel_id"] for r in after}
    assert len(moved) == 1 and cid not in moved, [r["channel_id"] for r in after]
    new = group.fakes[group.channels[moved.pop()]]
    tail = [rec["cache"] for rec in new.requests if rec.get("cache")][-5:]
    reads = [c.get("cache_read_input_tokens", c.get("cached_tokens")) for c in tail]
    assert reads[0] == 0 and all(n > 0 for n in reads[1:]), reads


@pytest.mark.slow
def test_a_claude_code_session_sticks_to_one_channel(relay, admin):
    group = Group(admin, relay)
    try:
        run(group, [relay.url])
    finally:
        group.stop()


@pytest.mark.slow
def test_it_sticks_across_three_relays_behind_a_round_robin(relay, admin, mongo_url,
                                                            tmp_path):
    others = [RelayProcess(mongo_url, str(tmp_path / f"r{i}"), db_name=relay.db_name).start()
              for i in range(2)]
    group = Group(admin, relay)
    try:
        run(group, [relay.url] + [o.url for o in others])
    finally:
        group.stop()
        for o in others:
            o.stop()


# ---- without a relay -------------------------------------------------------------------
class Ch:
    def __init__(self, cid, weight=1, priority=0):
        self.id, self.weight, self.priority = cid, weight, priority


def share(weights: list[int], n: int = 4000) -> list[float]:
    chans = [Ch(i + 1, w) for i, w in enumerate(weights)]
    wins = [0] * len(chans)
    for i in range(n):
        key = f"k{i}"
        best = max(chans, key=lambda c: score(key, c))
        wins[best.id - 1] += 1
    return [w / n for w in wins]


def test_placement_follows_the_weights_over_many_conversations():
    a, b = share([1, 1])
    assert 0.45 < a < 0.55
    a, b = share([3, 1])
    assert 0.70 < a < 0.80
    a, b, c = share([1, 0, 1])
    assert b < 0.01


def test_the_client_says_which_conversation():
    from types import SimpleNamespace as NS
    call = NS(native_body={"prompt_cache_key": "pck", "metadata": {"user_id": "u"}}, body={})
    assert client_session({"session_id": "codex-1"}, call) == "codex-1"
    assert client_session(HTTPHeaders({"X-Claude-Code-Session-Id": "cc-1"}), call) == "cc-1"
    assert client_session({}, call) == "pck"
    cc = NS(native_body={"metadata": {"user_id": '{"device_id": "d", "session_id": "s-9"}'}},
            body={})
    assert client_session(None, cc) == "s-9"
    old = NS(native_body={"metadata": {"user_id": "user_ab_account__session_1234abcd-ef"}},
             body={})
    assert client_session(None, old) == "1234abcd-ef"
    chat = NS(native_body=None, body={"messages": [{"role": "user", "content": "x"}]})
    assert client_session(None, chat) == ""


def test_a_conversation_is_its_system_prompt_and_first_user_message():
    one = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}]}
    later = {"messages": one["messages"] + [{"role": "assistant", "content": "A"},
                                            {"role": "user", "content": "Q2"}]}
    other = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q9"}]}
    assert conversation_of(one) == conversation_of(later) != conversation_of(other)
    assert conversation_of({"messages": [{"role": "system", "content": "S"}]}) == ""


def test_a_cache_write_is_unread_when_the_next_call_does_not_reach_it():
    from types import SimpleNamespace as NS

    from relay.money.pricing import Usage
    from relay.sessions import Sessions
    now = [1000.0]
    s = Sessions(None, None, ttl=3600, clock=lambda: now[0])
    call = NS(extra={"session_key": "k"})
    a, b = Ch(1), Ch(2)
    assert s.cache_use(call, a, Usage(100, 1, cache_write_5m_tokens=100)) == 0
    assert s.cache_use(call, a, Usage(150, 1, cached_tokens=100, cache_write_5m_tokens=50)) == 0
    # Read only part of the last write (the prompt changed inside it).
    assert s.cache_use(call, a, Usage(150, 1, cached_tokens=120, cache_write_5m_tokens=30)) == 30
    # Moved to another channel: the write there is of no use.
    assert s.cache_use(call, b, Usage(150, 1, cached_tokens=0, cache_write_5m_tokens=150)) == 30
    # Back after the 5-minute cache is gone.
    now[0] += 301
    assert s.cache_use(call, b, Usage(150, 1, cached_tokens=150)) == 150
    assert s.cache_use(NS(extra={}), a, Usage(1, 1, cache_write_5m_tokens=5)) == 0
