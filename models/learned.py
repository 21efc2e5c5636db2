"""What channels were seen to refuse (relay/compat/memory.py), kept across
restarts and shared by every relay on the database.

One collection, `channel_learned`, one document per fact:
    {_id: "<channel id>|<kind>|<model>|<name>", channel_id: int, kind: str,
     model: str, name: str, reason: str, at: float (seconds)}
`kind` is "wire" (model "": the API the whole channel speaks), "beta" or
"field" (per upstream model).  Facts are few (a handful per channel), so
every relay reads them whole: at start, and for one channel when another
relay says it learnt something there.

Query shapes (pinned in tests/models/test_store_fidelity.py): an upsert by
string _id with $set; find by an integer channel_id; find all;
delete_one by string _id plus an integer channel_id; delete_many by an
integer channel_id, and by `at` below a number.  No dotted fields.
"""
from __future__ import annotations

from models.store import ASCENDING

COLLECTION = "channel_learned"


def fact_id(channel_id: int, kind: str, model: str, name: str) -> str:
    return f"{int(channel_id)}|{kind}|{model}|{name}"


class LearnedStore:
    def __init__(self, store):
        self.store = store
        self._indexed = False

    @property
    def coll(self):
        return self.store.db[COLLECTION]

    async def _indexes(self) -> None:
        if not self._indexed:
            self._indexed = True
            await self.coll.create_index([("channel_id", ASCENDING)])

    async def save(self, channel_id: int, kind: str, model: str, name: str, reason: str,
                   at: float) -> str:
        await self._indexes()
        ident = fact_id(channel_id, kind, model, name)
        await self.coll.update_one({"_id": ident}, {"$set": {
            "channel_id": int(channel_id), "kind": kind, "model": model, "name": name,
            "reason": reason[:300], "at": float(at)}}, upsert=True)
        return ident

    async def all(self, limit: int = 100_000) -> list[dict]:
        return await self.coll.find({}).to_list(limit)

    async def of_channel(self, channel_id: int) -> list[dict]:
        return await self.coll.find({"channel_id": int(channel_id)}).to_list(10_000)

    async def forget(self, channel_id: int, ident: str | None = None) -> int:
        """Forget one fact of a channel (by its _id), or all of them."""
        if ident is None:
            r = await self.coll.delete_many({"channel_id": int(channel_id)})
        else:
            r = await self.coll.delete_one({"_id": ident, "channel_id": int(channel_id)})
        return r.deleted_count

    async def prune(self, before: float) -> int:
        r = await self.coll.delete_many({"at": {"$lt": float(before)}})
        return r.deleted_count
