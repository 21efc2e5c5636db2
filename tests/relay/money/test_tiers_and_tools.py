"""Issue 30, case 7: what the vendor bills per tier and per tool is billed.
Service tiers are priced from the catalogue (genai-prices' variants) at the
tier the upstream says it ran, or refused where no price exists; vendor-run
tool calls are priced per call from the upstream's usage (Anthropic's
server_tool_use; OpenAI Responses' output items; Gemini's grounding
metadata), at the catalogue's price or an administrator's."""
from __future__ import annotations

from decimal import Decimal

import pytest
import requests

from relay.convert.gemini_usage import grounding_calls
from relay.convert.responses import billed_usage
from relay.money import price_catalogue
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.tenant import Tenant

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def anthropic():
    f = FakeAnthropic().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake, anthropic):
    # gpt-5 is priced by the catalogue (no administrator's price); gpt-5-mine
    # by an administrator, which has no tiers.
    admin.create_channel(fake.url, ["gpt-5", "gpt-5-mine"], name="openai")
    admin.set_price("gpt-5-mine", input_price="1.25", output_price="10")
    admin.create_channel(anthropic.url, ["claude-sonnet-4-5", "claude-search"],
                         type="anthropic", name="anthropic")
    admin.post("/api/price/", {"model": "claude-search", "input_price": 3, "output_price": 15,
                               "web_search_price": "0.02"})
    return relay


def chat(relay, key, **body):
    return requests.post(relay.url + "/v1/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"messages": HI, "max_tokens": 1000, **body})


def usd_units(usd: Decimal) -> int:
    return int((usd * 500_000).to_integral_value(rounding="ROUND_HALF_UP"))


def tier_cost(tier: str, prompt: int, completion: int) -> int:
    p = price_catalogue.lookup("openai", "gpt-5", tier)
    return usd_units((p.input_price * prompt + p.output_price * completion) / 1_000_000)


@pytest.mark.parametrize("tier", ["priority", "flex"])
def test_a_tier_is_billed_at_its_catalogue_price(setup, admin, tier):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = chat(setup, t.key, model="gpt-5", service_tier=tier,
             fake_usage={"prompt_tokens": 1000, "completion_tokens": 2000})
    assert r.status_code == 200, r.text
    want = tier_cost(tier, 1000, 2000)
    assert want != tier_cost("", 1000, 2000)
    assert t.spent_since(before) == want
    assert t.logs(1)[0]["service_tier"] == tier


def test_the_tier_the_upstream_ran_is_the_tier_billed(setup, admin):
    """Flex without capacity runs as default: billed as default."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = chat(setup, t.key, model="gpt-5", service_tier="flex", stream=True,
             fake_service_tier="default",
             fake_usage={"prompt_tokens": 1000, "completion_tokens": 2000})
    assert r.status_code == 200 and b"[DONE]" in r.content
    assert t.spent_since(before) == tier_cost("", 1000, 2000)


def test_a_tier_without_a_price_is_a_400_naming_it(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before, sent = t.balances(), len(fake.requests)
    for model, tier in (("gpt-5-mine", "priority"), ("gpt-5", "scale")):
        r = chat(setup, t.key, model=model, service_tier=tier)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "service_tier"
    assert len(fake.requests) == sent and t.balances() == before
    assert chat(setup, t.key, model="gpt-5-mine", service_tier="auto").status_code == 200


def test_anthropic_web_searches_are_billed_per_call(setup, admin):
    """usage.server_tool_use.web_search_requests: 3 searches at the
    administrator's $0.02, and the catalogue's $0.01 for claude-sonnet-4-5."""
    for model, each in (("claude-search", Decimal("0.02")),
                        ("claude-sonnet-4-5", Decimal("0.01"))):
        t = Tenant(admin, setup.url)
        before = t.balances()
        r = requests.post(setup.url + "/v1/messages", timeout=30, headers={
            "x-api-key": t.key, "anthropic-version": "2023-06-01"}, json={
            "model": model, "max_tokens": 100, "messages": HI,
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "fake_usage": {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 0,
                           "server_tool_use": {"web_search_requests": 3}}})
        assert r.status_code == 200, r.text
        rec = t.logs(1)[0]
        assert rec["web_search_calls"] == 3
        tokens = Decimal(3) * 100 + Decimal(15) * 10   # both $3/M in, $15/M out
        assert t.spent_since(before) == usd_units(tokens / 1_000_000 + each * 3)


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_search_call_is_billed_one_search(setup, admin, stream):
    """web_search_options on chat completions: the search model's one
    search, streamed too (where the body is shelved by settle time)."""
    t = Tenant(admin, setup.url)
    r = chat(setup, t.key, model="gpt-5-mine", stream=stream, web_search_options={})
    assert r.status_code == 200, r.text
    assert t.logs(1)[0]["web_search_calls"] == 1
    r = chat(setup, t.key, model="gpt-5-mine", stream=stream)
    assert r.status_code == 200, r.text
    assert t.logs(2)[0]["web_search_calls"] == 0


def test_responses_output_items_count_hosted_tool_calls():
    resp = {"usage": {"input_tokens": 10, "output_tokens": 5}, "service_tier": "priority",
            "output": [{"type": "web_search_call", "id": "ws1"},
                       {"type": "web_search_call", "id": "ws2"},
                       {"type": "file_search_call", "id": "fs1"},
                       {"type": "code_interpreter_call", "id": "ci1", "container_id": "c1"},
                       {"type": "code_interpreter_call", "id": "ci2", "container_id": "c1"},
                       {"type": "message", "id": "m"}]}
    u = billed_usage(resp)
    assert (u.web_search_calls, u.file_search_calls, u.code_execution_calls) == (2, 1, 1)
    assert u.service_tier == "priority" and u.prompt_tokens == 10


def test_gemini_grounding_counts_prompts_then_queries():
    doc = {"candidates": [{"groundingMetadata": {"webSearchQueries": ["a", "b", "c"]}}]}
    assert grounding_calls(doc, "gemini-2.5-flash") == 1       # per grounded prompt
    assert grounding_calls(doc, "gemini-3-pro-preview") == 3    # per search query
    assert grounding_calls({"candidates": [{}]}, "gemini-3-pro-preview") == 0
