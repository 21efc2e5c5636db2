"""How many calls a second billing keeps up with, over many keys.

    python bench/billing_rate.py [--root TREE] [--keys 2000] [--users 200]
                                 [--rates 500,1000,2000,3000] [--seconds 20]

Billing alone, as the relay drives it (relay/money/billing.py of the tree at
--root, default this one): for each rate, calls spread evenly over the keys
(and their accounts) each reserve, settle and journal a usage record in
the relay's shape, against the embedded database in its own process, as
the relay runs it.  The flusher stores and applies them (whatever the
tree's flusher does: this one bulk-writes a tick's balances and rollups).

A rate is kept up with when, at the end, every record is in the database
and applied, and none waited in the spill file: the figures are the
records that reached the spill file, the most that waited in memory, how
long after the last call the books were closed, and the flusher's ticks.
Prints a table and writes bench/results/billing_rate-<label>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def load(root: str):
    sys.path.insert(0, root)
    from models.store import Store
    from relay.money.billing import Billing
    from relay.money.pricing import USAGE_FIELDS
    return Store, Billing, USAGE_FIELDS


def timed(fn, into: list):
    """`fn` (a coroutine function), each call's seconds appended to `into`."""
    async def run(*a, **kw):
        t0 = time.monotonic()
        try:
            return await fn(*a, **kw)
        finally:
            into.append(time.monotonic() - t0)
    return run


def record(rid: str, uid: int, tid: int, usage_fields) -> dict:
    """A plain call's record as relay/service.py makes it."""
    return {"_id": rid, "user_id": uid, "username": f"u{uid}", "token_id": tid,
            "token_name": f"k{tid}", "group": "default", "model": f"model-{tid % 40}",
            "upstream_model": f"model-{tid % 40}", "channel_id": 1 + tid % 8,
            "endpoint": "chat", "face": "openai", **{f: 0 for f in usage_fields},
            "prompt_tokens": 120, "completion_tokens": 40, "estimated": False,
            "duration_ms": 300, "ttfb_ms": 100, "status": 200, "stream": False,
            "client_ip": "203.0.113.7", "billing_mode": "per_token", "error": "",
            "created_at": time.time()}


async def one_rate(Store, Billing, usage_fields, rate: float, seconds: float, keys: int,
                   users: int) -> dict:
    work = tempfile.mkdtemp(prefix="billing-rate-")
    store = Store("", work, "relay")
    await store.start()
    await store.db.users.insert_many([{"_id": u, "quota": 10 ** 13, "used_quota": 0}
                                      for u in range(1, users + 1)])
    await store.db.tokens.insert_many([{"_id": t, "user_id": 1 + t % users, "quota": 10 ** 12,
                                        "used_quota": 0} for t in range(1, keys + 1)])
    # Leases stay held through the run, as a relay serving every key at least
    # every few seconds holds them (the warm-up below takes longer than the
    # default 10 s of idleness after which a lease goes back).
    b = Billing(store, process_id=f"bench-{uuid.uuid4().hex[:6]}", data_dir=work,
                idle_release=3600)
    await b.start_up([])
    b.start()
    # Every key and account holds its first lease before the clock starts,
    # as in a relay that has been serving them (a lease is a round trip;
    # the next comes after 2,000,000 units).
    for tid in range(1, keys + 1):
        await b.refund(await b.reserve(uuid.uuid4().hex, 1 + tid % users, tid, True, 400))
    ticks: list[float] = []
    db_pid = store.embedded.proc.pid
    cpu0, own0 = cpu_seconds(db_pid), time.process_time()
    b.flush = timed(b.flush, ticks)
    applies: list[float] = []
    if hasattr(b, "apply_stored"):
        # A tree whose flusher applies beside its store ticks (flush() is then
        # the store tick alone): the applies timed on their own.
        b.apply_stored = timed(b.apply_stored, applies)
    peak = 0
    made = 0
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        due = int((time.monotonic() - t0) * rate)
        while n < due:
            tid = 1 + n % keys
            uid = 1 + tid % users
            rid = uuid.uuid4().hex
            res = await b.reserve(rid, uid, tid, True, 400)
            await b.settle(res, 200, record(rid, uid, tid, usage_fields))
            n += 1
            if n % 50 == 0:
                # As requests do in a relay: the flusher gets its turns even
                # while this catches up after a stall.
                await asyncio.sleep(0)
        made = n
        peak = max(peak, b.journal.pending)
        await asyncio.sleep(0.005)
    elapsed = time.monotonic() - t0
    spilled = b.journal.spill.size
    t1 = time.monotonic()
    while b.journal.pending or not b.journal.spill.empty:
        await asyncio.sleep(0.05)
        if time.monotonic() - t1 > 120:
            break
    drained = time.monotonic() - t1
    db_cpu, own_cpu = cpu_seconds(db_pid) - cpu0, time.process_time() - own0
    await b.stop()
    stored = await store.db.usage.estimated_document_count()
    used = sum([d.get("used_quota", 0) async for d in store.db.tokens.find({}, {"used_quota": 1})])
    await store.close()
    ticks.sort()
    applies.sort()
    return {"rate": rate, "calls": made, "calls_per_s": round(made / elapsed), "stored": stored,
            "applied_quota_ok": used == made * 200, "spilled_bytes": spilled,
            "peak_in_memory": peak, "drain_after_s": round(drained, 2),
            "ticks": len(ticks), "tick_p50_ms": round(ticks[len(ticks) // 2] * 1000) if ticks else None,
            "tick_p99_ms": round(ticks[int(len(ticks) * 0.99)] * 1000) if ticks else None,
            "apply_p50_ms": round(applies[len(applies) // 2] * 1000) if applies else None,
            "apply_p99_ms": round(applies[int(len(applies) * 0.99)] * 1000) if applies else None,
            "kept_up": spilled == 0 and stored == made and used == made * 200,
            # CPU per call, which moves far less with the machine's load than
            # whether a rate was kept up: the database's (the one process
            # every relay's billing goes through) and this process's billing.
            "db_cpu_us_per_call": round(db_cpu / max(made, 1) * 1e6),
            "billing_cpu_us_per_call": round(own_cpu / max(made, 1) * 1e6),
            "one_core_sustains_per_s": round(made / db_cpu) if db_cpu else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--label", default="")
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--rates", default="500,1000,2000,3000")
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    label = args.label or ("this" if root == ROOT else os.path.basename(root))
    Store, Billing, usage_fields = load(root)
    rows = []
    for rate in [float(r) for r in args.rates.split(",")]:
        out = asyncio.run(one_rate(Store, Billing, usage_fields, rate, args.seconds, args.keys,
                                   args.users))
        rows.append(out)
        print(json.dumps(out), flush=True)
    print(f"\n{label}: {args.keys} keys, {args.users} accounts, {args.seconds:g} s a rate; "
          f"load average {os.getloadavg()}")
    print(f"{'asked/s':>8} {'made/s':>7} {'stored':>8} {'spilled B':>10} {'peak mem':>9} "
          f"{'drain s':>8} {'tick p50/p99 ms':>16} {'apply p50/p99':>14} {'db us/call':>10} "
          f"{'1 core/s':>8}  kept up")
    for r in rows:
        print(f"{r['rate']:8.0f} {r['calls_per_s']:7d} {r['stored']:8d} {r['spilled_bytes']:10d} "
              f"{r['peak_in_memory']:9d} {r['drain_after_s']:8.2f} "
              f"{str(r['tick_p50_ms']) + '/' + str(r['tick_p99_ms']):>16} "
              f"{str(r.get('apply_p50_ms')) + '/' + str(r.get('apply_p99_ms')):>14} "
              f"{r['db_cpu_us_per_call']:10d} {r['one_core_sustains_per_s']!s:>8}  {r['kept_up']}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"billing_rate-{label}.json"), "w") as f:
        json.dump({"label": label, "keys": args.keys, "users": args.users, "rows": rows,
                   "loadavg": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
