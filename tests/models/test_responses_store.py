"""models/responses.py against the embedded database: every query shape the
stored responses use (nx-27017 is not MongoDB: replace_one with upsert
ignores the filter's _id there, so the store upserts with $set)."""
from __future__ import annotations

import asyncio
import uuid

from models.responses import LOCAL, UPSTREAM, ResponseStore
from models.store import Store


def run(mongo_url, fn):
    async def main():
        store = Store(mongo_url, "", "t_" + uuid.uuid4().hex[:10])
        await store.start()
        try:
            return await fn(ResponseStore(store, retention_days=30), store)
        finally:
            await store.close()
    return asyncio.run(main())


def test_records_scoped_deleted_and_pruned(mongo_url):
    async def fn(rs: ResponseStore, store):
        await rs.save("resp_a", LOCAL, 5, 2, input=[{"type": "message"}], response={"id": "a"})
        await rs.save("resp_b", UPSTREAM, 5, 2, channel_id=9)
        await rs.save("resp_c", LOCAL, 6, 3, previous_response_id=None, response={"id": "c"})
        await rs.save("resp_a", LOCAL, 5, 2, input=[], response={"id": "a2"})  # same id: one
        assert (await rs.get("resp_a", 5))["response"] == {"id": "a2"}
        assert await store.db.responses.count_documents({}) == 3
        assert await rs.get("resp_a", 6) is None and await rs.get("resp_x", 5) is None
        assert (await rs.get("resp_b", 5))["channel_id"] == 9
        # expired records are gone for lookups, and pruned
        await store.db.responses.update_one({"_id": "resp_b"}, {"$set": {"expires_at": 1.0}})
        assert await rs.get("resp_b", 5) is None
        assert await rs.prune() == 1
        assert await rs.delete("resp_a", 6) is False and await rs.delete("resp_a", 5) is True
        await rs.save("resp_d", LOCAL, 7, 3)
        assert await rs.delete_for_token(7) == 1
        assert await rs.delete_for_user(3) == 1
        assert await store.db.responses.count_documents({}) == 0
    run(mongo_url, fn)


def test_chain_and_no_retention(mongo_url):
    async def fn(rs: ResponseStore, store):
        forever = ResponseStore(store, retention_days=0)
        await forever.save("r1", LOCAL, 1, 1, previous_response_id=None)
        await forever.save("r2", LOCAL, 1, 1, previous_response_id="r1")
        await forever.save("r3", LOCAL, 1, 1, previous_response_id="r2")
        await forever.save("r4", LOCAL, 2, 2, previous_response_id="r3")  # another key's
        assert (await forever.get("r1", 1))["expires_at"] is None
        assert await forever.prune() == 0  # null expires_at never matches $lt
        chain = await forever.chain(await forever.get("r3", 1), 1)
        assert [d["_id"] for d in chain] == ["r1", "r2", "r3"]
        assert [d["_id"] for d in await forever.chain(await forever.get("r4", 2), 2)] == ["r4"]
        await forever.save("r5", LOCAL, 1, 1, input=[{"id": "msg_1", "type": "message"}],
                           response={"output": [{"id": "fc_1", "type": "function_call"}]},
                           item_ids=["msg_1", "fc_1"])
        await forever.save("r6", LOCAL, 2, 2, input=[{"id": "msg_2"}], item_ids=["msg_2"])
        got = await forever.items(["fc_1", "msg_2", "nope"], 1)
        assert got == {"fc_1": {"id": "fc_1", "type": "function_call"}}
    run(mongo_url, fn)


def test_lookup_waits_for_the_keys_call_in_flight(mongo_url):
    async def fn(rs: ResponseStore, store):
        pending = rs.begin(11)

        async def finish_later():
            await asyncio.sleep(0.05)
            await rs.save("late", LOCAL, 11, 1)
            rs.end(11, pending)
        task = asyncio.ensure_future(finish_later())
        assert (await rs.get("late", 11))["_id"] == "late"
        await task
        assert not rs._pending
    run(mongo_url, fn)
