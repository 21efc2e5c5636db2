"""A group's rate for one call: flat, or tiered by the call's input tokens,
by the account's spend this calendar month, or both.  Pure; no I/O.

    rate = group rate x factor of the input tier x factor of the spend tier

A tier applies from its `from` on (input tokens: a prompt of exactly
`from` tokens is in it).  Spend tiers count what the account was charged
this calendar month in its time zone (relay/money/budgets.py keeps the
counter); a call that takes the month's spend to or past a tier's start
is billed at that tier's factor itself ("from the call that crosses a
tier on"): its cost at the rate before it decides whether it crosses.

The reservation uses `highest()`: the rate a call cannot exceed whatever
its prompt turns out to be and whenever it settles (a month may end
meanwhile), so it stays an upper bound of the charge.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Callable

from models.records import QUOTA_PER_USD

_ONE = Decimal(1)


def _tier(tiers: tuple, value: int) -> tuple[int, Decimal] | None:
    found = None
    for start, factor in tiers:
        if value >= start:
            found = (start, factor)
        else:
            break
    return found


def highest(group) -> Decimal:
    """The most any call in the group can be billed at."""
    inp = max([_ONE, *(f for _, f in group.input_tiers)])
    spend = max([_ONE, *(f for _, f in group.spend_tiers)])
    return group.rate * inp * spend


def rate_for(group, prompt_tokens: int, month_spend: int | None,
             cost_at: Callable[[Decimal], int] | None = None) -> tuple[Decimal, str]:
    """(rate, rule) for a finished call: `rule` names the tiers that applied,
    e.g. "input>=32000 x0.6; spend>=$50 x0.9", or "flat".

    `month_spend`: units the account was charged this month before this
    call (None when the group has no spend tiers); `cost_at(rate)`: what
    the call costs at a rate, to tell whether it crosses a spend tier."""
    rate, parts = group.rate, []
    t = _tier(group.input_tiers, prompt_tokens)
    if t is not None:
        rate *= t[1]
        parts.append(f"input>={t[0]} x{t[1]}")
    if group.spend_tiers and month_spend is not None:
        s = _tier(group.spend_tiers, month_spend)
        if cost_at is not None:
            before = rate * (s[1] if s else _ONE)
            crossed = _tier(group.spend_tiers, month_spend + max(cost_at(before), 0))
            s = crossed or s
        if s is not None:
            rate *= s[1]
            parts.append(f"spend>=${_usd(s[0])} x{s[1]}")
    return rate, "; ".join(parts) or "flat"


def _usd(units: int) -> str:
    return format((Decimal(units) / QUOTA_PER_USD).normalize(), "f")


def counts_month(group, user, groups: dict) -> bool:
    """Whether the account's spend this month is counted (its month
    counter, relay/money/budgets.py): its key's group has spend tiers, or it
    may put keys in one that has, so every call of it counts towards them,
    whatever group it is made in."""
    if group is not None and group.spend_tiers:
        return True
    return any(groups[g].spend_tiers for g in user.usable_set(groups) if g in groups)


def for_call(group, rate: Decimal, counters, spent, prompt_tokens: int,
             cost_at: Callable[[Decimal], int]) -> tuple[Decimal, str]:
    """(rate, rule) of a finished call in `group`: by its input tokens, and
    by the account's spend this month before it, read with `spent(id)` from
    its month counter among `counters`; `rate` when the group has no tiers."""
    if group is None or not (group.input_tiers or group.spend_tiers):
        return (group.rate if group is not None else rate), "flat"
    spend = None
    if group.spend_tiers:
        month = next((c for c in counters if c.scope == "user" and c.period == "month"), None)
        spend = spent(month.id) if month is not None else 0
    return rate_for(group, prompt_tokens, spend, cost_at)
