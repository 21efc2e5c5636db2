"""Pure cost arithmetic: usage + prices + group rate -> quota units.  No I/O.

A call's tokens are split into disjoint parts, each billed at its own price
(USD per million tokens), falling back to its parent's when unset:

    input   text (uncached)          input
            cache read, text         cache            -> input
            cache write 5 min        cache_write      -> input
            cache write 1 hour       cache_write_1h   -> cache_write -> input
            audio (uncached)         audio_input      -> input
            audio read from cache    audio_cache      -> cache -> audio_input -> input
            image (uncached)         image_input      -> input
            image read from cache    image_cache      -> cache -> image_input -> input
    output  text                     output
            reasoning                reasoning        -> output
            audio                    audio_output     -> output
            image                    image_output     -> output

Counts are inclusive, as the vendors report them: prompt_tokens holds every
input token (cached, written, audio, image), completion_tokens every output
token (reasoning, audio, image), cached_tokens every cache read (of which
cached_audio/image_tokens), audio_input_tokens every audio input token
(cached or not).  Each token is billed exactly once: a cache write is not
also billed as input, a cache read never as input.

Tiers (Price.at): past a prompt size the vendor bills every token of the
call at the tier's prices (Gemini 2.5 Pro, Claude with a 1M context).

    cost (USD) = rate * (sum of part * price) / 1e6  +  rate * unit_price * units
    per call   = rate * call_price (times the count, e.g. images)

Units are integers: 500,000 per USD.  Arithmetic is exact (Decimal) and the
result is rounded half-up once, at the end.  A non-zero cost never rounds
down to nothing: the smallest billable call costs one unit.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from decimal import ROUND_HALF_UP, Decimal

from models.records import QUOTA_PER_USD, Price

_MILLION = Decimal(1_000_000)


# Not frozen: a frozen dataclass of this size costs four times as much to
# build, on every call; nothing changes a Usage once made (use replace()).
@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Counted units for per-call or per-unit billing (images, seconds, chars).
    units: int = 0
    estimated: bool = False
    # The parts below are included in the totals above (see the module doc).
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    audio_input_tokens: int = 0
    cached_audio_tokens: int = 0
    image_input_tokens: int = 0
    cached_image_tokens: int = 0
    reasoning_tokens: int = 0
    audio_output_tokens: int = 0
    image_output_tokens: int = 0
    # Calls of vendor-run tools (web search, file search, code execution),
    # each billed at its own price on top of the tokens.
    web_search_calls: int = 0
    file_search_calls: int = 0
    code_execution_calls: int = 0
    # The service tier the upstream says it ran the call in ("" = standard);
    # not a count, so not one of USAGE_FIELDS.
    service_tier: str = ""

    def record(self) -> dict:
        """The counts as the usage record and its CSV keep them."""
        return {f: getattr(self, f) for f in USAGE_FIELDS}

    def detailed(self) -> bool:
        """Whether any part beyond text in (cached or not) and text out is set."""
        return bool(self.cache_write_5m_tokens or self.cache_write_1h_tokens
                    or self.audio_input_tokens or self.cached_audio_tokens
                    or self.image_input_tokens or self.cached_image_tokens
                    or self.reasoning_tokens or self.audio_output_tokens
                    or self.image_output_tokens)


# The usage record's component columns, in order (handlers/api_log.py, CSV).
USAGE_FIELDS = tuple(f.name for f in fields(Usage) if f.name not in ("estimated", "service_tier"))
# Each tool's calls and the price component that bills them, per call.
TOOL_PRICES = (("web_search_calls", "web_search_price"),
               ("file_search_calls", "file_search_price"),
               ("code_execution_calls", "code_execution_price"))


def to_units(usd: Decimal) -> int:
    if usd <= 0:
        return 0
    units = int((usd * QUOTA_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))
    return max(units, 1)


def _first(*prices: Decimal) -> Decimal:
    for p in prices:
        if p:
            return p
    return Decimal(0)


def _n(value: int) -> int:
    return value if value > 0 else 0


def token_parts(usage: Usage, p: Price) -> list[tuple[int, Decimal]]:
    """(tokens, USD per million) for each disjoint part of the call.

    Parts reported larger than their whole are clamped to it (a vendor's
    details never make a call cost more than its totals)."""
    prompt = _n(usage.prompt_tokens)
    read = min(_n(usage.cached_tokens), prompt)
    read_audio = min(_n(usage.cached_audio_tokens), read)
    read_image = min(_n(usage.cached_image_tokens), read - read_audio)
    left = prompt - read
    w5 = min(_n(usage.cache_write_5m_tokens), left)
    w1 = min(_n(usage.cache_write_1h_tokens), left - w5)
    left -= w5 + w1
    audio = min(max(_n(usage.audio_input_tokens) - read_audio, 0), left)
    image = min(max(_n(usage.image_input_tokens) - read_image, 0), left - audio)
    text = left - audio - image

    out_total = _n(usage.completion_tokens)
    reasoning = min(_n(usage.reasoning_tokens), out_total)
    audio_out = min(_n(usage.audio_output_tokens), out_total - reasoning)
    image_out = min(_n(usage.image_output_tokens), out_total - reasoning - audio_out)
    text_out = out_total - reasoning - audio_out - image_out

    i = p.input_price
    return [
        (text, i),
        (read - read_audio - read_image, _first(p.cache_price, i)),
        (w5, _first(p.cache_write_price, i)),
        (w1, _first(p.cache_write_1h_price, p.cache_write_price, i)),
        (audio, _first(p.audio_input_price, i)),
        (read_audio, _first(p.audio_cache_price, p.cache_price, p.audio_input_price, i)),
        (image, _first(p.image_input_price, i)),
        (read_image, _first(p.image_cache_price, p.cache_price, p.image_input_price, i)),
        (text_out, p.output_price),
        (reasoning, _first(p.reasoning_price, p.output_price)),
        (audio_out, _first(p.audio_output_price, p.output_price)),
        (image_out, _first(p.image_output_price, p.output_price)),
    ]


def token_cost_usd(usage: Usage, price: Price, rate: Decimal) -> Decimal:
    prompt = _n(usage.prompt_tokens)
    p = price.at(prompt) if price.tiers else price
    if usage.detailed():
        usd = sum((pr * n for n, pr in token_parts(usage, p) if n), Decimal(0))
    else:  # the common case, the same sum with only its first, second and ninth parts
        cached = min(_n(usage.cached_tokens), prompt)
        usd = (p.input_price * (prompt - cached) + (p.cache_price or p.input_price) * cached
               + p.output_price * _n(usage.completion_tokens))
    usd = usd / _MILLION + p.unit_price * _n(usage.units)
    return usd * rate


def cache_saving(usage: Usage, price: Price, rate: Decimal) -> int:
    """Quota units prompt caching saved on this call: its cost had every
    input token been plain input, less its cost (negative when writing the
    cache cost more than reading saved).  Not rounded up to a unit: 0 when
    the call used no cache."""
    if not (usage.cached_tokens or usage.cache_write_5m_tokens or usage.cache_write_1h_tokens):
        return 0
    plain = replace(usage, cached_tokens=0, cached_audio_tokens=0, cached_image_tokens=0,
                    cache_write_5m_tokens=0, cache_write_1h_tokens=0)
    diff = token_cost_usd(plain, price, rate) - token_cost_usd(usage, price, rate)
    return int((diff * QUOTA_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))


def token_cost(usage: Usage, price: Price, rate: Decimal) -> int:
    return to_units(token_cost_usd(usage, price, rate))


def call_cost(price: Price, rate: Decimal, count: int = 1) -> int:
    return to_units(price.call_price * rate * count)


def tools_usd(usage: Usage, price: Price, rate: Decimal) -> Decimal:
    """What the vendor-run tool calls cost, on top of everything else."""
    usd = Decimal(0)
    for count, component in TOOL_PRICES:
        n = getattr(usage, count)
        if n > 0:
            usd += getattr(price, component) * n
    return usd * rate


def cost(usage: Usage, price: Price, rate: Decimal, per_call: bool) -> int:
    """The cost of one finished call.

    Per-call keys pay the call price once per request; a model that only has
    a call price (images, Midjourney actions) is billed per call whatever the
    key's mode.  A per-call key calling a model with no call price is billed
    per token rather than for free.  Tool calls (web searches, ...) come on
    top, at their prices, in every mode.
    """
    only_call = price.call_price and not (price.input_price or price.output_price
                                          or price.unit_price)
    tools = (usage.web_search_calls or usage.file_search_calls or usage.code_execution_calls)
    if (per_call and price.call_price) or only_call:
        if not tools:
            return call_cost(price, rate, max(usage.units, 1))
        return to_units(price.call_price * rate * max(usage.units, 1)
                        + tools_usd(usage, price, rate))
    if not tools:
        return token_cost(usage, price, rate)
    return to_units(token_cost_usd(usage, price, rate) + tools_usd(usage, price, rate))
