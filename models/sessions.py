"""Sticky sessions (relay/sessions.py): which channel serves a conversation,
shared by every relay on the database.

One collection, `sessions`, one small document per conversation and model:
    {_id: "<key>" (a hex digest), c: channel id (int), at: seconds (float)}
written when a conversation is first placed, when it moves, and again
every half TTL while it lasts; read by a relay that has not seen it lately.

Query shapes (pinned in tests/models/test_store_fidelity.py): find_one by
string _id; bulk_write of update_one upserts by string _id with $set;
delete_many by `at` below a number.  No dotted fields, no integer _id.
"""
from __future__ import annotations

from pymongo import UpdateOne

from models.store import ASCENDING

COLLECTION = "sessions"


class SessionStore:
    def __init__(self, store):
        self.store = store
        self._indexed = False

    @property
    def coll(self):
        return self.store.db[COLLECTION]

    async def get(self, key: str) -> tuple[int, float] | None:
        doc = await self.coll.find_one({"_id": key})
        if not doc or not isinstance(doc.get("c"), int):
            return None
        return doc["c"], float(doc.get("at") or 0)

    async def save(self, placed: list[tuple[str, int, float]]) -> None:
        """Upsert (key, channel id, time) of each conversation, in one call."""
        if not self._indexed:
            self._indexed = True
            await self.coll.create_index([("at", ASCENDING)])
        if placed:
            await self.coll.bulk_write([UpdateOne({"_id": k}, {"$set": {"c": int(c), "at": at}},
                                                  upsert=True) for k, c, at in placed],
                                       ordered=False)

    async def prune(self, before: float) -> int:
        return (await self.coll.delete_many({"at": {"$lt": float(before)}})).deleted_count
