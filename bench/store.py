"""Store benchmark: our own write pattern against each embedded server.

    python bench/store.py [--records 1000000] [--batch 500] [--servers nx,secantus]

For each server it starts the server as a separate process on 127.0.0.1
(nx-27017 through models/embedded.py, SecantusDB as `secantusd-py`: it is
GPL-2.0, so it is only ever run, never imported), then writes usage records
the way the relay's flusher does, tick after tick:

  insert_many(batch of usage records, ordered=False)
  then, per tick, one conditional $inc per touched balance (10 accounts,
  10 keys), with the per-process applied-sequence marker (relay/money/leases.py)

and reports records/s for every tenth of the run, so a slowdown as the
collection grows shows, plus the p50/p99 of one tick.  Then it runs the
fidelity suite (tests/models/test_store_fidelity.py) against the same server and
counts failures.  Prints a table and writes bench/results/store.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pymongo import MongoClient  # noqa: E402

from models.embedded import EmbeddedMongo, secantus_command  # noqa: E402
from models.store import all_of  # noqa: E402
from relay.money.pricing import USAGE_FIELDS  # noqa: E402
from relay.money.usage import stored  # noqa: E402
from tests.helpers import free_port, wait_port  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")


def start(name: str, where: str):
    if name == "nx":
        db = EmbeddedMongo(where)
        url = db.start()
        return url, db.stop, db.proc.pid
    port = free_port()
    proc = subprocess.Popen(secantus_command(os.path.join(where, "db"), port),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, what="secantusd-py")

    def stop():
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return f"mongodb://127.0.0.1:{port}/?directConnection=true", stop, proc.pid


FULL = False  # --full-records: every field, as records were stored before relay/usage.stored()


def record(pid: str, seq: int, user: int, token: int) -> dict:
    """A plain call's usage record, as relay/service.py makes it and the
    flusher stores it (relay/usage.stored(): default fields left out)."""
    doc = {"_id": uuid.uuid4().hex, "user_id": user, "username": f"u{user}", "token_id": token,
           "token_name": "k", "group": "default", "model": "gpt-4o-mini",
           "upstream_model": "gpt-4o-mini", "channel_id": 1, "endpoint": "chat", "face": "openai",
           **{f: 0 for f in USAGE_FIELDS}, "prompt_tokens": 10, "completion_tokens": 3,
           "cost": 8, "quota": 8, "unpaid": 0, "estimated": False, "duration_ms": 3,
           "ttfb_ms": 2, "status": 200, "stream": False, "client_ip": "127.0.0.1",
           "billing_mode": "per_token", "error": "", "created_at": time.time(),
           "proc": pid, "seq": seq, "token_limited": True}
    return doc if FULL else stored(doc)


def cpu_seconds(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def run_one(name: str, records: int, batch: int, check_fidelity: bool = True) -> dict:
    where = tempfile.mkdtemp(prefix=f"store-{name}-")
    url, stop, spid = start(name, where)
    try:
        db = MongoClient(url)["bench"]
        db.usage.create_index([("user_id", 1), ("created_at", -1)])
        db.usage.create_index([("created_at", -1)])
        db.usage.create_index([("token_id", 1)])
        pid, seq = "bench-" + uuid.uuid4().hex[:6], 0
        for i in range(1, 11):
            for coll in (db.users, db.tokens):
                coll.insert_one({"_id": i, "quota": 10**12, "used_quota": 0,
                                 "leases": {pid: 10**9}, "applied": {pid: 0}})
        window, windows, ticks = records // 10, [], []
        t_start = time.monotonic()
        cpu0 = cpu_seconds(spid)
        w_start, w_done = t_start, 0
        done = 0
        while done < records:
            n = min(batch, records - done)
            docs = []
            for _ in range(n):
                seq += 1
                u = random.randint(1, 10)
                docs.append(record(pid, seq, u, u))
            t0 = time.monotonic()
            db.usage.insert_many(docs, ordered=False)
            sums: dict = {}
            for d in docs:
                sums[d["user_id"]] = sums.get(d["user_id"], 0) + d["quota"]
            for coll in (db.users, db.tokens):
                for ident, s in sums.items():
                    coll.update_one(all_of({"_id": ident}, {f"applied.{pid}": {"$lt": seq}},
                                           {f"leases.{pid}": {"$exists": True}}),
                                    {"$inc": {f"leases.{pid}": -s, "used_quota": s},
                                     "$set": {f"applied.{pid}": seq}})
            ticks.append(time.monotonic() - t0)
            done += n
            w_done += n
            if w_done >= window or done == records:
                now = time.monotonic()
                windows.append(round(w_done / (now - w_start)))
                print(f"  {name}: {done:>9,} records, {windows[-1]:>7,}/s in the last window",
                      flush=True)
                w_start, w_done = now, 0
        total = time.monotonic() - t_start
        cpu = cpu_seconds(spid) - cpu0
        used = sum(d["used_quota"] for d in db.users.find({}))
        count = db.usage.count_documents({})
        ticks.sort()
        out = {"server": name, "records": records, "batch": batch, "seconds": round(total, 1),
               "records_per_s": round(records / total), "windows_per_s": windows,
               "tick_p50_ms": round(ticks[len(ticks) // 2] * 1000, 1),
               "tick_p99_ms": round(ticks[int(len(ticks) * 0.99)] * 1000, 1),
               "server_cpu_us_per_record": round(cpu / records * 1e6, 1),
               "books_balance": used == records * 8 and count == records}
    finally:
        stop()
        shutil.rmtree(where, ignore_errors=True)
    out["fidelity_failures"] = fidelity(name) if check_fidelity else None
    return out


def fidelity(name: str) -> int | None:
    """Failures of tests/models/test_store_fidelity.py against a fresh server of this kind."""
    where = tempfile.mkdtemp(prefix=f"fid-{name}-")
    url, stop, _ = start(name, where)
    try:
        env = dict(os.environ, RELAY_TEST_MONGO_URL=url, RELAY_FIDELITY_RAW="1")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                            "tests/models/test_store_fidelity.py"], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        print(f"  {name} fidelity (raw driver, no compatibility layer): {last}", flush=True)
        failed = 0
        for part in last.replace("=", "").split(","):
            part = part.strip()
            if part.endswith("failed"):
                failed = int(part.split()[0])
        return failed
    finally:
        stop()
        shutil.rmtree(where, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--servers", default="nx,secantus")
    ap.add_argument("--no-fidelity", action="store_true")
    ap.add_argument("--full-records", action="store_true",
                    help="store every field, default ones too (as before relay/usage.stored())")
    args = ap.parse_args()
    global FULL
    FULL = args.full_records
    results = []
    for name in args.servers.split(","):
        print(f"{name}: {args.records:,} records in batches of {args.batch}", flush=True)
        results.append(run_one(name, args.records, args.batch, not args.no_fidelity))
    print(f"\n{'server':10} {'records/s':>10} {'first→last tenth /s':>22} {'tick p50/p99 ms':>17} "
          f"{'cpu µs/rec':>10} {'fidelity fails':>14} books")
    for r in results:
        w = r["windows_per_s"]
        print(f"{r['server']:10} {r['records_per_s']:>10,} {w[0]:>10,} → {w[-1]:>9,} "
              f"{r['tick_p50_ms']:>8}/{r['tick_p99_ms']:<8} {r['server_cpu_us_per_record']:>10} "
              f"{str(r['fidelity_failures']):>14} {'ok' if r['books_balance'] else 'WRONG'}")
    os.makedirs(RESULTS, exist_ok=True)
    name = "-".join(args.servers.split(",")) + ("-full" if FULL else "")
    with open(os.path.join(RESULTS, f"store-{name}.json"), "w") as fh:
        json.dump({"load_average": os.getloadavg(), "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
