"""How a process holds quota: leases, and their persistence.

Why leases.  The embedded database answers about a thousand operations a
second; two documents (account and key) times reserve and settle would cap
the relay far below its upstreams.  So each process leases quota from a
balance in chunks, with one atomic conditional update:

    {_id, quota >= take}  ->  $inc {quota: -take, leases.<process>: +take}

and reserves and settles against its lease in memory, where the event loop
makes check-and-subtract atomic (no await between them).  Because a lease is
only ever taken from what the database holds, no key or account goes below
zero under any concurrency, in one process or many.

Persistence.  Every `flush_interval` a flusher writes each touched balance:
`$set leases.<process>: held` and `$inc used_quota: spent`, together with the
buffered usage records.  A balance shown to people is
`quota + sum(leases)`, so it is right at any moment.  If a process dies, its
lease as of the last flush goes back to `quota` once its heartbeat is stale;
calls in the lost window lose both their charge and their usage record, so
`used_quota` still equals the sum of the usage records.  On a clean stop every
lease is returned.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from relay.errors import RelayError

log = logging.getLogger("relay.billing")

USER, TOKEN = "user", "token"
COLLECTIONS = {USER: "users", TOKEN: "tokens"}
STALE_AFTER = 30.0


class QuotaExhausted(RelayError):
    def __init__(self, kind: str):
        who = "API key" if kind == TOKEN else "account"
        super().__init__(403, f"The {who}'s quota is exhausted; top up or raise the key's quota.",
                         "insufficient_quota", f"{kind}_quota_exhausted")
        self.kind = kind


@dataclass
class _Balance:
    kind: str
    id: int
    held: int = 0        # leased from the store and not yet spent
    reserved: int = 0    # part of `held` promised to calls in flight
    spent: int = 0       # spent since the last flush
    store_quota: int = 0  # `quota` as last read from the store
    other_leases: int = 0
    store_used: int = 0
    touched: float = 0.0
    dirty: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def available(self) -> int:
        return self.held - self.reserved



class Leases:
    """Balances this process holds, leased from the store, and their flusher."""

    def __init__(self, store, process_id: str, lease_chunk: int, flush_interval: float,
                 idle_release: float):
        self.store = store
        self.pid = process_id
        self.chunk = lease_chunk
        self.flush_interval = flush_interval
        self.idle_release = idle_release
        self._bal: dict[tuple[str, int], _Balance] = {}
        self._flusher: asyncio.Task | None = None
        self._flush_lock = asyncio.Lock()
        self.before_flush = []  # async callables run at each flush (usage log)

    def _get(self, kind: str, ident: int) -> _Balance:
        b = self._bal.get((kind, ident))
        if b is None:
            b = self._bal[(kind, ident)] = _Balance(kind, ident)
        b.touched = time.monotonic()
        return b

    async def _lease(self, b: _Balance, amount: int) -> None:
        """Lease from the store until `b.available >= amount`, or raise."""
        async with b.lock:
            if b.available >= amount:
                return
            need = amount - b.available
            coll = self.store.db[COLLECTIONS[b.kind]]
            field_ = f"leases.{self.pid}"
            take = max(need, self.chunk)
            doc = await coll.find_one_and_update(
                {"_id": b.id, "quota": {"$gte": take}},
                {"$inc": {"quota": -take, field_: take}}, return_document=True)
            if doc is None:
                take = 0
                for _ in range(5):
                    cur = await coll.find_one({"_id": b.id}, {"quota": 1})
                    if cur is None:
                        raise RelayError(401, f"{b.kind} {b.id} no longer exists",
                                         "authentication_error", "invalid_api_key")
                    q = int(cur.get("quota", 0))
                    if q < need:
                        raise QuotaExhausted(b.kind)
                    doc = await coll.find_one_and_update(
                        {"_id": b.id, "quota": q}, {"$inc": {"quota": -q, field_: q}},
                        return_document=True)
                    if doc is not None:
                        take = q
                        break
                if not take:
                    raise QuotaExhausted(b.kind)
            b.held += take
            self._absorb(b, doc)

    def _absorb(self, b: _Balance, doc: dict) -> None:
        b.store_quota = int(doc.get("quota", 0))
        b.store_used = int(doc.get("used_quota", 0))
        leases = doc.get("leases") or {}
        b.other_leases = sum(int(v) for k, v in leases.items() if k != self.pid)

    def view_from_doc(self, kind: str, doc: dict) -> tuple[int, int]:
        """(remaining, used) from a document the caller already read."""
        b = self._bal.get((kind, doc["_id"]))
        leases = doc.get("leases") or {}
        if b is not None:
            others = sum(int(v) for k, v in leases.items() if k != self.pid)
            return int(doc.get("quota", 0)) + others + b.held, int(doc.get("used_quota", 0)) + b.spent
        return (int(doc.get("quota", 0)) + sum(int(v) for v in leases.values()),
                int(doc.get("used_quota", 0)))

    def live_view(self, kind: str, ident: int) -> tuple[int, int] | None:
        """The last known balance without a database read, or None."""
        b = self._bal.get((kind, ident))
        if b is None:
            return None
        return b.store_quota + b.other_leases + b.held, b.store_used + b.spent

    def start(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        last_reclaim = 0.0
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
                if time.monotonic() - last_reclaim > STALE_AFTER / 3:
                    last_reclaim = time.monotonic()
                    await self.heartbeat()
                    await self.reclaim_stale()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("billing flush failed; will retry")

    async def flush(self, release_all: bool = False) -> None:
        async with self._flush_lock:
            for hook in self.before_flush:
                await hook()
            now = time.monotonic()
            for b in list(self._bal.values()):
                idle = b.reserved == 0 and now - b.touched > self.idle_release
                release = release_all or idle
                if not (b.dirty or (release and b.held)):
                    if idle and not b.held and not b.spent:
                        self._bal.pop((b.kind, b.id), None)
                    continue
                await self._write(b, release)

    async def _write(self, b: _Balance, release: bool) -> None:
        """Persist one balance: its spend, and its lease (or give the lease back)."""
        async with b.lock:
            spent = b.spent
            give_back = b.available if release else 0
            coll = self.store.db[COLLECTIONS[b.kind]]
            key = f"leases.{self.pid}"
            if release and b.reserved == 0:
                update = {"$inc": {"quota": give_back, "used_quota": spent}, "$unset": {key: ""}}
            else:
                update = {"$inc": {"quota": give_back, "used_quota": spent},
                          "$set": {key: b.held - give_back}}
            doc = await coll.find_one_and_update({"_id": b.id}, update, return_document=True)
            b.spent -= spent
            b.held -= give_back
            b.dirty = b.spent != 0
            if doc is not None:
                self._absorb(b, doc)

    async def heartbeat(self) -> None:
        await self.store.db.processes.update_one(
            {"_id": self.pid}, {"$set": {"heartbeat": time.time()}}, upsert=True)

    async def reclaim_stale(self) -> int:
        """Return the leases of processes whose heartbeat stopped."""
        cutoff = time.time() - STALE_AFTER
        dead = [d["_id"] async for d in self.store.db.processes.find({"heartbeat": {"$lt": cutoff}})]
        returned = 0
        for pid in dead:
            key = f"leases.{pid}"
            for coll in COLLECTIONS.values():
                async for doc in self.store.db[coll].find({key: {"$exists": True}}, {key: 1}):
                    amount = int((doc.get("leases") or {}).get(pid, 0))
                    r = await self.store.db[coll].update_one(
                        {"_id": doc["_id"], key: amount},
                        {"$inc": {"quota": amount}, "$unset": {key: ""}})
                    returned += amount if r.modified_count else 0
            await self.store.db.processes.delete_one({"_id": pid})
        if returned:
            log.warning("returned %d units leased by %d stopped process(es)", returned, len(dead))
        return returned
