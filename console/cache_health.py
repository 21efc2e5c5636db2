"""Cache health: how much of the input the upstreams' prompt caches served,
per key or per channel, from the usage records' cache fields.

For each group: input tokens, of them read from a cache (`share` = read /
input), written to one (5 minutes and 1 hour), cache writes of its
conversations that no later call read (relay/sessions.cache_use), and the
quota units caching saved (relay/money/pricing.cache_saving: negative when
writes cost more than reads saved).  One `$group` by the key's or the
channel's id over the filter's records, which the embedded server runs too.
"""
from __future__ import annotations

SUMS = ("prompt_tokens", "cached_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
        "cache_unread", "cache_saved")
BY = {"key": "token_id", "channel": "channel_id"}
MAX_GROUPS = 500


def health(row: dict) -> dict:
    """One group's figures, with its read share."""
    out = {k: int(row.get(k) or 0) for k in SUMS}  # $sum of a field none has: null on nx-27017
    out["requests"] = int(row.get("requests") or 0)
    out["cache_written"] = out["cache_write_5m_tokens"] + out["cache_write_1h_tokens"]
    out["share"] = round(out["cached_tokens"] / out["prompt_tokens"], 4) \
        if out["prompt_tokens"] else 0.0
    return out


async def by_group(db, flt: dict, by: str) -> list[dict]:
    """Cache health of each key (by="key") or channel (by="channel") the
    filter's records touch, most input first."""
    field = BY[by]
    group = {"_id": f"${field}", "requests": {"$sum": 1},
             **{k: {"$sum": f"${k}"} for k in SUMS}}
    rows = await (await db.usage.aggregate([{"$match": flt}, {"$group": group}])).to_list(None)
    out = [dict(health(r), **{field: r["_id"]}) for r in rows if r.get("_id") is not None]
    out.sort(key=lambda r: -r["prompt_tokens"])
    return out[:MAX_GROUPS]
