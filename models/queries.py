"""Query shapes for the usage log and its rollups that every server runs
with an index: on the embedded one, in SQL, and never by reading the
collection into memory.

Measured on nx-27017 0.8 at a million records (bench/datascale.py; the
shapes are pinned by tests/models/test_query_plans.py, which asks SQLite
for the plan of every query the relay makes):

- plain equality `{f: v}` on a field without an index of its own (a
  compound one does not count) is answered as "f = v or f is an array
  holding v", which no index can serve: equality is sent as `{f: {$eq: v}}`,
  the same query on MongoDB;
- when two filters could each use an index, SQLite, without statistics,
  may pick the one that walks a hundred times more rows: only the filter
  most likely to be rare is sent as `$eq`, the others as `{$in: [v]}`,
  which the embedded server checks row by row (the same query on MongoDB);
- `$and` and `$or` are answered by reading every document into memory:
  never sent (keyset paging needs "older than (t, id)": it is sent as
  `created_at <= t` and the rows at exactly t already shown are dropped
  here);
- `count_documents` is an aggregation there, read into memory: never
  sent; nor is an aggregation over the usage log (each also counts the
  whole collection first), only over rollups;
- `$group` on anything but one field is read into memory: rollups carry
  the one field a chart groups by (`dm`);
- `skip` is walked row by row: bounded (MAX_SKIP).
"""
from __future__ import annotations

from dataclasses import dataclass

# The usage log's filters, rarest first: the first one present gets the
# index (models/store.INDEXES has one per field, with created_at).
USAGE_FILTERS = ("token_id", "user_id", "channel_id", "model", "status")
# Rows an old-style page (`p`) may skip before its first.
MAX_SKIP = 10_000


@dataclass(frozen=True)
class Cursor:
    """A row's place in the log: (created_at, _id), newest first."""
    created_at: float
    id: str

    def text(self) -> str:
        return f"{self.created_at!r}_{self.id}"

    @classmethod
    def parse(cls, text: str) -> "Cursor":
        """ValueError if `text` is not a cursor this module wrote."""
        ts, sep, ident = str(text).partition("_")
        if not sep or not ident or len(ident) > 128:
            raise ValueError("not a cursor")
        value = float(ts)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("not a cursor")
        return cls(value, ident)


def usage_filter(fields: dict, since: float | None = None, until: float | None = None) -> dict:
    """The filter for usage records with these field values (None: any)
    made between `since` (included) and `until` (excluded)."""
    flt: dict = {}
    indexed = False
    for name in USAGE_FILTERS:
        value = fields.get(name)
        if value is None:
            continue
        if not indexed:
            flt[name] = {"$eq": value}
            indexed = True
        else:
            flt[name] = {"$in": [value]}
    return _half_open(flt, "created_at", since, until, float)


def _with_time(flt: dict, op: str, value: float) -> dict:
    out = dict(flt)
    rng = dict(out.get("created_at") or {})
    rng[op] = value
    out["created_at"] = rng
    return out


async def usage_page(coll, flt: dict, size: int, older: Cursor | None = None,
                     newer: Cursor | None = None, skip: int = 0) -> tuple[list[dict], bool]:
    """One page of records, newest first: the `size` after `older` (or
    before `newer`, or the newest), and whether there are more beyond it in
    the direction read.  Each query reads at most a page and the ties of
    one instant."""
    if newer is not None:
        base, order, edge, keep = _with_time(flt, "$gte", newer.created_at), 1, newer, (
            lambda d: d["created_at"] > newer.created_at or str(d["_id"]) > newer.id)
    elif older is not None:
        base, order, edge, keep = _with_time(flt, "$lte", older.created_at), -1, older, (
            lambda d: d["created_at"] < older.created_at or str(d["_id"]) < older.id)
    else:
        base, order, edge, keep = flt, -1, None, (lambda d: True)
    skip = max(0, min(int(skip), MAX_SKIP))
    extra = 16
    while True:
        want = size + 1 + (extra if edge is not None else 0)
        cur = coll.find(base).sort([("created_at", order), ("_id", order)])
        if skip:
            cur = cur.skip(skip)
        docs = await cur.limit(want).to_list(want)
        kept = [d for d in docs if keep(d)]
        if len(kept) > size or len(docs) < want:
            break
        extra *= 4  # more rows of one instant than expected: read further
    more = len(kept) > size
    kept = kept[:size]
    if order == 1:
        kept.reverse()
    return kept, more


async def usage_chunks(coll, flt: dict, size: int = 1000):
    """Every matching record, newest first, `size` at a time (an export):
    each chunk is one bounded query, so nothing holds the whole result."""
    cursor = None
    while True:
        docs, more = await usage_page(coll, flt, size, older=cursor)
        if docs:
            yield docs
        if not more or not docs:
            return
        cursor = Cursor(docs[-1]["created_at"], str(docs[-1]["_id"]))


def rollup_match(fields: dict, first_day: int | None = None, end_day: int | None = None,
                 indexed: tuple = ()) -> dict:
    """The filter for rollup documents with these dimension values, for the
    days in [first_day, end_day): the first of `indexed` given (the fields
    the collection has an index on with the day, rarest first) is the one
    the server looks up; every other is checked row by row."""
    flt: dict = {}
    lead = next((n for n in indexed if fields.get(n) is not None), None)
    for name, value in fields.items():
        if value is None:
            continue
        flt[name] = {"$eq": value} if name == lead else {"$in": [value]}
    return _half_open(flt, "day", first_day, end_day, int)


async def rollup_sums(coll, flt: dict, fields: list[str], by: str | None = None) -> dict:
    """{group: {field: sum}} over the matching rollup documents (group None
    when `by` is None): one aggregation in SQL, one row per group.

    nx-27017 deviation: `$sum` of a field no document has is null, not 0."""
    group: dict = {"_id": f"${by}" if by else None}
    for f in fields:
        group[f] = {"$sum": f"${f}"}
    rows = await (await coll.aggregate([{"$match": flt}, {"$group": group}])).to_list(None)
    return {r["_id"]: {f: int(r.get(f) or 0) for f in fields} for r in rows}


def _half_open(flt: dict, field: str, lo, hi, kind) -> dict:
    """`flt` with lo <= field < hi where either end is given."""
    rng = {}
    if lo is not None:
        rng["$gte"] = kind(lo)
    if hi is not None:
        rng["$lt"] = kind(hi)
    if rng:
        flt[field] = rng
    return flt
