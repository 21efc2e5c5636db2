"""Issue 30, case 1: settling always runs.  A prompt of one 1,000,000-character
message (bpe-openai refuses a text of that size in one pass) through every
entry point, streamed and cut by the upstream before its usage: every call
has its usage record and its charge, the reservation does not outlive the
call, and the counting endpoints answer with a count.  Real relay, real
sockets, the vendor fakes' `reset` failure mode (the connection reset
mid-stream)."""
from __future__ import annotations

import json

import pytest
import requests

from relay.money import tokenizer
from tests.fakes.text_upstream import FakeText
from tests.tenant import Tenant

# Words, so that the count is far past 200,000 tokens (bpe-openai's limit a pass).
BIG = ("a plain sentence of several words. " * 30_000)[:1_000_000]
MODEL = "long-prompt-model"   # unknown to the catalogue: no context window caps the bound


@pytest.fixture(scope="module")
def fakes(fakes):
    """tests/conftest.py's Anthropic and Gemini fakes, and the text fake for OpenAI."""
    text = FakeText().start()
    yield {"text": text, "anthropic": fakes["anthropic"], "gemini": fakes["gemini"]}
    text.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fakes):
    admin.create_channel(fakes["text"].mode_url("reset"), [MODEL], name="openai-reset")
    admin.create_channel(fakes["anthropic"].mode_url("reset"), ["claude-long"], type="anthropic",
                         name="anthropic-reset")
    admin.create_channel(fakes["gemini"].mode_url("reset"), ["gemini-long"], type="gemini",
                         name="gemini-reset")
    admin.create_channel(fakes["anthropic"].mode_url("no_count_tokens"), ["claude-count"],
                         type="anthropic", name="anthropic-nocount")
    admin.create_channel(fakes["text"].mode_url("chatonly"), ["responses-count"],
                         name="chat-only")
    for m in (MODEL, "claude-long", "gemini-long", "claude-count", "responses-count"):
        admin.set_price(m, input_price="0.5", output_price="1")   # 0.25 / 0.5 units a token
    return relay


def post(relay, path, key, body, **kw):
    return requests.post(relay.url + path, data=json.dumps(body), timeout=120,
                         headers={"Authorization": f"Bearer {key}",
                                  "Content-Type": "application/json",
                                  "anthropic-version": "2023-06-01", **kw.pop("headers", {})},
                         **kw)


def settled(t: Tenant, before, model: str) -> dict:
    """The call's one record, charged exactly once on key and account alike."""
    rec = t.logs(1, model=model)[0]
    assert rec["model"] == model and rec["quota"] > 0, rec
    assert rec["unpaid"] == 0 and rec["quota"] == rec["cost"], rec
    assert t.spent_since(before) == rec["quota"]
    return rec


def no_traceback(relay):
    assert "Traceback" not in relay.log()


def test_chat_cut_before_usage_is_charged_and_releases_its_reservation(setup, admin):
    """Key quota 1,600,000: the call's bound (1,000,000 bytes of input at 0.25
    units, plus 1,000 tokens of output) is about 250,000; once settled, a
    call bound to 1,400,000 of what remains fits, which it would not if the
    first reservation were still held."""
    t = Tenant(admin, setup.url, key_quota=1_600_000)
    before = t.balances()
    r = post(setup, "/v1/chat/completions", t.key, stream=True, body={
        "model": MODEL, "stream": True, "max_tokens": 1000,
        "messages": [{"role": "user", "content": BIG}]})
    assert r.status_code == 200
    body = b"".join(r.iter_content(None))
    assert b"Hello" in body
    rec = settled(t, before, MODEL)
    assert rec["estimated"] and rec["prompt_tokens"] > 200_000
    assert rec["prompt_tokens"] == tokenizer.count_messages(
        [{"role": "user", "content": BIG}], MODEL)
    # 1,400,000 units of output bound: 2,800,000 tokens at 0.5 units.
    left = t.balances()[2]
    r = post(setup, "/v1/chat/completions", t.key, body={
        "model": MODEL, "max_tokens": (left - 10_000) * 2,
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    no_traceback(setup)


def test_messages_cut_mid_stream(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = post(setup, "/v1/messages", t.key, stream=True, body={
        "model": "claude-long", "stream": True, "max_tokens": 1000,
        "messages": [{"role": "user", "content": BIG}]})
    assert r.status_code == 200
    b"".join(r.iter_content(None))
    settled(t, before, "claude-long")
    no_traceback(setup)


def test_responses_cut_mid_stream(setup, admin, fakes):
    """Passed through to the Responses upstream, which cuts it after three deltas."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = post(setup, "/v1/responses", t.key, stream=True, body={
        "model": MODEL, "stream": True, "max_output_tokens": 1000, "input": BIG})
    assert r.status_code == 200
    b"".join(r.iter_content(None))
    rec = settled(t, before, MODEL)
    assert rec["estimated"] and rec["prompt_tokens"] > 200_000
    no_traceback(setup)


def test_gemini_cut_mid_stream(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1beta/models/gemini-long:streamGenerateContent?alt=sse",
                      headers={"x-goog-api-key": t.key}, timeout=120, stream=True,
                      json={"contents": [{"role": "user", "parts": [{"text": BIG}]}],
                            "generationConfig": {"maxOutputTokens": 1000}})
    assert r.status_code == 200
    b"".join(r.iter_content(None))
    settled(t, before, "gemini-long")
    no_traceback(setup)


def test_legacy_completions_cut_mid_stream(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = post(setup, "/v1/completions", t.key, stream=True, body={
        "model": MODEL, "stream": True, "max_tokens": 100, "prompt": BIG})
    assert r.status_code == 200
    b"".join(r.iter_content(None))
    rec = settled(t, before, MODEL)
    assert rec["estimated"] and rec["prompt_tokens"] == tokenizer.count_text(BIG, MODEL)
    no_traceback(setup)


def test_count_tokens_endpoints_count_a_long_message(setup, admin):
    """Free of charge, and a count rather than a 500: Anthropic's
    count_tokens on a channel without it (our estimate), Gemini's
    :countTokens and /v1/responses/input_tokens (our count)."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = post(setup, "/v1/messages/count_tokens", t.key, body={
        "model": "claude-count", "messages": [{"role": "user", "content": BIG}]})
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 200_000
    r = requests.post(setup.url + "/v1beta/models/gemini-long:countTokens", timeout=120,
                      headers={"x-goog-api-key": t.key},
                      json={"contents": [{"role": "user", "parts": [{"text": BIG}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["totalTokens"] > 200_000
    r = post(setup, "/v1/responses/input_tokens", t.key,
             body={"model": "responses-count", "input": BIG})
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 200_000
    assert t.balances() == before
    no_traceback(setup)


def test_tokenizer_counts_past_its_one_pass_limit():
    """The unit underneath: slices for a long text, bytes when the
    tokenizer refuses (a character that is several tokens, repeated)."""
    assert tokenizer.count_text(BIG) > 200_000
    odd = "\U0001f600" * 300_000   # 1,200,000 bytes of emoji
    assert tokenizer.count_text(odd) >= 300_000
    assert tokenizer.approx_text("abc") == 3
