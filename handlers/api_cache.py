"""/api/log/self/cache and /api/log/cache: prompt-cache health per key
(and, for administrators, per channel) over the usage log's filter
(console/cache_health.py), from the rollups through the reports
connection.  The filters are /api/log's."""
from __future__ import annotations

from console import cache_health
from handlers.api_log import log_args
from handlers.base import ApiError, ApiHandler


class SelfCacheHandler(ApiHandler):
    own_only = True

    async def get(self) -> None:
        self.require_user() if self.own_only else self.require_admin()
        by = self.str_arg("by", "key", max_len=10)
        if by not in cache_health.BY or (by == "channel" and self.own_only):
            choices = "key" if self.own_only else "key, channel"
            raise ApiError(400, "by must be 'key'" + ("" if self.own_only else " or 'channel'")
                           + ".", code="field_choice", field="by", choices=choices)
        fields, since, until = log_args(self, self.own_only)
        rows, lo, hi = await cache_health.by_group(self.store.reports, fields, since, until, by)
        if by == "key":
            names = {d["_id"]: d.get("name", "") async for d in self.store.reports.tokens.find(
                {"_id": {"$in": [r["token_id"] for r in rows]}}, {"name": 1})}
            for r in rows:
                r["name"] = names.get(r["token_id"], "")
        else:
            names = {c.id: c.name for c in self.ctx["catalog"].channels}
            for r in rows:
                r["name"] = names.get(r["channel_id"], "")
        # The whole hours counted (a start of none: the last DEFAULT_DAYS days).
        self.ok({"by": by, "items": rows, "since": lo, "until": hi})


class CacheHandler(SelfCacheHandler):
    own_only = False


default_handlers = [
    (r"/api/log/self/cache/?", SelfCacheHandler),
    (r"/api/log/cache/?", CacheHandler),
]
