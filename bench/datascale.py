"""The embedded database at scale: a relay with N usage records.

    python bench/datascale.py [--records 1000000] [--root TREE] [--label NAME]
                              [--via-driver] [--probe-rate 20] [--repeat 3]
                              [--db-mem-gib 8] [--workdir DIR] [--keep]
                              [--data DIR] [--exports 30,7]

Starts, on 127.0.0.1, the fake OpenAI upstream and a relay of the tree at
--root (default: this one) on its embedded database, sets up through the
management API what a modest business has (a channel, prices, a user
"heavy" who makes a tenth of the calls with ten keys, a probe key), stops
the relay and adds N usage records in the relay's own shape: 30 days, 200
users, 2,000 keys, 40 models, 8 channels, 3% failed calls
(models/bulkload.py: rows written into the server's own file; with
--via-driver the same documents go through the driver, insert_many in
batches of 1,000, at the server's pace).  When the tree keeps rollups
(relay/money/rollups.py) they are made from the records by its own code.

Then it starts the relay (timed: cold start), and while a probe makes
plain relay calls at --probe-rate a second, times each console query
--repeat times: the usage log (first and next page; all, a user with a
tenth of the records, a light user, a key, a model, a channel, a status,
the last 24 hours), the daily charts (admin 30 and 90 days, the heavy
user's dashboard) and CSV exports of the heavy user's month and week
(first byte, whole, rows, whether it ends in TOTAL); then the database's peak memory
(VmHWM of each embedded server process), the data directory's size, and a
restart (SIGTERM to listening again).  The probe's non-200 answers and its
p50/p99 are those of the whole query phase.

Figures move with the machine's load: the load average is printed with
them.  Prints one table and writes bench/results/datascale-<label>-<N>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402
from procs import ROOT  # noqa: E402

import requests  # noqa: E402

from models import bulkload  # noqa: E402
from tests.helpers import Api, free_port, wait_port  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
ADMIN_PASSWORD = "bench-admin-password"
HEAVY_PASSWORD = "Heavy-Bench-Password-7"
PROBE_MODEL = "gpt-4o-mini"
PROBE_BODY = json.dumps({"model": PROBE_MODEL, "messages": [
    {"role": "user", "content": "Say hello to the benchmark, in one short line."}]})
MODELS = [f"bench-model-{i:02d}" for i in range(40)]
CHANNELS = 8
USERS = 200
KEYS_PER_USER = 10


def sh(cmd: list[str], cwd: str = ROOT) -> str:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout


def du(path: str) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(base, f))
            except OSError:
                pass
    return total


def cap_memory(gib: float):
    """RLIMIT_AS for the relay and its database child (inherited): a
    database that would load every record dies at the cap, not the machine."""
    def apply() -> None:
        if gib > 0:
            limit = int(gib * 1024 ** 3)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


class Relay:
    def __init__(self, root: str, data_dir: str, log_path: str, mem_gib: float):
        self.root, self.data_dir, self.log_path, self.mem_gib = root, data_dir, log_path, mem_gib
        self.proc: subprocess.Popen | None = None
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 900.0) -> float:
        """Start; seconds until /api/status answers 200."""
        env = dict(os.environ, RELAY_ADMIN_PASSWORD=ADMIN_PASSWORD, PYTHONUNBUFFERED="1")
        env.pop("RELAY_MONGO_URL", None)
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(self.root, "server.py"), "--host", "127.0.0.1",
             "--port", str(self.port), "--data-dir", self.data_dir],
            cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=cap_memory(self.mem_gib))
        log.close()
        wait_port(self.port, self.proc, timeout=timeout, what="relay")
        while time.monotonic() - t0 < timeout:
            try:
                if requests.get(self.url + "/api/status", timeout=5).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("relay did not answer /api/status")

    def stop(self) -> float:
        t0 = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        return time.monotonic() - t0

    def db_peaks_mib(self) -> list[float]:
        return [procs.status_kb(p, "VmHWM") / 1024 for p in procs.database(self.proc.pid)]


def population(heavy_user: int, heavy_keys: list[int], now: float, days: float) -> bulkload.Population:
    keys = [(heavy_user, "heavy", k, f"heavy-key-{i}") for i, k in enumerate(heavy_keys)]
    for u in range(USERS - 1):
        uid = 100_000 + u
        keys += [(uid, f"user{u}", 1_000_000 + u * KEYS_PER_USER + j, f"key-{j}")
                 for j in range(KEYS_PER_USER)]
    return bulkload.Population(keys=keys, heavy=list(range(len(heavy_keys))), models=MODELS,
                               channels=list(range(1, CHANNELS + 1)), now=now, days=days)


def build(data_dir: str, n: int, pop: bulkload.Population, via_driver: bool, root: str) -> dict:
    path = bulkload.db_file(data_dir)
    sums = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "build-sums.db")
    if os.path.exists(sums):
        os.remove(sums)
    t0 = time.monotonic()
    if via_driver:
        from pymongo import MongoClient

        from models.embedded import EmbeddedMongo
        scratch = os.path.join(os.path.dirname(data_dir), "scratch.db")
        s = bulkload.sqlite3.connect(scratch)
        s.execute("CREATE TABLE usage (id INTEGER PRIMARY KEY AUTOINCREMENT, _id TEXT, data TEXT)")
        s.close()
        bulkload.build_usage(scratch, n, pop)
        db = EmbeddedMongo(data_dir)
        client = MongoClient(db.start())
        try:
            coll = client.relay.usage
            src = bulkload.sqlite3.connect(scratch)
            batch = []
            for (text,) in src.execute("SELECT data FROM usage ORDER BY id"):
                batch.append(json.loads(text))
                if len(batch) == 1000:
                    coll.insert_many(batch, ordered=False)
                    batch = []
            if batch:
                coll.insert_many(batch, ordered=False)
            src.close()
        finally:
            client.close()
            db.stop()
        os.remove(scratch)
    else:
        bulkload.build_usage(path, n, pop, sums=sums)
    built = time.monotonic() - t0
    rolled = 0.0
    if os.path.exists(os.path.join(root, "relay", "money", "rollups.py")):
        t1 = time.monotonic()
        make_rollups(root, path, None if via_driver else sums)
        rolled = time.monotonic() - t1
    if os.path.exists(sums):
        os.remove(sums)
    return {"records_s": round(built, 1), "rollups_s": round(rolled, 1)}


def make_rollups(root: str, path: str, sums: str | None) -> None:
    """The tree's own rollups of the stored records (as its flusher makes
    them): from the sums the build kept (rollups.build_built) when the tree
    has that, else from the records read back (rollups.build_file)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from relay.money import rollups;"
            "fast = len(sys.argv) > 3 and hasattr(rollups, 'build_built');"
            "rollups.build_built(sys.argv[2], sys.argv[3]) if fast else "
            "rollups.build_file(sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, root, path, *([sums] if sums else [])],
                   cwd=root, check=True)


class Probe(threading.Thread):
    """Plain relay calls at a steady rate, each one timed."""

    def __init__(self, url: str, key: str, rate: float):
        super().__init__(daemon=True)
        self.url, self.key, self.rate = url, key, rate
        self.results: list[tuple[float, int, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {self.key}"
        s.headers["Content-Type"] = "application/json"
        nxt = time.monotonic()
        while not self.stopping.is_set():
            t0 = time.monotonic()
            try:
                r = s.post(self.url + "/v1/chat/completions", data=PROBE_BODY, timeout=60)
                status = r.status_code
            except requests.RequestException:
                status = 0
            self.results.append((t0, status, time.monotonic() - t0))
            nxt += 1 / self.rate
            time.sleep(max(0.0, nxt - time.monotonic()))

    def summary(self, since: float, until: float) -> dict:
        got = [r for r in self.results if since <= r[0] <= until]
        lat = sorted(r[2] for r in got)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1)) if lat else (
            lambda q: None)
        return {"calls": len(got), "non_200": sum(1 for r in got if r[1] != 200),
                "statuses": sorted({r[1] for r in got}), "p50_ms": pick(0.5),
                "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 1) if lat else None}


def timed_get(api: Api, path: str, timeout: float) -> tuple[float, int, dict | None]:
    t0 = time.monotonic()
    try:
        r = api.s.get(api.base + path, timeout=timeout)
        dt = time.monotonic() - t0
        body = r.json() if r.headers.get("Content-Type", "").startswith("application/json") else None
        return dt, r.status_code, body
    except requests.RequestException:
        return time.monotonic() - t0, 0, None


def export(api: Api, path: str, timeout: float) -> dict:
    t0 = time.monotonic()
    first = None
    rows = 0
    last = b""
    status = 0
    try:
        with api.s.get(api.base + path, stream=True, timeout=timeout) as r:
            status = r.status_code
            tail = b""
            for chunk in r.iter_content(65536):
                if first is None:
                    first = time.monotonic() - t0
                rows += chunk.count(b"\n")
                tail = (tail + chunk)[-4096:]
            last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    except requests.RequestException as exc:
        return {"status": 0, "error": str(exc), "seconds": round(time.monotonic() - t0, 2)}
    return {"status": status, "first_byte_s": round(first or 0, 3),
            "seconds": round(time.monotonic() - t0, 2), "rows": max(rows - 1, 0),
            "total_row": last.startswith(b"TOTAL"), "last_line": last[:120].decode(errors="replace")}


def queries(keyset: bool, heavy_user: int, light_user: int, key: int, now: float) -> list:
    """(name, who, path, next-page): who is 'admin' or 'heavy'."""
    day = now - 86400
    out = [
        ("log: all", "admin", "/api/log/?size=50", True),
        ("log: heavy user (self, 10%)", "heavy", "/api/log/self?size=50", True),
        ("log: light user (admin)", "admin", f"/api/log/?user_id={light_user}&size=50", False),
        ("log: one key", "admin", f"/api/log/?token_id={key}&size=50", False),
        ("log: one model", "admin", f"/api/log/?model={MODELS[7]}&size=50", False),
        ("log: one channel", "admin", "/api/log/?channel_id=3&size=50", False),
        ("log: status 429", "admin", "/api/log/?status=429&size=50", False),
        ("log: last 24 h", "admin", f"/api/log/?start={day:.0f}&end={now:.0f}&size=50", False),
        ("chart: admin 30 days", "admin", "/api/log/daily?days=30&tz_offset=0", False),
        ("chart: admin 90 days", "admin", "/api/log/daily?days=90&tz_offset=60", False),
        ("chart: heavy user 30 days", "heavy", "/api/log/self/daily?days=30&tz_offset=480", False),
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--root", default=ROOT, help="the tree whose server.py to run")
    ap.add_argument("--label", default="")
    ap.add_argument("--via-driver", action="store_true")
    ap.add_argument("--probe-rate", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for one query")
    ap.add_argument("--db-mem-gib", type=float, default=8.0,
                    help="address-space cap of the relay and its database (0: none)")
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--workdir", default="", help="where to build (default: a temp dir)")
    ap.add_argument("--data", default="",
                    help="a data directory kept between runs: built there when it holds no "
                         "build of --records yet, reused as it is otherwise")
    ap.add_argument("--exports", default="30,7",
                    help="days of the heavy user's CSV exports, comma-separated ('' for none)")
    args = ap.parse_args()
    # SIGTERM ends the run through its finally: no process left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = os.path.abspath(args.root)
    label = args.label or ("this" if root == ROOT else os.path.basename(root))
    work = tempfile.mkdtemp(prefix="datascale-", dir=args.workdir or None)
    data_dir = os.path.join(os.path.abspath(args.data), "data") if args.data else os.path.join(
        work, "data")
    kept = os.path.join(os.path.dirname(data_dir), "datascale.json")
    upstream = relay = probe = None
    out: dict = {"label": label, "root": root, "records": args.records, "machine": procs.machine()}
    try:
        upstream, upstream_url = procs.start_upstream(work)
        relay = Relay(root, data_dir, os.path.join(work, "relay.log"), args.db_mem_gib)
        made = {}
        if os.path.exists(kept):
            with open(kept) as f:
                made = json.load(f)
            if made.get("records") != args.records:
                raise SystemExit(f"{kept}: a build of {made.get('records')} records, "
                                 f"not {args.records}: give another --data")
        if made:
            # A kept build: its fake upstream is gone, the channel goes to this one.
            out["build"] = {**made["build"], "reused": True}
            out["cold_start_s"] = round(relay.start(), 2)
            admin = Api.login(relay.url, "root", ADMIN_PASSWORD)
            admin.put("/api/channel/", {"id": made["channel"], "base_url": upstream_url})
            heavy, heavy_keys, probe_key = made["heavy"], made["heavy_keys"], made["probe_key"]
            now = time.time()
        else:
            relay.start()
            admin = Api.login(relay.url, "root", ADMIN_PASSWORD)
            channel = admin.create_channel(upstream_url, [PROBE_MODEL] + MODELS, name="bench")
            admin.set_price(PROBE_MODEL, input_price=1, output_price=2)
            heavy = admin.create_user("heavy", password=HEAVY_PASSWORD, quota=10 ** 13)
            hapi = Api.login(relay.url, "heavy", HEAVY_PASSWORD)
            heavy_keys = [hapi.create_token(f"heavy-key-{i}", remain_quota=10 ** 12)["id"]
                          for i in range(KEYS_PER_USER)]
            probe_key = hapi.create_token("probe", unlimited_quota=True)["key"]
            relay.stop()
            now = time.time()
            pop = population(heavy["id"], heavy_keys, now, args.days)
            print(f"building {args.records:,} records ...", flush=True)
            out["build"] = build(data_dir, args.records, pop, args.via_driver, root)
            print(f"  built in {out['build']}", flush=True)
            if args.data:
                with open(kept, "w") as f:
                    json.dump({"records": args.records, "build": out["build"], "built_at": now,
                               "channel": channel["id"], "heavy": heavy,
                               "heavy_keys": heavy_keys, "probe_key": probe_key}, f)
            out["cold_start_s"] = round(relay.start(), 2)
            admin = Api.login(relay.url, "root", ADMIN_PASSWORD)
        hapi = Api.login(relay.url, "heavy", HEAVY_PASSWORD)
        first = admin.get("/api/log/?size=1", expect=None)
        keyset = isinstance(first, dict) and "older" in (first.get("data") or {})
        out["api"] = "keyset" if keyset else "pages"
        probe = Probe(relay.url, probe_key, args.probe_rate)
        probe.start()
        time.sleep(2)
        t_start = time.monotonic()
        who = {"admin": admin, "heavy": hapi}
        results = {}
        for name, whom, path, paged in queries(keyset, heavy["id"], 100_017, 1_000_000 + 123, now):
            api = who[whom]
            runs = []
            nxt = None
            for _ in range(args.repeat):
                dt, status, body = timed_get(api, path, args.timeout)
                runs.append((dt, status))
                data = (body or {}).get("data") or {}
                nxt = data.get("older") if keyset else 2
            res = {"seconds": [round(r[0], 3) for r in runs], "status": [r[1] for r in runs]}
            if paged and nxt:
                page2 = path + (f"&older={nxt}" if keyset else "&p=2")
                runs2 = [timed_get(api, page2, args.timeout)[:2] for _ in range(args.repeat)]
                results[name + ", next page"] = {"seconds": [round(r[0], 3) for r in runs2],
                                                 "status": [r[1] for r in runs2]}
            results[name] = res
            print(f"  {name:36s} {statistics.median(res['seconds']):8.3f} s  {res['status']}",
                  flush=True)
        out["exports"] = {}
        for days in [int(d) for d in args.exports.split(",") if d.strip()]:
            span = f"start={now - days * 86400:.0f}&end={now:.0f}"
            e = out["exports"][days] = export(hapi, f"/api/log/self/export?{span}",
                                              args.timeout * 4)
            print(f"  export, {days} days: {e}", flush=True)
        t_end = time.monotonic()
        time.sleep(1)
        out["queries"] = results
        out["probe"] = probe.summary(t_start, t_end)
        probe.stopping.set()
        probe.join(70)
        out["db_peak_rss_mib"] = [round(x, 1) for x in relay.db_peaks_mib()]
        out["data_dir_mb"] = round(du(data_dir) / 1e6, 1)
        out["db_files_mb"] = {f: round(os.path.getsize(os.path.join(data_dir, "db", f)) / 1e6, 1)
                              for f in sorted(os.listdir(os.path.join(data_dir, "db")))
                              if os.path.isfile(os.path.join(data_dir, "db", f))}
        out["stop_s"] = round(relay.stop(), 2)
        out["restart_s"] = round(relay.start(), 2)
        out["loadavg_at_end"] = os.getloadavg()
    finally:
        if probe is not None:
            probe.stopping.set()
        if relay is not None:
            relay.stop()
        if upstream is not None:
            upstream.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        elif args.data:
            shutil.rmtree(work, ignore_errors=True)
            print(f"data directory kept: {data_dir}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(out)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"datascale-{label}-{args.records}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"written to {path}")


def report(out: dict) -> None:
    print(f"\n{out['label']}: {out['records']:,} records ({out.get('api')}), build {out.get('build')}")
    print(f"{'console query':40s} {'median s':>9s} {'max s':>8s}  status")
    for name, r in (out.get("queries") or {}).items():
        print(f"{name:40s} {statistics.median(r['seconds']):9.3f} {max(r['seconds']):8.3f}  "
              f"{sorted(set(r['status']))}")
    for days, e in (out.get("exports") or {}).items():
        name = f"export, heavy user, {days} days"
        print(f"{name:40s} first byte {e.get('first_byte_s')} s, whole {e.get('seconds')} s, "
              f"{e.get('rows')} rows, TOTAL row: {e.get('total_row')}, status {e.get('status')}"
              + (f": {e.get('last_line')}" if e.get("status") not in (200, None) else ""))
    p = out.get("probe") or {}
    print(f"probe: {p.get('calls')} calls, {p.get('non_200')} not 200 {p.get('statuses')}, "
          f"p50 {p.get('p50_ms')} ms, p99 {p.get('p99_ms')} ms, max {p.get('max_ms')} ms")
    print(f"database peak RSS MiB {out.get('db_peak_rss_mib')}; data dir {out.get('data_dir_mb')} MB "
          f"{out.get('db_files_mb')}")
    print(f"cold start {out.get('cold_start_s')} s; stop {out.get('stop_s')} s; restart "
          f"{out.get('restart_s')} s; load average at start {out['machine'].get('loadavg_at_start')}, "
          f"at end {out.get('loadavg_at_end')}")


if __name__ == "__main__":
    main()
