"""The billing flusher: each tick stores a bounded batch of usage records,
applies it to the balances idempotently, reads back the balances someone
watches and returns idle leases; beside it a guard moves late records to
the spill file, a heartbeat keeps this process alive, and a loop answers
other relays' recalls every tick (relay/money/recalls.py).
relay/money/leases.py explains the design."""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import PyMongoError, insert_records
from relay.money.leases import BUDGET, COLLECTIONS, TOKEN, USER, Leases
from relay.money.usage import stored

log = logging.getLogger("relay.billing")


def subjects_of(record: dict) -> list[tuple[str, int, bool]]:
    """(kind, id, paid from a lease) for each balance a record moves."""
    out = [(USER, record["user_id"], True)]
    if record.get("token_id") is not None:
        out.append((TOKEN, record["token_id"], bool(record.get("token_limited"))))
    # A budget's counter always counts down what is left of its limit (from
    # the lease its relay took, else from `quota`: relay/money/budgets.py).
    for cid, _ in record.get("budgets") or ():
        out.append((BUDGET, cid, True))
    return out


class Flusher(Leases):
    """Leases, and the flusher that makes charges durable."""

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
                log.warning("billing heartbeat: %s; will retry", exc or type(exc).__name__)

    async def _flush_loop(self) -> None:
        while True:
            busy = False
            started = time.monotonic()
            try:
                busy = await self.flush()
                for hook in self.after_flush:
                    await self._db(hook())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("billing flush: %s; will retry", exc or type(exc).__name__)
            # Ticks start every quarter interval, so a record is normally
            # stored long before the guard (at one interval) would move it to
            # the spill file, even with a database slowed by load; a backlog
            # drains a batch per tick without waiting.
            await asyncio.sleep(0 if busy else
                                max(self.flush_interval / 4 - (time.monotonic() - started), 0))

    async def _db(self, aw):
        return await asyncio.wait_for(aw, self.db_timeout)

    async def flush(self, release_all: bool = False) -> bool:
        """One tick: a bounded batch of records, then their balances, then idle
        leases.  Returns True while older records wait in the spill file."""
        async with self._flush_lock:
            started = time.time()
            batch, offset = self.journal.take()
            # Our own records at or below applied_upto are a copy the guard
            # wrote while a slow tick was still storing them.
            batch = [r for r in batch if r["proc"] != self.pid or r["seq"] > self.applied_upto]
            try:
                if batch:
                    await self._db(insert_records(self.store.db.usage, [stored(r) for r in batch]))
                    await self._db(self._apply(batch))
                self.journal.done(offset)
            except BaseException:
                self.journal.failed()
                raise
            mine = [r for r in batch if r["proc"] == self.pid]
            if mine:
                self.applied_upto = max(self.applied_upto, max(r["seq"] for r in mine))
                self.applied_created = max(self.applied_created,
                                           max(float(r.get("created_at") or 0) for r in mine))
            if batch:
                # `flushed_at`: every record made before it is in the database
                # or the spill file (what the crash tests check against).
                durable = started if not self.journal.memory else self.journal.memory[0][1].get(
                    "created_at", started)
                await self._db(self.store.db.processes.update_one(
                    {"_id": self.pid}, {"$max": {"applied_upto": self.applied_upto,
                                                 "applied_created": self.applied_created,
                                                 "flushed_at": min(durable, started)}}))
                try:
                    await self._db(self._read_back(batch))
                except (PyMongoError, asyncio.TimeoutError) as exc:
                    # Applied all the same; the next flush of the balance reads it.
                    log.warning("reading back applied balances: %s", exc or type(exc).__name__)
            await self._release_idle(release_all)
            return not self.journal.spill.empty

    async def _apply(self, records: list[dict]) -> None:
        """Apply records to the balances, idempotently (see the docstring)."""
        groups: dict[tuple, list] = {}
        for r in records:
            for kind, ident, leased in subjects_of(r):
                groups.setdefault((r["proc"], kind, ident, leased), []).append(
                    (int(r["seq"]), int(r.get("quota") or 0)))
        for (proc, kind, ident, leased), items in groups.items():
            await self._apply_one(proc, kind, ident, leased, items)
            b = self._bal.get((kind, ident)) if proc in self.own_ids else None
            run = b.shown.runs.get(proc) if b is not None else None
            if run is not None:
                # By sequence number, so a batch applied again changes nothing.
                run.applied(max(s for s, _ in items), time.monotonic())

    async def _read_back(self, records: list[dict]) -> None:
        """Read the balances just applied (one find per collection) that
        someone watches (`watched`: accounts with quota warnings): the truth
        the hooks decide warnings from (`on_applied`, given what the batch
        took from each), and what this relay sizes its leases by."""
        paid: dict[tuple[str, int], int] = {}
        watched = self.watched
        for r in records:
            # Budgets with a limit are always read back: their 80% notice,
            # and the month's spend that rate tiers are decided from.
            for cid, limited in r.get("budgets") or ():
                if limited or (BUDGET, cid) in self._bal:
                    paid[(BUDGET, cid)] = paid.get((BUDGET, cid), 0) + int(r.get("quota") or 0)
            if watched is not None and not watched(r["user_id"]):
                continue
            for kind, ident, leased in subjects_of(r):
                if kind == BUDGET:
                    continue
                paid[(kind, ident)] = paid.get((kind, ident), 0) + (
                    int(r.get("quota") or 0) if leased else 0)
        for kind, coll in COLLECTIONS.items():
            ids = [i for k, i in paid if k == kind]
            if not ids:
                continue
            async for doc in self.store.db[coll].find({"_id": {"$in": ids}}):
                b = self._bal.get((kind, doc["_id"]))
                if b is not None:
                    self._learn(b, doc)
                for fn in self.on_applied:
                    fn(kind, doc, paid.get((kind, doc["_id"]), 0))

    async def _apply_one(self, proc: str, kind: str, ident: int, leased: bool,
                         items: list[tuple[int, int]]) -> int:
        """Apply one process's records to one balance; returns the amount
        newly applied by this call (all of the batch's spend is accounted
        for either way: what is not applied now was applied before)."""
        coll = self.store.db[COLLECTIONS[kind]]
        mark, lease = f"applied.{proc}", f"leases.{proc}"
        first, last = min(s for s, _ in items), max(s for s, _ in items)
        total = sum(q for _, q in items)
        # Flat filters, the usual case first: a `$or` would need `$and`
        # around it on nx-27017 (models/compat.py), four times slower there.
        marks: list = [{"$lt": first}, {"$exists": False}]
        for _ in range(6):
            attempts = []
            for m in marks:
                if not leased:
                    attempts.append(({mark: m}, {"used_quota": total}))
                else:
                    attempts += [({mark: m, lease: {"$exists": True}},
                                  {lease: -total, "used_quota": total}),
                                 ({mark: m, lease: {"$exists": False}},
                                  {"quota": -total, "used_quota": total})]
            for flt, inc in attempts:
                r = await coll.update_one({"_id": ident, **flt},
                                          {"$inc": inc, "$set": {mark: last}})
                if r.matched_count:
                    return total
            # Some of it was applied before (a retry, or a reclaim that raced
            # a replay): apply only the records after the stored marker.
            doc = await coll.find_one({"_id": ident}, {"applied": 1})
            if doc is None:
                log.error("usage of %s %s applied to nothing: the %s is gone", kind, ident, kind)
                return total
            seen = int((doc.get("applied") or {}).get(proc, 0))
            rest = [(s, q) for s, q in items if s > seen]
            if not rest:
                return 0
            first, total = min(s for s, _ in rest), sum(q for _, q in rest)
            marks = [seen]
        raise PyMongoError(f"could not apply usage to {kind} {ident}: it kept changing")

    async def _release_idle(self, release_all: bool) -> None:
        now = time.monotonic()
        for b in list(self._bal.values()):
            # At shutdown nobody looks any more: let all go, so the documents
            # are tidied of this process's marks.
            b.shown.let_go(float("inf") if release_all else now - self.retain_applied)
            idle = b.reserved == 0 and now - b.touched > self.idle_release
            if release_all or idle:
                if b.held or (b.shown.unapplied == 0 and b.available == 0):
                    await self._db(self._release(b))
                if idle and not b.held and not b.shown.holding:
                    self._bal.pop((b.kind, b.id), None)

