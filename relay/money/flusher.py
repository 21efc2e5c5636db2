"""The billing flusher: ticks that store a bounded batch of usage records
each, every quarter of a flush interval; beside them, every two intervals,
an apply of what was stored to the balances and the usage rollups
(relay/money/applier.py), after which idle leases go back.  Beside those a
guard moves late records to the spill file, a heartbeat keeps this process
alive, and a loop answers other relays' recalls every tick
(relay/money/recalls.py).  relay/money/leases.py explains the design.

Why storing does not wait for applying: a record waits in memory at most a
flush interval before the guard moves it to the spill file (what a crash
may cost, README "What a crash costs"), and on a loaded machine an apply
over thousands of keys and rollup documents takes longer than that; had
the ticks waited for it, records made meanwhile would pass through the
spill file.  The apply's commands are chunked (applier.BULK_CHUNK), so a
batch to store waits behind one chunk at most."""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import PyMongoError, insert_records
from relay.money.applier import Applier
from relay.money.usage import stored
from relay.serving.buglog import reason

log = logging.getLogger("relay.billing")


# The flusher applies what it stored every APPLY_EVERY flush intervals, or
# once APPLY_MAX records wait, whichever comes first (_apply_loop()).
APPLY_EVERY = 2
APPLY_MAX = 4000
# Idle leases given back in one tick, at most (the rest in the next ones).
RELEASES_PER_TICK = 32


class Flusher(Applier):
    """Leases, and the flusher that makes charges durable."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._apply_lock = asyncio.Lock()
        # Records stored and not yet applied, by _id, in sequence order.
        self._unapplied: dict[str, dict] = {}
        self._applied_at = 0.0
        self.stored_upto = 0

    def start(self) -> None:
        if self._flusher is None:
            loop = asyncio.get_running_loop()
            self._flusher = loop.create_task(self._flush_loop())
            self._guard = loop.create_task(self._guard_loop())
            self._beat = loop.create_task(self._beat_loop())
            self.recalls_read = time.monotonic()
            self._recaller = loop.create_task(self._recall_loop())

    async def _guard_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval / 8)
            try:
                self.journal.guard(self.flush_interval)
            except OSError as exc:
                log.error("cannot write the spill file: %s", exc)

    async def _beat_loop(self) -> None:
        """Heartbeat and reclaim on their own timer: a slow flush must not
        make this process look dead, nor stop it taking calls."""
        while True:
            await asyncio.sleep(self.stale_after / 12)
            try:
                await self._db(self.heartbeat())
                await self._db(self.reclaim_stale())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("billing heartbeat: %s; will retry", reason(exc))

    async def _flush_loop(self) -> None:
        # One task (what stop() cancels), two loops: storing never waits
        # for an apply.
        await asyncio.gather(self._store_loop(), self._apply_loop())

    async def _store_loop(self) -> None:
        while True:
            busy = False
            started = time.monotonic()
            try:
                busy = await self.flush(defer=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("billing flush: %s; will retry", reason(exc))
            # Ticks start every quarter interval, so a record is normally
            # stored long before the guard (at one interval) would move it to
            # the spill file, even with a database slowed by load; a backlog
            # drains a batch per tick without waiting.
            await asyncio.sleep(0 if busy else
                                max(self.flush_interval / 4 - (time.monotonic() - started), 0))

    async def _apply_loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                if self._unapplied and (
                        len(self._unapplied) >= APPLY_MAX or
                        started - self._applied_at >= APPLY_EVERY * self.flush_interval):
                    await self.apply_stored()
                else:
                    await self._release_idle(False)
                for hook in self.after_flush:
                    await self._db(hook())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("billing apply: %s; will retry", reason(exc))
            await asyncio.sleep(max(self.flush_interval / 4 - (time.monotonic() - started), 0))

    async def flush(self, release_all: bool = False, defer: bool = False) -> bool:
        """A bounded batch of records stored; then, unless `defer` (the
        flusher's own store ticks, beside which _apply_loop applies every
        APPLY_EVERY flush intervals or once APPLY_MAX records wait), every
        record stored and not yet applied applied to the balances and
        rollups, and idle leases given back (all of them with
        `release_all`).  Applying every two intervals makes a key called ten
        times in a second one update, not ten, which at thousands of keys is
        most of the database's work.  A record is durable once stored; one
        stored and not applied when the process dies is applied by the
        reclaim pass, like any record after `applied_upto`
        (relay/money/leases.py).  Returns True while older records wait in
        the spill file."""
        took = await self._store_batch()
        if not defer:
            await self.apply_stored(release_all)
        # Not busy while the apply is behind and nothing is taken: the
        # store loop would spin on the spill file.
        return took and not self.journal.spill.empty

    async def _store_batch(self) -> bool:
        """Store a batch from the journal; False when none was taken."""
        async with self._flush_lock:
            started = time.time()
            taken = len(self._unapplied) < 2 * APPLY_MAX
            if not taken:
                # Applying is failing while storing is not: take no more (the
                # journal's guard moves what waits to the spill file).
                batch, offset = [], None
            else:
                batch, offset = self.journal.take()
            # Our own records already stored are a copy the guard wrote while
            # a slow tick was still storing them.
            batch = [r for r in batch if r["proc"] != self.pid or r["seq"] > self.stored_upto]
            try:
                if batch:
                    await self._db(insert_records(self.store.db.usage, [stored(r) for r in batch]))
                self.journal.done(offset)
            except BaseException:
                self.journal.failed()
                raise
            mine = [r["seq"] for r in batch if r["proc"] == self.pid]
            if mine:
                self.stored_upto = max(self.stored_upto, max(mine))
            for r in batch:
                if r["_id"] not in self._unapplied:
                    self._unapplied[r["_id"]] = r
            if batch:
                # `flushed_at`: every record made before it is in the database
                # or the spill file (what the crash tests check against).
                durable = started if not self.journal.memory else self.journal.memory[0][1].get(
                    "created_at", started)
                await self._db(self.store.db.processes.update_one(
                    {"_id": self.pid}, {"$max": {"flushed_at": min(durable, started)}}))
            return taken

    async def apply_stored(self, release_all: bool = False) -> None:
        """Apply every record stored and not yet applied (one apply at a
        time, in the order they were stored: each process's in sequence
        order), note `applied_upto`, read back the balances someone
        watches, then give back idle leases."""
        async with self._apply_lock:
            applying = list(self._unapplied.values())
            if applying:
                applied = await self._apply(applying)
                for r in applying:
                    self._unapplied.pop(r["_id"], None)
                self._applied_at = time.monotonic()
                own = [r for r in applying if r["proc"] == self.pid]
                if own:
                    self.applied_upto = max(self.applied_upto, max(r["seq"] for r in own))
                    self.applied_created = max(self.applied_created,
                                               max(float(r.get("created_at") or 0) for r in own))
                await self._db(self.store.db.processes.update_one(
                    {"_id": self.pid}, {"$max": {"applied_upto": self.applied_upto,
                                                 "applied_created": self.applied_created}}))
                try:
                    await self._db(self._read_back(applying, applied))
                except (PyMongoError, asyncio.TimeoutError) as exc:
                    # Applied all the same; the next apply of the balance reads it.
                    log.warning("reading back applied balances: %s", reason(exc))
            await self._release_idle(release_all)

    async def _release_idle(self, release_all: bool) -> None:
        """Give back the leases of balances idle for idle_release, at most
        RELEASES_PER_TICK a tick (each is a round trip: thousands of keys
        going idle at once held a tick for seconds); all at shutdown."""
        now = time.monotonic()
        left = RELEASES_PER_TICK
        for b in list(self._bal.values()):
            # At shutdown nobody looks any more: let all go, so the documents
            # are tidied of this process's marks.
            b.shown.let_go(float("inf") if release_all else now - self.retain_applied)
            idle = b.reserved == 0 and now - b.touched > self.idle_release
            if release_all or (idle and left > 0):
                if b.held or (b.shown.unapplied == 0 and b.available == 0):
                    left -= 1
                    await self._db(self._release(b))
                if idle and not b.held and not b.shown.holding:
                    self._bal.pop((b.kind, b.id), None)

