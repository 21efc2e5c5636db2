"""Money across relays, measured: three relay processes on one database
(the embedded server, started here) behind a round-robin client.

    python bench/relays.py [--invalidations 40] [--rounds 3]

A benchmark, not a test (tests/relay/money/test_across_relays.py asserts
the behaviour): it prints the figures README's "Several relays on one
database" states and writes them to bench/results/relays.json.

- small balance: a key of 200 calls' worth, 260 calls over the three relays
  (six callers, streams and plain calls in turn): calls served, calls
  refused while money remained (200 less those served), units below zero;
- lowering: a key set to 0 on relay A while B and C serve it (six
  callers): how long the change took, calls answered while it was under
  way, calls started after it was answered and served anyway (goal 0), and
  the key's balance at the end (units below zero: goal 0);
- warning: a threshold crossed by the last of 30 calls over the three
  relays: seconds from the crossing call's answer to the warning's
  delivery (a webhook receiver), and the balance it carried against the
  real one;
- invalidation: a key disabled on one relay (in turn each of the three; the
  third runs 20 s behind, tests/clocked_server.py): seconds until both
  others refuse it (p50, p100), given up after 10 s (counted as missed; on
  a tree where an invalidation can be lost it would otherwise wait for the
  caches' 300 s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models.embedded import EmbeddedMongo  # noqa: E402
from tests.fakes.notify_receivers import NotifyReceivers  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402
from tests.helpers import USER_PASSWORD, Api  # noqa: E402
from tests.relay.money.across import (RoundRobin, balance_books, chat,  # noqa: E402
                                      served_everywhere, settled, start_relays, stop_relays)
from tests.relay.money.money_env import MODEL, PRICE, client  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def tenant(t, user_quota, key_quotas):
    name = "u" + uuid.uuid4().hex[:8]
    user = t["admin"].create_user(name, quota=user_quota)
    api = Api.login(t["urls"][0], name, USER_PASSWORD)
    keys = [api.create_token(name=f"k{i}", remain_quota=q, billing_mode="per_call")
            for i, q in enumerate(key_quotas)]
    return user, api, keys


def small_balance(t) -> dict:
    _, _, (key,) = tenant(t, 80_000_000, [200 * PRICE])
    calls = RoundRobin(t["urls"], [key["key"]], threads=6).run(260)
    served = sum(c.status == 200 for c in calls)
    b = settled(t["db"], "token", key["id"])
    return {"served": served, "refused": len(calls) - served,
            "refused_while_money_remained": max(200 - served, 0),
            "units_below_zero": max(-b["remain"], 0)}


def lowering(t) -> dict:
    _, api, (key,) = tenant(t, 80_000_000, [50_000_000])
    served_everywhere(t["relays"], key["key"])
    load = RoundRobin(t["urls"][1:], [key["key"]], threads=6).start()
    time.sleep(1.5)
    sent = time.time()
    api.put("/api/token/", {"id": key["id"], "remain_quota": 0})
    answered = time.time()
    time.sleep(1.5)
    load.stop()
    ok = load.ok()
    b = settled(t["db"], "token", key["id"])
    return {"took_s": round(answered - sent, 3),
            "answered_while_under_way": sum(sent <= c.done <= answered for c in ok),
            "started_after_and_served": sum(c.sent > answered for c in ok),
            "final_balance": b["remain"], "units_below_zero": max(-b["remain"], 0)}


def warning(t, hooks) -> dict:
    calls = 30
    user, api, (key,) = tenant(t, 10_000_000, [5_000_000])
    name = uuid.uuid4().hex[:8]
    api.post("/api/subscription/", {
        "name": "low", "event_types": ["user_quota_warning", "key_quota_warning"],
        "user_threshold": 10_000_000 - calls * PRICE + 1,
        "key_threshold": 5_000_000 - calls * PRICE + 1, "channel_type": "webhook",
        "channel_config": {"url": f"{hooks.url}/hook/ok/{name}"}, "enabled": True})
    time.sleep(1.0)
    done = RoundRobin(t["urls"], [key["key"]], threads=3).run(calls)
    crossed = max(c.done for c in done)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(hooks.delivered("webhook", f"/hook/ok/{name}")) < 2:
        time.sleep(0.02)
    time.sleep(1.0)
    got = hooks.delivered("webhook", f"/hook/ok/{name}")
    real = {"user_quota_warning": balance_books(t["db"], "user", user["id"])["remain"],
            "key_quota_warning": balance_books(t["db"], "token", key["id"])["remain"]}
    # (When it was raised is in its event record, on the raising relay's
    # clock, which may be the one 20 s behind: the receiver's clock is this one.)
    return {"deliveries": len(got),
            "delivered_after_s": {r["json"]["event_type"]: round(r["at"] - crossed, 3)
                                  for r in got},
            "balance_reported_minus_real": {r["json"]["event_type"]: int(r["json"]["balance"])
                                            - real[r["json"]["event_type"]] for r in got}}


def invalidations(t, n: int, give_up: float = 10.0) -> dict:
    name = "i" + uuid.uuid4().hex[:8]
    t["admin"].create_user(name, quota=10 ** 12)
    took, missed = [], 0
    for i in range(n):
        writer = i % 3
        api = Api.login(t["urls"][writer], name, USER_PASSWORD)
        key = api.create_token(name=f"k{i}", remain_quota=10 ** 9, billing_mode="per_call")
        served_everywhere(t["relays"], key["key"])
        sent = time.time()
        api.put("/api/token/?status_only=true", {"id": key["id"], "status": 2})
        pending = {u for j, u in enumerate(t["urls"]) if j != writer}
        while pending and time.time() - sent < give_up:
            for u in list(pending):
                if chat(u, key["key"]).status_code == 401:
                    pending.discard(u)
        if pending:
            missed += 1
        took.append(time.time() - sent)
    # A missed one counts as give_up seconds: what it took is at least that.
    return {"count": n, "p50_s": round(statistics.median(took), 3),
            "p100_s": round(max(took), 3), f"missed_after_{give_up:g}_s": missed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--invalidations", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-relays-")
    db = EmbeddedMongo(os.path.join(work, "db"))
    url = db.start()
    fake = FakeOpenAI(record=False).start()
    hooks = NotifyReceivers().start()

    class Dir:
        def __truediv__(self, name):
            return os.path.join(work, name)
    relays = start_relays(url, Dir(), extra={
        2: {"script": "tests/clocked_server.py", "env": {"RELAY_CLOCK_SHIFT": "-20"}}})
    try:
        admin = Api.login(relays[0].url)
        admin.create_channel(fake.url, [MODEL])
        admin.set_price(MODEL, input_price=1, output_price=1, call_price=0.001)
        t = {"relays": relays, "admin": admin, "urls": [r.url for r in relays],
             "db": client(url)[relays[0].db_name]}
        _, _, (warm,) = tenant(t, 10 ** 9, [10 ** 9])
        served_everywhere(relays, warm["key"])
        out = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "load_average": os.getloadavg(), "rounds": []}
        for r in range(args.rounds):
            row = {"small_balance": small_balance(t), "lowering": lowering(t),
                   "warning": warning(t, hooks)}
            out["rounds"].append(row)
            print(json.dumps(row), flush=True)
        out["invalidation"] = invalidations(t, args.invalidations)
        print(json.dumps(out["invalidation"]))
        out["load_average_after"] = os.getloadavg()
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "relays.json"), "w") as fh:
            json.dump(out, fh, indent=1)
    finally:
        stop_relays(relays)
        hooks.stop()
        fake.stop()
        db.stop()


if __name__ == "__main__":
    main()
