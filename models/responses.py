"""Stored Responses: what `previous_response_id`, GET, DELETE and
input_items need, scoped to the API key that made each response.

Two kinds of record, one collection (`responses`, _id = the response id):
- "local": a response made through the bridge (a channel that speaks only
  chat); the relay keeps its input items and the finished Response.
- "upstream": a response a Responses channel stores itself; the relay keeps
  only which channel served it, so that follow-ups reach that channel.

Every record carries `expires_at` (retention, settings.responses_retention_days)
and is deleted with its key or its owner.  Query shapes used here (pinned by
tests/models/test_responses_store.py against the embedded server): an upsert by
string _id with $set; find_one and delete_one by string _id plus an integer
token_id; find by an integer token_id and $in on an unindexed array
(item_ids); delete_many by an integer user_id or token_id, or by
expires_at < now.  No dotted projections, no integer _id.
"""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import ASCENDING

log = logging.getLogger("relay.responses")

LOCAL, UPSTREAM = "local", "upstream"
# How long a lookup waits for the same key's calls still being recorded.
PENDING_WAIT = 10.0


class ResponseStore:
    def __init__(self, store, retention_days: float = 30):
        self.store = store
        self.retention = max(float(retention_days), 0.0) * 86400
        self._indexed = False
        self._pruned_at = 0.0
        self._pending: dict[int, set] = {}

    @property
    def coll(self):
        return self.store.db.responses

    async def _indexes(self) -> None:
        if not self._indexed:
            self._indexed = True
            for key in ("token_id", "user_id", "expires_at"):
                await self.coll.create_index([(key, ASCENDING)])

    # ---- calls still being recorded -----------------------------------------
    def begin(self, token_id: int) -> asyncio.Future:
        """A call of this key that may store a response has started; lookups
        of an id not found yet wait for it (the client may read
        response.completed and ask for the id before we wrote it)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.setdefault(token_id, set()).add(fut)
        return fut

    def end(self, token_id: int, fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(None)
        waiting = self._pending.get(token_id)
        if waiting is not None:
            waiting.discard(fut)
            if not waiting:
                del self._pending[token_id]

    # ---- records -------------------------------------------------------------
    async def save(self, rid: str, kind: str, token_id: int, user_id: int, **fields) -> None:
        await self._indexes()
        now = time.time()
        doc = {"kind": kind, "token_id": token_id, "user_id": user_id, "created_at": now,
               "expires_at": now + self.retention if self.retention else None, **fields}
        # Not replace_one(upsert=True): nx-27017 ignores the filter's _id there
        # and inserts under a new ObjectId.
        await self.coll.update_one({"_id": rid}, {"$set": doc}, upsert=True)
        if self.retention and now - self._pruned_at > 3600:
            self._pruned_at = now
            await self.prune()

    async def get(self, rid: str, token_id: int) -> dict | None:
        """The key's record of this id; None when there is none (unknown,
        another key's, expired or deleted)."""
        if not isinstance(rid, str) or not rid:
            return None
        doc = await self._find(rid, token_id)
        if doc is None and self._pending.get(token_id):
            await asyncio.wait(list(self._pending[token_id]), timeout=PENDING_WAIT)
            doc = await self._find(rid, token_id)
        return doc

    async def _find(self, rid: str, token_id: int) -> dict | None:
        doc = await self.coll.find_one({"_id": rid, "token_id": token_id})
        if doc is None or (doc.get("expires_at") and doc["expires_at"] < time.time()):
            return None
        return doc

    async def delete(self, rid: str, token_id: int) -> bool:
        r = await self.coll.delete_one({"_id": rid, "token_id": token_id})
        return bool(r.deleted_count)

    async def delete_for_token(self, token_id: int) -> int:
        r = await self.coll.delete_many({"token_id": int(token_id)})
        return r.deleted_count

    async def delete_for_user(self, user_id: int) -> int:
        r = await self.coll.delete_many({"user_id": int(user_id)})
        return r.deleted_count

    async def prune(self) -> int:
        r = await self.coll.delete_many({"expires_at": {"$lt": time.time()}})
        if r.deleted_count:
            log.info("pruned %d stored responses past retention", r.deleted_count)
        return r.deleted_count

    async def items(self, ids: list[str], token_id: int) -> dict[str, dict]:
        """Input or output items of the key's local records by item id (what
        an `item_reference` names); ids not found are left out."""
        found: dict[str, dict] = {}
        async for doc in self.coll.find({"token_id": token_id, "item_ids": {"$in": list(ids)}}):
            if doc.get("expires_at") and doc["expires_at"] < time.time():
                continue
            for item in (doc.get("input") or []) + ((doc.get("response") or {}).get("output")
                                                    or []):
                if isinstance(item, dict) and item.get("id") in ids:
                    found[item["id"]] = item
        return found

    async def chain(self, doc: dict, token_id: int, limit: int = 1000) -> list[dict]:
        """The key's local records a conversation runs through, oldest first,
        ending with `doc`.  Stops at a missing or foreign link."""
        out = [doc]
        while len(out) < limit and out[-1].get("previous_response_id"):
            prev = await self._find(out[-1]["previous_response_id"], token_id)
            if prev is None or prev.get("kind") != LOCAL:
                break
            out.append(prev)
        return out[::-1]
