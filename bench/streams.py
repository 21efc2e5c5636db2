"""Many slow streams through one relay, with a probe of plain calls beside them.

    python bench/streams.py [--steps 1000,5000,10000] [--chunks 15] [--interval 2]
                            [--rate 400] [--probe-rate 20] [--fake node|python]
                            [--http1] [--backlog 4096]
                            [--out results/streams.json]

On 127.0.0.1 only, it starts the slow fake upstream (`node
bench/slow_upstream.mjs`, or with --fake python `python -m
tests.fakes.slow_upstream`, which costs that machine as much CPU as the
relay) over HTTPS with HTTP/2, as the
vendors' APIs are served (`--http1` for plain HTTP/1.1, where each stream
holds a socket to the upstream as well as one to its client, so the
process's open-file limit caps the count at half of it), and the relay
(embedded database, trusting the fake's test CA by `upstream_ca_file`),
sets up a channel, a price, a user and a limited key as bench/run.py does,
then for each step opens N streaming chat calls at --rate a second.  Each
stream gets --chunks pieces, --interval seconds apart.  Meanwhile this
process sends plain (non-streaming) calls one after another on one
keep-alive connection, --probe-rate a second, the same plain call straight
to the fake upstream right after each (the direct probe: what the relay's
probe would see if the relay added nothing), and samples the resident
memory of the relay and of its database child.

Per step it prints: streams that ended well and the errors by kind; time
to first byte (p50, p99, max); the probe's p50, p99 and max and its
errors, and the direct probe's p50 and p99; peak VmRSS of the relay and of its database; the relay's open file
descriptors at the peak; the relay's CPU seconds.  After each step it waits
for the billing flush and checks that every stream and probe call has its
usage record.  Everything is bounded in time; nothing asserts a wall-clock
figure (a benchmark, not a test).

The streams come from a child process (`--client`): a bare asyncio socket
client that costs far less per stream than the relay, so that it is not what
is being measured.  It raises its own open-file limit to the hard limit.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402
from procs import ROOT  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")


def write_tls(tls_dir: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 from a throw-away CA: the CA goes to
    tls_dir/ca.pem (for the relay and the direct probe), the server's
    certificate and key to cert.pem and key.pem; returns those two."""
    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    os.makedirs(tls_dir, exist_ok=True)
    ca.cert_pem.write_to_path(os.path.join(tls_dir, "ca.pem"))
    cert.private_key_pem.write_to_path(os.path.join(tls_dir, "key.pem"))
    cert.cert_chain_pems[0].write_to_path(os.path.join(tls_dir, "cert.pem"))
    return os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem")


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def pct(values: list, q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ---- the stream client (a child process) ------------------------------------
class _Stream(asyncio.Protocol):
    __slots__ = ("c", "t0", "head", "status", "ttfb", "tail", "done", "transport", "fut")

    def __init__(self, client: "_Client", fut):
        self.c = client
        self.fut = fut
        self.head = b""
        self.status = 0
        self.ttfb = 0.0
        self.tail = b""
        self.done = False
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.t0 = time.monotonic()
        transport.write(self.c.request)

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self.status = int(self.head[9:12])
            except ValueError:
                self.status = -1
            data = self.head[end + 4:]
            self.head = b""
            if self.status != 200:
                # The error's code (relay_overloaded, upstream_connect_timeout...)
                # says which limit answered; its body follows the head.
                self.head = data
                self.code_of_error()
                return
        if self.status != 200:
            self.head += data
            self.code_of_error()
            return
        if data and not self.ttfb:
            self.ttfb = time.monotonic() - self.t0
        tail = self.tail + data
        if tail.endswith(b"0\r\n\r\n"):
            self.finish(None if b"[DONE]" in tail else "no [DONE]")
            return
        self.tail = tail[-40:]

    def code_of_error(self) -> None:
        found = re.search(rb'"code"\s*:\s*"([a-z_]{1,60})"', self.head)
        if found or len(self.head) > 4096:
            self.finish(f"http {self.status}" + (f" {found.group(1).decode()}" if found else ""))

    def finish(self, error) -> None:
        if not self.done:
            self.done = True
            self.transport.close()
            if not self.fut.done():
                self.fut.set_result((error, self.ttfb))

    def connection_lost(self, exc) -> None:
        if not self.done and self.status and self.status != 200:
            self.finish(f"http {self.status}")
        if not self.done:
            self.done = True
            if not self.fut.done():
                self.fut.set_result(("closed mid-stream" if self.status else "closed before "
                                     "the answer", self.ttfb))


class _Client:
    def __init__(self, host: str, port: int, key: str, body: bytes):
        self.host, self.port = host, port
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def one(self, gate: asyncio.Semaphore, deadline: float):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        async with gate:
            try:
                await loop.create_connection(lambda: _Stream(self, fut), self.host, self.port)
            except OSError as exc:
                return f"connect: {exc.strerror or exc}", 0.0
        try:
            return await asyncio.wait_for(fut, max(1.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return "timed out", 0.0


async def _client_main(args) -> dict:
    host, port = args.url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"model": args.model, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "Tell a long story."}],
                       "fake_chunks": args.chunks, "fake_delay": args.interval},
                      separators=(",", ":")).encode()
    client = _Client(host, int(port), args.key, body)
    gate = asyncio.Semaphore(256)  # connects in flight, so no SYN queue overflows
    t0 = time.monotonic()
    deadline = t0 + args.n / args.rate + args.chunks * args.interval + 60
    tasks = []
    for i in range(args.n):
        due = t0 + i / args.rate
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(client.one(gate, deadline)))
    opened = time.monotonic() - t0
    results = await asyncio.gather(*tasks)
    errors: dict[str, int] = {}
    ttfb = []
    for err, first in results:
        if err:
            errors[err] = errors.get(err, 0) + 1
        elif first:
            ttfb.append(first * 1000)
    return {"n": args.n, "ok": args.n - sum(errors.values()), "errors": errors,
            "ramp_s": round(opened, 2), "total_s": round(time.monotonic() - t0, 2),
            "ttfb_ms": {"p50": round(pct(ttfb, 50), 1), "p99": round(pct(ttfb, 99), 1),
                        "max": round(max(ttfb, default=0), 1)}}


def client_main(args) -> int:
    raise_nofile()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    print("STREAMS_JSON " + json.dumps(asyncio.run(_client_main(args))), flush=True)
    return 0


# ---- the probe and the orchestration ----------------------------------------
class Probe:
    """Plain calls one after another on one keep-alive connection."""

    def __init__(self, url: str, key: str, body: str, ca_file: str = ""):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        if url.startswith("https:"):
            import ssl
            self.conn = http.client.HTTPSConnection(
                host, int(port), timeout=30, context=ssl.create_default_context(cafile=ca_file))
        else:
            self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.body = body
        self.lat: list[float] = []
        self.at: list[float] = []  # when each call started (monotonic)
        self.errors: dict[str, int] = {}

    def call(self) -> None:
        t = time.perf_counter()
        try:
            self.conn.request("POST", "/v1/chat/completions", self.body, self.headers)
            r = self.conn.getresponse()
            data = r.read()
            if r.status != 200 or b'"choices"' not in data:
                found = re.search(rb'"code"\s*:\s*"([a-z_]{1,60})"', data)
                what = f"http {r.status}" + (f" {found.group(1).decode()}" if found else "")
                self.errors[what] = self.errors.get(what, 0) + 1
                return
        except (OSError, http.client.HTTPException) as exc:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
            self.conn.close()
            return
        self.lat.append((time.perf_counter() - t) * 1000)
        self.at.append(time.monotonic())


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's first line)."""
    try:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def steal_pct(before: list[int], after: list[int]) -> float:
    """The share of CPU time the hypervisor gave to other guests meanwhile:
    on a shared host, the slow steps are the ones where this is high."""
    if len(before) < 8 or len(after) < 8:
        return 0.0
    total = sum(after) - sum(before)
    return round(100 * (after[7] - before[7]) / total, 1) if total > 0 else 0.0


def tcp_drops() -> dict:
    """The kernel's counters of SYNs dropped at a full accept queue and of
    SYNs resent (TcpExt, for the whole network namespace: other work on
    the machine counts too)."""
    try:
        with open("/proc/net/netstat") as fh:
            lines = [ln.split() for ln in fh if ln.startswith("TcpExt:")]
        row = dict(zip(lines[0][1:], (int(v) for v in lines[1][1:])))
    except (OSError, IndexError, ValueError):
        return {}
    return {"listen_overflows": row.get("ListenOverflows", 0),
            "syn_resent": row.get("TCPSynRetrans", 0)}


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def run_step(n: int, args, relay, relay_url: str, key: str, body: str, upstream=None,
             direct: Probe | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--client", "--url", relay_url,
           "--key", key, "--n", str(n), "--rate", str(args.rate), "--chunks", str(args.chunks),
           "--interval", str(args.interval), "--model", args.model]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    probe = Probe(relay_url, key, body)
    peak = {"relay_rss_kb": 0, "database_rss_kb": 0, "relay_fds": 0}
    cpu0 = procs.cpu_seconds(relay.pid)
    up0 = procs.cpu_seconds(upstream.pid) if upstream else 0.0
    db = procs.database(relay.pid)
    db_cpu0 = sum(procs.cpu_seconds(p) for p in db)
    t0 = time.monotonic()
    next_sample = 0.0
    gap = 1.0 / args.probe_rate
    # Each second: the share of a core the relay, the upstream and the
    # stream client used, and the slowest probe call, to see whether slow
    # calls line up with a saturated relay or with the machine's other work.
    timeline: list = []
    last = (t0, procs.cpu_seconds(relay.pid), up0, procs.cpu_seconds(client.pid), 0)
    while client.poll() is None:
        start = time.monotonic()
        probe.call()
        if direct is not None:
            direct.call()
        if start >= next_sample:
            next_sample = start + 1.0
            now = (start, procs.cpu_seconds(relay.pid),
                   procs.cpu_seconds(upstream.pid) if upstream else 0.0,
                   procs.cpu_seconds(client.pid), len(probe.lat))
            span = now[0] - last[0]
            if span > 0.5:
                timeline.append([round(start - t0, 1)]
                                + [round((a - b) / span, 2) for a, b in zip(now[1:4], last[1:4])]
                                + [round(max(probe.lat[last[4]:], default=0), 1)])
                last = now
            peak["relay_rss_kb"] = max(peak["relay_rss_kb"], procs.status_kb(relay.pid, "VmRSS"))
            peak["database_rss_kb"] = max(peak["database_rss_kb"],
                                          sum(procs.status_kb(p, "VmRSS") for p in db))
            peak["relay_fds"] = max(peak["relay_fds"], open_fds(relay.pid))
        rest = gap - (time.monotonic() - start)
        if rest > 0:
            time.sleep(rest)
    out, err = client.communicate()
    line = next((ln for ln in out.splitlines() if ln.startswith("STREAMS_JSON ")), None)
    if line is None:
        raise RuntimeError(f"stream client failed ({client.returncode}): {out}\n{err}")
    res = json.loads(line.split(" ", 1)[1])
    res["wall_s"] = round(time.monotonic() - t0, 1)
    res["relay_cpu_s"] = round(procs.cpu_seconds(relay.pid) - cpu0, 2)
    res["database_cpu_s"] = round(sum(procs.cpu_seconds(p) for p in db) - db_cpu0, 2)
    res["upstream_cpu_s"] = round(procs.cpu_seconds(upstream.pid) - up0, 2) if upstream else 0
    res.update(peak)
    res["probe"] = {"calls": len(probe.lat) + sum(probe.errors.values()),
                    "errors": probe.errors,
                    "p50_ms": round(pct(probe.lat, 50), 2), "p99_ms": round(pct(probe.lat, 99), 2),
                    "max_ms": round(max(probe.lat, default=0), 2),
                    # When the slowest calls started, in seconds from the
                    # step's start: the streams open for n / rate seconds,
                    # then run chunks * interval.
                    "slowest": [[round(at - t0, 1), round(ms, 1)] for ms, at in
                                sorted(zip(probe.lat, probe.at), reverse=True)[:8]]}
    if direct is not None:
        res["direct_probe"] = {"calls": len(direct.lat) + sum(direct.errors.values()),
                               "errors": direct.errors,
                               "p50_ms": round(pct(direct.lat, 50), 2),
                               "p99_ms": round(pct(direct.lat, 99), 2),
                               "max_ms": round(max(direct.lat, default=0), 2)}
        direct.lat, direct.at, direct.errors = [], [], {}
    res["timeline"] = {"columns": ["s", "relay", "upstream", "client", "probe max ms"],
                       "rows": timeline}
    probe.conn.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="1000,5000,10000")
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--rate", type=float, default=400.0, help="new streams a second")
    ap.add_argument("--probe-rate", type=float, default=20.0, help="plain calls a second")
    ap.add_argument("--fake", choices=("node", "python"), default=None,
                    help="the slow upstream: bench/slow_upstream.mjs (the default where node is "
                         "on PATH) or tests/fakes/slow_upstream.py")
    ap.add_argument("--http1", action="store_true",
                    help="plain HTTP/1.1 upstream (one socket per stream) instead of HTTPS + h2")
    ap.add_argument("--backlog", type=int, default=4096,
                    help="the node fake's listen backlog (the kernel caps it at somaxconn)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "streams.json"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--timeline", action="store_true",
                    help="print each step's per-second CPU shares and slowest probe call")
    # the child process that opens the streams
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="gpt-4o-mini", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return client_main(args)

    from run import ADMIN_PASSWORD, BODY, settled, setup
    limit = raise_nofile()  # the children inherit it
    steps = [int(s) for s in args.steps.split(",") if s.strip()]
    facts = procs.machine()
    work = tempfile.mkdtemp(prefix="relay-streams-")
    upstream = relay = None
    try:
        port = procs.free_port()
        fake = args.fake or ("node" if shutil.which("node") else "python")
        tls = os.path.join(work, "tls")
        if fake == "node":
            cmd = ["node", os.path.join(ROOT, "bench", "slow_upstream.mjs"), "--port", str(port),
                   "--backlog", str(args.backlog)]
            if not args.http1:
                cert, key_file = write_tls(tls)
                cmd += ["--cert", cert, "--key", key_file]
        else:
            cmd = [sys.executable, "-m", "tests.fakes.slow_upstream", "--port", str(port)]
            if not args.http1:
                cmd += ["--tls", tls]
        relay_env = {}
        ca_file = "" if args.http1 else os.path.join(tls, "ca.pem")
        if ca_file:
            relay_env["RELAY_UPSTREAM_CA_FILE"] = ca_file
        upstream = procs.Child("slow upstream", cmd, os.path.join(work, "upstream.log"))
        upstream.start(port)
        upstream_url = f"{'http' if args.http1 else 'https'}://127.0.0.1:{port}"
        relay, relay_url = procs.start_relay(work, ADMIN_PASSWORD, extra_env=relay_env)
        env = setup(relay_url, upstream_url)
        admin, uid, key = env["admin"], env["user_id"], env["key"]
        direct = Probe(upstream_url, "", BODY, ca_file)
        print(f"relay {relay_url} (pid {relay.pid}), slow upstream {upstream_url} ({fake}); open-file "
              f"limit {limit}; load average {os.getloadavg()[0]:.1f}", flush=True)
        before = settled(admin, uid)
        rss_idle = procs.status_kb(relay.pid, "VmRSS")
        rows = []
        for n in steps:
            load0, stat0, drops0 = os.getloadavg()[0], cpu_times(), tcp_drops()
            r = run_step(n, args, relay, relay_url, key, BODY, upstream, direct)
            r["tcp"] = {k: v - drops0.get(k, 0) for k, v in tcp_drops().items()}
            r["loadavg_1m"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
            r["steal_pct"] = steal_pct(stat0, cpu_times())
            after = settled(admin, uid)
            r["records"] = after["records"] - before["records"]
            r["records_expected"] = n + r["probe"]["calls"]
            before = after
            rows.append(r)
            errs = sum(r["errors"].values())
            print(f"  {n:6d} streams: {r['ok']} ok, {errs} errors {r['errors'] or ''}; "
                  f"ttfb p50 {r['ttfb_ms']['p50']} ms p99 {r['ttfb_ms']['p99']} ms; probe p50 "
                  f"{r['probe']['p50_ms']} ms p99 {r['probe']['p99_ms']} ms "
                  f"({r['probe']['calls']} calls, errors {r['probe']['errors'] or 0}); direct p50 "
                  f"{r['direct_probe']['p50_ms']} ms p99 {r['direct_probe']['p99_ms']} ms; relay "
                  f"{r['relay_rss_kb'] / 1024:.0f} MiB, database {r['database_rss_kb'] / 1024:.0f}"
                  f" MiB; fds {r['relay_fds']}; records {r['records']}/{r['records_expected']}; "
                  f"SYNs dropped/resent {r['tcp'].get('listen_overflows')}/"
                  f"{r['tcp'].get('syn_resent')}",
                  flush=True)
        if args.timeline:
            for r in rows:
                columns = "  ".join(r["timeline"]["columns"])
                print(f"\n{r['n']} streams, each second: {columns}")
                for row in r["timeline"]["rows"]:
                    print(f"  {row[0]:5.1f}  {row[1]:5.2f}  {row[2]:5.2f}  {row[3]:5.2f}  "
                          f"{row[4]:7.1f}")
        print(f"\nrelay resident when idle after setup: {rss_idle / 1024:.0f} MiB")
        print(f"\n{'streams':>7s} {'ok':>6s} {'errors':>6s} {'ttfb p50':>9s} {'ttfb p99':>9s} "
              f"{'probe p50':>9s} {'probe p99':>9s} {'probe max':>9s} {'direct p50':>10s} "
              f"{'direct p99':>10s} {'relay MiB':>9s} "
              f"{'KiB/stream':>10s} {'db MiB':>7s} {'relay cpu s':>11s} {'load':>9s} {'steal%':>6s}")
        for r in rows:
            per = (r["relay_rss_kb"] - rss_idle) / max(r["n"], 1)
            print(f"{r['n']:7d} {r['ok']:6d} {sum(r['errors'].values()):6d} "
                  f"{r['ttfb_ms']['p50']:9.1f} {r['ttfb_ms']['p99']:9.1f} "
                  f"{r['probe']['p50_ms']:9.2f} {r['probe']['p99_ms']:9.2f} "
                  f"{r['probe']['max_ms']:9.2f} {r['direct_probe']['p50_ms']:10.2f} "
                  f"{r['direct_probe']['p99_ms']:10.2f} {r['relay_rss_kb'] / 1024:9.0f} {per:10.1f} "
                  f"{r['database_rss_kb'] / 1024:7.0f} {r['relay_cpu_s']:11.1f} "
                  f"{r['loadavg_1m'][0]:4.1f}-{r['loadavg_1m'][1]:<4.1f} {r['steal_pct']:6.1f}")
        result = {
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/streams.py " + " ".join(sys.argv[1:]),
            "machine": dict(facts, loadavg_at_end=os.getloadavg(), open_file_limit=limit),
            "setup": {"chunks": args.chunks, "interval_s": args.interval, "rate": args.rate,
                      "probe_rate": args.probe_rate, "database": "embedded", "fake": fake,
                      "backlog": args.backlog,
                      "upstream": "http/1.1" if args.http1 else "https, h2"},
            "relay_rss_idle_kb": rss_idle, "steps": rows}
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.out}")
        bad = any(r["errors"] or r["probe"]["errors"] or r["direct_probe"]["errors"]
                  or r["records"] != r["records_expected"]
                  for r in rows)
        return 1 if bad else 0
    finally:
        procs.tear_down((relay, upstream), work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
