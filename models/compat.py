"""Where the embedded server is not MongoDB: found by behaviour, routed around.

Each deviation is probed once when the store starts, against the server
actually running (a scratch collection, dropped after), so an upgrade that
fixes one takes the direct path and an upgrade that breaks one is caught by
tests/models/test_store_fidelity.py, which pins every shape the relay uses and
each deviation below as the exact wrong answer (a strict xfail: a fix
fails the suite too, so the route around it is revisited).

Deviations of nx-27017 0.8 (SecantusDB 0.7 has none of these):
- integer `_id`s sort as text (descending 1..25 gives 9, 8, 7, ...):
  `find_page` sorts such pages itself;
- `$or` beside other fields loses its grouping and can match (and update)
  another document: filters are built with `all_of` (models/store.py);
- a dotted projection comes back flat ({"a.b": 1}): nothing projects a
  dotted field, documents are read whole or by top-level field;
- a boolean written by `$set` reads back as 1 or 0: code that reads such a
  field uses bool(); equality filters on it match on both servers;
- a duplicate key error lacks "E11000" in its text: errors are matched by
  code (11000), never by text;
- equality on an indexed array field finds nothing: such fields get no
  index (notify/events.py);
- replace_one(upsert=True) ignores the filter's `_id` and inserts under a
  new ObjectId: models/responses.py upserts with `$set` instead;
- find_one_and_update with `$in` beside a range on integer `_id`s changes
  nothing: not used;
- `_id` 1 and "1" are the same key: no collection mixes id types;
- `$exists: true` misses a field that holds null: leases and markers never
  hold null;
- `$sum` of a field no document has is null, not 0: totals read int(x or 0);
- `$not` and `$toDate` are not implemented: not used;
- index names differ ("idx_<coll>_<field>" for "<field>_1"): never used by name.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quirks:
    int_id_sorts_as_text: bool = False


async def probe(db) -> Quirks:
    """Measure the deviations that need a different code path."""
    coll = db["_compat_probe"]
    try:
        await coll.delete_many({})
        await coll.insert_many([{"_id": 9}, {"_id": 10}])
        first = await coll.find({}, {"_id": 1}).sort("_id", -1).limit(1).to_list(1)
        return Quirks(int_id_sorts_as_text=bool(first) and first[0]["_id"] != 10)
    finally:
        await coll.drop()


async def find_page(coll, flt: dict, sort: str, direction: int, skip: int, limit: int,
                    quirks: Quirks) -> list[dict]:
    """One page of `coll.find(flt)` in `sort` order (direction 1 or -1).

    With integer `_id`s on a server that sorts them as text, the ids are
    sorted here (only the ids travel) and the page is read by `$in`.
    """
    if sort != "_id" or not quirks.int_id_sorts_as_text:
        return await coll.find(flt).sort(sort, direction).skip(skip).limit(limit).to_list(limit)
    ids = [d["_id"] async for d in coll.find(flt, {"_id": 1})]
    ids.sort(key=_id_order, reverse=direction < 0)
    page = ids[skip:skip + limit]
    if not page:
        return []
    docs = {d["_id"]: d async for d in coll.find({"_id": {"$in": page}})}
    return [docs[i] for i in page if i in docs]


def _id_order(value):
    # MongoDB's order across types: numbers before strings.
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def sort_by_id(docs: list[dict], direction: int = 1) -> list[dict]:
    """A whole result in `_id` order (for reads that take everything)."""
    return sorted(docs, key=lambda d: _id_order(d["_id"]), reverse=direction < 0)
