"""/api/log: usage records, newest first, paged by time, filterable, with
totals from the rollups (console/stats.py).

A page is read by its place in time, not by its number: `older=<cursor>`
(the page after one, further back) and `newer=<cursor>` (the page before
one); each answer gives the cursors of the pages beside it.  No page ever
counts the log: `total` is the number of records the filter's rollups
hold (whole hours: `total_exact` false when the range cuts through one).
`p` (new-api clients) still works for the first MAX_SKIP records.
"""
from __future__ import annotations

from console import stats
from handlers.api_fields import page_args
from handlers.base import ApiError, ApiHandler
from models import queries
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


def log_args(handler: ApiHandler, own_only: bool) -> tuple[dict, float | None, float | None]:
    """The filter's field values (None: any), and its time range."""
    fields: dict = {}
    if own_only:
        fields["user_id"] = handler.current_user["_id"]
    else:
        fields["user_id"] = handler.int_arg("user_id")
    for name in ("token_id", "channel_id", "status"):
        fields[name] = handler.int_arg(name)
    fields["model"] = handler.str_arg("model", max_len=200) or None
    since = handler.float_arg("start", None, 0, 1e11)
    until = handler.float_arg("end", None, 0, 1e11)
    return fields, since, until


def cursor_arg(handler: ApiHandler, name: str) -> queries.Cursor | None:
    raw = handler.str_arg(name, max_len=200)
    if not raw:
        return None
    try:
        return queries.Cursor.parse(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be a cursor from a previous page's "
                            f"'older' or 'newer'.", code="cursor", field=name) from None


class SelfLogHandler(ApiHandler):
    own_only = True
    API_COST = 2  # a page, and the totals from the rollups

    async def get(self) -> None:
        self.require_user() if self.own_only else self.require_admin()
        fields, since, until = log_args(self, self.own_only)
        p, size = page_args(self)
        older, newer = cursor_arg(self, "older"), cursor_arg(self, "newer")
        if older and newer:
            raise ApiError(400, "Give older or newer, not both.", code="older_and_newer")
        skip = (p - 1) * size
        if skip and (older or newer):
            raise ApiError(400, "p pages from the newest record; with older or newer leave it out.",
                           code="page_with_cursor")
        if skip > queries.MAX_SKIP:
            raise ApiError(400, f"p reaches back {queries.MAX_SKIP:,} records at most; page "
                                "further with the 'older' cursor each page gives.",
                           code="page_too_far", max=queries.MAX_SKIP)
        db = self.store.reports
        flt = queries.usage_filter(fields, since, until)
        docs, more = await queries.usage_page(db.usage, flt, size, older=older, newer=newer,
                                              skip=skip)
        admin = not self.own_only
        items = [log_view(d, admin) for d in docs]

        def at(d: dict) -> str:
            return queries.Cursor(d["created_at"], str(d["_id"])).text()
        going_back = newer is None
        sums = await stats.totals(db, fields, since, until)
        exact, lo, hi = sums.pop("exact"), sums.pop("since"), sums.pop("until")
        self.ok({
            "items": items,
            "older": at(docs[-1]) if docs and (more or not going_back) else None,
            "newer": at(docs[0]) if docs and ((more and not going_back) or older or skip)
            else None,
            "total": sums["requests"], "total_exact": exact,
            # Totals count whole hours: the ones counted, when a bound cuts one.
            "totals": sums, "totals_since": lo, "totals_until": hi,
            "page": p, "page_size": size, "export_max": stats.MAX_EXPORT_ROWS})


class AllLogHandler(SelfLogHandler):
    own_only = False


default_handlers = [
    (r"/api/log/self/?", SelfLogHandler),
    (r"/api/log/?", AllLogHandler),
]
