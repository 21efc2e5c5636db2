"""Vendor prices out of the box, from the `genai-prices` package (pydantic's
catalogue of official prices).

Which catalogue entry prices a channel's model:
- the provider comes from the channel type: openai -> openai, azure -> azure
  (which falls back to OpenAI's models), anthropic -> anthropic, gemini ->
  google; midjourney has no catalogue (its actions are priced by an admin);
- the model is the upstream model name, after the channel's model mapping
  (what the vendor bills), tried as it is, then without a "vendor/" prefix
  (aggregators' names such as "openai/gpt-4o");
- when that provider does not list the model, the catalogue's own matching
  by model name picks one (a Claude model behind an OpenAI-compatible
  channel is billed at Anthropic's price).
The standard tier is the default; a call that asks for a service tier
(flex, priority) is priced from the catalogue's variant for it, and has no
price where the catalogue has none.  Vendor-run tools are priced per call
(web searches, file searches, code executions); prices of other kinds
(video, pages) are not read.

Nothing is copied into the database: a price is resolved when first asked
for and cached in memory (an hour, so that dated price changes in the
catalogue take effect), so upgrading the package updates every price that
no administrator has overridden.
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

from cachetools import TTLCache

from models.records import Price

log = logging.getLogger("relay.prices")

try:
    import genai_prices
    from genai_prices import data_snapshot
    from genai_prices.types import TieredPrices
    VERSION = genai_prices.__version__
except ImportError:  # the relay still runs; every model then needs an admin price
    genai_prices = None
    VERSION = ""

PACKAGE = "genai-prices"
PROVIDERS = {"openai": "openai", "azure": "azure", "anthropic": "anthropic",
             "gemini": "google"}
# catalogue price key -> (our component, divisor to USD per our unit)
_KEYS = {
    "input_mtok": ("input_price", 1), "output_mtok": ("output_price", 1),
    "cache_read_mtok": ("cache_price", 1),
    "cache_write_mtok": ("cache_write_price", 1),
    "cache_write_5m_mtok": ("cache_write_price", 1),
    "cache_write_1h_mtok": ("cache_write_1h_price", 1),
    "input_audio_mtok": ("audio_input_price", 1), "output_audio_mtok": ("audio_output_price", 1),
    "cache_audio_read_mtok": ("audio_cache_price", 1),
    "input_image_mtok": ("image_input_price", 1), "output_image_mtok": ("image_output_price", 1),
    "cache_image_read_mtok": ("image_cache_price", 1),
    "output_reasoning_mtok": ("reasoning_price", 1),
    # per unit: our units are seconds of audio and characters of speech
    "audio_hours": ("unit_price", 3600), "input_audio_hours": ("unit_price", 3600),
    "input_mchars": ("unit_price", 1_000_000),
    # per call of a vendor-run tool
    "web_searches_kcount": ("web_search_price", 1000),
    "storage_searches_kcount": ("file_search_price", 1000),
    "code_executions_kcount": ("code_execution_price", 1000),
}
# The more specific key wins when an entry has both.
_SPECIFIC = {"cache_write_5m_mtok", "input_audio_hours"}

_cache: TTLCache = TTLCache(maxsize=20_000, ttl=3600)
# Limits do not change with the date: a plain dict (a TTLCache lookup costs
# tens of microseconds, on every call's reservation).
_limits: dict = {}
_MISS = object()

# The most output tokens one answer of a model may hold, as each vendor
# documents it (genai-prices knows context windows, not these).  The first
# pattern that matches the upstream model name, without a "vendor/" prefix,
# wins; reasoning and thinking tokens count within these limits.
OUTPUT_LIMITS = tuple((re.compile(p), n) for p, n in (
    (r"^gpt-5(\.\d+)?-chat", 16_384), (r"^gpt-5", 128_000),
    (r"^o1-mini", 65_536), (r"^o1-preview", 32_768), (r"^o[1-9]", 100_000),
    (r"^gpt-4\.1", 32_768), (r"^gpt-4o", 16_384), (r"^chatgpt-4o", 16_384),
    (r"^gpt-4-turbo|^gpt-4-\d{4}-preview", 4_096), (r"^gpt-4(-\d{4})?$", 8_192),
    (r"^gpt-3\.5", 4_096),
    (r"^claude-opus-4-[5-9]|^claude-(sonnet|haiku)-4|^claude-3-7", 64_000),
    (r"^claude-opus-4", 32_000), (r"^claude-3-5", 8_192), (r"^claude-3", 4_096),
    (r"^(models/)?gemini-(2\.5|[3-9])", 65_536), (r"^(models/)?gemini-", 8_192),
))


def lookup(channel_type: str, model: str, tier: str = "") -> Price | None:
    """The catalogue's price for `model` served by a channel of this type,
    in a service tier ("" for the standard one; "flex", "priority": the
    catalogue's price variant, None when it has none for the model), or
    None when the catalogue has none.  Never raises; cached."""
    key = (channel_type, model, tier)
    hit = _cache.get(key, _MISS)
    if hit is _MISS:
        try:
            hit = _resolve(channel_type, model, tier)
        except Exception:  # a catalogue bug must not take the relay down
            log.exception("price catalogue lookup failed for %s %s", channel_type, model)
            hit = None
        _cache[key] = hit
    return hit


def clear() -> None:
    _cache.clear()
    _limits.clear()


def limits(channel_type: str, model: str) -> tuple[int | None, int | None]:
    """(context window, most output tokens) of the upstream model, each
    None when unknown: the output limit from OUTPUT_LIMITS, the context
    window from the catalogue.  Never raises; cached."""
    key = (channel_type, model)
    hit = _limits.get(key)
    if hit is None:
        name = model.split("/", 1)[1] if "/" in model and not model.startswith("models/") \
            else model
        out = next((n for pat, n in OUTPUT_LIMITS if pat.match(name.lower())), None)
        window = None
        try:
            window = _context_window(channel_type, model)
        except Exception:  # a catalogue bug must not take the relay down
            log.exception("price catalogue lookup failed for %s %s", channel_type, model)
        if len(_limits) > 20_000:
            _limits.clear()
        hit = _limits[key] = (window, out)
    return hit


def _candidates(channel_type: str, model: str):
    """(provider, model info) of each catalogue entry the model may be, in
    order: its name and then without a "vendor/" prefix, each under the
    channel's provider and then any."""
    provider_id = PROVIDERS.get(channel_type)
    if genai_prices is None or provider_id is None or not model:
        return
    snap = data_snapshot.get_snapshot()
    names = [model] + ([model.split("/", 1)[1]] if "/" in model else [])
    for name in names:
        for pid in (provider_id, None):
            try:
                yield snap.find_provider_model(name, None, pid, None)
            except LookupError:
                continue


def _context_window(channel_type: str, model: str) -> int | None:
    for _provider, info in _candidates(channel_type, model):
        if info.context_window:
            return int(info.context_window)
    return None


def _resolve(channel_type: str, model: str, tier: str = "") -> Price | None:
    for provider, info in _candidates(channel_type, model):
        now = datetime.now(tz=UTC)
        if tier:
            if not any(v.when == {"service_tier": tier} and (
                    v.constraint is None or v.constraint.active(now))
                    for v in info.price_variants or ()):
                return None  # the catalogue does not price this tier for the model
            mp = info.get_prices(now, {"service_tier": tier})
        else:
            mp = info.get_prices(now)
        price = from_model_price(mp, model)
        if price is not None:
            return replace(price, ref=f"{provider.id}/{info.id}" + (f"@{tier}" if tier
                                                                      else ""))
    return None


def from_model_price(mp, model: str) -> Price | None:
    """A genai-prices ModelPrice -> our Price (source "catalogue")."""
    values: dict[str, Decimal] = {}
    tiers: dict[int, dict[str, Decimal]] = {}
    items = sorted(((k, v) for k, v in vars(mp).items() if v is not None and k in _KEYS),
                   key=lambda kv: kv[0] in _SPECIFIC)
    for key, value in items:
        name, per = _KEYS[key]
        if isinstance(value, TieredPrices):
            values[name] = Decimal(value.base) / per
            if per == 1:
                for tier in value.tiers:
                    tiers.setdefault(int(tier.start), {})[name] = Decimal(tier.price)
        else:
            values[name] = Decimal(value) / per
    if not any(values.values()):
        return None
    return Price(model=model, group="", **values,
                 tiers=tuple(sorted(tiers.items())), source="catalogue")
