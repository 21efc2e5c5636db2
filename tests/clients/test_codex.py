"""The real Codex CLI (npm @openai/codex 0.169.0, tests/clients) against the
relay: `codex exec` with its own CODEX_HOME in a temp folder and a model
provider pointing at the relay, through a channel of each kind (OpenAI
Responses passed through; chat-only OpenAI, Anthropic and Gemini bridged).

Every channel has default settings: the chat-only one is learnt to be so
from its 404 on the first call (relay/compat/wire.py), and the hosted tools
Codex offers (web_search, tool_search) are left out where they cannot run;
Codex's config names only the relay's base URL and key.  Codex also runs
over the relay's Responses WebSocket (`supports_websockets = true`), and
falls back to HTTP at once where the relay answers 426.

In every run the model (a fake playing tests/fakes/agent_script.py) asks for
Codex's shell tool to print a file holding a random secret; Codex runs it,
sends the output back, and its final answer carries the secret.  The
Anthropic run sets a reasoning effort, which reaches the upstream as
thinking.  Codex may
reach no host but 127.0.0.1: its proxies point at a recording black hole.
Billing is checked to the unit after each run.  One more run, as gpt-5.5,
has Codex send its freeform apply_patch tool (a custom tool) through an
Anthropic channel and apply the patch the model writes.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess

import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.blackhole_proxy import BlackHoleProxy
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import ROOT, USER_PASSWORD, Api
from tests.vendor_env import PRICE, expected_units

pytestmark = pytest.mark.slow

CODEX = os.path.join(ROOT, "tests", "clients", "node_modules", ".bin", "codex")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "codex_request.json")
# channel -> (type, fake name, base mode, options, usage per upstream call)
CHANNELS = {
    "codex-responses": ("openai", "openai", None, {}, (30, 6, 10)),
    "codex-chat": ("openai", "openai", "chatonly", {}, (10, 3, 0)),
    "codex-anthropic": ("anthropic", "anthropic", None, {}, (25, 7, 4)),
    "codex-gemini": ("gemini", "gemini", None, {}, (12, 5, 3)),
}

if not os.path.exists(CODEX):
    pytest.skip("Codex CLI not installed: npm ci --prefix tests/clients", allow_module_level=True)


@pytest.fixture(scope="module")
def env(relay, admin):
    fakes = {"openai": FakeOpenAI().start(), "anthropic": FakeAnthropic().start(),
             "gemini": FakeGemini().start()}
    for model, (kind, fake, mode, options, _) in CHANNELS.items():
        base = fakes[fake].mode_url(mode) if mode else fakes[fake].url
        admin.create_channel(base, [model], name=model, type=kind, options=options)
        admin.set_price(model, **PRICE)
    name = "codex" + secrets.token_hex(3)
    admin.create_user(name, quota=10 ** 12)
    user = Api.login(relay.url, name, USER_PASSWORD)
    proxy = BlackHoleProxy().start()
    yield {"relay": relay, "admin": admin, "user": user, "fakes": fakes, "proxy": proxy}
    proxy.stop()
    for f in fakes.values():
        f.stop()


def config(base_url: str, model: str, effort: str | None = None, socket: bool = False) -> str:
    return "\n".join([
        f'model = "{model}"', 'model_provider = "relay"', 'approval_policy = "never"',
        *([f'model_reasoning_effort = "{effort}"'] if effort else []),
        'sandbox_mode = "danger-full-access"', "check_for_update_on_startup = false",
        "[analytics]", "enabled = false", "[feedback]", "enabled = false",
        "[otel]", 'exporter = "none"',
        # Plugins sync a marketplace from GitHub: off, like every other
        # non-essential call.
        "[features]", "plugins = false", "remote_plugin = false",
        "[model_providers.relay]", 'name = "relay"', f'base_url = "{base_url}/v1"',
        'env_key = "RELAY_TEST_KEY"', 'wire_api = "responses"',
        *(["supports_websockets = true"] if socket else []), ""])


def run_codex(env, tmp_path, model: str, base_url: str = "", key: str = "",
              effort: str | None = None, socket: bool = False) -> tuple[dict, str, str]:
    tok = {} if key else env["user"].create_token(name="codex", remain_quota=10 ** 10)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    secret = "SECRET-" + secrets.token_hex(8)
    (work / "secret.txt").write_text(secret + "\n")
    (home / "config.toml").write_text(config(base_url or env["relay"].url, model, effort,
                                             socket))
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CODEX"))}
    proc_env.update(env["proxy"].env(), CODEX_HOME=str(home), RELAY_TEST_KEY=key or tok["key"],
                    HOME=str(tmp_path), NO_COLOR="1", RUST_LOG="codex_api=info")
    proc = subprocess.run([CODEX, "exec", "--strict-config", "--skip-git-repo-check",
                           "Print the contents of secret.txt using the shell tool."],
                          cwd=work, env=proc_env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tok, secret, proc.stdout + proc.stderr


def check_billing(env, tok: dict, usage: tuple, calls: int) -> list:
    admin = env["admin"]
    from tests.helpers import eventually

    def records():
        items = admin.get(f"/api/log/?token_id={tok['id']}&size=100")["data"]["items"]
        assert len(items) == calls, items
        return items
    recs = eventually(records, timeout=15)
    prompt, completion, cached = usage
    for r in recs:
        assert r["endpoint"] == "responses" and r["status"] == 200 and not r["estimated"], r
        assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) == usage, r
        assert r["quota"] == expected_units(prompt, completion, cached), r

    def used():
        got = env["user"].get(f"/api/token/{tok['id']}")["data"]["used_quota"]
        assert got == sum(r["quota"] for r in recs)
    eventually(used, timeout=10)
    return recs


@pytest.mark.parametrize("model", sorted(CHANNELS))
def test_codex_tool_round_trip(env, tmp_path, model):
    kind, fake_name, _mode, _opts, usage = CHANNELS[model]
    fake = env["fakes"][fake_name]
    since = len(fake.requests)
    before = len(env["proxy"].attempts)
    # Through Anthropic with a reasoning effort: thinking on the first turn.
    effort = "high" if model == "codex-anthropic" else None
    tok, secret, output = run_codex(env, tmp_path, model, effort=effort)
    assert secret in output, output[-3000:]
    sent = fake.requests[since:]
    billed = len(sent)
    if model == "codex-chat":
        # Learnt from the first call's 404, which is bridged at once: from
        # then on every call goes straight to chat.
        assert sent[0]["path"] == "/mode/chatonly/v1/responses"
        sent, billed = sent[1:], billed - 1
    assert len(sent) >= 2  # the tool call, then the answer with its output
    if model == "codex-responses":
        assert all(r["path"] == "/v1/responses" for r in sent)
        assert any(i.get("type") == "function_call_output" and secret in str(i.get("output"))
                   for i in sent[-1]["body"]["input"])
        assert "web_search" in [t["type"] for t in sent[0]["body"]["tools"]]
    elif model == "codex-chat":
        assert all(r["path"].endswith("/chat/completions") for r in sent)
        assert all("web_search" not in json.dumps(r["body"].get("tools")) for r in sent)
        assert sent[-1]["body"]["messages"][-1]["role"] == "tool"
        assert secret in sent[-1]["body"]["messages"][-1]["content"]
    elif model == "codex-anthropic":
        assert sent[0]["body"]["thinking"]["type"] == "enabled"
        # the tool loop has no signed thinking block to replay: none asked for
        assert "thinking" not in sent[-1]["body"]
        assert secret in json.dumps(sent[-1]["body"]["messages"][-1]["content"])
    assert env["proxy"].attempts[before:] == [], env["proxy"].attempts
    check_billing(env, tok, usage, billed)


@pytest.mark.parametrize("model", ["codex-responses", "codex-anthropic"])
def test_codex_over_the_responses_websocket(env, tmp_path, model):
    """Codex with supports_websockets: one socket, each response.create a
    billed call; the second continues the first by previous_response_id and
    the upstream still sees the whole conversation."""
    fake = env["fakes"][CHANNELS[model][1]]
    since = len(fake.requests)
    tok, secret, output = run_codex(env, tmp_path, model, socket=True)
    assert secret in output, output[-3000:]
    assert "successfully connected to Responses WebSocket" in output, output[-3000:]
    sent = fake.requests[since:]
    assert len(sent) >= 2
    if model == "codex-responses":
        assert all(r["path"] == "/v1/responses" and "previous_response_id" not in r["body"]
                   for r in sent)
        assert any(i.get("type") == "function_call_output" and secret in str(i.get("output"))
                   for i in sent[-1]["body"]["input"])
    else:
        assert secret in json.dumps(sent[-1]["body"]["messages"][-1]["content"])
    check_billing(env, tok, CHANNELS[model][4], len(sent))


def test_codex_falls_back_to_http_at_once_on_426(env, tmp_path, fresh_relay):
    relay = fresh_relay(args=["--responses-websocket", "false"])
    admin = Api.login(relay.url)
    admin.create_channel(env["fakes"]["openai"].url, ["codex-fallback"], name="fb")
    admin.set_price("codex-fallback", **PRICE)
    admin.create_user("fallback", quota=10 ** 12)
    key = Api.login(relay.url, "fallback", USER_PASSWORD).create_token(
        name="k", remain_quota=10 ** 10)["key"]
    _, secret, output = run_codex(env, tmp_path, "codex-fallback", base_url=relay.url, key=key,
                                  socket=True)
    assert secret in output
    assert "successfully connected to Responses WebSocket" not in output
    # One refused upgrade, then HTTP: no reconnect loop.
    assert relay.log().count("426 GET /v1/responses") == 1, relay.log()[-3000:]


def test_codex_request_shape(env, tmp_path):
    """What Codex itself sends (straight to the fake, no relay between), kept
    in tests/fixtures/codex_request.json: a Codex that sends something else
    fails here, and the fixture is rewritten for review."""
    fake = env["fakes"]["openai"]
    since = len(fake.requests)
    _, secret, output = run_codex(env, tmp_path, "gpt-test", fake.url, "sk-direct")
    assert secret in output
    rec = fake.requests[since]
    body = rec["body"]
    assert rec["headers"]["Authorization"] == "Bearer sk-direct"
    assert rec["headers"]["Originator"] == "codex_exec"
    shape = {
        "path": rec["path"],
        "headers": sorted(h.lower() for h in rec["headers"]
                          if h.lower() not in ("host", "content-length")),
        "header_values": {k.lower(): v for k, v in rec["headers"].items()
                          if k.lower() in ("accept", "content-type", "originator")},
        "body_keys": sorted(body),
        "body_values": {k: body[k] for k in ("stream", "store", "tool_choice",
                                             "parallel_tool_calls", "include", "reasoning")
                        if k in body},
        "input_items": sorted({f"{i.get('type', 'message')}:{i.get('role', '')}"
                               for i in body["input"]}),
        "tools": [{"type": t["type"], "name": t.get("name"),
                   "inner": [x.get("name") for x in t.get("tools") or ()] or None,
                   "parameters": sorted((t.get("parameters") or {}).get("properties") or {})}
                  for t in body.get("tools") or ()],
    }
    pinned = None
    if os.path.exists(FIXTURE):
        with open(FIXTURE) as fh:
            pinned = json.load(fh)
        if pinned == shape:
            return
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w") as fh:
        json.dump(shape, fh, indent=1, sort_keys=True)
        fh.write("\n")
    assert pinned is None, "Codex's request shape changed: see git diff tests/fixtures/"



FREEFORM_PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello from a freeform patch\n*** End Patch\n"


def test_codex_freeform_apply_patch_through_a_bridge(env, tmp_path):
    """For gpt-5.5 Codex sends apply_patch as a custom (freeform) tool with a
    lark grammar.  Through an Anthropic channel the model's tool_use comes
    back to Codex as a custom_tool_call, Codex applies the patch in its
    workspace and sends a custom_tool_call_output, which reaches the upstream
    as the tool_result.  (Codex also offers a client-run tool_search tool,
    which only OpenAI's models call: left out.)"""
    admin, fake = env["admin"], env["fakes"]["anthropic"]
    admin.create_channel(fake.url, ["gpt-5.5"], name="codex-freeform", type="anthropic",
                         model_mapping={"gpt-5.5": "claude-upstream"})
    admin.set_price("gpt-5.5", **PRICE)
    since = len(fake.requests)
    fake.tool_plan = {"name": "apply_patch", "input": {"input": FREEFORM_PATCH}}
    try:
        tok, _, output = run_codex(env, tmp_path, "gpt-5.5")
    finally:
        fake.tool_plan = None
    assert (tmp_path / "work" / "hello.txt").read_text() == "Hello from a freeform patch\n", \
        output[-3000:]
    sent = [r["body"] for r in fake.requests[since:]]
    assert len(sent) >= 2 and all(b["model"] == "claude-upstream" for b in sent)
    tool = next(t for t in sent[0]["tools"] if t["name"] == "apply_patch")
    assert tool["input_schema"]["required"] == ["input"]
    assert "*** Begin Patch" in tool["input_schema"]["properties"]["input"]["description"]
    use = [b for b in sent[-1]["messages"][-2]["content"] if b["type"] == "tool_use"][-1]
    result = [b for b in sent[-1]["messages"][-1]["content"] if b["type"] == "tool_result"][-1]
    assert use["name"] == "apply_patch" and use["input"] == {"input": FREEFORM_PATCH}
    assert result["tool_use_id"] == use["id"] and "hello.txt" in json.dumps(result["content"])
    assert "The tool returned:" in output
    check_billing(env, tok, CHANNELS["codex-anthropic"][4], len(sent))
