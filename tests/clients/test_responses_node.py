"""The Node clients of /v1/responses (tests/clients): the official `openai`
SDK's responses.create and responses.stream with function calling, and the
Vercel AI SDK's default `openai(model)` provider (generateText with a tool
loop, streamText), each against a pass-through channel and through the
bridge, billed to the unit.  The chat-only channel has default settings:
its first call's 404 teaches the relay that it speaks only chat."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import ROOT
from tests.vendor_env import Env

pytestmark = pytest.mark.slow

CLIENTS = os.path.join(ROOT, "tests", "clients")
# public model -> (prompt, completion, cached) the fake reports per call
MODELS = {"resp-model": (30, 6, 10), "chatonly-model": (10, 3, 0), "chatonly-vercel": (10, 3, 0),
          "anthropic-model": (25, 7, 4), "gemini-model": (12, 5, 3)}

if not os.path.isdir(os.path.join(CLIENTS, "node_modules", "openai")):
    pytest.skip("Node clients not installed: npm ci --prefix tests/clients",
                allow_module_level=True)


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("openai", "resp-model")
    e.channel("openai", "chatonly-model", mode="chatonly")
    e.channel("openai", "chatonly-vercel", mode="chatonly")  # learnt by the Vercel run itself
    yield e
    e.stop()


def node(env, tok, model: str, which: str) -> dict:
    proc = subprocess.run(["node", "responses_check.mjs"], cwd=CLIENTS, capture_output=True,
                          text=True, timeout=120, env=dict(
                              os.environ, RELAY_BASE=env.relay.url, RELAY_KEY=tok["key"],
                              MODEL=model, CLIENT=which))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out.get("error")
    return out


def billed(env, tok, model: str, n: int) -> None:
    recs = env.logs(tok["id"], n)
    assert len(recs) == n
    for r in recs:
        assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) == MODELS[model]
        assert not r["estimated"] and r["endpoint"] == "responses"
    env.check_billed(tok, *MODELS[model], n=n)


@pytest.mark.parametrize("model", sorted(set(MODELS) - {"chatonly-vercel"}))
def test_node_openai_sdk(env, model):
    tok = env.token()
    out = node(env, tok, model, "openai")
    assert out["create"]["status"] == "completed" and out["create"]["text"]
    assert out["create"]["usage"]["input_tokens"] == MODELS[model][0]
    types = out["stream"]["types"]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in types
    assert out["stream"]["calls"][0]["name"] == "get_weather"
    assert json.loads(out["stream"]["calls"][0]["arguments"]) == {"city": "Paris"}
    assert out["second"]["text"]
    billed(env, tok, model, 3)


@pytest.mark.parametrize("model", ["resp-model", "chatonly-vercel", "anthropic-model"])
def test_vercel_ai_sdk(env, model):
    tok = env.token()
    since = len(env.openai.requests)
    out = node(env, tok, model, "vercel")
    assert out["toolCalls"] == ["get_weather"] and out["steps"] == 2
    assert out["text"] and out["streamed"]
    assert out["usage"]["inputTokens"] == 2 * MODELS[model][0]
    billed(env, tok, model, 3)
    sent = [r for r in env.openai.requests if r["path"].endswith("/responses")]
    if model == "resp-model":
        assert sent, "the Vercel provider calls /v1/responses"
    if model == "chatonly-vercel":
        # The first call's 404 is bridged at once; the next go straight to chat.
        paths = [r["path"] for r in env.openai.requests[since:]]
        assert paths == ["/mode/chatonly/v1/responses"] + [
            "/mode/chatonly/v1/chat/completions"] * 3, paths
