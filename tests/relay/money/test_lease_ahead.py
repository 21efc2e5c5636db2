"""Leasing ahead: once a reserve leaves less than half a lease unreserved,
the next lease is taken in the background, so that a steady stream of calls
never waits for the database on its way in; near the end of a balance a
lease is a quarter of what is left (a call that needs the rest still gets
it, in the foreground).  Against the real database server."""
import asyncio
import uuid

from models.store import Store
from relay.money.billing import Billing, QuotaExhausted

CHUNK = 10_000


def run(coro):
    return asyncio.run(coro)


async def _store(mongo_url, quota: int):
    store = Store(mongo_url, db_name="la_" + uuid.uuid4().hex[:8])
    await store.start()
    await store.db.users.insert_one({"_id": 1, "quota": quota, "used_quota": 0})
    await store.db.tokens.insert_one({"_id": 1, "user_id": 1, "quota": quota, "used_quota": 0})
    return store


def _billing(store, tmp_path) -> Billing:
    return Billing(store, process_id="p1", lease_chunk=CHUNK, data_dir=str(tmp_path))


class _Count:
    """Counts the leases taken, and how many of them a reserve waited for."""

    def __init__(self, b: Billing):
        self.foreground = self.background = 0
        lease = b._lease

        async def counted(bal, amount, ahead=False):
            if ahead:
                self.background += 1
            else:
                self.foreground += 1
            return await lease(bal, amount, ahead=ahead)
        b._lease = counted


async def _books(store) -> list[tuple[int, int]]:
    out = []
    for coll in ("users", "tokens"):
        d = await store.db[coll].find_one({"_id": 1})
        out.append((int(d["quota"]) + sum(int(v) for v in (d.get("leases") or {}).values()),
                    int(d["used_quota"])))
    return out


def test_steady_calls_never_wait_for_a_lease(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 10_000_000)
        b = _billing(store, tmp_path)
        await b.register()
        count = _Count(b)
        for _ in range(40):  # 40 calls of 1,500: six chunks' worth
            rid = uuid.uuid4().hex
            res = await b.reserve(rid, 1, 1, True, 1500)
            await b.settle(res, 1500, {"_id": rid, "user_id": 1, "token_id": 1})
            await asyncio.sleep(0.02)  # calls arrive over time, not all in one turn
        # The first lease of each balance is waited for; every later one
        # was taken ahead.
        assert count.foreground == 2, vars(count)
        assert count.background >= 2 * 5, vars(count)
        await b.stop()
        assert await _books(store) == [(10_000_000 - 60_000, 60_000)] * 2
        await store.close()
    run(go())


def test_a_burst_waits_only_when_the_lease_ahead_is_not_back_yet(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 10_000_000)
        b = _billing(store, tmp_path)
        await b.register()
        count = _Count(b)
        # No pause between reserves: the background lease has had no turn,
        # so the reserve that finds too little waits for it (one lease for
        # both: not a second one of its own).
        held = [await b.reserve(uuid.uuid4().hex, 1, 1, True, 4000) for _ in range(3)]
        assert count.foreground == 2 and count.background == 2, vars(count)
        for res in held:
            await b.settle(res, 4000, {"_id": res.request_id, "user_id": 1, "token_id": 1})
        await b.stop()
        assert await _books(store) == [(10_000_000 - 12_000, 12_000)] * 2
        await store.close()
    run(go())


def test_near_the_end_the_lease_ahead_takes_a_quarter_of_what_is_left(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 14_000)
        b = _billing(store, tmp_path)
        await b.register()
        res = await b.reserve("a", 1, 1, True, 6000)   # unread yet: leases just 6,000
        await asyncio.sleep(0.2)                         # the lease ahead runs
        user = await store.db.users.find_one({"_id": 1})
        # A quarter of the 14,000 left (this relay alone holds it), not the
        # chunk of 10,000: the rest stays for whichever relay needs it.
        assert user["quota"] == 14_000 - 6000 - 3500, user
        # A call that does need it takes the rest in the foreground.
        res2 = await b.reserve("b", 1, 1, True, 8000)
        user = await store.db.users.find_one({"_id": 1})
        assert user["quota"] == 0, user
        try:
            await b.reserve("c", 1, 1, True, 1)
        except QuotaExhausted:
            pass
        else:
            raise AssertionError("reserved beyond the balance")
        for r in (res, res2):
            await b.settle(r, r.amount, {"_id": r.request_id, "user_id": 1, "token_id": 1})
        await b.stop()
        assert await _books(store) == [(0, 14_000)] * 2
        await store.close()
    run(go())


def test_stop_waits_for_a_lease_ahead_in_flight(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url, 1_000_000)
        b = _billing(store, tmp_path)
        await b.register()
        res = await b.reserve("a", 1, 1, True, 6000)  # starts a lease ahead
        await b.settle(res, 6000, {"_id": "a", "user_id": 1, "token_id": 1})
        await b.stop()                                # at once, the lease ahead still out
        await asyncio.sleep(0.3)
        # Nothing leased after the books closed: every unit is the store's
        # or the record's.
        for coll in ("users", "tokens"):
            d = await store.db[coll].find_one({"_id": 1})
            assert not any(int(v) for v in (d.get("leases") or {}).values()), d
        assert await _books(store) == [(1_000_000 - 6000, 6000)] * 2
        await store.close()
    run(go())
