"""Keeping the usage log bounded: retention, space given back, a ceiling.

Run from the billing flusher's tick (after_flush), off the request path,
and at most one bounded step a tick:

- usage records older than `usage_retention_days` (180 by default; 0
  keeps them) go, PRUNE_CHUNK at a time: their ids are read through the
  reports connection (models/store.py), so the search never holds the
  writer, and deleted by id, a short write;
- rollups (relay/money/rollups.py) older than `rollup_retention_days`
  (730) go the same way, so charts outlive the records they were made of;
- once COMPACT_EVERY records have gone, the space they held goes back to
  the file system (models/store.Store.give_back_space: SQLite's incremental
  vacuum on the embedded database, bounded by what was just freed);
- with `storage_max_gb`, the database's size is checked every minute: at
  WARN_AT of it the administrator is told (the bus topic "storage"; notify/
  raises `storage_warning`, at most once a day a level), and at the
  ceiling the oldest records go before their retention days, until the
  size is back under STOP_AT of it.

While there is work it takes a step every STEP seconds; otherwise it looks
again every IDLE seconds.
"""
from __future__ import annotations

import logging
import time

from relay.money import rollups

log = logging.getLogger("relay.usage")

PRUNE_CHUNK = 2000
COMPACT_EVERY = 20_000
STEP = 1.0
IDLE = 60.0
FIRST = 5.0
WARN_AT = 0.8
STOP_AT = 0.95


class Retention:
    def __init__(self, store, bus=None, usage_days: int = 180, rollup_days: int = 730,
                 max_bytes: int = 0, clock=time.time):
        self.store = store
        self.bus = bus
        self.usage_days = max(0, int(usage_days))
        self.rollup_days = max(0, int(rollup_days))
        self.max_bytes = max(0, int(max_bytes))
        self.clock = clock
        # The first look a few seconds after start: what it tells the bus
        # then finds the notifier listening.
        self._next = clock() + FIRST
        self._size_at = 0.0
        self.size = 0
        self.over = False
        self.freed = 0          # records and rollups deleted since the last compaction
        self.pruned = 0         # records deleted, all told

    async def tick(self) -> None:
        """One bounded step, if one is due (billing.after_flush calls it)."""
        now = self.clock()
        if now < self._next:
            return
        busy = await self.step(now)
        self._next = now + (STEP if busy else IDLE)

    async def step(self, now: float) -> bool:
        """Do the next piece of work; True if there may be more."""
        if self.max_bytes and (self.over or now - self._size_at >= IDLE):
            await self._measure(now)
        if self.over:
            # At the ceiling: the oldest records, whatever their age, and
            # their space back at once, so the next look sees the size fall.
            if await self._prune_usage(None):
                self.freed = 0
                await self.store.give_back_space()
                return True
        if self.usage_days and await self._prune_usage(now - self.usage_days * 86400):
            return True
        if self.rollup_days and await self._prune_rollups(now - self.rollup_days * 86400):
            return True
        if self.freed:
            self.freed = 0
            await self.store.give_back_space()
            if self.max_bytes:
                await self._measure(now)
        return False

    async def _prune_usage(self, cutoff: float | None) -> int:
        flt = {} if cutoff is None else {"created_at": {"$lt": cutoff}}
        ids = [d["_id"] async for d in self.store.reports.usage.find(flt, {"_id": 1}).sort(
            "created_at", 1).limit(PRUNE_CHUNK)]
        if not ids:
            return 0
        r = await self.store.db.usage.delete_many({"_id": {"$in": ids}})
        n = r.deleted_count
        self.pruned += n
        await self._freed(n)
        if cutoff is None:
            log.warning("storage ceiling: pruned the %d oldest usage record(s)", n)
        return n

    async def _prune_rollups(self, cutoff: float) -> int:
        day = rollups.day_of(cutoff)
        n = 0
        for coll in rollups.COLLECTIONS:
            ids = [d["_id"] async for d in self.store.reports[coll].find(
                {"day": {"$lt": day}}, {"_id": 1}).limit(PRUNE_CHUNK)]
            if ids:
                n += (await self.store.db[coll].delete_many({"_id": {"$in": ids}})).deleted_count
        await self._freed(n)
        return n

    async def _freed(self, n: int) -> None:
        self.freed += n
        if self.freed >= COMPACT_EVERY:
            self.freed = 0
            await self.store.give_back_space()

    async def _measure(self, now: float) -> None:
        self._size_at = now
        self.size = await self.store.disk_bytes()
        if not self.max_bytes:
            return
        share = self.size / self.max_bytes
        was = self.over
        self.over = share >= 1.0 or (was and share >= STOP_AT)
        if self.over and not was:
            log.warning("storage ceiling reached (%d of %d bytes): pruning the oldest usage "
                        "records", self.size, self.max_bytes)
        if share >= WARN_AT and self.bus is not None:
            self.bus.publish("storage", {"bytes": self.size, "max_bytes": self.max_bytes,
                                         "share": round(share, 3), "pruning": self.over})
