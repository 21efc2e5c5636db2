"""What several /api handlers read alike: a page of a collection, one
document by id, whole numbers, lists of group names and rate limits."""
from __future__ import annotations

from handlers.base import ApiError, ApiHandler, ident
from models.records import LIMIT_FIELDS
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
    total = await coll.count_documents(flt)
    docs = await handler.store.page(coll, flt, sort, -1, (p - 1) * size, size)
    return {"items": [view(d) for d in docs], "total": total, "page": p, "page_size": size}


async def by_id(coll, raw, what: str) -> dict:
    """The document whose _id is `raw` (a whole number, or its text), or the
    /api routes' 404 naming it as given."""
    doc = await coll.find_one({"_id": ident(raw)})
    if doc is None:
        raise ApiError(404, f"No {what} with id {raw}.")
    return doc


def limit_fields(body: dict) -> dict:
    """The rate limits present in body (relay/money/limits.py): 0 = none."""
    out = {}
    for f in LIMIT_FIELDS:
        if f in body:
            v = _int(body[f] if body[f] not in (None, "") else 0, f)
            if not 0 <= v <= 10 ** 12:
                raise ApiError(400, f"{f} must be 0 (no limit) or a positive whole number.")
            out[f] = v
    return out


def group_list(handler: ApiHandler, value, field: str = "usable_groups") -> list[str]:
    """A list of existing group names (a JSON list, or names separated by commas)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.replace("\n", ",").split(",")
    if not isinstance(value, list):
        raise ApiError(400, f"{field} must be a list of group names.")
    names = {jsonin.text(v, field, 64).strip() for v in value} - {""}
    unknown = sorted(g for g in names if g not in handler.ctx["catalog"].groups)
    if unknown:
        raise ApiError(400, f"{field}: there is no group named {unknown[0]!r}.")
    return sorted(names)


def _int(value, name: str, lo: int = jsonin.INT64_MIN, hi: int = jsonin.INT64_MAX) -> int:
    """A whole-number field (relay/jsonin.whole; BadInput is a 400 naming it)."""
    return jsonin.whole(value, name, lo, hi)
