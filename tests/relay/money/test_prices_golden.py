"""Golden prices: for sample usages of each vendor, our cost equals the
vendor's published price computation, to the unit, at group rates 1 and 2.

Every expected figure is worked out by hand below from the vendors' price
pages (USD per million tokens), not from relay/money/pricing.py; each is also
checked against genai-prices' own calculator (an independent
implementation of the same published prices).  500,000 units = 1 USD,
rounded half-up once.
"""
from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest

from relay.money import price_catalogue
from relay.adaptors.openai import usage_from as openai_usage
from relay.convert.anthropic import usage_from as anthropic_usage
from relay.convert.gemini import usage_from as gemini_usage
from relay.money.pricing import cost

# (name, provider, catalogue model, usage read from the vendor's own usage
#  object, expected USD at rate 1 worked out by hand)
CASES = [
    # OpenAI gpt-4o: $2.50 in, $1.25 cached in, $10 out.
    # 600*2.5 + 400*1.25 + 500*10 = 1500 + 500 + 5000 = 7000 -> $0.007
    ("openai cached", "openai", "gpt-4o", openai_usage(
        {"prompt_tokens": 1000, "completion_tokens": 500,
         "prompt_tokens_details": {"cached_tokens": 400}}), "0.007"),
    # OpenAI o3 (since 2025-06-10): $2 in, $0.50 cached, $8 out; reasoning is output.
    # 976*2 + 1024*0.5 + 3000*8 = 1952 + 512 + 24000 = 26464 -> $0.026464
    ("openai reasoning", "openai", "o3", openai_usage(
        {"prompt_tokens": 2000, "completion_tokens": 3000,
         "prompt_tokens_details": {"cached_tokens": 1024},
         "completion_tokens_details": {"reasoning_tokens": 2500}}), "0.026464"),
    # OpenAI gpt-realtime: text $4 in / $0.40 cached / $16 out, audio $32 in /
    # $0.40 cached / $64 out.  Input 1000 = text 400 (200 cached) + audio 600
    # (100 cached); output 500 = text 100 + audio 400.
    # 200*4 + 200*0.4 + 500*32 + 100*0.4 + 100*16 + 400*64
    # = 800 + 80 + 16000 + 40 + 1600 + 25600 = 44120 -> $0.04412
    ("openai audio", "openai", "gpt-realtime", openai_usage(
        {"input_tokens": 1000, "output_tokens": 500,
         "input_token_details": {"cached_tokens": 300, "text_tokens": 400, "audio_tokens": 600,
                                 "cached_tokens_details": {"text_tokens": 200,
                                                           "audio_tokens": 100}},
         "output_token_details": {"text_tokens": 100, "audio_tokens": 400}}), "0.04412"),
    # OpenAI gpt-image-1: text in $5, image in $10, image out $40.  An image
    # call's output tokens are all image tokens (not 717 for 201: new-api#4474).
    # 50*5 + 500*10 + 4160*40 = 250 + 5000 + 166400 = 171650 -> $0.17165
    ("openai image", "openai", "gpt-image-1", openai_usage(
        {"input_tokens": 550, "output_tokens": 4160, "total_tokens": 4710,
         "input_tokens_details": {"text_tokens": 50, "image_tokens": 500}}), "0.17165"),
    # Anthropic Claude Sonnet 4.5: $3 in, $0.30 cache read, $3.75 5-minute
    # write, $6 1-hour write, $15 out.  Writes billed once, at the write price
    # (not also as input: LiteLLM#9812).
    # 100*3 + 5000*0.3 + 1500*3.75 + 500*6 + 300*15
    # = 300 + 1500 + 5625 + 3000 + 4500 = 14925 -> $0.014925 (7462.5 units -> 7463)
    ("anthropic cache", "anthropic", "claude-sonnet-4-5-20250929", anthropic_usage(
        {"input_tokens": 100, "output_tokens": 300, "cache_read_input_tokens": 5000,
         "cache_creation_input_tokens": 2000,
         "cache_creation": {"ephemeral_5m_input_tokens": 1500,
                            "ephemeral_1h_input_tokens": 500}}), "0.014925"),
    # A write without the lifetime split is a 5-minute one.
    # 10*3 + 1000*3.75 + 20*15 = 30 + 3750 + 300 = 4080 -> $0.00408
    ("anthropic write", "anthropic", "claude-sonnet-4-5", anthropic_usage(
        {"input_tokens": 10, "output_tokens": 20, "cache_creation_input_tokens": 1000,
         "cache_read_input_tokens": 0}), "0.00408"),
    # Claude Opus 4.1: $15 in, $1.50 read, $18.75 write, $75 out.
    # 2000*15 + 3000*1.5 + 1000*18.75 + 400*75 = 30000 + 4500 + 18750 + 30000
    # = 83250 -> $0.08325
    ("anthropic opus", "anthropic", "claude-opus-4-1-20250805", anthropic_usage(
        {"input_tokens": 2000, "output_tokens": 400, "cache_read_input_tokens": 3000,
         "cache_creation_input_tokens": 1000}), "0.08325"),
    # Sonnet 4.5 above 200k prompt tokens: every token at $6 in / $0.60 read /
    # $22.50 out.  Prompt = 150000 + 60000 = 210000 > 200000.
    # 150000*6 + 60000*0.6 + 1000*22.5 = 900000 + 36000 + 22500 = 958500 -> $0.9585
    ("anthropic long", "anthropic", "claude-sonnet-4-5", anthropic_usage(
        {"input_tokens": 150000, "output_tokens": 1000, "cache_read_input_tokens": 60000,
         "cache_creation_input_tokens": 0}), "0.9585"),
    # Gemini 2.5 Pro (prompts <= 200k): $1.25 in, $0.125 cached, $10 out;
    # thinking billed as output.  6000*1.25 + 4000*0.125 + (500+1500)*10
    # = 7500 + 500 + 20000 = 28000 -> $0.028
    ("gemini thinking", "google", "gemini-2.5-pro", gemini_usage(
        {"promptTokenCount": 10000, "cachedContentTokenCount": 4000,
         "candidatesTokenCount": 500, "thoughtsTokenCount": 1500,
         "totalTokenCount": 12000}), "0.028"),
    # Gemini 2.5 Pro above 200k: $2.50 in, $15 out, for every token.
    # 250000*2.5 + 1000*15 = 625000 + 15000 = 640000 -> $0.64
    ("gemini long", "google", "gemini-2.5-pro", gemini_usage(
        {"promptTokenCount": 250000, "candidatesTokenCount": 1000,
         "totalTokenCount": 251000}), "0.64"),
    # Exactly 200k is not above it: 200000*1.25 + 10*10 = 250000 + 100 -> $0.2501
    ("gemini edge", "google", "gemini-2.5-pro", gemini_usage(
        {"promptTokenCount": 200000, "candidatesTokenCount": 10}), "0.2501"),
    # Gemini 2.5 Flash: text/image/video $0.30, audio $1.00, cached $0.03 and
    # cached audio $0.10, out $2.50.  Prompt 3000 = text 1000 + audio 2000;
    # cached 1200 = text 200 + audio 1000.
    # 800*0.3 + 200*0.03 + 1000*1 + 1000*0.1 + (400+100)*2.5
    # = 240 + 6 + 1000 + 100 + 1250 = 2596 -> $0.002596
    ("gemini audio", "google", "gemini-2.5-flash", gemini_usage(
        {"promptTokenCount": 3000, "cachedContentTokenCount": 1200,
         "candidatesTokenCount": 400, "thoughtsTokenCount": 100,
         "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1000},
                                 {"modality": "AUDIO", "tokenCount": 2000}],
         "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 200},
                                {"modality": "AUDIO", "tokenCount": 1000}]}), "0.002596"),
    # Gemini 2.5 Flash Image: $0.30 in, $2.50 text out, $30 image out.
    # 20*0.3 + 10*2.5 + 1290*30 = 6 + 25 + 38700 = 38731 -> $0.038731 (19365.5 -> 19366)
    ("gemini image", "google", "gemini-2.5-flash-image", gemini_usage(
        {"promptTokenCount": 20, "candidatesTokenCount": 1300,
         "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 10},
                                     {"modality": "IMAGE", "tokenCount": 1290}]}), "0.038731"),
]
CHANNEL_TYPE = {"openai": "openai", "anthropic": "anthropic", "google": "gemini"}


def half_up_units(usd: Decimal) -> int:
    units = usd * 500_000
    whole = int(units)
    return whole + (1 if units - whole >= Decimal("0.5") else 0)


def genai_usage(u) -> genai_prices.Usage:
    """Our usage in genai-prices' terms (its counts are inclusive, too)."""
    return genai_prices.Usage(
        input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
        cache_read_tokens=u.cached_tokens,
        cache_write_tokens=u.cache_write_5m_tokens + u.cache_write_1h_tokens,
        cache_write_1h_tokens=u.cache_write_1h_tokens,
        input_audio_tokens=u.audio_input_tokens, cache_audio_read_tokens=u.cached_audio_tokens,
        input_image_tokens=u.image_input_tokens, cache_image_read_tokens=u.cached_image_tokens,
        output_audio_tokens=u.audio_output_tokens, output_image_tokens=u.image_output_tokens)


@pytest.mark.parametrize("rate", [Decimal(1), Decimal(2)])
@pytest.mark.parametrize("name,provider,model,usage,usd", CASES, ids=[c[0] for c in CASES])
def test_golden(name, provider, model, usage, usd, rate):
    price = price_catalogue.lookup(CHANNEL_TYPE[provider], model)
    assert price is not None and price.source == "catalogue"
    expected = half_up_units(Decimal(usd) * rate)
    assert cost(usage, price, rate, False) == expected
    # The same figure from genai-prices' own calculator.
    theirs = genai_prices.calc_price(genai_usage(usage), model, provider_id=provider)
    assert half_up_units(theirs.total_price * rate) == expected


def test_units_and_half_up_examples():
    # the two halves above, spelled out
    assert half_up_units(Decimal("0.014925")) == 7463
    assert half_up_units(Decimal("0.038731")) == 19366
    assert half_up_units(Decimal("0.038731") * 2) == 38731


def test_per_unit_prices_from_the_catalogue():
    # whisper-1: $0.006 a minute = $0.0001 a second; 61 s -> $0.0061 -> 3050 units
    from relay.money.pricing import Usage
    whisper = price_catalogue.lookup("openai", "whisper-1")
    assert cost(Usage(units=61), whisper, Decimal(1), False) == 3050
    assert cost(Usage(units=61), whisper, Decimal(2), False) == 6100
    # tts-1: $15 per million characters; 1000 characters -> $0.015 -> 7500 units
    tts = price_catalogue.lookup("openai", "tts-1")
    assert cost(Usage(units=1000), tts, Decimal(1), False) == 7500


def test_catalogue_mapping():
    # provider from the channel type; azure falls back to OpenAI's models;
    # an aggregator's vendor/ prefix and a foreign vendor's model are found
    assert price_catalogue.lookup("azure", "gpt-4o").input_price == Decimal("2.5")
    p = price_catalogue.lookup("openai", "anthropic/claude-opus-4.1")
    assert p.ref == "anthropic/claude-opus-4-1" and p.output_price == 75
    assert price_catalogue.lookup("openai", "no-such-model-anywhere") is None
    assert price_catalogue.lookup("midjourney", "mj_imagine") is None
    assert price_catalogue.VERSION == genai_prices.__version__
