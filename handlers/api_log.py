"""/api/log: usage records, filterable, with totals."""
from __future__ import annotations

from handlers.api_fields import paged
from handlers.base import ApiHandler
from relay.money.pricing import USAGE_FIELDS
from relay.money.usage import expand

# Every usage component (relay/pricing.USAGE_FIELDS) is shown and exported.
FIELDS = ("user_id", "username", "token_id", "token_name", "group", "model", "upstream_model",
          "channel_id", "endpoint", "session", *USAGE_FIELDS, "service_tier", "cache_saved",
          "cache_unread", "cost", "quota", "unpaid", "estimated",
          "duration_ms", "ttfb_ms", "status", "stream", "client_ip", "billing_mode",
          "rate", "rate_rule", "error", "created_at")


# Summed in the totals and in the CSV export's last row; the cache's figures
# give a filter's cache health (README "Cache health").
TOTALS = ("quota", "cost", "unpaid", "prompt_tokens", "completion_tokens", "cached_tokens",
          "cache_write_5m_tokens", "cache_write_1h_tokens", "cache_saved", "cache_unread")


def log_view(d: dict, admin: bool) -> dict:
    d = expand(d)
    out = {"request_id": d["_id"], **{f: d.get(f) for f in FIELDS}}
    # `cost` (full price) and `unpaid` (what the balance could not cover):
    # records from before they existed were charged in full.
    if out["cost"] is None:
        out["cost"] = out["quota"]
    out["unpaid"] = out["unpaid"] or 0
    if not admin:
        out.pop("channel_id", None)
        out.pop("upstream_model", None)
    return out


def log_filter(handler: ApiHandler, own_only: bool) -> dict:
    flt: dict = {}
    if own_only:
        flt["user_id"] = handler.current_user["_id"]
    else:
        uid = handler.int_arg("user_id")
        if uid is not None:
            flt["user_id"] = uid
    for name in ("token_id", "channel_id", "status"):
        v = handler.int_arg(name)
        if v is not None:
            flt[name] = v
    model = handler.str_arg("model", max_len=200)
    if model:
        flt["model"] = model
    rng = {}
    for arg, op in (("start", "$gte"), ("end", "$lt")):
        v = handler.float_arg(arg, None, 0, 1e11)
        if v is not None:
            rng[op] = v
    if rng:
        flt["created_at"] = rng
    return flt


async def totals(handler: ApiHandler, flt: dict) -> dict:
    """Sums over every matching record: requests, charged quota, full cost,
    unpaid shortfall and tokens."""
    group: dict = {"_id": None, "requests": {"$sum": 1}}
    group.update({k: {"$sum": f"${k}"} for k in TOTALS})
    rows = await (await handler.store.db.usage.aggregate([{"$match": flt},
                                                          {"$group": group}])).to_list(1)
    row = rows[0] if rows else {}
    # `$sum` of a field no record has is null on nx-27017, 0 on MongoDB.
    return {k: int(row.get(k) or 0) for k in ("requests",) + TOTALS}


class SelfLogHandler(ApiHandler):
    own_only = True
    API_COST = 2  # a page and an aggregation for the totals

    async def get(self) -> None:
        self.require_user() if self.own_only else self.require_admin()
        flt = log_filter(self, self.own_only)
        # Usage ids are random request ids: order by time, newest first.
        data = await paged(self, self.store.db.usage, flt, lambda d: log_view(d, not self.own_only),
                           sort="created_at")
        data["totals"] = await totals(self, flt)
        self.ok(data)


class AllLogHandler(SelfLogHandler):
    own_only = False


default_handlers = [
    (r"/api/log/self/?", SelfLogHandler),
    (r"/api/log/?", AllLogHandler),
]
