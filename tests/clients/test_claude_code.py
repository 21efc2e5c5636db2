"""The real Claude Code CLI (npm @anthropic-ai/claude-code, pinned in
tests/clients) against the relay, through each channel type, with a full
tool round trip and billing checked to the unit.

Given only ANTHROPIC_BASE_URL and a relay key, `claude -p` runs in a temp
workspace with HOME in a temp folder.  The fake upstream (whatever its
wire format) asks for a Read of a file holding a random secret; the CLI
reads it, sends the result back, and its final answer quotes the secret.

It never reaches any host but 127.0.0.1: its non-essential traffic is off,
HTTP(S)_PROXY points at a black-hole proxy that records every attempt to
go elsewhere (there must be none), and where strace works every connect()
and sendto() of the CLI and its children is checked to target loopback.

One more run goes through a recording forwarder in front of the relay, to
see exactly what the CLI sends; that is pinned in
tests/fixtures/claude_code_requests.json (refreshed with
RELAY_REFRESH_FIXTURES=1), so a change in the client shows up here, and
the fixture is replayed through every channel type in
tests/clients/test_claude_code_fixture.py.

Adding a channel type is one entry in UPSTREAMS.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable

import pytest

from tests.fakes import gemini_upstream as fg
from tests.fakes.blackhole_proxy import BlackHoleProxy
from tests.fakes.recording_forwarder import RecordingForwarder
from tests.helpers import ROOT, eventually
from tests.vendor_env import Env, expected_units

CLAUDE = os.path.join(ROOT, "tests", "clients", "node_modules", ".bin", "claude")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "claude_code_requests.json")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not os.path.exists(CLAUDE), reason="Claude Code is not "
                                 "installed: npm ci --prefix tests/clients")]


@dataclass
class Upstream:
    """One channel the CLI runs against: its type, the upstream model it
    maps to, and `usage(rec)`: the (prompt, completion, cached) tokens its
    fake reported for one recorded request; `mode` the fake's mode (see
    FakeOpenAI) and `options` the channel's."""
    kind: str
    upstream: str
    usage: Callable[[dict], tuple[int, int, int]]
    options: dict = field(default_factory=dict)
    mode: str | None = None

    @property
    def name(self) -> str:
        return self.kind + (f"-{self.mode}" if self.mode else "")


def _gemini_usage(rec: dict) -> tuple[int, int, int]:
    thoughts = ((rec["body"].get("generationConfig") or {}).get("thinkingConfig") or {}).get(
        "includeThoughts")
    return 12, 5 + (fg.THOUGHT_TOKENS if thoughts else 0), 3


UPSTREAMS = [
    pytest.param(Upstream("anthropic", "claude-opus-upstream", lambda rec: (25, 7, 4)),
                 id="anthropic"),
    # A reasoning model: the CLI's effort goes on as reasoning_effort.
    pytest.param(Upstream("openai", "gpt-5-mini", lambda rec: (10, 3, 0)), id="openai-chat"),
    # An OpenAI channel that speaks only the Responses API: the CLI's calls
    # converted to Responses requests (effort as reasoning.effort) and back.
    pytest.param(Upstream("openai", "gpt-5-mini", lambda rec: (30, 6, 10),
                          {"wire_api": "responses"}, "responsesonly"), id="openai-responses"),
    # Gemini 3: a thinking level, and replayed calls need a thought signature.
    pytest.param(Upstream("gemini", "gemini-3-pro-preview", _gemini_usage), id="gemini"),
]

# Everything Claude Code would send anywhere but the API, turned off.
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
         "DISABLE_AUTOUPDATER": "1", "DISABLE_UPDATES": "1", "DISABLE_ERROR_REPORTING": "1",
         "DISABLE_BUG_COMMAND": "1", "DISABLE_FEEDBACK_COMMAND": "1",
         "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1", "DISABLE_GROWTHBOOK": "1",
         "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
         "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1", "DISABLE_INSTALLATION_CHECKS": "1"}
_LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    yield e
    e.stop()


@pytest.fixture(scope="module")
def proxy():
    p = BlackHoleProxy().start()
    yield p
    p.stop()


def _strace_works() -> bool:
    if not shutil.which("strace"):
        return False
    return subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"],
                          capture_output=True).returncode == 0


def _remote_addresses(trace: str) -> list[str]:
    """The non-loopback INET addresses of every connect/sendto traced."""
    found = re.findall(r'inet_(?:addr|pton)\((?:AF_INET6?, )?"([^"]+)"', trace)
    return [a for a in found if a not in _LOOPBACK and not a.startswith("127.")]


def run_claude(relay_url: str, key: str, model: str, home: str, workspace: str,
               proxy: BlackHoleProxy, prompt: str, trace_file: str | None) -> list[dict]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8",
           "ANTHROPIC_BASE_URL": relay_url, "ANTHROPIC_API_KEY": key,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
           "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "CLAUDE_CODE_SUBAGENT_MODEL": model,
           **proxy.env(), **QUIET}
    cmd = [CLAUDE, "-p", prompt, "--output-format", "stream-json", "--verbose",
           "--model", model, "--allowedTools", "Read"]
    if trace_file:
        cmd = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", trace_file] + cmd
    proc = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    events = []
    for line in proc.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return events


def _check_billing(env: Env, up: Upstream, token: dict, recs: list[dict]) -> None:
    """One usage record per upstream call, each charged exactly the price
    of the usage the upstream reported; the key's used quota is their sum."""
    logs = env.logs(token["id"], len(recs))
    assert len(logs) == len(recs), (len(logs), len(recs))
    assert all(r["status"] == 200 and r["estimated"] is False for r in logs), logs
    got = sorted((r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"], r["quota"])
                 for r in logs)
    want = sorted(u + (expected_units(*u),) for u in map(up.usage, recs))
    assert got == want
    total = sum(r["quota"] for r in logs)

    def used_is_the_sum():
        assert env.used(token["id"]) == total
    eventually(used_is_the_sum, timeout=10)


def _shape(rec: dict) -> dict:
    """What the fixture pins about one request Claude Code sends."""
    b = rec["body"]
    return {"query": rec["query"],
            "anthropic-version": rec["headers"].get("Anthropic-Version"),
            "anthropic-beta": sorted((rec["headers"].get("Anthropic-Beta") or "").split(",")),
            "headers": sorted(h.lower() for h in rec["headers"] if not h.lower().startswith(
                ("x-stainless-", "host", "content-length", "connection", "accept-encoding"))),
            "fields": sorted(b),
            "max_tokens": b.get("max_tokens"), "stream": b.get("stream"),
            "thinking": b.get("thinking"), "output_config": b.get("output_config"),
            "roles": [m["role"] for m in b.get("messages") or ()],
            "tools": sorted(t.get("name", t.get("type")) for t in b.get("tools") or ()),
            "block_types": sorted({blk.get("type") for m in b.get("messages") or ()
                                   if isinstance(m.get("content"), list)
                                   for blk in m["content"]})}


def _scrub(rec: dict, root: str, secret: str) -> dict:
    """A recorded request as the fixture keeps it: no key, no temp paths
    (the run's folder is /run), no per-run ids."""
    text = json.dumps({"query": rec["query"], "headers": rec["headers"], "body": rec["body"]})
    # (its memory folder is named after the path, every other character a dash)
    text = text.replace(root, "/run").replace(re.sub(r"[^A-Za-z0-9]", "-", root), "-run")
    text = text.replace(secret, "SECRET-0000")
    doc = json.loads(text)
    drop = {"X-Api-Key", "Host", "Content-Length", "X-Claude-Code-Session-Id", "Connection",
            "Accept-Encoding"}
    doc["headers"] = {k: v for k, v in doc["headers"].items() if k not in drop}
    doc["body"]["model"] = "claude-sonnet-4-5"
    if "metadata" in doc["body"]:
        doc["body"]["metadata"] = {"user_id": json.dumps({"device_id": "0" * 64,
                                                          "account_uuid": "",
                                                          "session_id": "session"})}
    return doc


def _check_fixture(recs: list[dict], root: str, secret: str) -> None:
    scrubbed = [_scrub(r, root, secret) for r in recs]
    if os.environ.get("RELAY_REFRESH_FIXTURES") or not os.path.exists(FIXTURE):
        version = json.load(open(os.path.join(ROOT, "tests", "clients", "package.json")))[
            "dependencies"]["@anthropic-ai/claude-code"]
        os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
        with open(FIXTURE, "w") as f:
            json.dump({"claude_code": version, "requests": scrubbed}, f, indent=1,
                      ensure_ascii=False)
            f.write("\n")
    pinned = json.load(open(FIXTURE))["requests"]
    assert [_shape(r) for r in scrubbed] == [_shape(r) for r in pinned], (
        "Claude Code now sends something else: check the relay against it, then refresh "
        "tests/fixtures/claude_code_requests.json with RELAY_REFRESH_FIXTURES=1")


class Run:
    """One CLI run in a fresh temp workspace and HOME, with a secret file
    the fake upstream asks it to Read."""

    def __init__(self, env: Env, kind: str, tmp_path, model: str):
        self.env, self.fake, self.model = env, env.fakes[kind], model
        self.workspace, self.home = tmp_path / "workspace", tmp_path / "home"
        self.workspace.mkdir()
        self.home.mkdir()
        self.secret = "SECRET-" + secrets.token_hex(8)
        (self.workspace / "notes.txt").write_text(f"The launch code is {self.secret}.\n")
        self.trace = str(tmp_path / "trace.txt") if _strace_works() else None
        self.token = env.token()

    def __call__(self, base_url: str, proxy: BlackHoleProxy) -> tuple[list[dict], list[dict]]:
        """(the CLI's stream-json events, the upstream requests it caused)."""
        self.fake.tool_plan = {"name": "Read",
                               "input": {"file_path": str(self.workspace / "notes.txt")}}
        n0 = len(self.fake.requests)
        try:
            events = run_claude(base_url, self.token["key"], self.model, str(self.home),
                                str(self.workspace), proxy, "What does notes.txt say?",
                                self.trace)
        finally:
            self.fake.tool_plan = None
        return events, self.fake.requests[n0:]

    def check_round_trip(self, events: list[dict], recs: list[dict]) -> None:
        """The CLI ran Read on the model's request, sent the result back,
        and its final answer quotes the secret."""
        uses = [b for e in events if e.get("type") == "assistant"
                for b in e["message"].get("content") or () if b.get("type") == "tool_use"]
        assert [u["name"] for u in uses] == ["Read"], events
        results = [b for e in events if e.get("type") == "user"
                   for b in e["message"].get("content") or () if b.get("type") == "tool_result"]
        assert results and self.secret in json.dumps(results[0]), events
        assert not results[0].get("is_error")
        final = [e for e in events if e.get("type") == "result"]
        assert final and final[-1]["is_error"] is False, events
        assert self.secret in final[-1]["result"], events
        assert len(recs) >= 2 and self.secret in json.dumps(recs[-1]["body"])

    def check_stayed_local(self, proxy: BlackHoleProxy) -> None:
        assert proxy.attempts == []
        if self.trace:
            assert _remote_addresses(open(self.trace).read()) == []


@pytest.mark.parametrize("up", UPSTREAMS)
def test_claude_code_tool_round_trip(env, proxy, tmp_path, up):
    # Named like Claude Code's current default model, so that the CLI sends
    # its newest request shape (system message in `messages`, adaptive
    # thinking, effort) whatever channel serves it.
    model = f"claude-opus-5-5-via-{up.name}"
    env.channel(up.kind, model, mode=up.mode, upstream=up.upstream, options=up.options or None)
    run = Run(env, up.kind, tmp_path, model)
    events, recs = run(env.relay.url, proxy)
    run.check_round_trip(events, recs)
    run.check_stayed_local(proxy)
    _check_billing(env, up, run.token, recs)
    if up.name == "openai":
        assert all(r["path"].endswith("/v1/chat/completions") for r in recs)
        assert all(r["body"].get("reasoning_effort") == "medium" for r in recs)
    if up.name == "openai-responsesonly":
        assert all(r["path"].endswith("/v1/responses") and r["body"]["store"] is False
                   for r in recs)
        assert all(r["body"].get("reasoning") == {"effort": "medium"} for r in recs)
        # Its system messages, merged into one instruction.
        assert recs[0]["body"].get("instructions")
        assert not [i for r in recs for i in r["body"]["input"] if i.get("role") == "developer"]
        assert any(i.get("type") == "function_call_output" for i in recs[-1]["body"]["input"])
    if up.kind == "gemini":
        assert recs[-1]["body"]["generationConfig"]["thinkingConfig"]["thinkingLevel"] == "high"
    if up.kind == "anthropic":
        # Pass-through: the CLI's beta route, version and betas reached the upstream.
        assert all(r["query"] == "beta=true" for r in recs)
        assert all("claude-code-20250219" in r["headers"].get("Anthropic-Beta", "")
                   for r in recs)
        assert any(m["role"] == "system" for m in recs[0]["body"]["messages"])


def test_what_claude_code_sends(env, proxy, tmp_path):
    """Through a recording forwarder: the CLI's own requests match the
    fixture, and an unmapped Anthropic channel got them byte for byte, with
    the CLI's version, betas and query."""
    model = "claude-opus-5-5"
    env.channel("anthropic", model)
    run = Run(env, "anthropic", tmp_path, model)
    fwd = RecordingForwarder(env.relay.url).start()
    try:
        events, recs = run(fwd.url, proxy)
    finally:
        fwd.stop()
    run.check_round_trip(events, recs)
    run.check_stayed_local(proxy)
    sent = [r for r in fwd.requests if r["path"].endswith("/messages")]
    assert len(sent) == len(recs)
    for client, upstream in zip(sent, recs):
        assert upstream["raw"] == client["raw"]
        assert upstream["query"] == client["query"] == "beta=true"
        for h in ("Anthropic-Version", "Anthropic-Beta"):
            assert upstream["headers"][h] == client["headers"][h]
    assert any(m["role"] == "system" for m in sent[0]["body"]["messages"])
    _check_fixture(sent, str(tmp_path), run.secret)
