"""Relay throughput benchmark: fake upstream direct vs through the relay.

    python bench/run.py [--duration 10] [--connections 20] [--no-profile]

Starts, on 127.0.0.1, the fake OpenAI upstream and the relay (embedded
database) as separate processes, sets up a channel, a price, a user with a
balance and a limited key through the management API, then loads with wrk:

  direct         the upstream itself, non-streaming chat
  direct_stream  the upstream itself, streaming chat
  relay          through the relay, non-streaming
  relay_stream   through the relay, streaming (the fake sends role, three
                 content pieces, finish, usage and [DONE])
  bare, bare_stream  bench/bare_proxy.py: Tornado + curl forwarding and
                 nothing else, the ceiling of our stack (skip: --no-bare)

each at --connections and again at one connection (added latency = relay p50
minus direct p50).  After every relay run it waits for the billing flush
and checks that usage records and the user's used_quota account for every
request wrk saw succeed, so the figures are those of a relay that bills.
Finally it profiles the relay with py-spy under non-streaming load.

Prints a table and writes bench/results/latest.json (and profile.txt,
profile.svg, hotspots.txt when profiling).  Needs wrk (`apt-get install
wrk`) and, for the profile, py-spy (`pip install -r bench/requirements.txt`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hotspots  # noqa: E402
import procs  # noqa: E402
from procs import ROOT  # noqa: E402

from tests.helpers import Api  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
ADMIN_PASSWORD = "bench-admin-password"
MODEL = "gpt-4o-mini"
# ~100 bytes, as in the comparison with LiteLLM's proxy.
BODY = json.dumps({"model": MODEL, "messages": [
    {"role": "user", "content": "Say hello to the benchmark, in one short line."}]},
    separators=(",", ":"))
STREAM_BODY = BODY[:-1] + ',"stream":true}'
# USD per million tokens; the fake reports 10 prompt + 3 completion tokens,
# so every call costs (10 * 1 + 3 * 2) / 1e6 USD = 8 quota units.
PRICE = {"input_price": 1, "output_price": 2}
TARGET_RATIO = 1 / 3


# --limits: on the key and its account, far above what a run reaches, so
# that every call pays for the checks and none is refused.
LIMITS = {"rpm_limit": 10 ** 8, "tpm_limit": 10 ** 10, "concurrency_limit": 10 ** 4}


def setup(relay_url: str, upstream_url: str, limits: bool = False) -> dict:
    admin = Api.login(relay_url, "root", ADMIN_PASSWORD)
    admin.create_channel(upstream_url, [MODEL], name="bench-fake")
    admin.set_price(MODEL, **PRICE)
    user = admin.create_user("benchuser", password="bench-password", quota=10 ** 12)
    me = Api.login(relay_url, "benchuser", "bench-password")
    token = me.create_token("bench", remain_quota=10 ** 11, **(LIMITS if limits else {}))
    if limits:
        admin.put("/api/user/", {"id": user["id"], **LIMITS})
    return {"admin": admin, "user_id": user["id"], "key": token["key"]}


def smoke(relay_url: str, upstream_url: str, key: str) -> None:
    """One call of each kind, read in full: wrk only sees status codes."""
    import requests
    url = "/v1/chat/completions"
    for base, hdr in ((upstream_url, {}), (relay_url, {"Authorization": f"Bearer {key}"})):
        r = requests.post(base + url, data=BODY, headers=hdr, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        r = requests.post(base + url, data=STREAM_BODY, headers=hdr, timeout=30)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text


def ledger(admin: Api, user_id: int) -> dict:
    """What the relay has recorded for the bench user so far."""
    every = admin.get(f"/api/log?user_id={user_id}&size=1")["data"]
    ok = admin.get(f"/api/log?user_id={user_id}&status=200&size=1")["data"]
    used = admin.get(f"/api/user/{user_id}")["data"]["used_quota"]
    return {"records": every["total"], "records_ok": ok["total"],
            "records_quota": every["totals"]["quota"], "records_ok_quota": ok["totals"]["quota"],
            "used_quota": used}


def settled(admin: Api, user_id: int, timeout: float = 60.0) -> dict:
    """The ledger once the billing flusher (every 0.125 s) has caught up:
    two equal readings 0.5 s apart."""
    deadline = time.monotonic() + timeout
    last = ledger(admin, user_id)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = ledger(admin, user_id)
        if now == last and now["records_quota"] == now["used_quota"]:
            return now
        last = now
    return last


def check_billing(name: str, run: dict, before: dict, after: dict, unit_cost: int,
                  in_flight: int) -> dict:
    d = {k: after[k] - before[k] for k in after}
    extra = d["records_ok"] - run["ok"]
    verdict = {
        "run": name, "wrk_ok": run["ok"], "records": d["records"], "records_ok": d["records_ok"],
        "used_quota": d["used_quota"], "records_quota": d["records_quota"],
        "records_ok_quota": d["records_ok_quota"], "expected_ok_quota": d["records_ok"] * unit_cost,
        # A call the relay finished as wrk stopped is billed but not counted
        # by wrk; at most one per connection.
        "finished_after_wrk_stopped": extra,
    }
    # Calls cut off when wrk stopped are recorded too (499, billed for what
    # was streamed), so only the successful ones have a known price.
    verdict["pass"] = (0 <= extra <= in_flight and d["used_quota"] == d["records_quota"]
                       and d["records_ok_quota"] == verdict["expected_ok_quota"])
    return verdict


def ms(v: float) -> str:
    return f"{v:8.2f}"


def median_run(rs: list[dict], top: bool = True) -> dict:
    """Field by field, the median of several runs of one configuration
    (errors are added up instead: one round's errors are not noise)."""
    out: dict = {}
    for key, value in rs[0].items():
        values = [r.get(key) for r in rs]
        if key == "socket_errors":
            total: dict = {}
            for v in values:
                for k, n in (v or {}).items():
                    total[k] = total.get(k, 0) + n
            out[key] = total
        elif key == "non_2xx":
            out[key] = sum(v or 0 for v in values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = median_run(values, top=False)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            m = statistics.median(values)
            # Of an even number of rounds the median is a mean: counts that
            # agree (connections) stay ints for the table's formats.
            out[key] = int(m) if all(type(v) is int for v in values) and m == int(m) else m
        else:
            out[key] = value
    if top and len(rs) > 1:
        out["rounds"] = len(rs)
    return out


def print_table(runs: dict) -> None:
    print(f"\n{'run':18s} {'conns':>5s} {'req/s':>9s} {'p50 ms':>8s} {'p90 ms':>8s} "
          f"{'p99 ms':>8s} {'errors':>6s}  cpu% proxy/upstream  cpu us/req proxy/upstream")
    for name, r in runs.items():
        errs = r["non_2xx"] + sum(r["socket_errors"].values())
        cpu, per = r["cpu_pct"], r["cpu_us_per_request"]
        proxy = next((p for p in ("relay", "bare_uvloop", "bare") if name.startswith(p)), None)
        print(f"{name:18s} {r['connections']:5d} {r['rps']:9.1f} {ms(r['p50_ms'])} "
              f"{ms(r['p90_ms'])} {ms(r['p99_ms'])} {errs:6d}  "
              f"{cpu.get(proxy, 0):5.1f} / {cpu['upstream']:5.1f}      "
              f"{per[proxy] if proxy else '-':>7} / {per['upstream']:6.1f}")


def find_py_spy() -> str | None:
    """py-spy from PATH, or from this interpreter's own environment (a venv
    that was not activated has it next to python, not on PATH)."""
    import sysconfig
    for where in (None, os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        found = shutil.which("py-spy", path=where)
        if found:
            return found
    return None


def profile(relay: procs.Child, key: str, relay_url: str, args) -> dict | None:
    spy = find_py_spy()
    if spy is None:
        print("\npy-spy is not installed: `pip install -r bench/requirements.txt` for the "
              "profile.  Skipped.", file=sys.stderr)
        return None
    half = max(2.0, args.profile_duration / 2)
    url = relay_url + "/v1/chat/completions"
    stream = args.profile_load == "stream"
    env = dict(os.environ, BENCH_BODY=STREAM_BODY if stream else BODY, BENCH_KEY=key)
    load = subprocess.Popen(
        ["wrk", "-t1", f"-c{args.connections}", f"-d{2 * half + 2:g}s", "-s",
         os.path.join(ROOT, "bench", "post.lua"), url], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1)
    suffix = "-stream" if stream else ""
    raw = os.path.join(RESULTS, f"profile{suffix}.txt")
    svg = os.path.join(RESULTS, f"profile{suffix}.svg")
    # Two windows of the same load: raw stacks for the summary, then the
    # flame graph (two samplers at once would stop the process twice).
    for fmt, out in (("raw", raw), ("flamegraph", svg)):
        done = subprocess.run([spy, "record", "--pid", str(relay.pid), "-d", f"{half:g}",
                               "-r", "100", "-f", fmt, "-o", out],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(f"py-spy failed: {done.stdout}{done.stderr}".strip())
            load.kill()
            load.wait()
            return None
    load.communicate()
    with open(raw) as f:
        summary = hotspots.summarise(f.read())
    # py-spy leaves out samples where the loop waits in epoll, so this is
    # the share of wall time the event loop was busy.
    summary["main_thread_busy_share"] = round(summary["samples"] / (100 * half), 3)
    summary["seconds"] = half
    text = hotspots.render(summary) + (
        f"\nThe event loop was busy in {100 * summary['main_thread_busy_share']:.0f}% of the "
        f"{half:g} s sampled.\n")
    with open(os.path.join(RESULTS, f"hotspots{suffix}.txt"), "w") as f:
        f.write(text)
    summary["load"] = args.profile_load
    print(f"\nProfile of the relay under {args.profile_load} load (py-spy, 100 Hz):")
    print(text)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times every run is repeated, interleaved; figures are medians")
    ap.add_argument("--connections", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    ap.add_argument("--latency-duration", type=float, default=5.0,
                    help="seconds per one-connection run")
    ap.add_argument("--profile-duration", type=float, default=20.0,
                    help="seconds of load while profiling (half raw stacks, half flame graph)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-load", choices=("plain", "stream"), default="plain",
                    help="chat calls to profile under: non-streaming (default) or streaming")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare Tornado+curl proxy")
    ap.add_argument("--limits", action="store_true",
                    help="set rate and concurrency limits (never reached) on the key and account")
    ap.add_argument("--out", default=os.path.join(RESULTS, "latest.json"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args()

    if not procs.have_wrk():
        print("wrk is not installed.  Install it with `apt-get install wrk` "
              "(tests/run.sh installs it too), then run again.", file=sys.stderr)
        return 2
    os.makedirs(RESULTS, exist_ok=True)
    facts = procs.machine()
    if facts["loadavg_at_start"][0] > 1.0:
        print(f"note: load average {facts['loadavg_at_start'][0]:.1f} on {facts['nproc']} "
              "cores; other processes will skew req/s (cpu us/req much less).")
    work = tempfile.mkdtemp(prefix="relay-bench-")
    upstream = relay = bare = bare_uv = None
    try:
        upstream, upstream_url = procs.start_upstream(work)
        if not args.no_bare:
            bare, bare_url = procs.start_bare_proxy(work, upstream_url)
            # The same proxy on the relay's own event loop (uvloop): the
            # ceiling of the stack as the relay runs it.
            bare_uv, bare_uv_url = procs.start_bare_proxy(work, upstream_url, uvloop=True)
        relay, relay_url = procs.start_relay(work, ADMIN_PASSWORD)
        env = setup(relay_url, upstream_url, args.limits)
        admin, uid, key = env["admin"], env["user_id"], env["key"]
        smoke(relay_url, upstream_url, key)
        first = settled(admin, uid)
        rss_setup = procs.status_kb(relay.pid, "VmRSS")
        if first["records_ok"] != 2 or first["records_ok_quota"] <= 0:
            # Without a price every check below would compare zeros.
            print(f"billing looks off: the two smoke calls left {first}", file=sys.stderr)
            return 1
        unit_cost = first["records_ok_quota"] // max(first["records_ok"], 1)
        print(f"relay {relay_url} (pid {relay.pid}), upstream {upstream_url} "
              f"(pid {upstream.pid}); one call costs {unit_cost} units; work dir {work}")

        watch = {"relay": relay.pid, "upstream": upstream.pid}
        db = procs.database(relay.pid)
        if db:  # the embedded database: its CPU per call is the usage records' cost
            watch["database"] = db[0]
        path = "/v1/chat/completions"
        plan = [  # name, base, body, key, connections, seconds
            ("direct", upstream_url, BODY, "", args.connections, args.duration),
            ("direct_stream", upstream_url, STREAM_BODY, "", args.connections, args.duration),
            ("relay", relay_url, BODY, key, args.connections, args.duration),
            ("relay_stream", relay_url, STREAM_BODY, key, args.connections, args.duration),
            ("direct_c1", upstream_url, BODY, "", 1, args.latency_duration),
            ("direct_stream_c1", upstream_url, STREAM_BODY, "", 1, args.latency_duration),
            ("relay_c1", relay_url, BODY, key, 1, args.latency_duration),
            ("relay_stream_c1", relay_url, STREAM_BODY, key, 1, args.latency_duration),
        ]
        if bare is not None:
            watch["bare"] = bare.pid
            watch["bare_uvloop"] = bare_uv.pid
            plan[4:4] = [("bare", bare_url, BODY, "", args.connections, args.duration),
                         ("bare_stream", bare_url, STREAM_BODY, "", args.connections,
                          args.duration),
                         ("bare_uvloop", bare_uv_url, BODY, "", args.connections, args.duration),
                         ("bare_uvloop_stream", bare_uv_url, STREAM_BODY, "", args.connections,
                          args.duration)]
            plan += [("bare_c1", bare_url, BODY, "", 1, args.latency_duration),
                     ("bare_stream_c1", bare_url, STREAM_BODY, "", 1, args.latency_duration)]
        # Warm the relay (caches, leases, curl pool) outside the figures.
        procs.wrk(relay_url + path, BODY, key, args.connections, duration=2)
        before = settled(admin, uid)
        rounds, checks = {}, []
        for turn in range(args.rounds):
            if args.rounds > 1:
                print(f" round {turn + 1} of {args.rounds}", flush=True)
            for name, base, body, k, conns, secs in plan:
                r = procs.wrk(base + path, body, k, conns, args.threads, secs, watch)
                rounds.setdefault(name, []).append(r)
                print(f"  {name:18s} {r['rps']:9.1f} req/s  p50 {r['p50_ms']:.2f} ms  "
                      f"p99 {r['p99_ms']:.2f} ms", flush=True)
                if base == relay_url:
                    after = settled(admin, uid)
                    c = check_billing(name, r, before, after, unit_cost, conns)
                    checks.append(c)
                    before = after
        # Each figure is its median over the rounds: the rounds interleave
        # every server, so a slow minute on a shared machine is one round's
        # outlier instead of one server's handicap.
        runs = {name: median_run(rs) for name, rs in rounds.items()}
        peak = {"relay_rss_after_setup_kb": rss_setup,
                "relay_vm_hwm_kb": procs.status_kb(relay.pid, "VmHWM"),
                "relay_vm_rss_kb": procs.status_kb(relay.pid, "VmRSS"),
                "upstream_vm_hwm_kb": procs.status_kb(upstream.pid, "VmHWM"),
                "database_vm_hwm_kb": sum(procs.status_kb(p, "VmHWM")
                                          for p in procs.database(relay.pid))}

        print_table(runs)
        ratios = {
            "relay_vs_direct": round(runs["relay"]["rps"] / runs["direct"]["rps"], 3),
            "relay_stream_vs_direct_stream":
                round(runs["relay_stream"]["rps"] / runs["direct_stream"]["rps"], 3),
            "relay_stream_vs_direct":
                round(runs["relay_stream"]["rps"] / runs["direct"]["rps"], 3),
        }
        added = {
            "non_stream_ms": round(runs["relay_c1"]["p50_ms"] - runs["direct_c1"]["p50_ms"], 3),
            "stream_ms": round(runs["relay_stream_c1"]["p50_ms"]
                               - runs["direct_stream_c1"]["p50_ms"], 3),
        }
        if bare is not None:
            # The stack's own floor: what the bare proxy adds at one connection.
            added["bare_non_stream_ms"] = round(runs["bare_c1"]["p50_ms"]
                                                - runs["direct_c1"]["p50_ms"], 3)
            added["bare_stream_ms"] = round(runs["bare_stream_c1"]["p50_ms"]
                                            - runs["direct_stream_c1"]["p50_ms"], 3)
            ratios["relay_vs_bare"] = round(runs["relay"]["rps"] / runs["bare"]["rps"], 3)
            ratios["bare_vs_direct"] = round(runs["bare"]["rps"] / runs["direct"]["rps"], 3)
            ratios["relay_stream_vs_bare_stream"] = round(
                runs["relay_stream"]["rps"] / runs["bare_stream"]["rps"], 3)
            ratios["relay_vs_bare_uvloop"] = round(
                runs["relay"]["rps"] / runs["bare_uvloop"]["rps"], 3)
            ratios["relay_stream_vs_bare_uvloop_stream"] = round(
                runs["relay_stream"]["rps"] / runs["bare_uvloop_stream"]["rps"], 3)
        met = min(ratios["relay_vs_direct"],
                  ratios["relay_stream_vs_direct_stream"]) >= TARGET_RATIO
        # Every server here is one single-threaded process that runs out of
        # CPU first, so 1 / (CPU per call) is what it could serve with a core
        # of its own.  These ratios hold still when other work shares the
        # machine; the measured ones above do not.
        cpu_ratios = {k: round(runs[b]["cpu_us_per_request"][pb]
                               / runs[a]["cpu_us_per_request"][pa], 3)
                      for k, a, pa, b, pb in (
                          ("relay_vs_direct", "relay", "relay", "direct", "upstream"),
                          ("relay_stream_vs_direct_stream", "relay_stream", "relay",
                           "direct_stream", "upstream"),
                          ("bare_vs_direct", "bare", "bare", "direct", "upstream"),
                          ("bare_stream_vs_direct_stream", "bare_stream", "bare",
                           "direct_stream", "upstream"),
                          # the bare proxy's CPU per call over the relay's
                          ("relay_vs_bare", "relay", "relay", "bare", "bare"),
                          ("relay_stream_vs_bare_stream", "relay_stream", "relay",
                           "bare_stream", "bare"),
                          ("relay_vs_bare_uvloop", "relay", "relay", "bare_uvloop",
                           "bare_uvloop"),
                          ("relay_stream_vs_bare_uvloop_stream", "relay_stream", "relay",
                           "bare_uvloop_stream", "bare_uvloop"))
                      if a in runs and b in runs}
        print("\nratios (relay req/s / direct req/s)        measured  by CPU per call")
        for k, v in ratios.items():
            c = cpu_ratios.get(k)
            print(f"  {k:36s} {v:9.3f}  {'' if c is None else f'{c:9.3f}'}")
        met_cpu = min(cpu_ratios["relay_vs_direct"],
                      cpu_ratios["relay_stream_vs_direct_stream"]) >= TARGET_RATIO
        print(f"  target >= {TARGET_RATIO:.3f} for both modes: {'met' if met else 'NOT met'} "
              f"(by CPU per call: {'met' if met_cpu else 'NOT met'})")
        if "database" in watch:
            print("database child CPU per call (us): " + ", ".join(
                f"{k} {runs[k]['cpu_us_per_request']['database']:.0f}"
                for k in ("relay", "relay_stream", "relay_c1", "relay_stream_c1")))
        print(f"added latency at one connection (p50): non-streaming {added['non_stream_ms']:.2f} "
              f"ms, streaming {added['stream_ms']:.2f} ms" + (
                  f" (bare proxy: {added['bare_non_stream_ms']:.2f} and "
                  f"{added['bare_stream_ms']:.2f} ms)" if "bare_stream_ms" in added else ""))
        print(f"peak memory (VmHWM): relay {peak['relay_vm_hwm_kb'] / 1024:.1f} MiB "
              f"(resident after setup {rss_setup / 1024:.1f} MiB), "
              f"database child {peak['database_vm_hwm_kb'] / 1024:.1f} MiB, "
              f"fake upstream {peak['upstream_vm_hwm_kb'] / 1024:.1f} MiB")
        print("\nbilling check (wrk successes vs usage records with status 200, after flush):")
        for c in checks:
            print(f"  {c['run']:16s} wrk ok {c['wrk_ok']:7d}  records ok {c['records_ok']:7d} "
                  f"(all {c['records']:7d})  used_quota {c['used_quota']:9d}  "
                  f"records quota {c['records_quota']:9d}  {'ok' if c['pass'] else 'MISMATCH'}")
        billing_ok = all(c["pass"] for c in checks)

        prof = None if args.no_profile else profile(relay, key, relay_url, args)
        result = {
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/run.py " + " ".join(sys.argv[1:]),
            "machine": dict(facts, loadavg_at_end=os.getloadavg()),
            "setup": {"connections": args.connections, "duration_s": args.duration,
                      "rounds": args.rounds,
                      "latency_duration_s": args.latency_duration, "wrk_threads": args.threads,
                      "body_bytes": len(BODY), "stream_body_bytes": len(STREAM_BODY),
                      "unit_cost": unit_cost, "billing": "per token, limited key + user",
                      "rate_limits": LIMITS if args.limits else None,
                      "database": "embedded (nx-27017 child process)"},
            "runs": runs, "ratios": ratios, "ratios_by_cpu_per_call": cpu_ratios,
            "target_ratio": round(TARGET_RATIO, 3),
            "target_met": met, "target_met_by_cpu_per_call": met_cpu,
            "added_latency_ms": added, "memory": peak,
            "billing_check": checks, "billing_ok": billing_ok,
            "profile": prof,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.out}")
        return 0 if billing_ok else 1
    finally:
        procs.tear_down((relay, bare, bare_uv, upstream), work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
