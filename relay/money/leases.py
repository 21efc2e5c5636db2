"""How a process holds quota, and how a charge becomes durable.

Leases.  The embedded database answers about a thousand operations a
second; two documents (account and key) times reserve and settle would cap
the relay far below its upstreams.  So each process leases quota from a
balance in chunks, with one atomic conditional update:

    {_id, quota >= take - credit_limit} -> $inc {quota: -take, leases.<P>: +take}

and reserves and settles against its lease in memory, where the event loop
makes check-and-subtract atomic (no await between them).  A balance shown
to people is `quota + sum(leases)`.

One writer for money: the usage record is the source of truth.  A charge
exists only as a usage record; the balances are made from records,
idempotently.  Settling a call does, without an await in between: take the
cost from the in-memory lease and put the record (with its process id P and
a dense sequence number n) in the journal (relay/money/journal.py).  Each flush
tick (every quarter of `usage_flush_interval`; relay/money/flusher.py) then, in
this order and whatever the load:

  1. inserts one bounded batch of the oldest records (insert_many; a record
     already there is a duplicate by _id, code 11000, and harmless);
  2. applies that batch to the balances, one conditional update per touched
     document:
         {_id, applied.<P> < first seq of the batch (or absent)}
         -> $inc {leases.<P>: -spent, used_quota: +spent}, $set {applied.<P>: last seq}
     so a batch applied twice changes nothing (a key that is not limited
     only counts used_quota; a record whose lease is gone, see below, is
     paid from `quota`);
  3. returns idle leases, and notes `applied_upto` and `flushed_at` in the
     process document;
and a guard, every eighth of the interval, moves any record older than one
interval from memory to the spill file, so a slow or absent database cannot
keep a record in memory longer than 1.125 intervals.

Nothing on the request path waits for any of it.

A crash.  Records in memory die with the process, and so does their charge:
the lease they were taken from is still whole in the database and goes back
to `quota`.  Records in the database (or in the spill file, which the next
start on the data directory puts there) are applied by the reclaim pass:
it reads the dead process's records after its `applied_upto`, applies the
dense run of sequence numbers (a gap means a record still on its way from a
spill file), returns the rest of every lease, and leaves a tombstone
`{dead: true, applied_upto}` so that a late replay applies nothing twice.
So the loss window is the calls of the last flush interval (at most 1.125
of it), their charge and their record together, never one without the
other.  A process is dead when its data directory's next owner says so
(at once), or when its heartbeat is older than `lease_stale_after`.

A process cut off from a shared database stops taking billable calls once
its last heartbeat is 3/8 of the staleness threshold old (others declare
it dead at 3/4, checking every 1/12, so its leases are back within the
threshold, 60 s by default), so it never spends
a lease another process may already have returned.  If it comes back
after being declared dead, it takes a new process id (its old records are
then paid from `quota`, as their lease was returned) and carries on.

No query here depends on a projection of a dotted field (the embedded
server returns those flat): documents are read whole or by top-level field.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from relay.errors import RelayError
from relay.money.journal import Journal
from relay.money.processes import Processes
from relay.money.shown import Shown, figures

log = logging.getLogger("relay.billing")

USER, TOKEN = "user", "token"
COLLECTIONS = {USER: "users", TOKEN: "tokens"}


class QuotaExhausted(RelayError):
    def __init__(self, kind: str):
        who = "API key" if kind == TOKEN else "account"
        super().__init__(403, f"The {who}'s quota is exhausted; top up or raise the key's quota.",
                         "insufficient_quota", f"{kind}_quota_exhausted")
        self.kind = kind


class BillingUnavailable(RelayError):
    def __init__(self, why: str):
        super().__init__(503, f"Billing is unavailable ({why}); try again shortly.",
                         "service_unavailable", "billing_unavailable")


@dataclass
class _Balance:
    kind: str
    id: int
    held: int = 0        # leased and not spent (may go negative after a fence)
    reserved: int = 0    # part of `held` promised to calls in flight
    credit: int = 0      # how far below zero the stored quota may go (accounts)
    # Its charges by sequence number: what is not yet applied in the
    # database, and what people see of it (relay/money/shown.py).
    shown: Shown = field(default_factory=Shown)
    touched: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ahead: asyncio.Task | None = None  # the next chunk, being leased in the background

    @property
    def available(self) -> int:
        return self.held - self.reserved


class Leases(Processes):
    """Balances this process holds: leased from the store, spent in memory
    (the flusher that makes charges durable: relay/money/flusher.py)."""

    collections = COLLECTIONS

    def __init__(self, store, process_id: str, lease_chunk: int, flush_interval: float,
                 idle_release: float, journal: Journal, stale_after: float = 60.0,
                 db_timeout: float = 5.0):
        self.store = store
        self.pid = process_id
        self.own_ids = {process_id}   # a fenced process has had more than one
        self.chunk = lease_chunk
        self.flush_interval = flush_interval
        self.idle_release = idle_release
        self.journal = journal
        self.stale_after = stale_after
        self.db_timeout = db_timeout
        # How long a charge applied in the database is still counted for a
        # document read before that (relay/money/shown.py): far above any read.
        self.retain_applied = max(2 * db_timeout, 10.0)
        self.seq = 0
        self.applied_upto = 0
        self.applied_created = 0.0    # created_at of that record (reclaim reads from it)
        self._bal: dict[tuple[str, int], _Balance] = {}
        self._flusher: asyncio.Task | None = None
        self._guard: asyncio.Task | None = None
        self._beat: asyncio.Task | None = None
        self._flush_lock = asyncio.Lock()
        self._ahead: set[asyncio.Task] = set()
        self._last_heartbeat = time.monotonic()
        self.after_flush = []  # async callables run after each tick (accessed times, pruning)
        # What else a process holds, given back when it is reclaimed (async
        # callables given its id) or when this one is fenced (given old, new).
        self.on_reclaim = []
        self.on_fence = []

    # ---- in memory ----------------------------------------------------------
    def _get(self, kind: str, ident: int) -> _Balance:
        b = self._bal.get((kind, ident))
        if b is None:
            b = self._bal[(kind, ident)] = _Balance(kind, ident)
        b.touched = time.monotonic()
        return b

    def check_open(self) -> None:
        """Raise BillingUnavailable when a billable call must not start."""
        if self.journal.spill.full:
            raise BillingUnavailable("the database is unreachable and the spill file is full")
        if time.monotonic() - self._last_heartbeat > self.stale_after * 3 / 8:
            raise BillingUnavailable("the database has not answered for "
                                     f"{time.monotonic() - self._last_heartbeat:.0f}s")

    def journal_record(self, record: dict) -> None:
        """Number a charged record and queue it (no await: see settle)."""
        self.seq += 1
        record["proc"], record["seq"] = self.pid, self.seq
        self.journal.add(record)

    def lease_ahead(self, b: _Balance) -> None:
        """After a reserve: with less than half a chunk left unreserved, lease
        the next chunk in the background, so that the reserves after this
        one find it there.  Waiting for it on the request path held every
        reserve of the balance for a database round trip each time a chunk
        ran out: up to a third of a second on a database loaded by 10,000
        streams (bench/streams.py, 2026-11-25)."""
        if b.ahead is not None or b.available >= self.chunk // 2 or self.journal.closed:
            return
        task = b.ahead = asyncio.get_running_loop().create_task(self._lease_ahead(b))
        self._ahead.add(task)
        task.add_done_callback(self._ahead.discard)

    async def _lease_ahead(self, b: _Balance) -> None:
        try:
            await asyncio.wait_for(self._lease(b, self.chunk, ahead=True), self.db_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a reserve that needs it leases in the foreground
            log.debug("leasing ahead on %s %s: %s", b.kind, b.id, exc or type(exc).__name__)
        finally:
            b.ahead = None

    async def wait_ahead(self, b: _Balance) -> None:
        """A reserve that finds too little waits for the chunk already on
        its way rather than leasing one of its own."""
        task = b.ahead
        if task is not None:
            await asyncio.wait({task})

    async def _lease(self, b: _Balance, amount: int, ahead: bool = False) -> None:
        """Lease from the store until `b.available >= amount`, or raise.
        `ahead` (leasing before anyone needs it): only a whole chunk, and
        nothing when the store has less; the rest of a balance goes to a
        call that needs it."""
        async with b.lock:
            if b.available >= (self.chunk // 2 if ahead else amount):
                return
            need = amount - b.available
            coll = self.store.db[COLLECTIONS[b.kind]]
            lease = f"leases.{self.pid}"
            take = max(need, self.chunk)
            doc = await coll.find_one_and_update(
                {"_id": b.id, "quota": {"$gte": take - b.credit}},
                {"$inc": {"quota": -take, lease: take}}, return_document=True)
            if doc is None and ahead:
                return
            if doc is None:
                take = 0
                for _ in range(5):
                    cur = await coll.find_one({"_id": b.id}, {"quota": 1})
                    if cur is None:
                        raise RelayError(401, f"{b.kind} {b.id} no longer exists",
                                         "authentication_error", "invalid_api_key")
                    q = int(cur.get("quota", 0))
                    if q + b.credit < need:
                        raise QuotaExhausted(b.kind)
                    doc = await coll.find_one_and_update(
                        {"_id": b.id, "quota": q}, {"$inc": {"quota": -(q + b.credit),
                                                             lease: q + b.credit}},
                        return_document=True)
                    if doc is not None:
                        take = q + b.credit
                        break
                if not take:
                    raise QuotaExhausted(b.kind)
            b.held += take
            self._absorb(b, doc)

    def _absorb(self, b: _Balance, doc: dict) -> None:
        b.shown.keep(doc)

    def view_from_doc(self, kind: str, doc: dict) -> tuple[int, int]:
        """(remaining, used) from a document the caller already read."""
        total, used, marks = figures(doc)
        b = self._bal.get((kind, doc["_id"]))
        if b is None:
            return total, used
        return b.shown.of(total, used, marks) or b.shown.live()

    def live_view(self, kind: str, ident: int) -> tuple[int, int] | None:
        """The last known balance without a database read, or None."""
        b = self._bal.get((kind, ident))
        return None if b is None else b.shown.live()

    async def _release(self, b: _Balance) -> None:
        """Give this process's unreserved lease on `b` back to `quota`."""
        async with b.lock:
            give = b.available
            coll = self.store.db[COLLECTIONS[b.kind]]
            lease, mark = f"leases.{self.pid}", f"applied.{self.pid}"
            doc = None
            if b.reserved == 0 and not b.shown.holding:
                # Nothing of ours is left on this balance: tidy the document.
                doc = await coll.find_one_and_update(
                    {"_id": b.id, lease: give}, {"$inc": {"quota": give},
                                                 "$unset": {lease: "", mark: ""}},
                    return_document=True)
                if doc is not None:
                    b.shown.unmarked(self.pid)
            if doc is None and give:
                doc = await coll.find_one_and_update(
                    {"_id": b.id}, {"$inc": {"quota": give, lease: -give}}, return_document=True)
            b.held -= give
            if doc is not None:
                self._absorb(b, doc)
