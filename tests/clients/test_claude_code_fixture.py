"""What Claude Code really sends (tests/fixtures/claude_code_requests.json,
captured from the pinned CLI by tests/clients/test_claude_code.py), replayed
through the relay to every channel type with the CLI's own headers: the
first turn of a Read round trip and the turn carrying the tool result.

This runs without the CLI, so every change to the Messages face or the
converters is checked against the real client's requests."""
from __future__ import annotations

import copy
import json
import os

import pytest
import requests

from relay.convert import anthropic as ac
from relay.convert import gemini as gc
from relay.faces import anthropic as aface
from tests.fakes import gemini_upstream as fg
from tests.helpers import ROOT
from tests.vendor_env import Env

FIXTURE = json.load(open(os.path.join(ROOT, "tests", "fixtures", "claude_code_requests.json")))
FIRST, SECOND = FIXTURE["requests"][:2]
USAGE = {"anthropic": (25, 7, 4), "openai": (10, 3, 0), "azure": (10, 3, 0),
         "gemini": (12, 5 + fg.THOUGHT_TOKENS, 3)}


def _client_headers(rec: dict, key: str) -> dict:
    return dict(rec["headers"], **{"x-api-key": key})


# ---- without a relay: the face and the converters ----------------------------------
def test_fixture_is_what_the_issue_describes():
    b = FIRST["body"]
    assert FIRST["query"] == "beta=true" and b["stream"] is True
    assert "claude-code-20250219" in FIRST["headers"]["Anthropic-Beta"]
    assert [m["role"] for m in b["messages"]] == ["user", "system"]
    assert len(b["tools"]) >= 10 and "Read" in [t["name"] for t in b["tools"]]
    assert [m["role"] for m in SECOND["body"]["messages"]] == ["user", "system", "assistant",
                                                               "user"]


@pytest.mark.parametrize("rec", [FIRST, SECOND], ids=["first", "tool-result"])
def test_fixture_converts_for_every_target(rec):
    raw = json.dumps(rec["body"]).encode()
    call = aface.parse_messages("r", raw, rec["headers"], rec["query"])
    body = call.body
    # One leading system message: the top-level system, then the CLI's
    # environment block from inside `messages`.
    assert [m["role"] for m in body["messages"]][0] == "system"
    assert "Primary working directory: /run/workspace" in body["messages"][0]["content"]
    assert sum(m["role"] == "system" for m in body["messages"]) == 1
    assert body["reasoning_effort"] == "medium"  # output_config.effort on adaptive thinking
    assert "Read" in [t["function"]["name"] for t in body["tools"]]
    gem = gc.request_from_openai(body, "gemini-2.5-pro")
    assert "Primary working directory" in gem["systemInstruction"]["parts"][0]["text"]
    assert gem["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 8192,
                                                         "includeThoughts": True}
    back = ac.request_from_openai(body, "claude-x")
    assert back["max_tokens"] == rec["body"]["max_tokens"]
    if rec is SECOND:
        tool = [m for m in body["messages"] if m["role"] == "tool"]
        assert len(tool) == 1 and "SECRET-0000" in tool[0]["content"]
        # A tool loop in progress without a signature to start it: no thinking.
        assert "thinking" not in back
    n = aface.estimate_tokens(aface.parse_count_tokens("r", raw))
    assert n > 5000  # a real agent prompt: thousands of tokens


# ---- through the relay, every channel type -------------------------------------------
@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("anthropic", "claude-opus-5-5")  # unmapped: the bytes go through untouched
    yield e
    e.stop()


def _replay(env: Env, rec: dict, model: str, key: str) -> list[tuple[str, dict]]:
    body = copy.deepcopy(rec["body"])
    body["model"] = model
    r = requests.post(f"{env.relay.url}/v1/messages?{rec['query']}",
                      data=json.dumps(body).encode(), headers=_client_headers(rec, key),
                      stream=True, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = []
    for block in r.content.decode().split("\n\n"):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("event: "):
            events.append((lines[0][7:], json.loads(lines[1][6:])))
    return events


@pytest.mark.parametrize("kind", ["anthropic", "openai", "gemini", "azure"])
def test_fixture_round_trip_through_each_channel_type(env, kind):
    tok = env.token()
    fake = env.fakes[kind]
    model = "claude-opus-5-5" if kind == "anthropic" else env.models[kind]
    fake.tool_plan = {"name": "Read", "input": {"file_path": "/run/workspace/notes.txt"}}
    try:
        first = _replay(env, FIRST, model, tok["key"])
        up_first = fake.requests[-1]
        second = _replay(env, SECOND, model, tok["key"])
    finally:
        fake.tool_plan = None
    names = [n for n, _ in first]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [d["content_block"] for n, d in first if n == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["name"] == "Read"
    args = "".join(d["delta"]["partial_json"] for n, d in first
                   if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(args) == {"file_path": "/run/workspace/notes.txt"}
    assert first[-2][1]["delta"]["stop_reason"] == "tool_use"
    text = "".join(d["delta"]["text"] for n, d in second
                   if n == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert "SECRET-0000" in text and second[-2][1]["delta"]["stop_reason"] == "end_turn"
    if kind == "anthropic":
        # Pass-through: the CLI's bytes, version, betas and query, as sent.
        sent = json.dumps(dict(FIRST["body"], model=model)).encode()
        assert up_first["raw"] == sent and up_first["query"] == "beta=true"
        for h in ("Anthropic-Version", "Anthropic-Beta"):
            assert up_first["headers"][h] == FIRST["headers"][h]
    else:
        assert not any(h.lower().startswith("anthropic") for h in up_first["headers"])
    env.check_billed(tok, *USAGE[kind], n=2)
    # count_tokens on the same body: free, answered for every channel type.
    body = {k: v for k, v in FIRST["body"].items() if k not in ("max_tokens", "stream")}
    r = requests.post(f"{env.relay.url}/v1/messages/count_tokens?beta=true",
                      json=dict(body, model=model), timeout=30,
                      headers=_client_headers(FIRST, tok["key"]))
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    assert len(env.logs(tok["id"], 2)) == 2


# ---- the current betas, end to end ----------------------------------------------------
SCOPE = "prompt-caching-scope-2026-01-05"


def _with_current_betas(rec: dict) -> dict:
    """The recorded turn with everything the newest betas add: a context
    management edit (it has one), a tool's input_examples and deferred
    loading, cache_control with a scope and a TTL, and the signed thinking
    block of the tool loop (SECOND has it)."""
    rec = copy.deepcopy(rec)
    b = rec["body"]
    b["tools"][0]["input_examples"] = [{"description": "find the notes"}]
    b["tools"][1]["defer_loading"] = True
    b["system"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h", "scope": "global"}
    rec["headers"]["Anthropic-Beta"] += f",{SCOPE}"
    return rec


@pytest.mark.parametrize("kind", ["anthropic", "openai", "gemini"])
def test_current_betas_pass_through_or_convert_cleanly(env, kind):
    """On an Anthropic channel they all arrive as sent; elsewhere nothing of
    them reaches an upstream that would refuse it, and the call works."""
    tok = env.token()
    fake = env.fakes[kind]
    model = "claude-opus-5-5" if kind == "anthropic" else env.models[kind]
    rec = _with_current_betas(SECOND)
    fake.tool_plan = {"name": "Read", "input": {"file_path": "/run/workspace/notes.txt"}}
    try:
        events = _replay(env, rec, model, tok["key"])
    finally:
        fake.tool_plan = None
    assert events[-1][0] == "message_stop"
    sent = fake.requests[-1]
    if kind == "anthropic":
        assert sent["body"] == dict(rec["body"], model=model)
        assert SCOPE in sent["headers"]["Anthropic-Beta"]
        thinking = sent["body"]["messages"][2]["content"][0]
        assert thinking["type"] == "thinking" and thinking["signature"].startswith("sig_fake")
    else:
        text = json.dumps(sent["body"])
        for gone in ("input_examples", "defer_loading", "cache_control", "context_management",
                     "signature", "clear_thinking"):
            assert gone not in text, gone
        assert not any(h.lower().startswith("anthropic") for h in sent["headers"])
