"""What several /api handlers read alike: a page of a collection, one
document by id, whole numbers, lists of group names, rate limits and
budgets by period."""
from __future__ import annotations

import asyncio
import time

from handlers.base import ApiError, ApiHandler, ident
from models.records import LIMIT_FIELDS, PERIODS, parse_budgets
from models.store import count_matching
from relay.money import budgets
from relay.money.leases import BUDGET
from relay.serving import jsonin


def page_args(handler: ApiHandler) -> tuple[int, int]:
    """p (from 1) and size (1-200); out-of-range small values are clamped as
    new-api clients expect, values no page could have are refused."""
    p = handler.int_arg("p", 1, -10 ** 9, 10 ** 9)
    size = handler.int_arg("size", None, -10 ** 9, 10 ** 9)
    if size is None:
        size = handler.int_arg("page_size", 20, -10 ** 9, 10 ** 9)
    return max(p, 1), min(max(size, 1), 200)


async def paged(handler: ApiHandler, coll, flt: dict, view, sort: str = "_id") -> dict:
    """One page of documents, newest first by `sort` (descending)."""
    p, size = page_args(handler)
    total = await count_matching(coll, flt)  # not count_documents: models/store.py
    docs = await handler.store.page(coll, flt, sort, -1, (p - 1) * size, size)
    return {"items": [view(d) for d in docs], "total": total, "page": p, "page_size": size}


async def by_id(coll, raw, what: str) -> dict:
    """The document whose _id is `raw` (a whole number, or its text), or the
    /api routes' 404 naming it as given; `what` is "user" or "channel"."""
    doc = await coll.find_one({"_id": ident(raw)})
    if doc is None:
        raise ApiError(404, f"No {what} with id {raw}.",
                       code="no_such_user" if what == "user" else "no_such_channel", id=raw)
    return doc


def limit_fields(body: dict) -> dict:
    """The rate limits present in body (relay/money/limits.py): 0 = none."""
    out = {}
    for f in LIMIT_FIELDS:
        if f in body:
            v = _int(body[f] if body[f] not in (None, "") else 0, f)
            if not 0 <= v <= 10 ** 12:
                raise ApiError(400, f"{f} must be 0 (no limit) or a positive whole number.",
                               code="field_range", field=f, min=0, max=10 ** 12)
            out[f] = v
    return out


def group_list(handler: ApiHandler, value, field: str = "usable_groups") -> list[str]:
    """A list of existing group names (a JSON list, or names separated by commas)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.replace("\n", ",").split(",")
    if not isinstance(value, list):
        raise ApiError(400, f"{field} must be a list of group names.", code="field_not_list",
                       field=field)
    names = {jsonin.text(v, field, 64).strip() for v in value} - {""}
    unknown = sorted(g for g in names if g not in handler.ctx["catalog"].groups)
    if unknown:
        raise ApiError(400, f"{field}: there is no group named {unknown[0]!r}.", code="no_group",
                       group=unknown[0])
    return sorted(names)


def _int(value, name: str, lo: int = jsonin.INT64_MIN, hi: int = jsonin.INT64_MAX) -> int:
    """A whole-number field (relay/jsonin.whole; BadInput is a 400 naming it)."""
    return jsonin.whole(value, name, lo, hi)


def budget_fields(body: dict) -> dict:
    """Budgets by period present in body (relay/money/budgets.py):
    {"budgets": {"day": units, "week": units, "month": units}}, 0 = none."""
    if "budgets" not in body:
        return {}
    try:
        parsed = parse_budgets(body["budgets"] if body["budgets"] is not None else {})
    except ValueError as exc:
        raise ApiError.of(exc, code="invalid", message=f"{exc}.") from None
    return {"budgets": dict(parsed)}


async def timezone_field(body: dict) -> dict:
    """The account's time zone for budgets and month spend: an IANA name.
    Checked off the event loop (the first check lists every zone: 40 ms)."""
    if "timezone" not in body:
        return {}
    tz = body["timezone"]
    if not await asyncio.get_running_loop().run_in_executor(None, budgets.valid_zone, tz):
        raise ApiError(400, f"timezone must be an IANA time zone name such as 'UTC' or "
                            f"'Asia/Shanghai'; {str(tz)[:64]!r} is not one.", code="timezone",
                       value=str(tz)[:64])
    return {"timezone": tz}


async def budgets_changed(handler: ApiHandler, scope: str, ident_: int, old: dict, new: dict,
                          tz: str | None) -> None:
    """A budget's limit changed: the current period's counter follows
    (billing recalls every relay's lease on it when it is lowered)."""
    now = time.time()
    for period in PERIODS:
        if int(old.get(period) or 0) != int(new.get(period) or 0):
            c = budgets.counter(scope, ident_, period, 0, now, tz)
            await handler.ctx["billing"].set_budget_limit(c.id, int(new.get(period) or 0))


async def budget_use(handler: ApiHandler, subjects: list[tuple[str, int, dict]],
                     tz_of) -> dict:
    """{(scope, id): [{period, limit, used, resets_at}]} for the current
    period of each budget of `subjects` ((scope, id, its budgets));
    `tz_of(scope, id)` names the account's time zone.  One read."""
    now = time.time()
    want = {}
    for scope, sid, bs in subjects:
        for period, limit in (bs or {}).items():
            if limit:
                c = budgets.counter(scope, sid, period, limit, now, tz_of(scope, sid))
                want[c.id] = (scope, sid, c)
    out: dict = {(scope, sid): [] for scope, sid, _ in subjects}
    docs = {}
    if want:
        async for d in handler.store.db.budgets.find({"_id": {"$in": list(want)}}):
            docs[d["_id"]] = d
    billing = handler.ctx["billing"]
    for cid, (scope, sid, c) in want.items():
        used = 0
        if cid in docs:
            used = billing.view_from_doc(BUDGET, docs[cid])[1]
        out[(scope, sid)].append({"period": c.period, "limit": c.limit, "used": used,
                                  "resets_at": int(c.ends_at)})
    for v in out.values():
        v.sort(key=lambda x: PERIODS.index(x["period"]))
    return out
