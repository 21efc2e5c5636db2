"""Cache health you can see: each call's record carries what caching saved
and the conversation's earlier cache write no call read; the usage API
totals them, /api/log/self/cache and /api/log/cache give them per key and
per channel, and the CSV export has them per record and in its TOTAL row.
Against a fake Anthropic upstream that counts its prompt cache per account
(tests/fakes/prompt_cache.py), driven by Claude Code's recorded turns."""
from __future__ import annotations

import csv
import io
import uuid

import pytest

from tests.clients.agent_session import AgentSession
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.helpers import USER_PASSWORD, Api, eventually

# USD per million: input 2, cache read 0.2, cache write 2.5, output 8.
PRICES = {"input_price": 2, "output_price": 8, "cache_price": 0.2, "cache_write_price": 2.5}


@pytest.fixture(scope="module")
def env(relay, admin):
    fake = FakeAnthropic().start()
    fake.caching = True
    model = "cc-" + uuid.uuid4().hex[:6]
    ch = admin.create_channel(fake.url, [model], name="cache-" + model, type="anthropic",
                              key="acct-" + model)
    admin.post("/api/price/", {"model": model, **PRICES})
    name = "ch" + uuid.uuid4().hex[:6]
    admin.create_user(name, quota=10 ** 12)
    user = Api.login(relay.url, name, USER_PASSWORD)
    yield {"relay": relay, "admin": admin, "user": user, "fake": fake, "model": model, "ch": ch}
    fake.stop()


def records(env, tok, n):
    def got():
        items = env["user"].get(f"/api/log/self?token_id={tok['id']}&size=50")["data"]
        assert len(items["items"]) == n, items["items"]
        # Totals (and cache health) are the rollups, applied within two
        # flush intervals of the records being stored (relay/money/flusher.py).
        assert items["totals"]["requests"] == n, items["totals"]
        return sorted(items["items"], key=lambda r: r["created_at"]), items["totals"]
    return eventually(got, timeout=15)


def saving(rec) -> int:
    """What caching saved, at PRICES: reads at 0.2 instead of 2, writes at
    2.5 instead of 2 (USD per million; 500,000 units a USD)."""
    w = rec["cache_write_5m_tokens"] + rec["cache_write_1h_tokens"]
    return round((rec["cached_tokens"] * 1.8 - w * 0.5) / 2)


def test_cache_health_per_call_per_key_per_channel_and_in_the_csv(env):
    tok = env["user"].create_token(name="agent", remain_quota=10 ** 11)
    agent = AgentSession(tok["key"], env["model"], "s-" + uuid.uuid4().hex)
    for _ in range(3):
        assert agent.send(env["relay"].url).status_code == 200
    # The conversation's start changes: nothing is read, the last write was wasted.
    agent.body["system"][-1]["text"] += " Changed."
    assert agent.send(env["relay"].url).status_code == 200
    recs, totals = records(env, tok, 4)
    assert recs[0]["cached_tokens"] == 0 and recs[0]["cache_write_5m_tokens"] > 0
    assert recs[1]["cached_tokens"] > 0 and recs[2]["cached_tokens"] > 0
    assert recs[3]["cached_tokens"] < recs[2]["cached_tokens"]
    assert [r["cache_unread"] for r in recs] == [0, 0, 0, recs[2]["cache_write_5m_tokens"]]
    for r in recs:
        assert r["cache_saved"] == saving(r), r
    assert recs[0]["cache_saved"] < 0 < recs[1]["cache_saved"]  # writing costs, reading pays
    for k in ("cached_tokens", "cache_saved", "cache_unread", "prompt_tokens"):
        assert totals[k] == sum(r[k] for r in recs), k

    by_key = env["user"].get(f"/api/log/self/cache?token_id={tok['id']}")["data"]["items"]
    assert len(by_key) == 1 and by_key[0]["token_id"] == tok["id"]
    row = by_key[0]
    assert row["name"] == "agent" and row["requests"] == 4
    assert row["cached_tokens"] == totals["cached_tokens"]
    assert row["share"] == round(totals["cached_tokens"] / totals["prompt_tokens"], 4)
    assert row["cache_unread"] == recs[3]["cache_unread"]
    assert row["cache_saved"] == totals["cache_saved"]

    by_channel = env["admin"].get(f"/api/log/cache?by=channel&token_id={tok['id']}")["data"]
    assert [(r["channel_id"], r["cached_tokens"]) for r in by_channel["items"]] == \
        [(env["ch"]["id"], totals["cached_tokens"])]
    # A user sees only their own keys, and no channels.
    env["user"].get("/api/log/self/cache?by=channel", expect=None)
    other = env["admin"].get("/api/log/self/cache")["data"]["items"]
    assert all(r["token_id"] != tok["id"] for r in other)

    text = env["user"].get(f"/api/log/self/export?token_id={tok['id']}").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["cache_unread"]) for r in rows[:-1]][::-1] == [r["cache_unread"] for r in recs]
    assert rows[-1]["request_id"] == "TOTAL"
    assert int(rows[-1]["cache_saved"]) == totals["cache_saved"]
    assert int(rows[-1]["cached_tokens"]) == totals["cached_tokens"]
