"""Budgets by period through billing (relay/money/budgets.py), fast: three
billing objects as three relays on one real database server, a counter per
period, a day boundary in a non-UTC zone on an injected clock, a limit
lowered while another relay holds a lease of it, and the 80% notice.  The
processes test is tests/relay/money/test_budgets_relays.py."""
import asyncio
import itertools
import uuid

import pytest

from models.store import Store
from relay.money import budgets
from relay.money.billing import Billing, BudgetExceeded, QuotaExhausted
from relay.money.flusher import APPLY_EVERY

# 2026-11-26 23:59:59 in Shanghai (15:59:59 UTC); a second later it is the 27th there.
BEFORE_MIDNIGHT = 1795708799.0
LIMIT = 100_000
PRICE = 1_000


def run(coro):
    return asyncio.run(coro)


class Bus:
    def __init__(self):
        self.seen = []

    def publish(self, topic, data):
        self.seen.append((topic, data))


async def _store(mongo_url):
    store = Store(mongo_url, db_name="bu_" + uuid.uuid4().hex[:8])
    await store.start()
    await store.db.users.insert_one({"_id": 1, "quota": 10 ** 9, "used_quota": 0})
    await store.db.tokens.insert_one({"_id": 1, "user_id": 1, "quota": 10 ** 9, "used_quota": 0})
    return store


async def _relays(store, tmp_path, n=3, bus=None):
    out = []
    for i in range(n):
        b = Billing(store, bus=bus, process_id=f"R{i}", lease_chunk=1_000_000,
                    data_dir=str(tmp_path / f"r{i}"), recall_wait=1.0)
        await b.start_up([])
        b.start()
        out.append(b)
    return out


def day(now: float, limit: int = LIMIT, tz: str = "Asia/Shanghai", scope="token"):
    return budgets.counter(scope, 1, "day", limit, now, tz)


async def _call(b: Billing, counter, cost: int = PRICE) -> None:
    rid = uuid.uuid4().hex
    res = await b.reserve(rid, 1, 1, True, cost, counters=(counter,))
    await b.settle(res, cost, {"_id": rid, "user_id": 1, "token_id": 1})


def test_a_day_budget_over_three_relays_serves_exactly_its_limit(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        relays = await _relays(store, tmp_path)
        c = day(BEFORE_MIDNIGHT)
        served = refused = 0
        for b in itertools.islice(itertools.cycle(relays), LIMIT // PRICE + 3):
            try:
                await _call(b, c)
                served += 1
            except BudgetExceeded as exc:
                refused += 1
                assert (exc.status, exc.code, exc.type) == (429, "budget_exceeded",
                                                            "insufficient_quota")
        assert (served, refused) == (LIMIT // PRICE, 3)
        for b in relays:
            await b.stop()
        doc = await store.db.budgets.find_one({"_id": c.id})
        assert doc["used_quota"] == LIMIT and doc["quota"] == 0 and not doc.get("leases"), doc
        tok = await store.db.tokens.find_one({"_id": 1})
        assert tok["used_quota"] == LIMIT     # the key paid every call served, no more
        await store.close()
    run(go())


def test_the_next_day_in_shanghai_is_a_new_counter(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        (a,) = await _relays(store, tmp_path, 1)
        today = day(BEFORE_MIDNIGHT, 2 * PRICE)
        await _call(a, today)
        await _call(a, today)
        with pytest.raises(BudgetExceeded):
            await _call(a, today)
        tomorrow = day(BEFORE_MIDNIGHT + 1, 2 * PRICE)
        assert tomorrow.id == "t1/day/2026-11-27" and today.id == "t1/day/2026-11-26"
        assert today.ends_at == BEFORE_MIDNIGHT + 1
        await _call(a, tomorrow)              # nothing reset it: it is another counter
        # In UTC the same instants are one day: the account's budget is spent.
        utc = day(BEFORE_MIDNIGHT, 3 * PRICE, "UTC", "user")
        for _ in range(3):
            await _call(a, utc)
        with pytest.raises(BudgetExceeded):
            await _call(a, day(BEFORE_MIDNIGHT + 1, 3 * PRICE, "UTC", "user"))
        await a.stop()
        await store.close()
    run(go())


def test_retry_after_names_the_next_period_start(mongo_url, tmp_path):
    async def go():
        import time
        store = await _store(mongo_url)
        (a,) = await _relays(store, tmp_path, 1)
        c = budgets.counter("user", 1, "day", PRICE, time.time(), "Asia/Shanghai")
        await _call(a, c)
        with pytest.raises(BudgetExceeded) as err:
            await _call(a, c)
        left = c.ends_at - time.time()
        assert 0 < err.value.retry_after <= left + 2
        assert err.value.headers["Retry-After"] == str(err.value.retry_after)
        assert "account" in err.value.message and "day" in err.value.message
        await a.stop()
        await store.close()
    run(go())


def test_a_lowered_limit_binds_the_relay_holding_a_lease(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        a, b = await _relays(store, tmp_path, 2)
        c = day(BEFORE_MIDNIGHT, 1_000_000)
        await _call(b, c)
        await asyncio.sleep(0.3)
        doc = await store.db.budgets.find_one({"_id": c.id})
        assert int(doc["leases"]["R1"]) > PRICE        # b leased ahead of its calls
        await a.set_budget_limit(c.id, 3 * PRICE)       # 2,000 left of the new limit
        await _call(b, c)
        await _call(a, c)
        with pytest.raises(BudgetExceeded):
            await _call(b, c)
        with pytest.raises(BudgetExceeded):
            await _call(a, c)
        for r in (a, b):
            await r.stop()
        doc = await store.db.budgets.find_one({"_id": c.id})
        assert doc["used_quota"] == 3 * PRICE and doc["quota"] == 0 and doc["limit"] == 3 * PRICE
        await store.close()
    run(go())


def test_a_budget_never_caps_the_charge_and_the_quota_still_refuses(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        await store.db.tokens.update_one({"_id": 1}, {"$set": {"quota": 5 * PRICE}})
        (a,) = await _relays(store, tmp_path, 1)
        c = day(BEFORE_MIDNIGHT, 2 * PRICE)
        rid = uuid.uuid4().hex
        res = await a.reserve(rid, 1, 1, True, PRICE, counters=(c,))
        # The call cost three times what it reserved: charged in full.
        assert await a.settle(res, 3 * PRICE, {"_id": rid, "user_id": 1, "token_id": 1}) \
            == 3 * PRICE
        with pytest.raises(BudgetExceeded):
            await _call(a, c)
        roomy = day(BEFORE_MIDNIGHT + 1, 100 * PRICE)    # the next day's
        await _call(a, roomy, 2 * PRICE)
        with pytest.raises(QuotaExhausted):   # the key's quota, not the budget
            await _call(a, roomy, 2 * PRICE)
        await a.stop()
        doc = await store.db.budgets.find_one({"_id": c.id})
        assert doc["used_quota"] == 3 * PRICE and doc["quota"] == -PRICE, doc
        await store.close()
    run(go())


def test_eighty_percent_is_published_from_the_database_read_back(mongo_url, tmp_path):
    async def go():
        store = await _store(mongo_url)
        bus = Bus()
        (a,) = await _relays(store, tmp_path, 1, bus)
        c = day(BEFORE_MIDNIGHT, 10 * PRICE)
        # Records are applied (and read back) within two flush intervals
        # and a tick of being stored (relay/money/flusher.APPLY_EVERY).
        applied = (APPLY_EVERY + 1) * a.flush_interval
        for _ in range(7):
            await _call(a, c)
        await asyncio.sleep(applied)
        assert not [d for t, d in bus.seen if t == "budget_used"]
        await _call(a, c)                    # the 8th: 80%
        for _ in range(20):
            await asyncio.sleep(applied / 10)
            used = [d for t, d in bus.seen if t == "budget_used"]
            if used:
                break
        assert used and used[0] == {"counter_id": c.id, "user_id": 1, "token_id": 1,
                                    "period": "day", "limit": 10 * PRICE, "used": 8 * PRICE}
        await a.stop()
        await store.close()
    run(go())
