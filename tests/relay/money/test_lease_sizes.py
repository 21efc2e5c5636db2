"""Leases that follow the balance (relay/money/leases.py, recalls.py), with
two billing objects as two relays on one real database server: how much a
relay leases, when it leases per call, how a short relay gets the rest back
by a recall, and how a lowering binds the other relay.  The processes test
is tests/relay/money/test_across_relays.py."""
import asyncio
import time
import uuid

import pytest

from models.store import Store
from relay.money.billing import Billing, QuotaExhausted

CHUNK = 1_000_000


def run(coro):
    return asyncio.run(coro)


async def _store(mongo_url, quota: int):
    store = Store(mongo_url, db_name="ls_" + uuid.uuid4().hex[:8])
    await store.start()
    await store.db.users.insert_one({"_id": 1, "quota": quota, "used_quota": 0})
    await store.db.tokens.insert_one({"_id": 1, "user_id": 1, "quota": quota, "used_quota": 0})
    return store


async def _relay(store, tmp_path, name: str, direct_below: int = 0, start: bool = True):
    b = Billing(store, process_id=name, lease_chunk=CHUNK, data_dir=str(tmp_path / name),
                direct_below=direct_below, recall_wait=1.0)
    await b.start_up([])
    if start:
        b.start()
    return b


async def _call(b: Billing, cost: int) -> None:
    rid = uuid.uuid4().hex
    res = await b.reserve(rid, 1, 1, True, cost)
    await b.settle(res, cost, {"_id": rid, "user_id": 1, "token_id": 1})


async def _leases(store) -> dict:
    doc = await store.db.users.find_one({"_id": 1})
    return {p: int(v) for p, v in (doc.get("leases") or {}).items()}


def test_a_lease_is_a_quarter_of_what_is_left_split_by_its_holders(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 2_400_000)
        a = await _relay(store, tmp_path, "A")
        await _call(a, 1000)
        await asyncio.sleep(0.3)            # a's lease ahead: a quarter of 2.4M
        assert (await _leases(store))["A"] == 1000 + 600_000 - 1000
        b = await _relay(store, tmp_path, "B")
        await _call(b, 1000)
        await asyncio.sleep(0.3)            # two holders: an eighth of what is left
        leases = await _leases(store)       # (a's call applied when b read it, or not yet)
        assert leases["B"] in ((2_400_000 - 1000) // 8, 2_400_000 // 8), leases
        for r in (a, b):
            await r.stop()
        await store.close()
    run(go())


def test_with_several_relays_a_small_balance_is_leased_per_call(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 50_000)
        a = await _relay(store, tmp_path, "A", direct_below=100_000)
        b = await _relay(store, tmp_path, "B", direct_below=100_000)
        await a.reclaim_stale()             # a counts b
        assert a.relays == 2 and b.relays == 2
        for _ in range(5):
            await _call(a, 700)
            await _call(b, 700)
        await asyncio.sleep(0.3)
        # Each holds nothing beyond its calls: all the rest is the store's.
        doc = await store.db.tokens.find_one({"_id": 1})
        assert doc["quota"] == 50_000 - 7000, doc
        for r in (a, b):
            await r.stop()
        await store.close()
    run(go())


def test_a_short_relay_recalls_the_other_relays_lease(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 40_000)
        a = await _relay(store, tmp_path, "A")
        b = await _relay(store, tmp_path, "B")
        await _call(a, 1000)
        await asyncio.sleep(0.3)
        held = (await _leases(store))["A"]
        assert held > 1000, held           # a holds a lease ahead of its calls
        # b needs more than the store has without a's lease
        need = 40_000 - 1000 - held + 5000
        res = await b.reserve("big", 1, 1, True, need)
        await b.settle(res, need, {"_id": "big", "user_id": 1, "token_id": 1})
        with pytest.raises(QuotaExhausted):
            await b.reserve("more", 1, 1, True, 40_000)
        for r in (a, b):
            await r.stop()
        doc = await store.db.users.find_one({"_id": 1})
        assert doc["quota"] == 40_000 - 1000 - need and doc["used_quota"] == 1000 + need
        await store.close()
    run(go())


def test_a_lowering_takes_the_other_relays_lease_back_before_it_sets(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 4_000_000)
        a = await _relay(store, tmp_path, "A")
        b = await _relay(store, tmp_path, "B")
        await _call(b, 1000)
        await asyncio.sleep(0.3)
        assert (await _leases(store))["B"] > 500_000
        await a.set_remaining("user", 1, 0)
        assert b._bal[("user", 1)].available == 0     # b answered: nothing left to spend
        with pytest.raises(QuotaExhausted):
            await _call(b, 1000)
        assert await a.balance("user", 1) == (0, 1000)
        for r in (a, b):
            await r.stop()
        doc = await store.db.users.find_one({"_id": 1})
        assert doc["quota"] == 0 and doc["used_quota"] == 1000 and not doc.get("leases"), doc
        await store.close()
    run(go())


def test_a_relay_cut_off_gives_no_lease_back_that_another_may_have_returned(mongo_url, tmp_path):
    """A relay whose heartbeat is late (a starved loop, a slow database) may
    have been declared dead by another relay, which returned its leases to
    `quota`.  Were it to give its idle lease back now, the same units would
    be in `quota` twice (its lease left negative until its old id is
    reclaimed again), and other relays could lease and spend them."""
    async def go():
        store = await _store(mongo_url, 2_400_000)
        a = await _relay(store, tmp_path, "A", start=False)
        b = await _relay(store, tmp_path, "B", start=False)
        await _call(a, 1000)
        await a.flush()                     # a's call stored and applied
        held = (await _leases(store))["A"]
        assert held > 0
        # a's loop starved: no heartbeat for longer than the threshold.
        await store.db.processes.update_one({"_id": "A"}, {"$set": {"heartbeat": 0}})
        a._last_heartbeat -= a.stale_after
        await b.reclaim_stale()             # b declares a dead: a's lease back in quota
        doc = await store.db.users.find_one({"_id": 1})
        assert "A" not in (doc.get("leases") or {})
        assert int(doc["quota"]) == 2_400_000 - 1000
        await a.flush(release_all=True)     # a, not knowing, lets its idle lease go
        doc = await store.db.users.find_one({"_id": 1})
        assert all(int(v) >= 0 for v in (doc.get("leases") or {}).values()), doc.get("leases")
        assert int(doc["quota"]) == 2_400_000 - 1000, "a lease given back twice"
        await a.heartbeat()                 # a learns it was declared dead, and goes on
        assert a.pid != "A"
        await _call(a, 1000)
        await a.flush()
        for r in (a, b):
            await r.stop()
        doc = await store.db.users.find_one({"_id": 1})
        assert int(doc["quota"]) == 2_400_000 - 2000 and not (doc.get("leases") or {})
        await store.close()
    run(go())


def test_a_relay_that_beats_after_it_was_found_stale_keeps_its_lease(mongo_url, tmp_path):
    """Another relay reads the stale processes, then reclaims them one by
    one; a heartbeat that lands between the two means the process lives (and
    may spend its lease).  It is not reclaimed; a process claimed first
    learns it at its next heartbeat and goes on under a new id."""
    async def go():
        store = await _store(mongo_url, 2_400_000)
        a = await _relay(store, tmp_path, "A", start=False)
        b = await _relay(store, tmp_path, "B", start=False)
        c = await _relay(store, tmp_path, "C", start=False)
        await _call(a, 1000)
        await a.flush()
        held = (await _leases(store))["A"]
        await store.db.processes.update_one({"_id": "A"}, {"$set": {"heartbeat": 0}})
        cutoff = time.time() - b.stale_after * 3 / 4
        found = await b.stale_ids(cutoff)
        assert found == ["A"]
        await a.heartbeat()                 # a's heartbeat lands after b read it
        assert await b.reclaim_claimed(found, cutoff) == 0
        assert (await _leases(store))["A"] == held and a.pid == "A"
        # Now claimed before its heartbeat: reclaimed, and a fences itself.
        await store.db.processes.update_one({"_id": "A"}, {"$set": {"heartbeat": 0}})
        found = await c.stale_ids(cutoff)
        assert await c.reclaim_claimed(found, cutoff) >= held   # the key's lease too
        assert "A" not in await _leases(store)
        await a.heartbeat()
        assert a.pid != "A"
        await _call(a, 1000)
        await a.flush()
        for r in (a, b, c):
            await r.stop()
        doc = await store.db.users.find_one({"_id": 1})
        assert int(doc["quota"]) == 2_400_000 - 2000 and not (doc.get("leases") or {})
        await store.close()
    run(go())
