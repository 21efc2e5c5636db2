"""Coding-agent traffic: what the calls that carry the money cost the relay.

    python bench/agents.py [--rounds 3] [--duration 5] [--connections 10]
                           [--profile [SECONDS]] [--routes messages,responses]
                           [--stream | --no-stream] [--tree DIR [--tree DIR2]]

bench/run.py measures a 100-byte chat; a coding agent sends 60-150 KB
(bench/agent_bodies.py: a Claude Code body of about 100 KB, a Codex body of
about 80 KB, a Gemini agent's of about 90 KB).  This loads, with wrk, each
route an agent's call can take, pass-through and converted, streamed as the
agents stream:

  messages -> anthropic      /v1/messages on an Anthropic channel (bytes pass)
  messages -> openai chat    /v1/messages converted to chat completions
  messages -> gemini         /v1/messages converted to Gemini
  responses -> openai        /v1/responses on an OpenAI channel (bytes pass)
  responses -> anthropic     /v1/responses converted to Messages
  responses -> chat-only     /v1/responses bridged to chat completions
  gemini -> gemini           :streamGenerateContent on a Gemini channel
  gemini -> openai chat      :streamGenerateContent converted to chat
  chat 100 B                 bench/run.py's small chat, for scale
  messages 200 B -> anthropic  Claude Code's route with a one-line body: the
                             agent route's cost less this is its body's
  messages 100 KB text -> anthropic  the same with one 100 KB string: of
                             the body's cost, what its bytes cost apart
                             from the document parsed out of them

and beside each the same body sent straight to the fake of its own format
(direct), interleaved, --rounds times.  The fakes are the test suite's
faithful ones (bench/agent_fakes.py, one process).  Figures are CPU time
per answered call (they hold still on a shared machine; req/s does not):

  relay us     the relay's CPU per call
  direct us    the fake's CPU per direct call (it parses the body too)
  ratio        direct us / relay us: 1.0 means the relay costs what the
               upstream itself does; the goal is >= 0.6
  x small      relay us / the relay's CPU on the 100-byte chat
  bare us      bench/bare_proxy.py's CPU per call (Tornado + curl on uvloop,
               forwarding and nothing else) on a pass-through route's body:
               what the bytes cost the stack itself
  goal us      the issue's goal for a pass-through route: 1.3 x the relay's
               small chat, plus the bare proxy's cost of this body over its
               cost of the small chat

--profile samples the relay with py-spy (100 Hz) under each route and
prints where the time goes by phase (parse the client's body, estimate
the reservation, convert, encode, scan the stream, ...).  --tree runs the
server.py of another checkout; given twice or more, an A/B: each tree's
relay is loaded in turn, route by route, with the same fakes and bodies.
Writes bench/results/agents.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agent_bodies  # noqa: E402
import hotspots  # noqa: E402
import procs  # noqa: E402
from procs import ROOT  # noqa: E402
from run import BODY, STREAM_BODY, find_py_spy  # noqa: E402

from tests.helpers import Api  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
ADMIN_PASSWORD = "bench-admin-password"
PRICE = {"input_price": 1, "output_price": 2, "cache_price": 0.1}
GEMINI_PATH = "/v1beta/models/{model}:streamGenerateContent?alt=sse"
GEMINI_PLAIN = "/v1beta/models/{model}:generateContent"

# name, client body, channel type, upstream model, channel options
ROUTES = [
    ("messages -> anthropic", "claude", "anthropic", "claude-sonnet-4-5", {}),
    ("messages -> openai chat", "claude", "openai", "gpt-5", {"wire_api": "chat"}),
    ("messages -> gemini", "claude", "gemini", "gemini-2.5-pro", {}),
    ("responses -> openai", "codex", "openai", "gpt-5", {"wire_api": "responses"}),
    ("responses -> anthropic", "codex", "anthropic", "claude-sonnet-4-5", {}),
    ("responses -> chat-only", "codex", "openai", "gpt-5", {"wire_api": "chat"}),
    ("gemini -> gemini", "gemini", "gemini", "gemini-2.5-pro", {}),
    ("gemini -> openai chat", "gemini", "openai", "gpt-5", {"wire_api": "chat"}),
    ("chat 100 B", "small", "openai", "gpt-5", {}),
    ("messages 200 B -> anthropic", "claude small", "anthropic", "claude-sonnet-4-5", {}),
    ("messages 100 KB text -> anthropic", "claude text", "anthropic", "claude-sonnet-4-5", {}),
]
# The client body's own format: where it goes when sent direct.
DIRECT = {"claude": ("anthropic", "claude-sonnet-4-5"), "codex": ("openai", "gpt-5"),
          "claude small": ("anthropic", "claude-sonnet-4-5"),
          "claude text": ("anthropic", "claude-sonnet-4-5"),
          "gemini": ("gemini", "gemini-2.5-pro"), "small": ("openai", "gpt-5")}



def passes(name: str) -> str | None:
    """The upstream type of a route whose body passes through (the channel
    speaks the client's format), or None for a converted route."""
    kind, ctype, options = next((r[1], r[2], r[4]) for r in ROUTES if r[0] == name)
    bridged = kind == "codex" and options.get("wire_api") == "chat"
    return ctype if DIRECT[kind][0] == ctype and not bridged else None


# Phases of a relayed call, by the innermost frame of a sample that falls in
# one (a json or re frame counts for the code that called it).
PHASES = (
    ("parse the client's body", ("relay/serving/jsonin.py",), ()),
    ("estimate the reservation", ("relay/money/tokenizer.py",), ("approx",)),
    ("scan the upstream's stream", ("relay/serving/sse.py",), ("RawEvents", "_boundary",
                                                               "_find_boundary")),
    ("convert events", ("relay/convert/anthropic_stream.py", "relay/convert/gemini_stream.py",
                        "relay/convert/responses_stream.py"), ()),
    ("convert the request", ("relay/convert/",), ()),
    ("encode the upstream body", (), ("_dumps", "dumps")),
    ("adaptors (headers, usage, pass-through)", ("relay/adaptors/",), ()),
    ("billing, usage, limits", ("relay/money/",), ()),
    ("upstream client (libcurl)", ("relay/upstream/", "tornado/curl_httpclient.py",
                                   "tornado/httpclient.py"), ()),
    ("inbound HTTP (tornado)", ("tornado/web.py", "tornado/http1connection.py",
                                "tornado/iostream.py", "tornado/httputil.py",
                                "tornado/httpserver.py"), ()),
    ("handlers, faces, service", ("handlers/", "relay/faces/", "relay/service.py",
                                  "relay/attempts.py", "relay/catalog.py"), ()),
    ("database driver", ("pymongo/", "bson/"), ()),
)


def phase_of(frames: list[tuple[str, str]]) -> str:
    for func, path in reversed(frames):
        for name, paths, funcs in PHASES:
            if (paths and path.startswith(paths)) and (not funcs or func.startswith(funcs)):
                return name
            if not paths and funcs and func in funcs and path.startswith(("relay/", "handlers/")):
                return name
    return "event loop and the rest"


def phases(raw: str) -> list[tuple[str, float]]:
    count: Counter = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit() or stack.startswith("Thread._bootstrap"):
            continue
        total += int(n)
        count[phase_of([hotspots._fold(f) for f in stack.split(";")])] += int(n)
    return [(k, v / total) for k, v in count.most_common()] if total else []


def bodies(stream: bool) -> dict:
    out = {"claude": agent_bodies.claude_code(), "codex": agent_bodies.codex(),
           "gemini": agent_bodies.gemini()}
    for kind in ("claude", "codex"):
        out[kind]["stream"] = stream
    out["small"] = json.loads(STREAM_BODY if stream else BODY)
    # Claude Code's own route with a one-line body: what of the agent
    # route's cost is the body's, and what the route's
    out["claude small"] = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream,
                           "messages": [{"role": "user", "content": "Say hello."}]}
    # and with as many bytes as the agent's body in one string: the bytes'
    # cost apart from the parsed document's
    out["claude text"] = dict(out["claude small"],
                              messages=[{"role": "user", "content": "hello world " * 8500}])
    return out


def path_for(kind: str, model: str, stream: bool) -> str:
    if kind.startswith("claude"):
        return "/v1/messages"
    if kind == "codex":
        return "/v1/responses"
    if kind == "gemini":
        return (GEMINI_PATH if stream else GEMINI_PLAIN).format(model=model)
    return "/v1/chat/completions"


def with_model(kind: str, body: dict, model: str) -> dict:
    return body if kind == "gemini" else {**body, "model": model}


def headers_for(kind: str, key: str) -> dict:
    """Each client's own headers (the Bearer key goes too; the relay reads either)."""
    if kind.startswith("claude"):
        return {"anthropic-version": "2023-06-01", "x-api-key": key}
    return {"x-goog-api-key": key} if kind == "gemini" else {}


def wire(body: dict) -> bytes:
    """A body as the agents write it: compact, and UTF-8 as is (Node's
    JSON.stringify, serde_json), not as \\u escapes (Python's default)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def write(work: str, name: str, body: dict) -> str:
    path = os.path.join(work, name + ".json")
    with open(path, "wb") as f:
        f.write(wire(body))
    return path


def check(url: str, path: str, body_file: str, key: str, headers: dict) -> None:
    """One call read whole: wrk only sees status codes."""
    import requests
    with open(body_file, "rb") as f:
        data = f.read()
    hdr = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **headers}
    r = requests.post(url + path, data=data, headers=hdr, timeout=60)
    if r.status_code != 200 or len(r.content) < 20:
        raise RuntimeError(f"{url + path}: {r.status_code} {r.text[:600]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=10)
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--routes", default="", help="only routes whose name holds one of these "
                                                 "comma-separated words")
    ap.add_argument("--profile", nargs="?", type=float, const=6.0, default=0.0,
                    metavar="SECONDS", help="py-spy phase table per route (sampled for "
                                            "SECONDS, 6 when not given)")
    ap.add_argument("--bare", action=argparse.BooleanOptionalAction, default=True,
                    help="load bench/bare_proxy.py (Tornado + curl, nothing else) with each "
                         "pass-through route's body too: the stack's own cost of the bytes")
    ap.add_argument("--tree", action="append", default=[],
                    help="a checkout whose server.py runs (repeat for an A/B: each gets a relay "
                         "of its own, loaded in turn); default: this one")
    args = ap.parse_args()
    if not procs.have_wrk():
        print("wrk is not installed: `apt-get install wrk`.", file=sys.stderr)
        return 2
    trees = [os.path.abspath(t) for t in args.tree] or [ROOT]
    routes = [r for r in ROUTES if not args.routes
              or any(w.strip() in r[0] for w in args.routes.split(","))]
    work = tempfile.mkdtemp(prefix="relay-agents-")
    children = []
    try:
        fakes = procs.Child("fakes", [sys.executable, os.path.join(ROOT, "bench", "agent_fakes.py")],
                            os.path.join(work, "fakes.log"))
        fakes._log = open(fakes.log_path, "ab")
        fakes.proc = subprocess.Popen(fakes.cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=fakes._log, text=True)
        children.append(fakes)
        urls = json.loads(fakes.proc.stdout.readline())
        body_of = bodies(args.stream)
        relays = []  # (tree, child, url, key)
        for n, tree in enumerate(trees):
            child, url = procs.start_relay(work, ADMIN_PASSWORD, tree, name=f"relay{n}")
            children.append(child)
            relays.append((tree, child, url, setup(url, urls, routes)))
        plan = []  # (route name, kind, relay path, relay body file, direct url, path, file)
        bare = {}  # upstream type -> (child, url): the stack's floor for a pass-through
        for i, (name, kind, ctype, upstream_model, options) in enumerate(routes):
            public = f"bench-{i}-{ctype}"
            dtype, dmodel = DIRECT[kind]
            plan.append((name, kind, path_for(kind, public, args.stream),
                         write(work, f"relay-{i}", with_model(kind, body_of[kind], public)),
                         urls[dtype], path_for(kind, dmodel, args.stream),
                         write(work, f"direct-{i}", with_model(kind, body_of[kind], dmodel))))
            if args.bare and passes(name) and dtype not in bare:
                bare[dtype] = procs.start_bare_proxy(work, urls[dtype], uvloop=True)
                children.append(bare[dtype][0])
        for _, _, url, key in relays:
            for name, kind, rpath, rfile, durl, dpath, dfile in plan:
                check(url, rpath, rfile, key, headers_for(kind, key))
                check(durl, dpath, dfile, "upstream-key", headers_for(kind, "upstream-key"))
                if passes(name) in bare:
                    check(bare[passes(name)][1], dpath, dfile, "upstream-key",
                          headers_for(kind, "upstream-key"))
                procs.wrk(url + rpath, "", key, args.connections, duration=2,  # warm-up
                          body_file=rfile, headers=headers_for(kind, key))
        seen: dict = {tree: {name: {"relay": [], "direct": [], "bare": []} for name, *_ in plan}
                      for tree in trees}
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for n in range(args.rounds):
            for name, kind, rpath, rfile, durl, dpath, dfile in plan:
                for tree, child, url, key in relays:
                    # Each relay's run beside a direct run of its own, back to
                    # back: the ratio is taken within one stretch of load.
                    watch = {"relay": child.pid, "upstream": fakes.pid}
                    d = procs.wrk(durl + dpath, "", "upstream-key", args.connections,
                                  duration=args.duration, watch=watch, body_file=dfile,
                                  headers=headers_for(kind, "upstream-key"))
                    r = procs.wrk(url + rpath, "", key, args.connections,
                                  duration=args.duration, watch=watch, body_file=rfile,
                                  headers=headers_for(kind, key))
                    for what, run in (("direct", d), ("relay", r)):
                        if run["non_2xx"] or run["socket_errors"]:
                            raise RuntimeError(f"{name} {what}: {run['non_2xx']} non-2xx, "
                                               f"{run['socket_errors']}")
                    seen[tree][name]["direct"].append(d)
                    seen[tree][name]["relay"].append(r)
                    if passes(name) in bare and tree == trees[0]:
                        child_b, burl = bare[passes(name)]
                        b = procs.wrk(burl + dpath, "", "upstream-key", args.connections,
                                      duration=args.duration, watch={"bare": child_b.pid},
                                      body_file=dfile, headers=headers_for(kind, "upstream-key"))
                        if b["non_2xx"] or b["socket_errors"]:
                            raise RuntimeError(f"{name} bare: {b['non_2xx']} non-2xx, "
                                               f"{b['socket_errors']}")
                        for t in trees:
                            seen[t][name]["bare"].append(b)
                    print(f"  round {n + 1} {name:33s} {tree[-24:]:>24s} relay "
                          f"{r['cpu_us_per_request']['relay']:7.0f} us  direct "
                          f"{d['cpu_us_per_request']['upstream']:7.0f} us", flush=True)
        table = {"trees": {tree: summarise(seen[tree], body_of, plan) for tree in trees}}
        if args.profile:
            os.makedirs(RESULTS, exist_ok=True)
            for tree, child, url, key in relays:
                table["trees"][tree]["phases"] = {
                    name: profile(name, child.pid, url + rpath, rfile, key,
                                  headers_for(kind, key), args.connections, args.profile)
                    for name, kind, rpath, rfile, *_ in plan}
        table["meta"] = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                         "rounds": args.rounds, "duration": args.duration,
                         "connections": args.connections, "stream": args.stream,
                         "loadavg_at_end": os.getloadavg(), "machine": procs.machine()}
        for tree, t in table["trees"].items():
            print(f"\n== {tree}")
            render(t)
        if len(trees) > 1:
            base = table["trees"][trees[0]]["routes"]
            for tree in trees[1:]:
                print(f"\nrelay CPU per call, {tree} against {trees[0]}:")
                for name, r in table["trees"][tree]["routes"].items():
                    print(f"  {name:33s} {100 * (r['relay_us'] / base[name]['relay_us'] - 1):+6.1f}%"
                          f"   ratio {base[name]['ratio']:.2f} -> {r['ratio']:.2f}")
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "agents.json"), "w") as f:
            json.dump(table, f, indent=1)
        return 0
    finally:
        procs.tear_down(reversed(children), work)


def setup(url: str, fake_urls: dict, routes: list) -> str:
    """A channel, a price and a key per route on one relay; returns the key."""
    admin = Api.login(url, "root", ADMIN_PASSWORD)
    admin.create_user("agentbench", password="bench-password", quota=10 ** 13)
    me = Api.login(url, "agentbench", "bench-password")
    key = me.create_token("bench", remain_quota=10 ** 12)["key"]
    for i, (name, kind, ctype, upstream_model, options) in enumerate(routes):
        public = f"bench-{i}-{ctype}"
        admin.create_channel(fake_urls[ctype], [public], name=public, type=ctype,
                             key="upstream-key", model_mapping={public: upstream_model},
                             options=options)
        admin.set_price(public, **PRICE)
    return key


def summarise(seen: dict, body_of: dict, plan: list) -> dict:
    rows = {}
    for name, kind, *_ in plan:
        relay_us = statistics.median(r["cpu_us_per_request"]["relay"] for r in seen[name]["relay"])
        direct_us = statistics.median(r["cpu_us_per_request"]["upstream"]
                                      for r in seen[name]["direct"])
        rows[name] = {"body_bytes": len(wire(body_of[kind])),
                      "relay_us": relay_us, "direct_us": direct_us,
                      "ratio": round(direct_us / relay_us, 3),
                      "relay_rps": statistics.median(r["rps"] for r in seen[name]["relay"]),
                      "upstream_us_relayed": statistics.median(
                          r["cpu_us_per_request"]["upstream"] for r in seen[name]["relay"])}
        if seen[name]["bare"]:
            rows[name]["bare_us"] = statistics.median(r["cpu_us_per_request"]["bare"]
                                                      for r in seen[name]["bare"])
    small = rows.get("chat 100 B", {})
    for row in rows.values():
        row["x_small"] = round(row["relay_us"] / small["relay_us"], 2) if small else None
        # The goal for a pass-through: 1.3 x the relay's small chat,
        # plus what the bytes cost the stack itself (the bare proxy's CPU on
        # this body less its CPU on the small chat).
        if "bare_us" in row and "bare_us" in small and row is not small:
            row["goal_us"] = round(1.3 * small["relay_us"] + row["bare_us"] - small["bare_us"])
    return {"routes": rows}


def render(table: dict) -> None:
    print(f"\n{'route':33s} {'body':>8s} {'relay us':>9s} {'direct us':>9s} {'ratio':>6s} "
          f"{'x small':>7s} {'bare us':>8s} {'goal us':>8s} {'relay/s':>8s}"
          "   (CPU per call, medians)")
    for name, r in table["routes"].items():
        xs = "" if r["x_small"] is None else f"{r['x_small']:.2f}"
        bare = f"{r['bare_us']:.0f}" if "bare_us" in r else ""
        goal = f"{r['goal_us']:.0f}" if "goal_us" in r else ""
        print(f"{name:33s} {r['body_bytes']:8,d} {r['relay_us']:9.0f} {r['direct_us']:9.0f} "
              f"{r['ratio']:6.2f} {xs:>7s} {bare:>8s} {goal:>8s} {r['relay_rps']:8.0f}")
    for name, rows in (table.get("phases") or {}).items():
        if not rows:
            continue
        print(f"\n{name}: where the relay's time goes (py-spy)")
        for phase, share in rows:
            print(f"  {100 * share:5.1f}%  {phase}")


def profile(name: str, pid: int, url: str, body_file: str, key: str, headers: dict,
            connections: int, seconds: float = 6.0) -> list:
    """The phase table of the relay under one route's load; the raw stacks stay in
    bench/results/agents-profile-<route>.txt (`python bench/hotspots.py FILE`)."""
    spy = find_py_spy()
    if spy is None:
        print("py-spy is not installed (pip install -r bench/requirements.txt)", file=sys.stderr)
        return []
    env = dict(os.environ, BENCH_BODY="", BENCH_KEY=key, BENCH_BODY_FILE=body_file,
               BENCH_HEADERS="\n".join(f"{k}: {v}" for k, v in headers.items()))
    load = subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds + 2:g}s", "-s",
                             os.path.join(ROOT, "bench", "post.lua"), url], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    raw = os.path.join(RESULTS, f"agents-profile-{slug}.txt")
    subprocess.run([spy, "record", "--pid", str(pid), "-d", f"{seconds:g}", "-r", "100",
                    "-f", "raw", "-o", raw], capture_output=True, text=True)
    load.wait()
    try:
        with open(raw) as f:
            return phases(f.read())
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
