"""Budgets by period: a limit in quota units per day, week or month, on a
key or an account, beside the lifetime quota.  Pure; no I/O.

A period is calendar-aligned in the account's time zone (IANA name, by
default UTC): a day from local midnight, a week from Monday, a month from
its first day.  Each (subject, period, start) has its own counter, a
document in `budgets` whose _id names them all, e.g. "u5/day/2026-11-26";
so nothing resets a budget: the next period's calls find a new counter.

A counter is a balance like any other (relay/money/leases.py): `quota`
is what is left of the limit (it starts at the limit; without a limit it
starts at 0 and only counts), `used_quota` what was charged in the
period.  Calls reserve from it and are charged to it through billing, so
a limit is exact across relays the same way a quota is.  The account's
month counter is also the month's spend that rate tiers read
(relay/money/rates.py): one counter serves both, and it exists when
either needs it.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from models.records import PERIODS, parse_budgets  # noqa: F401 (the API's validation)

DEFAULT_TZ = "UTC"
_ZONES: dict[str, ZoneInfo] = {}


def zone(name: str | None) -> ZoneInfo:
    """The time zone named (cached); UTC for none or an unknown name."""
    name = name or DEFAULT_TZ
    z = _ZONES.get(name)
    if z is None:
        try:
            z = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            z = ZoneInfo(DEFAULT_TZ)
        if len(_ZONES) < 1000:
            _ZONES[name] = z
    return z


_KNOWN: set[str] = set()


def valid_zone(name) -> bool:
    """Whether `name` is an IANA time zone (zoneinfo's list: no paths, no
    folders such as "America", no "localtime")."""
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        return False
    if not _KNOWN:
        _KNOWN.update(available_timezones(), {"UTC"})
    return name in _KNOWN


def bounds(period: str, now: float, tz: str | None) -> tuple[dt.date, float]:
    """(first local day of the period holding `now`, epoch of the next one)."""
    z = zone(tz)
    local = dt.datetime.fromtimestamp(now, z)
    day = local.date()
    if period == "day":
        start, nxt = day, day + dt.timedelta(days=1)
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        nxt = start + dt.timedelta(days=7)
    else:
        start = day.replace(day=1)
        nxt = (start + dt.timedelta(days=32)).replace(day=1)
    return start, dt.datetime.combine(nxt, dt.time(), z).timestamp()


@dataclass(frozen=True, slots=True)
class Counter:
    """One subject's counter for the period holding a call."""
    # "u5/day/2026-11-26" (u: account, t: key); no ":", which separates
    # the parts of a recall's id (relay/money/recalls.py).
    id: str
    limit: int       # quota units; 0: none (it only counts)
    ends_at: float   # epoch of the next period's start (Retry-After)
    scope: str       # "user" or "token"
    period: str


def counter(scope: str, ident: int, period: str, limit: int, now: float,
            tz: str | None) -> Counter:
    start, ends = bounds(period, now, tz)
    return Counter(f"{scope[0]}{ident}/{period}/{start.isoformat()}", max(int(limit), 0),
                   ends, scope, period)


def counters_for(user, token, spend_tiers: bool, now: float) -> list[Counter]:
    """The counters a call of `token` must reserve from and be charged to:
    each period with a limit on the key or the account, and the account's
    month (for spend tiers) even without a limit."""
    out = []
    for scope, subject in (("user", user), ("token", token)):
        for period, limit in subject.budgets:
            if limit > 0:
                out.append(counter(scope, subject.id, period, limit, now, user.timezone))
    if spend_tiers and not any(c.scope == "user" and c.period == "month" for c in out):
        out.append(counter("user", user.id, "month", 0, now, user.timezone))
    return out
