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
    def __init__(self, store, bus=None, batch: int = 1000):
        self.store = store
        self.bus = bus
        self.batch = batch
        self._buf: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> None:
        record.setdefault("created_at", time.time())
        self._buf.append(record)
        if self.bus is not None:
            self.bus.publish("usage", {"user_id": record.get("user_id"), "record": record})

    @property
    def pending(self) -> int:
        return len(self._buf)

    async def flush(self) -> None:
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
