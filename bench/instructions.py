"""A/B by instructions: each tree's relay under callgrind, the same calls
sent to each, and the instructions the relay process ran per call.

    python bench/instructions.py /work/main /path/to/changed-tree [--calls 2000] [--stream]

CPU time per call (bench/ab.py) is the figure that matters, but on a
shared machine it moves by 5% from one minute to the next, more than most
single changes are worth.  An instruction count does not move with the
machine: the same tree gives the same count within a fraction of a percent,
so a change of 1% can be seen.  It says nothing of cache misses or system
calls, so a change is judged on both: instructions to see it at all,
ab.py to see that the machine agrees.

The relay process alone is counted (its embedded database child runs
natively), from after a warm-up to the last answer, with the calls sent by
`--connections` keep-alive connections.  Billing is on, as in run.py.
Needs valgrind (`apt-get install valgrind`).
"""
from __future__ import annotations

import argparse
import glob
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402
from run import ADMIN_PASSWORD, BODY, STREAM_BODY, setup  # noqa: E402


def _send(url: str, key: str, body: str, n: int, failures: list) -> None:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for _ in range(n):
        conn.request("POST", "/v1/chat/completions", body, headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            failures.append(r.status)
    conn.close()


def load(url: str, key: str, body: str, calls: int, connections: int) -> list:
    failures: list = []
    each = calls // connections
    threads = [threading.Thread(target=_send, args=(url, key, body, each, failures))
               for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _total(out_prefix: str) -> int:
    """Instructions in every dump written under the prefix (their totals lines)."""
    total = 0
    for path in glob.glob(out_prefix + "*"):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"totals:\s+(\d+)", line)
                if m:
                    total += int(m.group(1))
    return total


def measure(tree: str, upstream_url: str, work: str, name: str, args) -> dict:
    out = os.path.join(work, name + ".cg")
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}.%p"]
    port = procs.free_port()
    data_dir = os.path.join(work, name + "-data")
    os.makedirs(data_dir, exist_ok=True)
    # A fixed hash seed: dict and set probing, and so the count, the same every run.
    # Work done per second rather than per call (polls for changes made
    # elsewhere; billing's flush tick, a quarter of the flush interval, and
    # its read of other relays' recalls, a quarter of the recall wait at
    # most) would count more the slower valgrind runs: polled rarely.
    env = dict(os.environ, RELAY_ADMIN_PASSWORD=ADMIN_PASSWORD, PYTHONUNBUFFERED="1",
               PYTHONHASHSEED="0", RELAY_INVALIDATION_POLL="60", RELAY_NOTIFY_POLL_INTERVAL="60",
               RELAY_MJ_POLL_INTERVAL="600", RELAY_USAGE_FLUSH_INTERVAL="4",
               RELAY_LEASE_RECALL_WAIT="8")
    env.pop("RELAY_MONGO_URL", None)
    child = procs.Child(name, valgrind + [sys.executable, os.path.join(tree, "server.py"),
                                          "--host", "127.0.0.1", "--port", str(port),
                                          "--data-dir", data_dir],
                        os.path.join(work, name + ".log"), env=env, cwd=tree)
    child.start(port, timeout=600)
    try:
        url = f"http://127.0.0.1:{port}"
        key = setup(url, upstream_url)["key"]
        body = STREAM_BODY if args.stream else BODY
        load(url, key, body, args.warmup, args.connections)
        _control(child.pid, "-i", "on")
        t0 = time.monotonic()
        failures = load(url, key, body, args.calls, args.connections)
        _control(child.pid, "-i", "off")
        seconds = time.monotonic() - t0
        _control(child.pid, "-d")
        time.sleep(0.5)
        ir = _total(out)
    finally:
        child.stop(timeout=120)
    calls = args.calls // args.connections * args.connections
    return {"tree": tree, "calls": calls, "failures": len(failures),
            "instructions_per_call": ir / calls, "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="source trees holding server.py")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--stream", action="store_true", help="streaming chat instead")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory: callgrind_annotate reads its .cg files")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: `apt-get install valgrind`.", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="relay-instructions-")
    upstream = None
    try:
        upstream, upstream_url = procs.start_upstream(work)
        results = []
        for i, tree in enumerate(args.trees):
            r = measure(os.path.abspath(tree), upstream_url, work, f"relay{i}", args)
            results.append(r)
            print(f"  {tree}: {r['instructions_per_call'] / 1000:9.1f} k instructions/call "
                  f"({r['calls']} calls, {r['failures']} failed, {r['seconds']:.0f} s)",
                  flush=True)
        base = results[0]["instructions_per_call"]
        print(f"\n{'tree':40s} {'k instr/call':>12s}")
        for r in results:
            ipc = r["instructions_per_call"]
            print(f"{r['tree'][-40:]:40s} {ipc / 1000:12.1f}  {100 * (ipc - base) / base:+.1f}%")
        return 1 if any(r["failures"] for r in results) else 0
    finally:
        procs.tear_down([upstream], work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
