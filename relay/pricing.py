"""Pure cost arithmetic: usage + prices + group rate -> quota units.  No I/O.

cost (USD) = rate * (input * (prompt - cached) + cache * cached + output * completion) / 1e6
per call   = rate * call_price (times the count, e.g. images)

Units are integers: 500,000 per USD.  Arithmetic is exact (Decimal) and the
result is rounded half-up once, at the end.  A non-zero cost never rounds
down to nothing: the smallest billable call costs one unit.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from models.records import QUOTA_PER_USD, Price

_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Counted units for per-call or per-unit billing (images, seconds, chars).
    units: int = 0
    estimated: bool = False


def to_units(usd: Decimal) -> int:
    if usd <= 0:
        return 0
    units = int((usd * QUOTA_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))
    return max(units, 1)


def token_cost_usd(usage: Usage, price: Price, rate: Decimal) -> Decimal:
    cached = min(max(usage.cached_tokens, 0), max(usage.prompt_tokens, 0))
    uncached = max(usage.prompt_tokens, 0) - cached
    # An unset cache price means cached tokens cost what input tokens cost.
    cache_price = price.cache_price if price.cache_price else price.input_price
    usd = (price.input_price * uncached + cache_price * cached
           + price.output_price * max(usage.completion_tokens, 0)) / _MILLION
    return usd * rate


def token_cost(usage: Usage, price: Price, rate: Decimal) -> int:
    return to_units(token_cost_usd(usage, price, rate))


def call_cost(price: Price, rate: Decimal, count: int = 1) -> int:
    return to_units(price.call_price * rate * count)


def cost(usage: Usage, price: Price, rate: Decimal, per_call: bool) -> int:
    """The cost of one finished call.

    Per-call keys pay the call price once per request; a model that only has
    a call price (images, Midjourney actions) is billed per call whatever the
    key's mode.  A per-call key calling a model with no call price is billed
    per token rather than for free.
    """
    only_call = price.call_price and not (price.input_price or price.output_price)
    if (per_call and price.call_price) or only_call:
        return call_cost(price, rate, max(usage.units, 1))
    return token_cost(usage, price, rate)
