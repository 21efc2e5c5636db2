"""Fidelity: every query, update, projection, index and aggregation shape the
relay uses (models/, relay/, notify/, handlers/, console/), against what
MongoDB's documentation says the result is.

It runs against whatever `mongo_url` is (RELAY_TEST_MONGO_URL, else the
embedded default), through the same async driver the relay uses.  A shape
the embedded server gets wrong has two tests: the raw shape (expected to
fail where models/compat.py's probe says the server deviates; with
RELAY_FIDELITY_RAW=1 it must pass, which is how bench/store.py counts a
server's deviations) and the shape as models/ routes it, which must pass
everywhere.  An upgrade of a server that breaks a shape we use fails here.

Known deviations are listed per server in KNOWN with the exact wrong answer
the server gives.  There the raw test is xfail(strict=True): it must fail in
exactly that way (any other wrong answer is a plain failure), and an upgrade
that fixes the deviation makes it pass, which fails the run, so that the
route around it in models/ is revisited.
"""
import asyncio
import os
import uuid
from typing import Any, NamedTuple

import pytest
from pymongo import AsyncMongoClient, MongoClient, ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from models.compat import find_page, probe, sort_by_id
from models.store import (DUPLICATE_KEY, INDEXES, all_of, count_matching, insert_capped,
                          insert_records)

RAW = os.environ.get("RELAY_FIDELITY_RAW") == "1"


class Known(NamedTuple):
    what: str          # the deviation, and what models/ does about it
    gives: Any         # the server's answer where MongoDB's documentation says `want`


# nx-27017 0.8 (models/compat.py names each deviation where it is routed around).
KNOWN: dict[str, dict[str, Known]] = {"nx-27017": {
    "test_int_and_str_id_of_the_same_text_are_two_documents": Known(
        "_id 1 and '1' collide: no collection mixes id types", False),
    "test_boolean_set_reads_back_as_a_boolean": Known(
        "a boolean written by $set reads back as 1: code reads such fields with bool()",
        ("int", 1)),
    "test_exists_true_on_a_null_field": Known(
        "$exists: true misses a field holding null: leases and markers never hold null", []),
    "test_dotted_projection_is_nested": Known(
        "a dotted projection comes back flat: nothing projects a dotted field",
        {"_id": 1, "a.b": 1}),
    "test_or_beside_other_fields_raw": Known(
        "$or beside other fields updates another document: filters go through all_of()",
        (1, [3])),
    "test_int_id_sort_raw": Known(
        "integer _id sorts as text: listings go through Store.page() / sort_by_id()",
        [9, 8, 7, 6, 5]),
    "test_find_one_and_update_by_in_on_int_ids": Known(
        "find_one_and_update with $in beside a range on integer ids changes nothing and "
        "returns the document as it was: no such shape is used",
        {"_id": 0, "status": "pending"}),
    "test_duplicate_key_is_code_11000": Known(
        "duplicate key text lacks E11000: matched by code 11000 (models/store.py)", False),
    "test_every_index_we_create": Known(
        "index names differ (idx_<coll>_<field>): never used by name", False),
    "test_equality_on_an_indexed_array_field": Known(
        "equality on an indexed array field finds nothing: event_types has no index", []),
    "test_sum_of_a_missing_field_is_zero": Known(
        "$sum of a field no document has is null: totals read it as int(x or 0)",
        [{"_id": None, "unpaid": None}]),
    "test_set_keeps_every_digit_of_a_double": Known(
        "a double written by $set reads back rounded to 15 significant digits (insert keeps "
        "them): no filter compares such a double (the sign-in throttle compares an integer "
        "version)", (1795690033.79062, 0)),
    "test_replace_one_upsert_takes_the_filters_id": Known(
        "replace_one(upsert=True) ignores the filter's _id and inserts under a new "
        "ObjectId: models/responses.py upserts with $set", False),
}}


class KnownDeviation(Exception):
    """The server answered exactly as KNOWN says it does."""


@pytest.fixture(scope="session")
def server(mongo_url) -> str:
    """Which server `mongo_url` is: nx-27017, secantus or mongodb."""
    client = MongoClient(mongo_url, serverSelectionTimeoutMS=10000)
    try:
        info = client.admin.command("buildInfo")
    finally:
        client.close()
    if info.get("process") == "nx_27017":
        return "nx-27017"
    return "secantus" if "secantusVersion" in info else "mongodb"


@pytest.fixture
def expect(request, server):
    """expect(got, want): MongoDB's documented answer `want`.  On a server
    with a KNOWN deviation for this test, the test is a strict xfail that
    only the pinned wrong answer satisfies."""
    known = KNOWN.get(server, {}).get(request.node.name)
    if known is not None and not RAW:
        request.applymarker(pytest.mark.xfail(strict=True, raises=KnownDeviation,
                                              reason=f"{server}: {known.what}"))

    def check(got, want):
        if got != want and known is not None and got == known.gives:
            raise KnownDeviation(f"{known.what}: {got!r}")
        assert got == want
    return check


@pytest.fixture
def db(mongo_url):
    """A fresh database name per test (case() gives it an async client)."""
    return mongo_url, "fid_" + uuid.uuid4().hex[:8]


def case(mongo_url_name, body):
    """Run `body(db)` on a fresh database with a fresh client."""
    mongo_url, name = mongo_url_name

    async def go():
        client = AsyncMongoClient(mongo_url, tz_aware=False)
        try:
            return await body(client[name])
        finally:
            await client.drop_database(name)
            await client.close()
    return asyncio.run(go())


async def ints(db, n=25, **extra):
    await db.c.insert_many([{"_id": i, "n": i, "g": "a" if i % 2 else "b", **extra}
                            for i in range(1, n + 1)])
    return db.c


# ---- reads ------------------------------------------------------------------
def test_find_one_by_int_and_str_id(db):
    async def body(db):
        await db.c.insert_many([{"_id": 1, "v": "int"}, {"_id": "a", "v": "str"}])
        assert (await db.c.find_one({"_id": 1}))["v"] == "int"
        assert (await db.c.find_one({"_id": "a"}))["v"] == "str"
        assert await db.c.find_one({"_id": 2}) is None
    case(db, body)


def test_int_and_str_id_of_the_same_text_are_two_documents(db, expect):
    async def body(db):
        await db.c.insert_one({"_id": 1})
        try:
            await db.c.insert_one({"_id": "1"})
        except DuplicateKeyError:
            return False
        return True
    expect(case(db, body), True)


def test_in_on_int_ids_with_another_field(db):
    async def body(db):
        c = await ints(db)
        got = sorted([d["_id"] async for d in c.find({"_id": {"$in": [2, 3, 4, 30]}, "g": "b"})])
        assert got == [2, 4]
        assert await c.count_documents({"_id": {"$in": [3, 5]}, "g": "a"}) == 2
    case(db, body)


def test_ranges_on_floats_and_in_on_strings(db):
    async def body(db):
        await db.c.insert_many([{"_id": i, "ts": i + 0.5, "status": s}
                                for i, s in enumerate(["pending", "sending", "sent", "failed"])])
        assert [d["_id"] async for d in db.c.find({"ts": {"$gt": 1.5}}).sort("ts", 1)] == [2, 3]
        assert await db.c.count_documents({"ts": {"$gte": 1.5, "$lt": 3.5}}) == 2
        assert await db.c.count_documents({"status": {"$in": ["pending", "sending"]},
                                           "ts": {"$lte": 1.5}}) == 2
    case(db, body)


def test_equality_on_booleans_inserted_and_set(db):
    async def body(db):
        await db.c.insert_many([{"_id": 1, "done": False}, {"_id": 2, "done": True}])
        await db.c.update_one({"_id": 3}, {"$set": {"done": False}}, upsert=True)
        await db.c.update_one({"_id": 2}, {"$set": {"done": False}})
        assert sorted([d["_id"] async for d in db.c.find({"done": False})]) == [1, 2, 3]
        assert await db.c.count_documents({"done": True}) == 0
        # reading one back: what code may rely on is its truth value
        assert not (await db.c.find_one({"_id": 2}))["done"]
    case(db, body)


def test_boolean_set_reads_back_as_a_boolean(db, expect):
    async def body(db):
        await db.c.insert_one({"_id": 1})
        await db.c.update_one({"_id": 1}, {"$set": {"dead": True}})
        return (await db.c.find_one({"_id": 1}))["dead"]
    got = case(db, body)
    expect((type(got).__name__, got), ("bool", True))   # 1 == True in Python


def test_exists_and_equality_on_dotted_fields(db):
    async def body(db):
        await db.c.insert_many([{"_id": 1, "leases": {"p1": 5, "p2": 0}},
                                {"_id": 2, "leases": {"p2": 7}},
                                {"_id": 3, "leases": {"p1": None}},
                                {"_id": 4}])
        assert sorted([d["_id"] async for d in db.c.find({"leases.p2": {"$exists": True}})]) == [1, 2]
        assert sorted([d["_id"] async for d in db.c.find({"leases.p2": {"$exists": False}})]) == \
            [3, 4]
        assert [d["_id"] async for d in db.c.find({"leases.p1": 5})] == [1]
        assert await db.c.count_documents({"leases.p2": {"$lt": 5}}) == 1
    case(db, body)


def test_exists_true_on_a_null_field(db, expect):
    async def body(db):
        await db.c.insert_many([{"_id": 1, "v": None}, {"_id": 2}])
        return [d["_id"] async for d in db.c.find({"v": {"$exists": True}})]
    expect(case(db, body), [1])


def test_top_level_projection(db):
    async def body(db):
        await db.c.insert_one({"_id": 1, "username": "u", "email": "e", "leases": {"p": 1}})
        assert await db.c.find_one({"_id": 1}, {"username": 1}) == {"_id": 1, "username": "u"}
        assert await db.c.find_one({"_id": 1}, {"leases": 1}) == {"_id": 1, "leases": {"p": 1}}
        assert await db.c.find_one({"_id": 1}, {"_id": 1}) == {"_id": 1}
        # Billing.balance: the figures a balance is shown from (relay/money/shown.py).
        await db.c.insert_one({"_id": 2, "quota": 5, "used_quota": 7, "name": "k",
                               "leases": {"p": 1, "q": 2}, "applied": {"p": 9}})
        assert await db.c.find_one({"_id": 2}, {"quota": 1, "used_quota": 1, "leases": 1,
                                                "applied": 1}) == {
            "_id": 2, "quota": 5, "used_quota": 7, "leases": {"p": 1, "q": 2}, "applied": {"p": 9}}
    case(db, body)


def test_dotted_projection_is_nested(db, expect):
    async def body(db):
        await db.c.insert_one({"_id": 1, "a": {"b": 1, "c": 2}})
        return await db.c.find_one({"_id": 1}, {"a.b": 1})
    expect(case(db, body), {"_id": 1, "a": {"b": 1}})


def test_or_beside_other_fields_raw(db, expect):
    async def body(db):
        c = await ints(db, 5)
        await c.update_one({"_id": 3}, {"$set": {"m": 4}})
        r = await c.update_one({"_id": 4, "$or": [{"m": {"$exists": False}}, {"m": {"$lt": 5}}]},
                               {"$set": {"hit": 1}})
        return r.matched_count, [d["_id"] async for d in c.find({"hit": 1})]
    expect(case(db, body), (1, [4]))


def test_or_inside_and_as_models_builds_it(db):
    async def body(db):
        c = await ints(db, 5)
        await c.update_one({"_id": 3}, {"$set": {"m": 4}})
        flt = all_of({"_id": 4}, {"$or": [{"m": {"$exists": False}}, {"m": {"$lt": 5}}]},
                     {"n": {"$exists": True}})
        r = await c.update_one(flt, {"$set": {"hit": 1}})
        assert r.matched_count == 1
        assert [d["_id"] async for d in c.find({"hit": 1})] == [4]
        flt = all_of({"_id": 3}, {"$or": [{"m": {"$exists": False}}, {"m": {"$lt": 4}}]})
        assert (await c.update_one(flt, {"$set": {"hit": 2}})).matched_count == 0
        assert all_of({"_id": 1}) == {"_id": 1}
    case(db, body)


def test_ne(db):
    async def body(db):
        c = await ints(db, 6)
        assert sorted([d["_id"] async for d in c.find({"g": {"$ne": "a"}})]) == [2, 4, 6]
    case(db, body)


# ---- sorting and pages ----------------------------------------------------
def test_int_id_sort_raw(db, expect, server):
    async def body(db):
        c = await ints(db)
        return ([d["_id"] async for d in c.find({}).sort("_id", -1).limit(5)],
                await probe(db))
    got, quirks = case(db, body)
    # models/compat.py's probe (which picks the path at start) agrees with the pin
    assert quirks.int_id_sorts_as_text == ("test_int_id_sort_raw" in KNOWN.get(server, {}))
    expect(got, [25, 24, 23, 22, 21])


def test_int_id_pages_as_models_reads_them(db):
    async def body(db):
        c = await ints(db)
        quirks = await probe(db)
        assert [d["_id"] for d in await find_page(c, {}, "_id", -1, 0, 5, quirks)] == \
            [25, 24, 23, 22, 21]
        assert [d["_id"] for d in await find_page(c, {"g": "a"}, "_id", -1, 2, 4, quirks)] == \
            [21, 19, 17, 15]
        assert [d["_id"] for d in await find_page(c, {}, "_id", 1, 8, 3, quirks)] == [9, 10, 11]
        assert await find_page(c, {"g": "zz"}, "_id", -1, 0, 5, quirks) == []
        assert [d["n"] for d in await find_page(c, {}, "n", -1, 0, 3, quirks)] == [25, 24, 23]
        assert [d["_id"] for d in sort_by_id(await c.find({}).to_list(None))][:11] == \
            list(range(1, 12))
    case(db, body)


def test_sort_by_float_desc_with_skip_and_limit(db):
    async def body(db):
        await db.c.insert_many([{"_id": f"r{i}", "created_at": 1000.0 + i * 1.5}
                                for i in range(12)])
        got = [d["_id"] async for d in db.c.find({}).sort("created_at", -1).skip(2).limit(3)]
        assert got == ["r9", "r8", "r7"]
    case(db, body)


def test_sort_by_string_id(db):
    async def body(db):
        await db.c.insert_many([{"_id": n} for n in ["vip", "default", "svip", "a@b"]])
        assert [d["_id"] async for d in db.c.find({}).sort("_id", 1)] == \
            ["a@b", "default", "svip", "vip"]
    case(db, body)


# ---- updates ------------------------------------------------------------------
def test_conditional_lease_update(db):
    async def body(db):
        await db.users.insert_one({"_id": 7, "quota": 100, "used_quota": 0})
        doc = await db.users.find_one_and_update(
            {"_id": 7, "quota": {"$gte": 60}}, {"$inc": {"quota": -60, "leases.p1": 60}},
            return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 40 and doc["leases"] == {"p1": 60}
        assert await db.users.find_one_and_update(
            {"_id": 7, "quota": {"$gte": 60}}, {"$inc": {"quota": -60}},
            return_document=ReturnDocument.AFTER) is None
        doc = await db.users.find_one_and_update(
            {"_id": 7, "quota": 40}, {"$inc": {"quota": -40, "leases.p1": 40}},
            return_document=True)
        assert doc["quota"] == 0 and doc["leases"]["p1"] == 100
    case(db, body)


def test_claim_of_a_stale_process_and_a_heartbeat_after_it(db):
    """relay/money/processes.py: a stale process is claimed (heartbeat -1)
    only while still stale, and its own heartbeat no longer matches then."""
    async def body(db):
        await db.processes.insert_one({"_id": "A", "dead": False, "heartbeat": 1000.5})
        stale = {"_id": "A", "dead": False, "heartbeat": {"$lt": 2000.25}}
        assert (await db.processes.update_one(stale, {"$set": {"heartbeat": -1.0}})).matched_count
        beat = {"_id": "A", "dead": False, "heartbeat": {"$gte": 0}}
        assert not (await db.processes.update_one(beat, {"$set": {"heartbeat": 3000.5}})
                    ).matched_count
        # Claimed, its reclaimer gone: still stale, so the next pass takes it over.
        assert (await db.processes.update_one(stale, {"$set": {"heartbeat": -1.0}})).matched_count
        await db.processes.update_one({"_id": "A"}, {"$set": {"heartbeat": 0}})
        assert (await db.processes.update_one(beat, {"$set": {"heartbeat": 3000.5}})).matched_count
        assert not (await db.processes.update_one(stale, {"$set": {"heartbeat": -1.0}})
                    ).matched_count
    case(db, body)


def test_apply_marker_update_and_unset(db):
    """The shapes of relay/money/leases.py: apply once per marker, return a lease."""
    async def body(db):
        await db.u.insert_one({"_id": 1, "quota": 0, "used_quota": 0, "leases": {"p": 100}})
        upd = {"$inc": {"leases.p": -30, "used_quota": 30}, "$set": {"applied.p": 3}}
        first = {"_id": 1, "applied.p": {"$exists": False}, "leases.p": {"$exists": True}}
        later = {"_id": 1, "applied.p": {"$lt": 1}, "leases.p": {"$exists": True}}
        assert (await db.u.update_one(later, upd)).matched_count == 0
        assert (await db.u.update_one(first, upd)).matched_count == 1
        assert (await db.u.update_one(first, upd)).matched_count == 0
        assert (await db.u.update_one(later, upd)).matched_count == 0
        gone = {"_id": 1, "applied.p": {"$lt": 4}, "leases.p": {"$exists": False}}
        assert (await db.u.update_one(gone, upd)).matched_count == 0
        assert (await db.u.update_one(all_of({"_id": 1}, {"applied.p": 3}),
                                      {"$set": {"applied.p": 4}})).matched_count == 1
        r = await db.u.update_one({"_id": 1, "leases.p": 70},
                                  {"$inc": {"quota": 70}, "$unset": {"leases.p": "", "applied.p": ""}})
        assert r.matched_count == 1
        doc = await db.u.find_one({"_id": 1})
        assert doc["quota"] == 70 and doc["used_quota"] == 30
        assert "p" not in (doc.get("leases") or {}) and "p" not in (doc.get("applied") or {})
    case(db, body)


def test_max_set_and_upserts(db):
    async def body(db):
        await db.c.update_one({"_id": "p"}, {"$set": {"heartbeat": 5.0, "dead": False},
                                             "$min": {"started_at": 4.0}}, upsert=True)
        await db.c.update_one({"_id": "p"}, {"$set": {"heartbeat": 6.0},
                                             "$min": {"started_at": 6.0}}, upsert=True)
        assert (await db.c.find_one({"_id": "p"}))["started_at"] == 4.0
        await db.c.update_one({"_id": "p"}, {"$set": {"heartbeat": 5.0}})
        await db.c.update_one({"_id": "p"}, {"$max": {"applied_upto": 7, "flushed_at": 2.0}})
        await db.c.update_one({"_id": "p"}, {"$max": {"applied_upto": 3}})
        doc = await db.c.find_one({"_id": "p"})
        assert doc["applied_upto"] == 7 and doc["heartbeat"] == 5.0
        r = await db.c.update_one({"_id": "q", "dead": False}, {"$set": {"x": 1}})
        assert r.matched_count == 0 and await db.c.find_one({"_id": "q"}) is None
        doc = await db.counters.find_one_and_update({"_id": "users"}, {"$inc": {"seq": 1}},
                                                    upsert=True, return_document=True)
        assert doc["seq"] == 1
        await db.c.replace_one({"_id": "gpt@"}, {"_id": "gpt@", "v": 1}, upsert=True)
        await db.c.replace_one({"_id": "gpt@"}, {"_id": "gpt@", "v": 2}, upsert=True)
        assert (await db.c.find_one({"_id": "gpt@"}))["v"] == 2
    case(db, body)


def test_update_many_and_delete_many(db):
    async def body(db):
        c = await ints(db, 12)
        r = await c.update_many({"_id": {"$in": [3, 4, 10]}}, {"$set": {"m": 1}})
        assert r.modified_count == 3
        assert sorted([d["_id"] async for d in c.find({"m": 1})]) == [3, 4, 10]
        r = await c.delete_many({"_id": {"$in": [10, 11]}})
        assert r.deleted_count == 2
        assert sorted([d["_id"] async for d in c.find({"_id": {"$gte": 9}})]) == [9, 12]
        r = await c.delete_many({"n": {"$lt": 3}})
        assert r.deleted_count == 2
        assert await c.count_documents({}) == 8
    case(db, body)


def test_first_claim_with_find_one_and_update(db):
    """notify/outbox.py claims the first due item atomically (string ids)."""
    async def body(db):
        await db.o.insert_many([{"_id": f"e|{i}", "status": "pending", "next_at": float(i)}
                                for i in range(3)])
        got = await db.o.find_one_and_update(
            {"status": {"$in": ["pending", "sending"]}, "next_at": {"$lte": 1.0}},
            {"$set": {"status": "sending"}, "$inc": {"attempts": 1}},
            sort=[("next_at", 1)], return_document=ReturnDocument.AFTER)
        assert got == {"_id": "e|0", "status": "sending", "next_at": 0.0, "attempts": 1}
        assert await db.o.count_documents({"status": "sending"}) == 1
    case(db, body)


def test_find_one_and_update_by_in_on_int_ids(db, expect):
    async def body(db):
        await db.o.insert_many([{"_id": i, "status": "pending"} for i in range(3)])
        return await db.o.find_one_and_update(
            {"status": {"$in": ["pending"]}, "_id": {"$lte": 1}}, {"$set": {"status": "x"}},
            sort=[("_id", 1)], return_document=ReturnDocument.AFTER)
    expect(case(db, body), {"_id": 0, "status": "x"})


# ---- writes that may collide ------------------------------------------------------
def test_duplicate_key_is_code_11000(db, expect):
    async def body(db):
        await db.c.create_index([("key", 1)], unique=True)
        await db.c.insert_one({"_id": 1, "key": "a"})
        with pytest.raises(DuplicateKeyError) as e1:
            await db.c.insert_one({"_id": 1, "key": "b"})
        with pytest.raises(DuplicateKeyError) as e2:
            await db.c.insert_one({"_id": 2, "key": "a"})
        assert e1.value.code == DUPLICATE_KEY and e2.value.code == DUPLICATE_KEY
        return str(e1.value)
    expect("E11000" in case(db, body), True)


def test_insert_many_unordered_with_duplicates(db):
    async def body(db):
        await db.u.insert_one({"_id": "a"})
        with pytest.raises(BulkWriteError) as exc:
            await db.u.insert_many([{"_id": "a"}, {"_id": "b"}, {"_id": "c"}], ordered=False)
        assert [e["code"] for e in exc.value.details["writeErrors"]] == [DUPLICATE_KEY]
        assert sorted([d["_id"] async for d in db.u.find({})]) == ["a", "b", "c"]
        # as the journal writes a batch again: duplicates are written already
        assert await insert_records(db.u, [{"_id": "c"}, {"_id": "d"}]) == 1
        assert await db.u.count_documents({}) == 4
    case(db, body)


# ---- indexes ------------------------------------------------------------------------
def test_every_index_we_create(db, expect):
    async def body(db):
        for coll, specs in INDEXES.items():
            for keys, opts in specs:
                await db[coll].create_index(keys, **opts)
                await db[coll].create_index(keys, **opts)   # idempotent
        await db.users.insert_one({"_id": 1, "username": "x"})
        with pytest.raises(DuplicateKeyError):
            await db.users.insert_one({"_id": 2, "username": "x"})
        names = [i["name"] async for i in await db.users.list_indexes()]
        return names
    expect("username_1" in case(db, body), True)


def test_equality_on_an_indexed_array_field(db, expect):
    async def body(db):
        await db.s.create_index([("event_types", 1)])
        await db.s.insert_many([{"_id": 1, "event_types": ["a", "b"]}, {"_id": 2,
                                                                       "event_types": ["c"]}])
        return [d["_id"] async for d in db.s.find({"event_types": "a"})]
    expect(case(db, body), [1])


def test_equality_on_an_array_field_without_index(db):
    async def body(db):
        await db.s.insert_many([{"_id": 1, "event_types": ["a", "b"], "user_id": 3},
                                {"_id": 2, "event_types": ["c"], "user_id": 3}])
        assert [d["_id"] async for d in db.s.find({"event_types": "a", "user_id": 3})] == [1]
        assert [d["_id"] async for d in db.s.find({"event_types": {"$in": ["c", "z"]}})] == [2]
    case(db, body)


# ---- aggregation ----------------------------------------------------------------------
def test_group_sums_as_the_log_totals_use_them(db):
    async def body(db):
        await db.usage.insert_many([
            {"_id": f"r{i}", "user_id": 1 + i % 2, "model": "m" + str(i % 3), "quota": i * 10,
             "cost": i * 11, "unpaid": i, "prompt_tokens": i, "created_at": 100.0 + i}
            for i in range(10)])
        rows = await (await db.usage.aggregate([
            {"$match": {"user_id": 1, "created_at": {"$gte": 100.0, "$lt": 109.0}}},
            {"$group": {"_id": None, "quota": {"$sum": "$quota"}, "requests": {"$sum": 1},
                        "cost": {"$sum": "$cost"}, "unpaid": {"$sum": "$unpaid"}}}])).to_list(1)
        assert rows == [{"_id": None, "quota": 200, "requests": 5, "cost": 220, "unpaid": 20}]
        rows = await (await db.usage.aggregate([
            {"$match": {"created_at": {"$gte": 100.0}}},
            {"$group": {"_id": "$model", "quota": {"$sum": "$quota"}, "requests": {"$sum": 1}}}
        ])).to_list(None)
        assert sorted((r["_id"], r["quota"], r["requests"]) for r in rows) == \
            [("m0", 180, 4), ("m1", 120, 3), ("m2", 150, 3)]
        assert await (await db.usage.aggregate([{"$match": {"user_id": 9}}, {"$group": {
            "_id": None, "quota": {"$sum": "$quota"}}}])).to_list(1) == []
    case(db, body)


def test_records_of_a_process_since_a_time(db):
    """The reclaim pass: a dead process's records made since a time."""
    async def body(db):
        await db.usage.create_index([("created_at", -1)])
        await db.usage.insert_many([{"_id": f"{p}{s}", "proc": p, "seq": s, "created_at": 100.0 + s}
                                    for p in ("a", "b") for s in (12, 3, 10, 2, 11)])
        got = sorted([d["seq"] async for d in db.usage.find(
            {"proc": "a", "created_at": {"$gte": 110.0}})])
        assert got == [10, 11, 12]
    case(db, body)


def test_sum_of_a_missing_field_is_zero(db, expect):
    async def body(db):
        await db.usage.insert_many([{"_id": "a", "quota": 1}, {"_id": "b", "quota": 2}])
        return await (await db.usage.aggregate([{"$group": {
            "_id": None, "unpaid": {"$sum": "$unpaid"}}}])).to_list(1)
    expect(case(db, body), [{"_id": None, "unpaid": 0}])


def test_sum_of_a_field_some_records_lack(db):
    """Usage records are stored compactly (relay/money/usage.py stored()): a zero
    `unpaid` or token detail is left out, so totals sum over a mix."""
    async def body(db):
        await db.usage.insert_many([{"_id": "a", "quota": 1, "unpaid": 5}, {"_id": "b", "quota": 2},
                                    {"_id": "c", "quota": 3, "unpaid": 7}])
        rows = await (await db.usage.aggregate([{"$group": {
            "_id": None, "quota": {"$sum": "$quota"}, "unpaid": {"$sum": "$unpaid"}}}])).to_list(1)
        assert rows == [{"_id": None, "quota": 6, "unpaid": 12}]
        got = sorted([d["_id"] async for d in db.usage.find({"unpaid": {"$gt": 0}})])
        assert got == ["a", "c"]
    case(db, body)


# ---- shapes added with stored responses and rate limits ------------------------
def test_replace_one_upsert_takes_the_filters_id(db, expect):
    async def body(db):
        await db.r.replace_one({"_id": "resp_a"}, {"v": 1}, upsert=True)
        await db.r.replace_one({"_id": "resp_a"}, {"v": 2}, upsert=True)
        return await db.r.find({}).to_list(None) == [{"_id": "resp_a", "v": 2}]
    expect(case(db, body), True)


def test_upsert_by_string_id_with_set_as_stored_responses_use_it(db):
    async def body(db):
        for v in (1, 2):
            await db.r.update_one({"_id": "resp_a"}, {"$set": {"v": v, "token_id": 5}},
                                  upsert=True)
        assert await db.r.find({}).to_list(None) == [{"_id": "resp_a", "v": 2, "token_id": 5}]
        assert (await db.r.delete_one({"_id": "resp_a", "token_id": 6})).deleted_count == 0
        assert (await db.r.delete_one({"_id": "resp_a", "token_id": 5})).deleted_count == 1
    case(db, body)


def test_limit_permit_shapes(db):
    """relay/money/limits.py: a pool per limit and minute, leased by process, and a
    dead process's concurrency slots given back (string _ids, dotted counts)."""
    async def body(db):
        c = db.limits
        await c.insert_many([{"_id": "token:1:rpm:100", "left": 10, "limit": 10, "held": {},
                              "exp": 102 * 60},
                             {"_id": "token:1:concurrency", "left": 4, "limit": 4, "held": {}}])
        doc = await c.find_one_and_update({"_id": "token:1:concurrency", "left": {"$gte": 3}},
                                          {"$inc": {"left": -3, "held.p1": 3}},
                                          return_document=ReturnDocument.AFTER)
        assert doc["left"] == 1 and doc["held"] == {"p1": 3}
        assert await c.find_one_and_update({"_id": "token:1:concurrency", "left": {"$gte": 2}},
                                           {"$inc": {"left": -2}}) is None
        await c.update_one({"_id": "token:1:rpm:100"}, {"$inc": {"left": -2, "held.p1": 2},
                                                        "$set": {"want": True}})
        wanted = [d["_id"] async for d in c.find(
            {"_id": {"$in": ["token:1:rpm:100", "token:1:concurrency"]}, "want": True},
            {"_id": 1})]
        assert wanted == ["token:1:rpm:100"]
        await c.update_one({"_id": "token:1:rpm:100"}, {"$unset": {"want": ""}})
        # the reclaim of p1: concurrency documents only (no `exp`), by its count
        dead = [d async for d in c.find({"held.p1": {"$exists": True}, "exp": {"$exists": False}})]
        assert [d["_id"] for d in dead] == ["token:1:concurrency"]
        r = await c.update_one({"_id": "token:1:concurrency", "held.p1": 3},
                               {"$inc": {"left": 3}, "$unset": {"held.p1": ""}})
        assert r.modified_count == 1
        assert await c.find_one({"_id": "token:1:concurrency"}) == {
            "_id": "token:1:concurrency", "left": 4, "limit": 4, "held": {}}
        assert (await c.delete_many({"exp": {"$lt": 103 * 60}})).deleted_count == 1
        assert await c.count_documents({}) == 1
    case(db, body)


def test_allow_list_migration_and_key_cap_shapes(db):
    """models/migrations.py finds keys without `allow_nets` (projected), and
    models/store.insert_capped counts a user's keys after inserting one
    (count_matching: the count command, equality as $eq)."""
    async def body(db):
        await db.tokens.insert_many([
            {"_id": 1, "user_id": 7, "allow_ips": "10.0.0.0/8"},
            {"_id": 2, "user_id": 7, "allow_ips": "", "allow_nets": {"n": 0, "v4": "", "v6": ""}},
            {"_id": 3, "user_id": 8, "allow_ips": ""}])
        old = [d async for d in db.tokens.find({"allow_nets": {"$exists": False}},
                                               {"_id": 1, "allow_ips": 1})]
        assert sorted(d["_id"] for d in old) == [1, 3]
        assert all(set(d) == {"_id", "allow_ips"} for d in old)
        await db.tokens.update_one({"_id": 1}, {"$set": {"allow_nets": {"n": 1, "v4": "0a00"}}})
        assert (await db.tokens.find_one({"_id": 1}))["allow_nets"] == {"n": 1, "v4": "0a00"}
        await db.tokens.create_index("user_id")
        assert await count_matching(db.tokens, {"user_id": 7}) == 2
        await db.tokens.insert_one({"_id": 4, "user_id": 7})
        assert await count_matching(db.tokens, {"user_id": 7}) == 3
        assert await count_matching(db.tokens, {"user_id": 9}) == 0
        # notify/subscriptions.py: are these keys all the user's?
        assert await count_matching(db.tokens, {"_id": {"$in": [1, 3, 4, 99]},
                                                "user_id": 7}) == 2
        await db.tokens.delete_one({"_id": 4})
        assert await count_matching(db.tokens, {"user_id": 7}) == 2
        assert await insert_capped(db.tokens, {"_id": 5, "user_id": 7}, {"user_id": 7}, 3)
        assert not await insert_capped(db.tokens, {"_id": 6, "user_id": 7}, {"user_id": 7}, 3)
        assert await db.tokens.find_one({"_id": 6}) is None
        assert await count_matching(db.tokens, {"user_id": 7}) == 3
    case(db, body)


def test_the_console_lists_count_by_the_count_command(db):
    """handlers/api_fields.paged and notify/service.py count a listing's
    total with count_matching: a search by a pattern in either of two
    fields ($or of $regex), a name pattern, a key's hash, everything; the
    outbox's deliveries of a subscription or a user; announcements of one
    kind.  The same totals the documents' own find gives."""
    async def body(db):
        await db.users.insert_many([
            {"_id": 1, "username": "alice", "email": "a@example.com"},
            {"_id": 2, "username": "bob", "email": "ALICE.b@example.com"},
            {"_id": 3, "username": "carol", "email": "c@example.com"}])
        rx = {"$regex": "alice", "$options": "i"}
        assert await count_matching(db.users, {"$or": [{"username": rx}, {"email": rx}]}) == 2
        assert await count_matching(db.users, {}) == 3
        assert await count_matching(db.users, {"username": {"$regex": "o", "$options": "i"}}) == 2
        await db.tokens.insert_many([{"_id": i, "user_id": 7 + i % 2, "key_hash": f"h{i}",
                                      "name": f"Key {i}"} for i in range(1, 6)])
        assert await count_matching(db.tokens, {"user_id": 7, "key_hash": "h2"}) == 1
        assert await count_matching(db.tokens, {"user_id": 8,
                                                "name": {"$regex": "KEY", "$options": "i"}}) == 3
        await db.notify_outbox.insert_many([
            {"_id": f"o{i}", "sub_id": "s1" if i < 4 else "s2", "user_id": 7,
             "created_at": 100.0 + i} for i in range(6)])
        assert await count_matching(db.notify_outbox, {"sub_id": "s1"}) == 4
        assert await count_matching(db.notify_outbox, {"user_id": 7}) == 6
        await db.announcements.insert_many([{"_id": 1, "kind": "announcement"},
                                            {"_id": 2, "kind": "marketing"}])
        assert await count_matching(db.announcements, {"kind": "announcement"}) == 1
    case(db, body)


def test_set_keeps_every_digit_of_a_double(db, expect):
    async def body(db):
        v = 1795690033.7906194  # a time.time()
        await db.c.insert_one({"_id": 1, "x": v})
        assert (await db.c.find_one({"_id": 1}))["x"] == v
        await db.c.update_one({"_id": 1}, {"$set": {"x": v}})
        return (await db.c.find_one({"_id": 1}))["x"], await db.c.count_documents({"x": v})
    expect(case(db, body), (1795690033.7906194, 1))


def test_sign_in_throttle_shapes(db):
    """handlers/login_throttle.py: a count claimed by its integer version
    (or by its absence), a racing first insert refused by code, the count
    given back, a wait moved on only if later; sparse unique keys on users (models/migrations.py)."""
    async def body(db):
        c = db.login_failures
        await c.insert_one({"_id": "acct:1", "n": 1, "last": 5.0, "until": 5.0, "v": 1})
        with pytest.raises(DuplicateKeyError):
            await c.insert_one({"_id": "acct:1", "n": 1, "last": 5.0, "until": 5.0, "v": 1})
        r = await c.update_one({"_id": "acct:1", "v": 1},
                               {"$set": {"n": 2, "last": 6.0, "until": 8.0, "v": 2}})
        assert r.matched_count == 1
        r = await c.update_one({"_id": "acct:1", "v": 1}, {"$set": {"n": 9}})
        assert r.matched_count == 0
        r = await c.update_one({"_id": "acct:1", "v": 2, "n": {"$gt": 0}},
                               {"$inc": {"n": -1, "v": 1}, "$set": {"until": 5.0}})
        assert r.matched_count == 1
        assert await c.find_one({"_id": "acct:1"}) == {"_id": "acct:1", "n": 1, "last": 6.0,
                                                       "until": 5.0, "v": 3}
        # A wrong password's wait from the answer: moved on only if later.
        r = await c.update_one({"_id": "acct:1", "until": {"$lt": 4.5}}, {"$set": {"until": 4.5}})
        assert r.matched_count == 0
        r = await c.update_one({"_id": "acct:1", "until": {"$lt": 7.25}},
                               {"$set": {"until": 7.25}})
        assert r.matched_count == 1 and (await c.find_one({"_id": "acct:1"}))["until"] == 7.25
        await c.insert_one({"_id": "ip:x", "n": 3, "last": 1.0, "until": 1.0})
        r = await c.update_one({"_id": "ip:x", "v": {"$exists": False}}, {"$set": {"v": 1}})
        assert r.matched_count == 1
        u = db.users
        await u.create_index([("name_key", 1)], unique=True, sparse=True)
        await u.create_index([("email_key", 1)], unique=True, sparse=True)
        await u.insert_many([{"_id": 1, "username": "alice"}, {"_id": 2, "username": "ALICE"},
                             {"_id": 3, "username": "bob"}])
        await u.update_one({"_id": 1}, {"$set": {"name_key": "alice", "email_key": "a@x"}})
        with pytest.raises(DuplicateKeyError):
            await u.update_one({"_id": 2}, {"$set": {"name_key": "alice"}})
        with pytest.raises(DuplicateKeyError):
            await u.update_one({"_id": 3}, {"$set": {"email_key": "a@x"}})
        await u.update_one({"_id": 2}, {"$set": {"name_key": "alice#2"}})
        assert (await u.find_one({"name_key": "alice"}))["_id"] == 1
        assert [d["_id"] async for d in u.find({"name_key": {"$exists": False}})] == [3]
        await u.update_one({"_id": 1}, {"$unset": {"email_key": ""}})
        await u.update_one({"_id": 3}, {"$set": {"email_key": "a@x"}})
        assert (await u.find_one({"email_key": "a@x"}))["_id"] == 3
    case(db, body)


def test_allowance_slot_shapes(db):
    """models/allowance.py: a free slot of a key claimed by $in on string ids
    beside a range, the slots read back, a racing insert refused by code;
    notify/contact.py: a confirmation counted by a conditional $inc."""
    async def body(db):
        c = db.allowances
        ids = [f"test-send:7#{i}" for i in range(3)]
        await c.insert_many([{"_id": ids[0], "until": 100.0}, {"_id": ids[1], "until": 50.0}])
        got = await c.find_one_and_update({"_id": {"$in": ids}, "until": {"$lte": 60.0}},
                                          {"$set": {"until": 3660.0}})
        assert got == {"_id": ids[1], "until": 50.0}
        assert await c.find_one_and_update({"_id": {"$in": ids}, "until": {"$lte": 60.0}},
                                           {"$set": {"until": 1.0}}) is None
        held = {d["_id"]: d["until"] async for d in c.find({"_id": {"$in": ids}})}
        assert held == {ids[0]: 100.0, ids[1]: 3660.0}
        await c.insert_one({"_id": ids[2], "until": 3700.0})
        with pytest.raises(DuplicateKeyError):
            await c.insert_one({"_id": ids[2], "until": 3700.0})
        u = db.users
        await u.insert_one({"_id": 1, "pending_email": "a@x", "email_code_tries": 0})
        for _ in range(2):
            doc = await u.find_one_and_update(
                {"_id": 1, "pending_email": {"$exists": True}, "email_code_tries": {"$lt": 2}},
                {"$inc": {"email_code_tries": 1}}, return_document=ReturnDocument.AFTER)
            assert doc is not None
        assert await u.find_one_and_update(
            {"_id": 1, "pending_email": {"$exists": True}, "email_code_tries": {"$lt": 2}},
            {"$inc": {"email_code_tries": 1}}) is None
        await u.update_one({"_id": 1}, {"$unset": {"pending_email": "", "email_code_tries": ""}})
        assert await u.find_one({"_id": 1}) == {"_id": 1}
    case(db, body)


def test_pruning_shapes(db):
    """models/housekeeping.py: the ids of expired records by an indexed
    range, a bounded batch of them, deleted by $in on ObjectIds and strings."""
    async def body(db):
        await db.invalidations.create_index([("ts", 1)])
        await db.invalidations.insert_many([{"kind": "token", "ts": float(i)} for i in range(10)])
        ids = [d["_id"] async for d in db.invalidations.find({"ts": {"$lt": 7.5}},
                                                             {"_id": 1}).limit(5)]
        assert len(ids) == 5
        assert (await db.invalidations.delete_many({"_id": {"$in": ids}})).deleted_count == 5
        left = sorted([d["ts"] async for d in db.invalidations.find({})])
        assert len(left) == 5 and all(t >= 0 for t in left)
        assert sum(1 for t in left if t < 7.5) == 3
        await db.login_failures.insert_many([{"_id": f"ip:{i}", "last": float(i)}
                                             for i in range(4)])
        ids = [d["_id"] async for d in db.login_failures.find({"last": {"$lt": 2.0}},
                                                              {"_id": 1}).limit(1000)]
        assert sorted(ids) == ["ip:0", "ip:1"]
        assert (await db.login_failures.delete_many({"_id": {"$in": ids}})).deleted_count == 2
        assert sorted([d["_id"] async for d in db.login_failures.find({})]) == ["ip:2", "ip:3"]
    case(db, body)


def test_lease_freeze_recall_and_forfeit_shapes(db):
    """relay/money/leases.py and recalls.py: a lease refused while a balance
    is frozen, a recall numbered by $inc, answers by $max on a dotted field,
    the change's compare-and-set with forfeit marks, a give-back refused
    where a mark is, and the marks unset."""
    async def body(db):
        u = db.users
        await u.insert_one({"_id": 3, "quota": 1000, "used_quota": 0,
                            "leases": {"A": 300, "B": 200}})
        lease = {"_id": 3, "quota": {"$gte": 100}, "lowering": {"$exists": False}}
        doc = await u.find_one_and_update(lease, {"$inc": {"quota": -100, "leases.A": 100}},
                                          return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 900 and doc["leases"] == {"A": 400, "B": 200}
        doc = await u.find_one_and_update({"_id": 3, "lowering": {"$exists": False}},
                                          {"$inc": {"recall": 1}, "$set": {"lowering": "t1"}},
                                          return_document=ReturnDocument.AFTER)
        assert doc["recall"] == 1 and doc["lowering"] == "t1"
        assert await u.find_one_and_update(lease, {"$inc": {"quota": -100}}) is None
        assert await u.find_one_and_update({"_id": 3, "lowering": {"$exists": False}},
                                           {"$set": {"lowering": "t2"}}) is None
        # A answers: gives back 150 and writes the number, in one update.
        unmarked = {"_id": 3, "forfeit.A": {"$exists": False}}
        doc = await u.find_one_and_update(
            unmarked, {"$inc": {"quota": 150, "leases.A": -150}, "$max": {"ack.A": 1}},
            return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 1050 and doc["leases"]["A"] == 250 and doc["ack"] == {"A": 1}
        await u.update_one({"_id": 3}, {"$max": {"ack.A": 0}})
        assert (await u.find_one({"_id": 3}))["ack"] == {"A": 1}
        # The change: conditional on the figure read and the freeze; B is late.
        assert await u.find_one_and_update({"_id": 3, "quota": 999, "lowering": "t1"},
                                           {"$set": {"quota": 0}}) is None
        doc = await u.find_one_and_update(
            {"_id": 3, "quota": 1050, "lowering": "t1"},
            {"$set": {"quota": 0, "forfeit.B": 1}}, return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 0 and doc["forfeit"] == {"B": 1}
        r = await u.update_one({"_id": 3, "lowering": "t1"}, {"$unset": {"lowering": ""}})
        assert r.modified_count == 1
        # B's give-back is refused where its mark is; it forfeits instead.
        assert await u.find_one_and_update({"_id": 3, "forfeit.B": {"$exists": False}},
                                           {"$inc": {"quota": 200, "leases.B": -200}}) is None
        doc = await u.find_one_and_update(
            {"_id": 3, "forfeit.B": 1},
            {"$inc": {"leases.B": -200}, "$unset": {"forfeit.B": ""}, "$max": {"ack.B": 1}},
            return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 0 and doc["leases"] == {"A": 250, "B": 0}
        assert doc["forfeit"] == {} and doc["ack"] == {"A": 1, "B": 1}
        # A tidies: lease and marks gone, only if no forfeit mark is there.
        doc = await u.find_one_and_update(
            {"_id": 3, "leases.A": 250, "forfeit.A": {"$exists": False}},
            {"$inc": {"quota": 250}, "$unset": {"leases.A": "", "applied.A": "", "ack.A": ""}},
            return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 250 and doc["leases"] == {"B": 0} and doc["ack"] == {"B": 1}
    case(db, body)


def test_recall_documents_and_read_back_shapes(db):
    """relay/money/recalls.py names each recall in a small collection, read
    whole and removed one by one; the flusher reads balances back by $in."""
    async def body(db):
        await db.recalls.insert_many([{"_id": "user:7:3"}, {"_id": "token:12:1"}])
        with pytest.raises(DuplicateKeyError):
            await db.recalls.insert_one({"_id": "user:7:3"})
        got = sorted(d["_id"] for d in await db.recalls.find({}).limit(1000).to_list(1000))
        assert got == ["token:12:1", "user:7:3"]
        assert (await db.recalls.delete_one({"_id": "user:7:3"})).deleted_count == 1
        assert (await db.recalls.delete_one({"_id": "user:7:3"})).deleted_count == 0
        await ints(db, 12)
        got = sorted([d["_id"] async for d in db.c.find({"_id": {"$in": [12, 3, 30, 7]}})])
        assert got == [3, 7, 12]
    case(db, body)


def test_budget_counter_shapes(db):
    """relay/money/budgets.py: one counter document per subject and period,
    named by a string _id with slashes; made by insert_one (a duplicate is
    another relay's, code 11000), leased and applied as users and tokens
    are, read back by $in on string ids, its id in a recall's name."""
    async def body(db):
        cid = "t7/day/2026-11-26"
        await db.budgets.insert_one({"_id": cid, "quota": 1000, "used_quota": 0, "limit": 1000,
                                     "user_id": 3, "token_id": 7, "period": "day"})
        with pytest.raises(DuplicateKeyError) as err:
            await db.budgets.insert_one({"_id": cid, "quota": 5})
        assert err.value.code == DUPLICATE_KEY
        doc = await db.budgets.find_one_and_update(
            {"_id": cid, "quota": {"$gte": 600}, "lowering": {"$exists": False}},
            {"$inc": {"quota": -600, "leases.p1": 600}}, return_document=ReturnDocument.AFTER)
        assert doc["quota"] == 400 and doc["leases"] == {"p1": 600}
        r = await db.budgets.update_one(
            {"_id": cid, "applied.p1": {"$exists": False}, "leases.p1": {"$exists": True}},
            {"$inc": {"leases.p1": -900, "used_quota": 900}, "$set": {"applied.p1": 4}})
        assert r.matched_count == 1
        await db.budgets.insert_one({"_id": "u3/month/2026-11-01", "quota": 0, "used_quota": 0})
        got = {d["_id"]: d async for d in db.budgets.find(
            {"_id": {"$in": [cid, "u3/month/2026-11-01", "u3/day/2026-11-26"]}})}
        assert set(got) == {cid, "u3/month/2026-11-01"}
        assert got[cid]["leases"] == {"p1": -300} and got[cid]["used_quota"] == 900
        await db.recalls.insert_one({"_id": f"budget:{cid}:1"})
        assert [d["_id"] async for d in db.recalls.find({})] == [f"budget:{cid}:1"]
    case(db, body)


def test_invalidation_log_shapes(db):
    """relay/catalog.py: one document, a counter and the last entries, moved
    by one update ($inc with $push, $each, $slice; upserted the first time);
    read by a top-level projection, then whole."""
    async def body(db):
        c = db.invalidations
        assert await c.find_one({"_id": "log"}, {"n": 1}) is None
        for i in range(5):
            entry = f'["token","h{i}","p"]'
            await c.update_one({"_id": "log"}, {"$inc": {"n": 1},
                                                "$push": {"log": {"$each": [entry], "$slice": -3}}},
                               upsert=True)
        assert await c.find_one({"_id": "log"}, {"n": 1}) == {"_id": "log", "n": 5}
        doc = await c.find_one({"_id": "log"})
        assert doc["n"] == 5
        assert doc["log"] == ['["token","h2","p"]', '["token","h3","p"]', '["token","h4","p"]']
    case(db, body)


def test_learned_facts_shapes(db):
    """models/learned.py (what channels refuse): upserts by string _id with
    $set, reads by an integer channel_id and whole, one fact deleted by _id
    plus channel_id, a channel's all, and the stale by a float `at`."""
    from types import SimpleNamespace

    from models.learned import LearnedStore

    async def body(db):
        s = LearnedStore(SimpleNamespace(db=db))
        a = await s.save(7, "wire", "", "chat", "Not Found", 100.5)
        await s.save(7, "wire", "", "chat", "Not Found", 200.5)  # the same fact, learnt again
        b = await s.save(7, "field", "m|x", "tools.*.input_examples", "extra", 150.0)
        await s.save(8, "beta", "m", "context-management-2025-06-27", "unexpected", 50.0)
        assert sorted(d["_id"] for d in await s.of_channel(7)) == sorted([a, b])
        assert [d["at"] for d in await s.of_channel(7) if d["_id"] == a] == [200.5]
        assert len(await s.all()) == 3
        assert await s.forget(7, "8|beta|m|context-management-2025-06-27") == 0
        assert await s.forget(7, b) == 1
        assert await s.prune(100.0) == 1  # channel 8's
        assert [d["_id"] for d in await s.all()] == [a]
        assert await s.forget(7) == 1 and await s.all() == []
    case(db, body)


def test_session_placement_shapes(db):
    """models/sessions.py (sticky sessions): bulk upserts by string _id with
    $set, find_one by string _id, delete_many by a float `at`."""
    from types import SimpleNamespace

    from models.sessions import SessionStore

    async def body(db):
        s = SessionStore(SimpleNamespace(db=db))
        await s.save([("a" * 32, 3, 10.5), ("b" * 32, 4, 20.0)])
        await s.save([("a" * 32, 5, 30.25)])  # moved
        assert await s.get("a" * 32) == (5, 30.25)
        assert await s.get("b" * 32) == (4, 20.0)
        assert await s.get("c" * 32) is None
        assert await s.prune(25.0) == 1
        assert await s.get("b" * 32) is None and await s.get("a" * 32) == (5, 30.25)
    case(db, body)


# ---- the usage log and its rollups (models/queries.py, relay/money/flusher.py) ----
def _log(n=12):
    return [{"_id": f"r{i:02d}", "user_id": 1 + i % 2, "token_id": 10 + i % 3,
             "model": "m" + str(i % 2), "channel_id": 5, "status": 429 if i % 4 == 0 else 200,
             "created_at": 100.0 + i // 2, "quota": i} for i in range(n)]


def test_usage_pages_by_time_with_ties_as_models_reads_them(db):
    from models.queries import Cursor, usage_chunks, usage_filter, usage_page

    async def body(db):
        docs = _log()
        await db.usage.insert_many(docs)
        order = sorted(docs, key=lambda d: (d["created_at"], d["_id"]), reverse=True)
        flt = usage_filter({"token_id": None, "user_id": 1, "model": None})
        want = [d["_id"] for d in order if d["user_id"] == 1]
        seen, cursor = [], None
        while True:
            page, more = await usage_page(db.usage, flt, 2, older=cursor)
            seen += [d["_id"] for d in page]
            if not more:
                break
            cursor = Cursor(page[-1]["created_at"], page[-1]["_id"])
        assert seen == want
        # and back: the page before the third record, newest first
        third = next(d for d in order if d["_id"] == want[3])
        page, more = await usage_page(db.usage, flt, 2,
                                      newer=Cursor(third["created_at"], third["_id"]))
        assert [d["_id"] for d in page] == want[1:3] and more
        got = [d["_id"] async for chunk in usage_chunks(db.usage, usage_filter({}), 5)
               for d in chunk]
        assert got == [d["_id"] for d in order]
        page, _ = await usage_page(db.usage, usage_filter({}), 3, skip=4)
        assert [d["_id"] for d in page] == [d["_id"] for d in order][4:7]
    case(db, body)


def test_usage_filters_eq_and_in_with_a_time_range(db):
    from models.queries import usage_filter

    async def body(db):
        await db.usage.insert_many(_log())
        flt = usage_filter({"token_id": 11, "user_id": 2, "model": "m1", "status": 200},
                           since=101.0, until=105.0)
        assert flt["token_id"] == {"$eq": 11} and flt["user_id"] == {"$in": [2]}
        got = sorted([d["_id"] async for d in db.usage.find(flt)])
        assert got == ["r07"]
        assert sorted([d["_id"] async for d in db.usage.find({"status": {"$eq": 429}})]) == [
            "r00", "r04", "r08"]
    case(db, body)


def test_delete_by_id_in_and_oldest_first_with_projection(db):
    async def body(db):
        await db.usage.insert_many(_log())
        ids = [d["_id"] async for d in db.usage.find({"created_at": {"$lt": 103.0}},
                                                     {"_id": 1}).sort("created_at", 1).limit(4)]
        assert sorted(ids) == ["r00", "r01", "r02", "r03"]
        assert (await db.usage.delete_many({"_id": {"$in": ids}})).deleted_count == 4
        assert await db.usage.count_documents({}) == 8
    case(db, body)


def test_bulk_conditional_updates_and_upserts_as_the_flusher_sends_them(db):
    from pymongo import UpdateOne

    async def body(db):
        await db.users.insert_many([{"_id": 1, "quota": 0, "used_quota": 0, "leases": {"p": 50},
                                     "applied": {"p": 3}},
                                    {"_id": 2, "quota": 10, "used_quota": 0}])
        await db.roll.insert_one({"_id": "d|m", "n": 1, "a": {"p": 3}})
        ops = [UpdateOne({"_id": 1, "applied.p": {"$lt": 4}, "leases.p": {"$exists": True}},
                         {"$inc": {"leases.p": -5, "used_quota": 5}, "$set": {"applied.p": 6}}),
               UpdateOne({"_id": 1, "applied.p": {"$exists": False}, "leases.p": {"$exists": True}},
                         {"$inc": {"leases.p": -5, "used_quota": 5}, "$set": {"applied.p": 6}}),
               UpdateOne({"_id": 2, "applied.p": {"$lt": 4}}, {"$inc": {"used_quota": 7}}),
               UpdateOne({"_id": 2, "applied.p": {"$exists": False}},
                         {"$inc": {"used_quota": 7}, "$set": {"applied.p": 6}})]
        r = await db.users.bulk_write(ops, ordered=False)
        assert (r.matched_count, r.modified_count) == (2, 2)
        got = {d["_id"]: d async for d in db.users.find({"_id": {"$in": [1, 2]}},
                                                         {"used_quota": 1, "leases": 1,
                                                          "applied": 1})}
        assert got[1] == {"_id": 1, "used_quota": 5, "leases": {"p": 45}, "applied": {"p": 6}}
        assert got[2] == {"_id": 2, "used_quota": 7, "applied": {"p": 6}}
        # the rollup forms: an upsert where the mark is absent, a duplicate where it is not
        ups = [UpdateOne({"_id": "d|m", "a.p": {"$exists": False}},
                         {"$inc": {"n": 1}, "$set": {"a.p": 9}, "$setOnInsert": {"day": 1}},
                         upsert=True),
               UpdateOne({"_id": "d|x", "a.p": {"$exists": False}},
                         {"$inc": {"n": 2, "h07q": 4}, "$set": {"a.p": 9},
                          "$setOnInsert": {"day": 1, "model": "x"}}, upsert=True),
               UpdateOne({"_id": "d|m", "a.p": {"$lt": 4}}, {"$inc": {"n": 1}, "$set": {"a.p": 9}})]
        with pytest.raises(BulkWriteError) as exc:
            await db.roll.bulk_write(ups, ordered=False)
        assert [(e["index"], e["code"]) for e in exc.value.details["writeErrors"]] == [
            (0, DUPLICATE_KEY)]
        assert await db.roll.find_one({"_id": "d|m"}) == {"_id": "d|m", "n": 2, "a": {"p": 9}}
        assert await db.roll.find_one({"_id": "d|x"}) == {
            "_id": "d|x", "n": 2, "h07q": 4, "a": {"p": 9}, "day": 1, "model": "x"}
    case(db, body)


def test_rollup_sums_by_one_field_as_the_charts_read_them(db):
    from models.queries import rollup_match, rollup_sums

    async def body(db):
        await db.r.insert_many([
            {"_id": f"{d}|{u}|{m}", "day": d, "user_id": u, "model": m, "dm": f"{d}|{m}",
             "n": 1 + u, "h03q": 10 * u} for d in (0, 86400) for u in (1, 2) for m in ("a", "b")])
        flt = rollup_match({"user_id": 2, "model": None}, 0, 86400 * 2, ("user_id",))
        assert flt == {"user_id": {"$eq": 2}, "day": {"$gte": 0, "$lt": 172800}}
        got = await rollup_sums(db.r, flt, ["n", "h03q", "h04q"], by="dm")
        assert got == {f"{d}|{m}": {"n": 3, "h03q": 20, "h04q": 0}
                       for d in (0, 86400) for m in ("a", "b")}
        got = await rollup_sums(db.r, rollup_match({"model": "b"}, 86400, None), ["n"])
        assert got == {None: {"n": 5}}
    case(db, body)


def test_every_known_deviation_names_a_raw_test():
    """A pin for a test that does not check it would pass unseen."""
    import inspect
    for known in KNOWN.values():
        for name in known:
            fn = globals().get(name)
            assert fn is not None and "expect" in inspect.signature(fn).parameters, name
