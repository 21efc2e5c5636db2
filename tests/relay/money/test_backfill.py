"""An upgraded relay finds a usage log without rollups: the first start makes
them (relay/money/backfill.py), exactly once, even when it dies halfway and
starts again, and even for the records of a dead relay that billing applies
after it.  Against the real database server; then end to end, a relay's
charts and totals over records it never flushed itself."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from models.store import Store
from relay.money import rollups
from relay.money.backfill import NOTE, backfill
from tests.helpers import Api, RelayProcess


def run(coro):
    return asyncio.run(coro)


def _records(now: float) -> list[dict]:
    out = []
    for i in range(300):
        out.append({"_id": f"r{i:04d}", "user_id": 1 + i % 3, "token_id": 10 + i % 5,
                    "model": "m" + str(i % 2), "channel_id": 1, "status": 200,
                    "quota": 10 + i, "prompt_tokens": i, "completion_tokens": 1,
                    "created_at": now - 5 * 86400 + i * 1200.0, "proc": f"old{i % 2}",
                    "seq": i // 2 + 1})
    # from before sequence numbers
    out += [{"_id": f"legacy{i}", "user_id": 1, "model": "m0", "quota": 7,
             "created_at": now - 4 * 86400 + i} for i in range(4)]
    return out


async def _sums(store) -> dict:
    return {c: {d["_id"]: (d.get("n"), d.get("q")) async for d in store.db[c].find({})}
            for c in rollups.COLLECTIONS}


@pytest.mark.parametrize("where", ["server", "embedded"])
def test_backfill_once_and_again_after_a_crash(mongo_url, tmp_path, where):
    """Records read through the driver (any server), or summed by SQLite in
    the embedded server's file."""
    async def go():
        store = (Store(mongo_url, db_name="bf_" + uuid.uuid4().hex[:8]) if where == "server"
                 else Store("", str(tmp_path / "data"), "relay"))
        await store.start()
        try:
            now = time.time()
            recs = _records(now)
            await store.db.usage.insert_many(recs)
            assert await backfill(store, clock=lambda: now) == len(recs)
            want = {c: {k: (d["n"], d.get("q")) for k, d in docs.items()}
                    for c, docs in rollups.documents(
                        [r if "proc" in r else {**r, "proc": "legacy", "seq": 1} for r in recs]
                    ).items()}
            got = await _sums(store)
            assert got == want
            assert await backfill(store) == 0  # done: not again
            # Dead halfway through: the note says day 2 of 5; the days done
            # again add nothing twice.
            await store.db.migrations.update_one({"_id": NOTE}, {"$set": {
                "done": False, "day": rollups.day_of(now - 3 * 86400)}})
            await backfill(store, clock=lambda: now)
            assert await _sums(store) == want
        finally:
            await store.client.drop_database(store.db_name)
            await store.close()
    run(go())


def test_an_upgraded_relay_charts_the_records_it_never_flushed(mongo_url, tmp_path):
    from pymongo import MongoClient
    relay = RelayProcess(mongo_url, str(tmp_path))
    db = MongoClient(mongo_url)[relay.db_name]
    now = time.time()
    db.usage.insert_many(_records(now))
    relay.start()
    try:
        admin = Api.login(relay.url)
        t = admin.get("/api/log/?user_id=2")["data"]["totals"]
        assert t["requests"] == 100 and t["quota"] == sum(10 + i for i in range(300) if i % 3 == 1)
        chart = admin.get("/api/log/daily?days=7&tz_offset=0")["data"]
        assert sum(chart["total_requests"]) == 304
    finally:
        relay.stop()
