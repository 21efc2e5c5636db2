"""Cache-read share of a coding session with and without sticky sessions.

    python bench/sticky.py [--sessions 5] [--turns 20]

Replays Claude Code's recorded turns (tests/clients/agent_session.py) as
`--sessions` conversations of `--turns` turns each, through a group of two
Anthropic channels and a converted OpenAI one, weighted 1:1:1, each a fake
upstream account that counts prompt caching as its vendor does
(tests/fakes/prompt_cache.py).  Once through a relay with sticky sessions
(the default TTL) and once through one with `--sticky-session-ttl 0` (every
call drawn by weight, as before).  From the usage records: the share of
input tokens read from a cache on turns 2 and later, the tokens written,
the channel switches per conversation, and what the calls cost.

Prints a table and writes bench/results/sticky.json.  Not a test: nothing
is asserted (tests/relay/test_sessions.py asserts the behaviour).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from models.embedded import EmbeddedMongo  # noqa: E402
from tests.clients.agent_session import AgentSession  # noqa: E402
from tests.fakes.anthropic_upstream import FakeAnthropic  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402
from tests.helpers import USER_PASSWORD, Api, RelayProcess  # noqa: E402

# Anthropic's prices for a Sonnet-class model, USD per million tokens.
PRICE = {"input_price": 3, "output_price": 15, "cache_price": 0.3, "cache_write_price": 3.75}


def run(mongo_url: str, work: str, sticky: bool, sessions: int, turns: int) -> dict:
    args = [] if sticky else ["--sticky-session-ttl", "0"]
    relay = RelayProcess(mongo_url, os.path.join(work, "sticky" if sticky else "spread"),
                         args=args).start()
    fakes = [FakeAnthropic().start(), FakeAnthropic().start(), FakeOpenAI().start()]
    try:
        admin = Api.login(relay.url)
        model = "claude-bench"
        for i, fake in enumerate(fakes):
            fake.caching = True
            kind = "openai" if i == 2 else "anthropic"
            extra = {"model_mapping": {model: "gpt-4o-mini"},
                     "options": {"max_output_tokens": 16384}} if kind == "openai" else {}
            admin.create_channel(fake.url, [model], name=f"c{i}", type=kind, key=f"acct-{i}",
                                 **extra)
        admin.post("/api/price/", {"model": model, **PRICE})
        admin.create_user("bench", quota=10 ** 13)
        user = Api.login(relay.url, "bench", USER_PASSWORD)
        by_session: dict[str, list] = {}
        for n in range(sessions):  # a key each, so that its records are the session's
            tok = user.create_token(name=f"agent{n}", remain_quota=10 ** 12)
            agent = AgentSession(tok["key"], model, "s-" + uuid.uuid4().hex)
            for _ in range(turns):
                r = agent.send(relay.url)
                if r.status_code != 200:
                    raise SystemExit(f"turn failed: {r.status_code} {r.text[:300]}")
            deadline = time.monotonic() + 30
            while True:
                got = admin.get(f"/api/log/?token_id={tok['id']}&size=500")["data"]["items"]
                if len(got) >= turns or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            by_session[tok["key"]] = sorted(got, key=lambda r: r["created_at"])
    finally:
        for f in fakes:
            f.stop()
        relay.stop()
    recs = [r for rs in by_session.values() for r in rs]
    later = [r for rs in by_session.values() for r in rs[1:]]
    prompt = sum(r["prompt_tokens"] for r in later)
    cached = sum(r["cached_tokens"] for r in later)
    switches = [sum(1 for a, b in zip(rs, rs[1:]) if a["channel_id"] != b["channel_id"])
                for rs in by_session.values()]
    return {"sticky": sticky, "calls": len(recs), "share_turns_2_on": round(cached / prompt, 4),
            "cache_written": sum(r["cache_write_5m_tokens"] + r["cache_write_1h_tokens"]
                                 for r in recs),
            "cache_unread": sum(r["cache_unread"] for r in recs),
            "switches_per_session": round(sum(switches) / len(switches), 2),
            "cost_usd": round(sum(r["cost"] for r in recs) / 500_000, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sticky.json"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sticky-bench-")
    db = EmbeddedMongo(os.path.join(work, "db"))
    url = db.start()
    try:
        rows = [run(url, work, sticky, args.sessions, args.turns) for sticky in (False, True)]
    finally:
        db.stop()
    print(f"{'routing':<10} {'read share (turns 2+)':>22} {'written':>10} {'unread':>10} "
          f"{'switches':>9} {'cost USD':>9}")
    for r in rows:
        print(f"{'sticky' if r['sticky'] else 'by weight':<10} {r['share_turns_2_on']:>22.1%} "
              f"{r['cache_written']:>10,} {r['cache_unread']:>10,} "
              f"{r['switches_per_session']:>9} {r['cost_usd']:>9}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                   "sessions": args.sessions, "turns": args.turns, "runs": rows}, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
