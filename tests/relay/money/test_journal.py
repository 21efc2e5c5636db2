"""The money journal in one process against the real database server:
idempotent application, the spill file's order and bound, a relay declared
dead while alive (fencing), and a reclaim racing a replay."""
import asyncio
import json
import uuid

import pytest

from models.store import Store
from relay.money import rollups
from relay.money.billing import Billing, BillingUnavailable
from relay.money.journal import Spill

INITIAL = 1_000_000


def run(coro):
    return asyncio.run(coro)


async def _store(mongo_url):
    store = Store(mongo_url, db_name="j_" + uuid.uuid4().hex[:8])
    await store.start()
    await store.db.users.insert_one({"_id": 1, "quota": INITIAL, "used_quota": 0})
    await store.db.tokens.insert_one({"_id": 1, "user_id": 1, "quota": INITIAL, "used_quota": 0})
    return store


def _billing(store, data_dir, pid, **kw):
    return Billing(store, process_id=pid, lease_chunk=10_000, data_dir=str(data_dir), **kw)


async def _charge(b: Billing, n: int, cost: int = 100) -> list[str]:
    ids = []
    for _ in range(n):
        rid = uuid.uuid4().hex
        res = await b.reserve(rid, 1, 1, True, cost)
        await b.settle(res, cost, {"_id": rid, "user_id": 1, "token_id": 1})
        ids.append(rid)
    return ids


async def _books(store) -> dict:
    out = {}
    for coll in ("users", "tokens"):
        d = await store.db[coll].find_one({"_id": 1})
        remain = int(d["quota"]) + sum(int(v) for v in (d.get("leases") or {}).values())
        out[coll] = (remain, int(d["used_quota"]))
    recs = [r async for r in store.db.usage.find({})]
    out["records"] = sum(int(r["quota"]) for r in recs)
    out["count"] = len(recs)
    # The flusher's rollups of the same records, every family.
    out["rolled"] = {c: (sum(int(d.get("n") or 0) for d in docs),
                         sum(int(d.get("q") or 0) for d in docs))
                     for c in rollups.COLLECTIONS
                     for docs in [[d async for d in store.db[c].find({})]]}
    return out


async def _stored_batch(mongo_url, tmp_path, pid: str, n: int):
    """A store, a registered billing process that charged `n` calls, and
    the journal's batch of them, stored as usage records and not applied."""
    store = await _store(mongo_url)
    b = _billing(store, tmp_path, pid)
    await b.register()
    await _charge(b, n)
    batch, _ = b.journal.take()
    await store.db.usage.insert_many([dict(r) for r in batch])
    return store, b, batch


def _assert_books(b):
    for coll in ("users", "tokens"):
        remain, used = b[coll]
        assert remain + used == INITIAL, b
        assert used == b["records"], b
    # each record in the rollups once, however often its batch was applied
    assert all(v == (b["count"], b["records"]) for v in b["rolled"].values()), b


def test_a_batch_applied_twice_changes_nothing(mongo_url, tmp_path):
    async def go():
        store, b, batch = await _stored_batch(mongo_url, tmp_path, "p1", 5)
        await b._apply(batch)
        await b._apply(batch)             # a retry after a lost reply
        await b._apply(batch[:2])         # a replay of part of it
        b.journal.done(None)
        books = await _books(store)
        assert books["users"][1] == 500 and books["tokens"][1] == 500
        await store.close()
    run(go())


def test_a_batch_overlapping_one_applied_before_goes_in_bulk(mongo_url, tmp_path):
    """A batch whose first records were applied already (an apply retried
    after a timeout that fell after its bulk write landed): the rest of it
    is applied by a second bulk write conditioned on the marks just read,
    not balance by balance (the long way costs each balance up to seven
    round trips, and under load a busy tick's worth of them outlasted the
    database timeout and made the next apply overlap again)."""
    async def go():
        store, b, batch = await _stored_batch(mongo_url, tmp_path, "p1o", 5)
        await b._apply(batch[:3])
        long_way = []
        one = b._apply_one

        async def counted(*args):
            long_way.append(args[1:3])
            return await one(*args)
        b._apply_one = counted
        await b._apply(batch)
        assert long_way == []
        await b._apply(batch)             # and once more: nothing changes
        b.journal.done(None)
        books = await _books(store)
        assert books["users"][1] == 500 and books["tokens"][1] == 500
        _assert_books(books)
        await store.close()
    run(go())


def test_spill_keeps_order_and_its_bound_stops_billable_calls(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        b = _billing(store, tmp_path, "p2", spill_max_mb=1)
        b.journal.spill.max_bytes = 3000
        await b.register()
        await _charge(b, 5)
        b.journal.guard(-1)               # everything is "old": to the file
        assert not b.journal.memory and not b.journal.spill.empty
        await _charge(b, 3)
        b.journal.guard(-1)
        with open(b.journal.spill.path) as fh:
            seqs = [json.loads(line)["seq"] for line in fh]
        assert seqs == sorted(seqs) == list(range(1, 9))
        await _charge(b, 30)
        b.journal.guard(-1)               # past the bound: stays in memory, loudly
        assert b.journal.spill.full and b.journal.memory
        with pytest.raises(BillingUnavailable):
            b.check_open()
        while await b.flush():            # the database takes the backlog, in order
            pass
        await b.flush()
        assert b.journal.spill.empty and not b.journal.spill.full
        b.check_open()
        books = await _books(store)
        assert books["count"] == 38
        _assert_books(books)
        await store.close()
    run(go())


def test_torn_last_line_is_not_a_record(tmp_path):
    spill = Spill(str(tmp_path), 10_000)
    spill.append([{"_id": "a", "seq": 1}])
    with open(spill.path, "a") as fh:
        fh.write('{"_id": "b", "se')
    recs, offset = spill.read(10)
    assert [r["_id"] for r in recs] == ["a"] and offset < spill.size


def test_declared_dead_while_alive_carries_on_under_a_new_id(mongo_url, tmp_path):
    """Cut off from a shared database too long, a relay is reclaimed by
    another; when it comes back it pays its old records from quota and
    takes a new id.  The books still balance."""
    async def go():
        store = await _store(mongo_url)
        zombie = _billing(store, tmp_path / "z", "zombie")
        other = _billing(store, tmp_path / "o", "other")
        await zombie.register()
        await other.register()
        await _charge(zombie, 4)
        await zombie.flush()              # 4 records applied
        await _charge(zombie, 3)          # 3 more, not yet in the database
        await other.reclaim("zombie")     # the others gave up on it
        _assert_books(await _books(store))
        await zombie.heartbeat()          # it finds out
        assert zombie.pid != "zombie"
        await _charge(zombie, 2)
        while await zombie.flush():
            pass
        await zombie.flush(release_all=True)
        books = await _books(store)
        assert books["count"] == 9
        _assert_books(books)
        await store.close()
    run(go())


def test_reclaim_applies_only_the_dense_run(mongo_url, tmp_path):
    """Records after a gap wait for the spill file that holds the gap."""
    async def go():
        store = await _store(mongo_url)
        dead = _billing(store, tmp_path / "d", "dead")
        await dead.register()
        await _charge(dead, 6)
        batch, _ = dead.journal.take()
        # records 1, 2 and 5, 6 reached the database; 3 and 4 are in a spill file
        await store.db.usage.insert_many([dict(r) for r in batch if r["seq"] not in (3, 4)])
        spilled = [r for r in batch if r["seq"] in (3, 4)]
        heir = _billing(store, tmp_path / "h", "heir")
        await heir.register()
        await heir.reclaim("dead")
        books = await _books(store)
        assert books["users"][1] == 200 and books["count"] == 4
        await store.db.usage.insert_many([dict(r) for r in spilled])
        await heir.reclaim("dead")        # the next start, after replaying the file
        books = await _books(store)
        assert books["users"][1] == 600 and books["count"] == 6
        _assert_books(books)
        await store.close()
    run(go())


def test_records_are_stored_compactly_and_read_back_whole(mongo_url, tmp_path):
    """A zero token detail, a zero shortfall, no error and not estimated are
    left out of the stored record (the embedded server's CPU per record goes
    with its size); every reader sees them again through expand()."""
    from handlers.api_log import log_view
    from relay.money.pricing import USAGE_FIELDS
    from relay.money.usage import expand, stored

    full = {"_id": "x", "user_id": 1, "token_id": 1, "quota": 0, "cost": 0, "unpaid": 0,
            "estimated": False, "error": "", "service_tier": "", "session": "", "cache_saved": 0,
            "cache_unread": 0, "status": 200, "token_limited": False, "rate_rule": "flat",
            **{f: 0 for f in USAGE_FIELDS}, "prompt_tokens": 3, "reasoning_tokens": 2}
    small = stored(full)
    for kept in ("quota", "cost", "status", "token_limited", "prompt_tokens", "completion_tokens",
                 "reasoning_tokens"):
        assert kept in small
    for left in ("unpaid", "estimated", "error", "session", "cache_saved", "cache_unread",
                 "cached_tokens", "units", "audio_input_tokens", "service_tier", "rate_rule"):
        assert left not in small
    assert expand(small) == full
    # A value of another type than the default's is never taken for it.
    assert stored({"estimated": 0, "unpaid": False})  == {"estimated": 0, "unpaid": False}

    async def body():
        store = await _store(mongo_url)
        b = _billing(store, tmp_path, "p1")
        await b.register()
        rid = uuid.uuid4().hex
        res = await b.reserve(rid, 1, 1, True, 10)
        await b.settle(res, 10, {"_id": rid, "user_id": 1, "token_id": 1,
                                 **{f: 0 for f in USAGE_FIELDS}, "prompt_tokens": 4,
                                 "estimated": False, "error": ""})
        await b.flush()
        raw = await store.db.usage.find_one({"_id": rid})
        assert "cached_tokens" not in raw and "unpaid" not in raw and "error" not in raw
        view = log_view(raw, admin=True)
        assert view["cached_tokens"] == 0 and view["unpaid"] == 0 and view["error"] == ""
        assert view["estimated"] is False and view["prompt_tokens"] == 4 and view["quota"] == 10
        await store.close()
    run(body())


def test_a_call_that_settles_after_billing_stopped_is_still_recorded(mongo_url, tmp_path):
    """Shutdown gives back the reservations of calls still running; one that
    settles after all (it ignored its cancellation) is charged from what is
    left, the rest unpaid, and its record goes to the spill file, which the
    next start applies.  The books balance either way."""
    async def go():
        store = await _store(mongo_url)
        b = _billing(store, tmp_path, "p1")
        await b.register()
        await _charge(b, 2)
        late = await b.reserve("late", 1, 1, True, 100)
        await b.stop()
        assert late.done and late.orphaned
        charged = await b.settle(late, 100, {"_id": "late", "user_id": 1, "token_id": 1})
        assert await b.settle(late, 100, {"_id": "late", "user_id": 1, "token_id": 1}) == charged
        with open(b.journal.spill.path) as fh:
            spilled = [json.loads(line) for line in fh]
        assert [(r["_id"], r["cost"], r["quota"], r["unpaid"]) for r in spilled] == \
            [("late", 100, charged, 100 - charged)]
        assert not b.journal.memory
        nxt = _billing(store, tmp_path, "p2")
        await nxt.start_up(["p1"])
        assert await store.db.usage.find_one({"_id": "late"})
        books = await _books(store)
        assert books["users"][1] == books["records"] == 200 + charged
        assert books["users"][0] + books["users"][1] == INITIAL
        assert books["tokens"][0] + books["tokens"][1] == INITIAL
        await nxt.stop()
        await store.close()
    run(go())


def test_records_are_stored_while_an_apply_takes_long(mongo_url, tmp_path):
    """The flusher stores records every tick even while an apply is still
    running (relay/money/flusher.py): had the ticks waited for it, records
    made meanwhile would have gone to the spill file after one interval.
    The apply is held here by holding its lock, as a long apply holds it."""
    async def go():
        store = await _store(mongo_url)
        b = _billing(store, tmp_path, "P", flush_interval=0.2)
        await b.start_up([])
        b.start()
        await b._apply_lock.acquire()
        try:
            ids = await _charge(b, 30)
            await asyncio.sleep(1.5)            # over seven intervals
            stored = [r["_id"] async for r in store.db.usage.find({}, {"_id": 1})]
            assert sorted(stored) == sorted(ids)
            assert b.journal.spill.empty and not b.journal.pending
            assert (await store.db.tokens.find_one({"_id": 1}))["used_quota"] == 0
        finally:
            b._apply_lock.release()
        await asyncio.sleep(1.0)                # two intervals and a tick, and more
        assert (await store.db.tokens.find_one({"_id": 1}))["used_quota"] == 3000
        await b.stop()
        books = await _books(store)
        assert books["users"] == books["tokens"] == (INITIAL - 3000, 3000)
        assert books["records"] == 3000 and books["count"] == 30
        assert all(v == (30, 3000) for v in books["rolled"].values()), books["rolled"]
        await store.close()
    run(go())
