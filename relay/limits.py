"""Rate and concurrency limits per key and per account.

Three limits, each settable on a key (its token document) and on an account
(its user document); 0 or absent means none (models/records.LIMIT_FIELDS):
- rpm_limit: requests per minute;
- tpm_limit: tokens per minute, input plus output as the vendor reports
  them.  A call is admitted while its minute has tokens left; its tokens
  are counted when it ends (the length of an answer is not known before);
- concurrency_limit: calls in flight at once.
A minute is a fixed window of the clock (UTC minute), so "k a minute" means
at most k in each calendar minute, and Retry-After names its end.

Exact across processes, off the hot path.  Like quota (relay/leases.py),
permits live in the database, one document per limit and window,
`{_id, left, limit, held.<process>}`, and a process leases them with one
atomic conditional update

    {_id, left >= take}  ->  $inc {left: -take, held.<process>: +take}

then admits calls from its lease in memory: a call within its limits does
not wait for the database, and nothing is counted per process, so N
processes never admit N times the limit.  A lease is a sixteenth of the
limit (at most 256), and the next one is taken in the background when a
quarter is left; when the pool runs low, a process takes exactly one.

Permits one process leased but does not use would make another refuse
calls under the limit.  So a process that finds the pool empty while
others hold permits sets `want` on the document and waits (up to `wait`
seconds, polling); at every flush tick each process gives back its unused
permits of wanted documents and writes how many it holds, so a waiter knows
whether waiting can help.  Only calls at the limit ever wait; the rest of
them get 429 at once until the window ends (or, for concurrency, a tick).

Crashes: a dead process's rate permits die with their minute; its
concurrency slots go back to the pool when billing reclaims the process
(relay/processes.py: one registry, one heartbeat and one staleness rule for
quota leases and limit permits alike, so the slots come back with the
quota, within `lease_stale_after`, or at once when the next relay on the
same data directory starts).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from models.store import DuplicateKeyError
from relay.background import cancel_and_wait
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
class _Bucket:
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


@dataclass
class Ticket:
    """What one admitted call holds; give it back with Limiter.done()."""
    token_id: int
    user_id: int
    buckets: list


class Limiter:
    def __init__(self, store, process_id: str, flush_interval: float = 0.25,
                 wait: float | None = None):
        self.store = store
        self.pid = process_id   # billing's process id (relay/processes.py), followed on a fence
        self.flush_interval = flush_interval
        self.wait = wait if wait is not None else max(0.5, 3 * flush_interval)
        self._buckets: dict[tuple, _Bucket] = {}
        self._task: asyncio.Task | None = None
        self._bg: set = set()

    @property
    def coll(self):
        return self.store.db.limits

    # ---- the hot path ---------------------------------------------------------
    async def admit(self, token, user) -> Ticket | None:
        """Take one permit of every limit on the key and the account, or
        raise LimitExceeded (nothing taken).  No await while the leases
        here cover the call."""
        if not (any(token.limits) or any(user.limits)):
            return None
        window = int(time.time() // 60)
        now = time.monotonic()
        taken: list[_Bucket] = []
        try:
            for scope, ident, limits in (("token", token.id, token.limits),
                                         ("user", user.id, user.limits)):
                for kind, limit in enumerate(limits):
                    if limit <= 0:
                        continue
                    b = self._bucket(scope, ident, kind, limit, window, now)
                    while b.held < 1:
                        await self._lease(b)
                    # No await from the check to here: the take is atomic.
                    b.held -= 1
                    if kind == CONC:
                        b.busy += 1
                    taken.append(b)
                    if b.held < b.chunk // 4 and not b.refilling and kind != CONC:
                        self._refill(b)
        except BaseException:
            for b in taken:
                b.held += 1
                if b.kind == CONC:
                    b.busy -= 1
            raise
        return Ticket(token.id, user.id, taken)

    def done(self, ticket: Ticket | None, usage=None) -> None:
        """A call ended: free its concurrency slots and count its tokens
        (usage: relay.pricing.Usage or None) in the current minute."""
        if ticket is None:
            return
        tokens = (usage.prompt_tokens + usage.completion_tokens) if usage is not None else 0
        window = int(time.time() // 60)
        for b in ticket.buckets:
            if b.kind == CONC:
                b.busy -= 1
                b.held += 1
            elif b.kind == TPM:
                # The admission took one token already.
                cur = self._bucket(b.scope, b.ident, TPM, b.limit, window)
                more = tokens - 1
                if more < 0:
                    if cur is b:
                        b.held += 1
                    continue
                use = min(more, cur.held)
                cur.held -= use
                cur.debt += more - use

    # ---- leases ---------------------------------------------------------------
    def _bucket(self, scope: str, ident: int, kind: int, limit: int, window: int,
                now: float = 0.0) -> _Bucket:
        w = window if kind != CONC else -1
        b = self._buckets.get((scope, ident, kind, w))
        if b is None:
            doc_id = f"{scope}:{ident}:{_CODE[kind]}" + (f":{w}" if w >= 0 else "")
            b = self._buckets[(scope, ident, kind, w)] = _Bucket(scope, ident, kind, limit, w,
                                                                 doc_id)
        if b.limit != limit:  # changed by an admin: the document follows at the next lease
            b.limit = limit
            b.refused_until = 0.0
        b.touched = now or time.monotonic()
        return b

    async def _lease(self, b: _Bucket) -> None:
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

    async def _create(self, b: _Bucket) -> bool:
        doc = {"_id": b.doc_id, "left": b.limit, "limit": b.limit, "held": {}}
        if b.window >= 0:
            doc["exp"] = (b.window + 2) * 60  # kept a minute past its end, then pruned
        try:
            await self.coll.insert_one(doc)
            return True
        except DuplicateKeyError:
            return False

    async def _relimit(self, b: _Bucket, old: int) -> None:
        """The limit changed since the document was made: move its pool by
        the difference, once (conditional on the old limit)."""
        await self.coll.update_one({"_id": b.doc_id, "limit": old},
                                   {"$inc": {"left": b.limit - old}, "$set": {"limit": b.limit}})

    def _retry_after(self, b: _Bucket) -> int:
        if b.kind == CONC:
            return 1
        return max(1, math.ceil((b.window + 1) * 60 - time.time()))

    def _exceeded(self, b: _Bucket) -> LimitExceeded:
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

    def _refill(self, b: _Bucket) -> None:
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

    # ---- flushing ---------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.flush(release_all=True)

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
        reclaim pass calls this, relay/processes.py); its rate permits die
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

    def fenced(self, old: str, new: str) -> None:
        """Billing was declared dead and carries on as `new`: whoever
        reclaimed `old` gave its slots back, so nothing held here is ours
        any more (calls in flight finish on buckets no longer kept)."""
        self.pid = new
        self._buckets = {}


def install(app) -> None:
    """Give the relay service its limiter, and run its flusher with the app."""
    s = app.settings
    billing = s["billing"]
    limiter = s["limits"] = Limiter(s["store"], billing.pid, s["config"].usage_flush_interval)
    s["service"].limits = limiter
    # One process registry for quota and limits (relay/processes.py).
    billing.on_reclaim.append(limiter.reclaim)
    billing.on_fence.append(limiter.fenced)

    async def on_start(_app) -> None:
        limiter.start()

    async def on_stop(_app) -> None:
        await limiter.stop()

    s["on_start"].append(on_start)
    s["on_stop"].append(on_stop)
