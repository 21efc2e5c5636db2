"""A/B: the relay of several source trees against one fake upstream,
interleaved, compared by CPU time per request.

    python bench/ab.py /work/main /path/to/changed-tree [--rounds 3] [--stream]
    python bench/ab.py . .:limits      # the same tree, with rate limits set on the key

Each tree's `server.py` runs as its own relay (own embedded database), all
set up alike; every round loads each relay in turn with wrk.  req/s moves
with whatever else runs on the machine; the relay's CPU microseconds per
answered call move far less, so that is the figure printed first (median
over rounds, lower is better).  Billing is on as in run.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402
from run import ADMIN_PASSWORD, BODY, STREAM_BODY, setup  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="source trees holding server.py")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=20)
    ap.add_argument("--stream", action="store_true", help="streaming chat instead")
    args = ap.parse_args()
    if not procs.have_wrk():
        print("wrk is not installed: `apt-get install wrk`.", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="relay-ab-")
    children = []
    try:
        upstream, upstream_url = procs.start_upstream(work)
        children.append(upstream)
        relays = []
        for i, spec in enumerate(args.trees):
            # "tree:limits": that tree with rate limits set on its key (run.py --limits)
            tree, _, flag = spec.partition(":")
            child, url = procs.start_relay(work, ADMIN_PASSWORD, os.path.abspath(tree),
                                           name=f"relay{i}")
            children.append(child)
            key = setup(url, upstream_url, flag == "limits")["key"]
            relays.append((spec, child, url, key))
        body = STREAM_BODY if args.stream else BODY
        for _, _, url, key in relays:  # warm-up
            procs.wrk(url + "/v1/chat/completions", body, key, args.connections, duration=2)
        seen: dict[str, list] = {t: [] for t in args.trees}
        for n in range(args.rounds):
            for tree, child, url, key in relays:
                r = procs.wrk(url + "/v1/chat/completions", body, key, args.connections,
                              duration=args.duration, watch={"relay": child.pid})
                seen[tree].append(r)
                print(f"  round {n + 1} {tree}: {r['cpu_us_per_request']['relay']:7.1f} us/req "
                      f"{r['rps']:8.1f} req/s  errors {r['non_2xx']}", flush=True)
        print(f"\n{'tree':40s} {'cpu us/req':>10s} {'req/s':>9s} {'p50 ms':>8s}  (medians)")
        base = None
        for tree, runs in seen.items():
            us = statistics.median(r["cpu_us_per_request"]["relay"] for r in runs)
            rps = statistics.median(r["rps"] for r in runs)
            p50 = statistics.median(r["p50_ms"] for r in runs)
            base = base or us
            print(f"{tree[-40:]:40s} {us:10.1f} {rps:9.1f} {p50:8.2f}  "
                  f"{100 * (us - base) / base:+.1f}% cpu")
        return 0
    finally:
        procs.tear_down(reversed(children), work)


if __name__ == "__main__":
    sys.exit(main())
