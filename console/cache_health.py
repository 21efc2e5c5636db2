"""Cache health: how much of the input the upstreams' prompt caches served,
per key or per channel, from the usage rollups' cache figures.

For each group: input tokens, of them read from a cache (`share` = read /
input), written to one (5 minutes and 1 hour), cache writes of its
conversations that no later call read (relay/sessions.cache_use), and the
quota units caching saved (relay/money/pricing.cache_saving: negative when
writes cost more than reads saved).

Read from the rollups the billing flusher keeps (relay/money/rollups.py,
console/stats.sums_by), never the usage records, through the reports
connection: one `$group` by the key's or the channel's id over the
smallest family holding the filter, by its index, whole hours (like the
log's totals).  Without a start it covers the last DEFAULT_DAYS days, so
that even an administrator's unfiltered view reads a day range by its
index, not every rollup document ever kept.
"""
from __future__ import annotations

import time

from console import stats
from relay.money import rollups

SUMS = ("prompt_tokens", "cached_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
        "cache_unread", "cache_saved")
BY = {"key": "token_id", "channel": "channel_id"}
MAX_GROUPS = 500
DEFAULT_DAYS = stats.MAX_DAYS


def health(row: dict) -> dict:
    """One group's figures, with its read share."""
    out = {k: int(row.get(k) or 0) for k in SUMS}
    out["requests"] = int(row.get("requests") or 0)
    out["cache_written"] = out["cache_write_5m_tokens"] + out["cache_write_1h_tokens"]
    out["share"] = round(out["cached_tokens"] / out["prompt_tokens"], 4) \
        if out["prompt_tokens"] else 0.0
    return out


def default_since(since: float | None, now: float | None = None) -> float:
    """The start of a view given none: DEFAULT_DAYS back, at a day's start."""
    if since is not None:
        return since
    return rollups.day_of((time.time() if now is None else now) - DEFAULT_DAYS * rollups.DAY)


async def by_group(db, fields: dict, since: float | None, until: float | None,
                   by: str) -> tuple[list[dict], int | None, int | None]:
    """(cache health of each key (by="key") or channel (by="channel") the
    filter's records touch, most input first; the whole hours counted)."""
    field = BY[by]
    groups, lo, hi = await stats.sums_by(db, fields, default_since(since), until, by=field)
    out = []
    for ident, sums in groups.items():
        if ident is None:
            continue
        row = {src: sums[m] for src, m in rollups.NAMES.items() if src in SUMS}
        row["requests"] = sums["n"]
        out.append(dict(health(row), **{field: ident}))
    out.sort(key=lambda r: -r["prompt_tokens"])
    return out[:MAX_GROUPS], lo, hi
