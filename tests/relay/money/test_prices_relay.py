"""Vendor prices through the real relay and fake upstreams: a catalogue
price with nothing typed by anyone, an override, a group override, the 503
of an unpriced model, and every vendor's usage shape (cached, cache-write,
audio, reasoning, tier-crossing), streamed and not, billed to the unit and
kept in the usage record and its CSV.

Expected figures are the vendors' published prices worked out by hand (see
tests/relay/money/test_prices_golden.py for the arithmetic of the same usages)."""
from __future__ import annotations

import csv
import io
import time
import uuid

import pytest
import requests

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api
from tests.relay.money.money_env import record


@pytest.fixture(scope="module")
def env(relay, admin):
    fakes = {"openai": FakeOpenAI().start(), "anthropic": FakeAnthropic().start(),
             "gemini": FakeGemini().start()}
    admin.post("/api/group/", {"name": "rate2", "rate": 2})
    ch = {k: [] for k in fakes}

    def channel(kind, models, mapping=None):
        ch[kind] += models
        admin.create_channel(fakes[kind].url, models, groups=["default", "rate2"],
                             name=f"{kind}-{len(ch[kind])}", type=kind,
                             **({"model_mapping": mapping} if mapping else {}))
    channel("openai", ["gpt-4o", "o3", "gpt-realtime", "house-model"])
    channel("anthropic", ["claude-sonnet-4-5", "my-claude"], {"my-claude": "claude-opus-4-1"})
    channel("gemini", ["gemini-2.5-pro", "gemini-2.5-flash"])
    name = "p" + uuid.uuid4().hex[:8]
    user = admin.create_user(name, quota=10 ** 12)
    # Keys in the rate-2 group too: an administrator's grant (usable groups).
    admin.put("/api/user/", {"id": user["id"], "usable_groups": ["rate2"]})
    api = Api.login(relay.url, name, USER_PASSWORD)
    yield {"admin": admin, "api": api, "url": relay.url, **fakes}
    for f in fakes.values():
        f.stop()


def token(env, group="default"):
    return env["api"].create_token(name="k" + uuid.uuid4().hex[:6], remain_quota=10 ** 10,
                                   group=group)


def used(env, tok) -> int:
    return env["api"].get(f"/api/token/{tok['id']}")["data"]["used_quota"]


def billed(env, tok, r, units: int, **counts) -> dict:
    """The call's record is charged `units` and keeps the counts; the key's
    used quota moved by exactly that much."""
    assert r.status_code == 200, r.text
    rec = record(env, r.headers["X-Request-Id"])
    assert rec["estimated"] is False, rec
    assert rec["quota"] == units, rec
    assert rec["cost"] == units and rec["unpaid"] == 0, rec   # charged in full
    for k, v in counts.items():
        assert rec[k] == v, (k, rec)
    deadline = time.monotonic() + 10
    while used(env, tok) != units and time.monotonic() < deadline:
        time.sleep(0.1)
    assert used(env, tok) == units
    return rec


def chat(env, tok, model, stream=False, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            **extra}
    return requests.post(env["url"] + "/v1/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {tok['key']}"}, timeout=30)


def messages(env, tok, model, stream=False):
    body = {"model": model, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    return requests.post(env["url"] + "/v1/messages", json=body, timeout=30,
                         headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01"})


def generate(env, tok, model, stream=False):
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return requests.post(f"{env['url']}/v1beta/models/{model}:{method}", timeout=30,
                         json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                         headers={"x-goog-api-key": tok["key"]})


# ---- where a price comes from -------------------------------------------------
def test_catalogue_price_with_nothing_typed(env):
    tok = token(env)
    # gpt-4o: $2.50 in, $1.25 cached, $10 out: 600*2.5 + 400*1.25 + 500*10 = $0.007
    r = chat(env, tok, "gpt-4o", fake_usage={"prompt_tokens": 1000, "completion_tokens": 500,
                                             "cached_tokens": 400})
    billed(env, tok, r, 3500, prompt_tokens=1000, completion_tokens=500, cached_tokens=400)
    rows = [p for p in env["admin"].get("/api/price/")["data"] if p["model"] == "gpt-4o"]
    assert len(rows) == 1 and rows[0]["source"] == "catalogue"
    assert rows[0]["ref"] == "openai/gpt-4o" and rows[0]["input_price"] == 2.5
    cat = env["admin"].get("/api/price/catalogue")["data"]
    assert cat["package"] == "genai-prices" and cat["version"]


def test_override_then_group_override_then_back(env):
    admin = env["admin"]
    usage = {"prompt_tokens": 1000, "completion_tokens": 500, "cached_tokens": 0}
    admin.set_price("o3", input_price=1, output_price=2)
    try:
        tok = token(env)
        # (1000*1 + 500*2) / 1e6 = $0.002
        billed(env, tok, chat(env, tok, "o3", fake_usage=usage), 1000)
        admin.set_price("o3", input_price=4, output_price=0, group="rate2")
        r2 = token(env, "rate2")
        # the group's own price, at the group's rate 2: 1000*4/1e6*2 = $0.008
        billed(env, r2, chat(env, r2, "o3", fake_usage=usage), 4000)
        rows = {(p["group"], p["source"]) for p in admin.get("/api/price/")["data"]
                if p["model"] == "o3"}
        assert rows == {("", "override"), ("rate2", "override")}
    finally:
        admin.delete("/api/price/?model=o3&group=rate2")
        admin.delete("/api/price/?model=o3")
    # back to the catalogue (o3: $2 in, $8 out): 1000*2 + 500*8 = $0.006
    tok = token(env)
    billed(env, tok, chat(env, tok, "o3", fake_usage=usage), 3000)


def test_unpriced_model_stays_unusable(env):
    tok = token(env)
    r = chat(env, tok, "house-model")
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_price_missing"
    rows = [p for p in env["admin"].get("/api/price/")["data"] if p["model"] == "house-model"]
    assert [p["source"] for p in rows] == ["none"]
    env["admin"].set_price("house-model", input_price=1)
    try:
        assert chat(env, tok, "house-model").status_code == 200
    finally:
        env["admin"].delete("/api/price/?model=house-model")


def test_price_follows_the_channel_mapping(env):
    # "my-claude" is claude-opus-4-1 upstream: $15 in, $75 out.
    env["anthropic"].usage = {"input_tokens": 1000, "output_tokens": 100,
                              "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    tok = token(env)
    # 1000*15 + 100*75 = 22500 -> $0.0225
    billed(env, tok, messages(env, tok, "my-claude"), 11250)
    row = [p for p in env["admin"].get("/api/price/")["data"] if p["model"] == "my-claude"][0]
    assert row["ref"] == "anthropic/claude-opus-4-1" and row["upstream_model"] == "claude-opus-4-1"


def test_bad_price_bodies(env):
    admin = env["admin"]
    admin.post("/api/price/", {"model": "m", "tiers": [{"above": "x"}]}, expect=400)
    admin.post("/api/price/", {"model": "m", "tiers": [{"above": 5, "bogus": 1}]}, expect=400)
    admin.post("/api/price/", {"model": "m", "tiers": "no"}, expect=400)
    admin.post("/api/price/", {"model": "m", "audio_input_price": -1}, expect=400)
    saved = admin.post("/api/price/", {"model": "tiered-house", "input_price": 1,
                                       "tiers": [{"above": 10, "input_price": 3}]})["data"]
    assert saved["tiers"] == [{"above": 10, "input_price": 3}]
    admin.delete("/api/price/?model=tiered-house")


# ---- every vendor's usage shape, streamed and not -----------------------------
REALTIME = {"input_tokens": 1000, "output_tokens": 500,
            "input_token_details": {"cached_tokens": 300, "text_tokens": 400, "audio_tokens": 600,
                                    "cached_tokens_details": {"text_tokens": 200,
                                                              "audio_tokens": 100}},
            "output_token_details": {"text_tokens": 100, "audio_tokens": 400}}
O3 = {"prompt_tokens": 2000, "completion_tokens": 3000, "total_tokens": 5000,
      "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
      "completion_tokens_details": {"reasoning_tokens": 2500, "audio_tokens": 0}}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reasoning_and_audio(env, stream):
    tok = token(env)
    # o3: 976*2 + 1024*0.5 + 3000*8 = $0.026464 -> 13232 units
    billed(env, tok, chat(env, tok, "o3", stream, fake_usage_doc=O3), 13232,
           reasoning_tokens=2500, cached_tokens=1024)
    tok = token(env)
    # gpt-realtime (input/output_token_details): $0.04412 -> 22060 units
    billed(env, tok, chat(env, tok, "gpt-realtime", stream, fake_usage_doc=REALTIME), 22060,
           audio_input_tokens=600, cached_audio_tokens=100, audio_output_tokens=400)


ANTHROPIC_CACHE = {"input_tokens": 100, "output_tokens": 300, "cache_read_input_tokens": 5000,
                   "cache_creation_input_tokens": 2000,
                   "cache_creation": {"ephemeral_5m_input_tokens": 1500,
                                      "ephemeral_1h_input_tokens": 500}}
ANTHROPIC_LONG = {"input_tokens": 150000, "output_tokens": 1000,
                  "cache_read_input_tokens": 60000, "cache_creation_input_tokens": 0}


@pytest.mark.parametrize("face", ["anthropic", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_writes_and_tier(env, stream, face):
    send = messages if face == "anthropic" else chat
    env["anthropic"].usage = ANTHROPIC_CACHE
    tok = token(env)
    # $3 in, $0.30 read, $3.75 5m write, $6 1h write, $15 out: $0.014925 -> 7463
    billed(env, tok, send(env, tok, "claude-sonnet-4-5", stream=stream), 7463,
           prompt_tokens=7100, cached_tokens=5000, cache_write_5m_tokens=1500,
           cache_write_1h_tokens=500, completion_tokens=300)
    env["anthropic"].usage = ANTHROPIC_LONG
    tok = token(env)
    # above 200k: $6 in, $0.60 read, $22.50 out: $0.9585 -> 479250
    billed(env, tok, send(env, tok, "claude-sonnet-4-5", stream=stream), 479250,
           prompt_tokens=210000)


GEMINI_THINKING = {"promptTokenCount": 10000, "cachedContentTokenCount": 4000,
                   "candidatesTokenCount": 500, "thoughtsTokenCount": 1500}
GEMINI_LONG = {"promptTokenCount": 250000, "candidatesTokenCount": 1000}
GEMINI_AUDIO = {"promptTokenCount": 3000, "cachedContentTokenCount": 1200,
                "candidatesTokenCount": 400, "thoughtsTokenCount": 100,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1000},
                                        {"modality": "AUDIO", "tokenCount": 2000}],
                "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 200},
                                       {"modality": "AUDIO", "tokenCount": 1000}]}


@pytest.mark.parametrize("face", ["gemini", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_gemini_thinking_audio_and_tier(env, stream, face):
    send = generate if face == "gemini" else chat
    env["gemini"].usage = GEMINI_THINKING
    tok = token(env)
    # 2.5 Pro: 6000*1.25 + 4000*0.125 + 2000*10 = $0.028 -> 14000
    billed(env, tok, send(env, tok, "gemini-2.5-pro", stream=stream), 14000,
           reasoning_tokens=1500, completion_tokens=2000, cached_tokens=4000)
    env["gemini"].usage = GEMINI_LONG
    tok = token(env)
    # above 200k: 250000*2.5 + 1000*15 = $0.64 -> 320000
    billed(env, tok, send(env, tok, "gemini-2.5-pro", stream=stream), 320000)
    env["gemini"].usage = GEMINI_AUDIO
    tok = token(env)
    # 2.5 Flash with audio: $0.002596 -> 1298
    billed(env, tok, send(env, tok, "gemini-2.5-flash", stream=stream), 1298,
           audio_input_tokens=2000, cached_audio_tokens=1000)


def test_csv_export_carries_every_component(env):
    tok = token(env)
    r = chat(env, tok, "o3", fake_usage_doc=O3)
    billed(env, tok, r, 13232)
    resp = env["api"].get(f"/api/log/self/export?token_id={tok['id']}")
    assert resp.status_code == 200, resp.text
    text = resp.text
    rows = list(csv.DictReader(io.StringIO(text)))
    row = [x for x in rows if x["request_id"] == r.headers["X-Request-Id"]][0]
    for col in ("cache_write_5m_tokens", "cache_write_1h_tokens", "audio_input_tokens",
                "cached_audio_tokens", "image_input_tokens", "cached_image_tokens",
                "audio_output_tokens", "image_output_tokens"):
        assert row[col] == "0", (col, row)
    assert row["reasoning_tokens"] == "2500" and row["cached_tokens"] == "1024"
    assert row["quota"] == "13232"
    # beside the components, the charge's full price and shortfall, and the totals row
    assert row["cost"] == "13232" and row["unpaid"] == "0", row
    assert rows[-1]["request_id"] == "TOTAL" and rows[-1]["quota"] == "13232", rows[-1]
    assert rows[-1]["cost"] == "13232" and rows[-1]["unpaid"] == "0", rows[-1]
