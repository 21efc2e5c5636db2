"""The usage log: one record per billed call, written in batches.

Records are buffered in memory and written with insert_many by the billing
flusher, in the same tick as the balances they belong to, so the hot path
never waits for the database.  Shutdown flushes what is left.
"""
from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("relay.usage")


class UsageLog:
    def __init__(self, store, bus=None, batch: int = 1000, retention_days: int = 0):
        self.store = store
        self.bus = bus
        self.batch = batch
        self.retention_days = retention_days
        self._buf: list[dict[str, Any]] = []
        self._accessed: dict[int, int] = {}
        self._pruned_at = 0.0

    def touch(self, token_id: int) -> None:
        """Note a key's use; its accessed_time is written with the next flush."""
        self._accessed[token_id] = int(time.time())

    def add(self, record: dict[str, Any]) -> None:
        record.setdefault("created_at", time.time())
        self._buf.append(record)
        if self.bus is not None:
            self.bus.publish("usage", {"user_id": record.get("user_id"), "record": record})

    @property
    def pending(self) -> int:
        return len(self._buf)

    async def flush(self) -> None:
        await self._flush_records()
        if self._accessed:
            accessed, self._accessed = self._accessed, {}
            for tid, ts in accessed.items():
                await self.store.db.tokens.update_one({"_id": tid},
                                                      {"$max": {"accessed_time": ts}})
        if self.retention_days and time.time() - self._pruned_at > 3600:
            self._pruned_at = time.time()
            await self.prune(self.retention_days)

    async def prune(self, days: int) -> int:
        """Delete usage records older than `days` (the log must not grow forever)."""
        cutoff = time.time() - days * 86400
        r = await self.store.db.usage.delete_many({"created_at": {"$lt": cutoff}})
        if r.deleted_count:
            log.info("pruned %d usage records older than %d days", r.deleted_count, days)
        return r.deleted_count

    async def _flush_records(self) -> None:
        while self._buf:
            chunk = self._buf[:self.batch]
            try:
                await self.store.db.usage.insert_many([dict(r) for r in chunk], ordered=False)
            except Exception as exc:
                # Records already present (a retry after a partial write) are
                # duplicates by request id and safe to drop; anything else stays.
                if "duplicate" not in str(exc).lower() and "E11000" not in str(exc):
                    log.warning("usage flush failed (%d pending): %s", len(self._buf), exc)
                    return
            del self._buf[:len(chunk)]
