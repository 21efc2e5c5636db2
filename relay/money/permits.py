"""The permits of relay/money/limits.py in the database: a pool document per limit
and window, how this process leases from it (waiting, when others hold the
rest), gives back what others want, and returns a dead process's slots.
relay/money/limits.py explains the design."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from models.store import DuplicateKeyError
from relay.errors import RelayError

log = logging.getLogger("relay.limits")

RPM, TPM, CONC = 0, 1, 2
_WHAT = ("requests per minute", "tokens per minute", "concurrent requests")
_CODE = ("rpm", "tpm", "concurrency")
# Seconds between prunings of past minutes' documents.
PRUNE_EVERY = 10.0


class LimitExceeded(RelayError):
    """429 naming the limit hit; `headers` are Retry-After and the
    x-ratelimit-* pair(s) OpenAI clients read."""

    def __init__(self, scope: str, kind: int, limit: int, retry_after: int, headers: dict):
        who = "API key" if scope == "token" else "account"
        super().__init__(429, f"The {who}'s limit of {limit} {_WHAT[kind]} is reached; "
                              f"retry after {retry_after} s.", "rate_limit_error",
                         f"{scope}_{_CODE[kind]}_limit")
        self.headers = headers


@dataclass
class Bucket:
    """This process's share of one limit in one minute (concurrency: for
    as long as it is set), and of its pool document `doc_id`."""
    scope: str
    ident: int
    kind: int
    limit: int
    window: int                 # minute number; -1 for concurrency
    doc_id: str
    held: int = 0               # permits leased here and unused (CONC: free slots)
    busy: int = 0               # CONC: slots in use here
    debt: int = 0               # TPM: tokens counted beyond the lease, owed to the pool
    left: int = -1              # the document's `left` when last seen (for headers)
    written: int = 0            # held (+busy) as last written to the document
    refused_until: float = 0.0  # monotonic; fail fast after a fruitless wait
    refilling: bool = False     # a lease is being taken ahead of need
    touched: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def chunk(self) -> int:
        """Permits leased at once: a sixteenth of the limit, at most 256 calls
        (or a million tokens)."""
        return max(1, min(self.limit // 16, 1_000_000 if self.kind == TPM else 256))


class Permits:
    """Mixin of Limiter: its buckets (`_buckets`, keyed by scope, id, kind
    and window) and their pool documents."""

    @property
    def coll(self):
        return self.store.db.limits

    # ---- leases ---------------------------------------------------------------
    def _bucket(self, scope: str, ident: int, kind: int, limit: int, window: int,
                now: float = 0.0) -> Bucket:
        w = window if kind != CONC else -1
        b = self._buckets.get((scope, ident, kind, w))
        if b is None:
            doc_id = f"{scope}:{ident}:{_CODE[kind]}" + (f":{w}" if w >= 0 else "")
            b = self._buckets[(scope, ident, kind, w)] = Bucket(scope, ident, kind, limit, w,
                                                                doc_id)
        if b.limit != limit:  # changed by an admin: the document follows at the next lease
            b.limit = limit
            b.refused_until = 0.0
        b.touched = now or time.monotonic()
        return b

    async def _lease(self, b: Bucket) -> None:
        """Lease permits into `b` until it holds one, or raise LimitExceeded."""
        async with b.lock:
            if b.held >= 1:
                return
            if b.refused_until > time.monotonic():
                raise self._exceeded(b)
            take = b.chunk
            deadline = time.monotonic() + self.wait
            created = wanted = False
            held = f"held.{self.pid}"
            while True:
                # Tokens counted here beyond the lease are paid first.
                debt = b.debt
                doc = await self.coll.find_one_and_update(
                    {"_id": b.doc_id, "left": {"$gte": take + debt}},
                    {"$inc": {"left": -take - debt, held: take}}, return_document=True)
                if doc is None and debt and b.debt == debt:
                    paid = await self.coll.find_one_and_update(
                        {"_id": b.doc_id}, {"$inc": {"left": -debt}}, return_document=True)
                    if paid is not None:
                        b.debt -= debt
                        continue
                if doc is not None:
                    b.debt -= debt
                    b.held += take
                    b.written += take
                    b.left = int(doc["left"])
                    if int(doc.get("limit", b.limit)) != b.limit:
                        await self._relimit(b, int(doc.get("limit", b.limit)))
                    if wanted:
                        await self.coll.update_one({"_id": b.doc_id}, {"$unset": {"want": ""}})
                    return
                if not created:
                    created = True
                    if await self._create(b):
                        continue
                cur = await self.coll.find_one({"_id": b.doc_id})
                if cur is None:
                    continue
                if int(cur.get("limit", b.limit)) != b.limit:
                    await self._relimit(b, int(cur.get("limit", b.limit)))
                    continue
                b.left = max(int(cur.get("left", 0)), 0)
                if take > 1:
                    take = 1 if b.left < 1 else min(take, b.left)
                    continue
                others = sum(int(v) for k, v in (cur.get("held") or {}).items()
                             if k != self.pid)
                if others > 0 and time.monotonic() < deadline:
                    if not wanted:
                        wanted = True
                        await self.coll.update_one({"_id": b.doc_id}, {"$set": {"want": True}})
                    await asyncio.sleep(self.flush_interval / 3)
                    continue
                if wanted:
                    await self.coll.update_one({"_id": b.doc_id}, {"$unset": {"want": ""}})
                b.refused_until = time.monotonic() + (
                    self.flush_interval if b.kind == CONC else self._retry_after(b))
                raise self._exceeded(b)

    async def _create(self, b: Bucket) -> bool:
        doc = {"_id": b.doc_id, "left": b.limit, "limit": b.limit, "held": {}}
        if b.window >= 0:
            doc["exp"] = (b.window + 2) * 60  # kept a minute past its end, then pruned
        try:
            await self.coll.insert_one(doc)
            return True
        except DuplicateKeyError:
            return False

    async def _relimit(self, b: Bucket, old: int) -> None:
        """The limit changed since the document was made: move its pool by
        the difference, once (conditional on the old limit)."""
        await self.coll.update_one({"_id": b.doc_id, "limit": old},
                                   {"$inc": {"left": b.limit - old}, "$set": {"limit": b.limit}})

    def _retry_after(self, b: Bucket) -> int:
        if b.kind == CONC:
            return 1
        return max(1, math.ceil((b.window + 1) * 60 - time.time()))

    def _exceeded(self, b: Bucket) -> LimitExceeded:
        """429 for bucket `b`, with the scope's request and token figures as
        this process last saw them (the pool's left plus its own unused)."""
        retry = self._retry_after(b)
        headers = {"Retry-After": str(retry)}
        window = int(time.time() // 60)
        for kind, name in ((RPM, "requests"), (TPM, "tokens")):
            other = self._buckets.get((b.scope, b.ident, kind, window))
            if other is None:
                continue
            remaining = 0 if other is b else max(0, max(other.left, 0) + other.held)
            headers[f"x-ratelimit-limit-{name}"] = str(other.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(remaining)
            headers[f"x-ratelimit-reset-{name}"] = f"{self._retry_after(other)}s"
        return LimitExceeded(b.scope, b.kind, b.limit, retry, headers)

    def _refill(self, b: Bucket) -> None:
        """Lease the next chunk before this one runs out, so that a steady
        stream of calls never waits for the database.  Only from a pool
        with plenty left; near the limit the calls lease for themselves."""
        b.refilling = True

        async def run() -> None:
            try:
                async with b.lock:
                    take = b.chunk
                    doc = await self.coll.find_one_and_update(
                        {"_id": b.doc_id, "left": {"$gte": take * 4 + b.debt}},
                        {"$inc": {"left": -take - b.debt, f"held.{self.pid}": take}},
                        return_document=True)
                    if doc is not None:
                        b.debt = 0
                        b.held += take
                        b.written += take
                        b.left = int(doc["left"])
            except Exception:
                log.warning("could not lease ahead for %s", b.doc_id, exc_info=True)
            finally:
                b.refilling = False
        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._bg.discard)

    # ---- giving back ----------------------------------------------------------
    async def _loop(self) -> None:
        pruned = 0.0
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
                if time.monotonic() - pruned > PRUNE_EVERY:
                    pruned = time.monotonic()
                    await self.coll.delete_many({"exp": {"$lt": time.time()}})
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("limits flush failed; will retry")

    async def flush(self, release_all: bool = False) -> None:
        """Give back what others want (or everything, at a stop), pay token
        debts, and write what this process holds."""
        window = int(time.time() // 60)
        now = time.monotonic()
        for key, b in list(self._buckets.items()):
            if b.window >= 0 and b.window < window:
                del self._buckets[key]  # a past minute: its permits are void
        holding = [b.doc_id for b in self._buckets.values() if b.held > 0]
        wanted = set()
        if holding and not release_all:
            wanted = {d["_id"] async for d in self.coll.find(
                {"_id": {"$in": holding}, "want": True}, {"_id": 1})}
        for key, b in list(self._buckets.items()):
            idle = b.busy == 0 and now - b.touched > 10.0
            give = b.held if (release_all or b.doc_id in wanted or (b.kind == CONC and idle)) else 0
            if not (give or b.debt or b.held + b.busy != b.written):
                if idle and not b.held and not b.busy:
                    del self._buckets[key]
                continue
            async with b.lock:
                give = min(give, b.held)
                debt, b.debt = b.debt, 0
                b.held -= give
                now_held = b.held + b.busy
                update = {"$inc": {"left": give - debt}, "$set": {f"held.{self.pid}": now_held}}
                if release_all:  # stopping: calls still running lose their slots too
                    update = {"$inc": {"left": give - debt + b.busy},
                              "$unset": {f"held.{self.pid}": ""}}
                try:
                    doc = await self.coll.find_one_and_update({"_id": b.doc_id}, update,
                                                              return_document=True)
                except Exception:
                    b.held += give
                    b.debt += debt
                    raise
                b.written = now_held
                if doc is not None:
                    b.left = int(doc.get("left", 0))

    async def reclaim(self, pid: str) -> int:
        """Give back the concurrency slots of dead process `pid` (billing's
        reclaim pass calls this, relay/money/processes.py); its rate permits die
        with their minute.  Returns the slots given back."""
        key = f"held.{pid}"
        returned = 0
        # Only concurrency documents (no `exp`): a rate document's held
        # count may include permits spent since it was written.
        async for doc in self.coll.find({key: {"$exists": True}, "exp": {"$exists": False}}):
            n = int((doc.get("held") or {}).get(pid, 0))
            r = await self.coll.update_one({"_id": doc["_id"], key: n},
                                           {"$inc": {"left": n}, "$unset": {key: ""}})
            returned += n if r.modified_count else 0
        if returned:
            log.warning("returned %d concurrency slot(s) held by stopped process %s",
                        returned, pid)
        return returned
