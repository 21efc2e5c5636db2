"""How relays hold quota, and how a charge becomes durable.

Leases.  The embedded database answers about a thousand operations a
second; two documents (account and key) times reserve and settle would cap
the relay far below its upstreams.  So a relay leases part of a balance
with one atomic conditional update:

    {_id, quota >= take - credit_limit, lowering absent}
        -> $inc {quota: -take, leases.<P>: +take}

and reserves and settles against its lease in memory, where the event loop
makes check-and-subtract atomic (no await between them).  A balance shown
to people is `quota + sum(leases)`, less the charges not applied yet.

Several relays share one database, so a lease must never refuse a paying
user on another relay, nor let a relay spend what an administrator took
away.  Three rules (relay/money/recalls.py holds the second and third):

  Leases follow the balance.  A relay leases at most
  (what is left) / (LEASE_SHARE x the relays holding a lease on it),
  and never more than `lease_chunk`; the next lease is taken in the
  background when half of one is left.  What is left and who holds it come
  from the last document this relay read of the balance (every lease, give
  back and flush reads one).  Below `lease_direct_below` units while other
  relays run (the heartbeat pass counts them), or before this relay has
  read the balance at all, a relay holds nothing ahead: each reserve
  leases exactly what the call needs (one atomic conditional update) and
  each settle gives back what the call did not use (one more, off the
  request path), so a relay holds only what its running calls reserved.
  A relay alone on its database keeps leasing (a quarter of what is left):
  nobody else needs the rest, and one that starts can recall it.

  A relay that finds too little asks for it back.  When the balance is
  short and other relays hold leases on it, the reserve raises the
  balance's recall counter and names the recall in `recalls`; every relay
  reads `recalls` every flush tick, in a loop of its own, and gives back
  the unreserved part of its lease on a recalled balance, writing the
  number it answered (`ack.<P>`).  The reserve meanwhile waits, up to
  `lease_recall_wait` seconds, trying again every half tick; only then is
  the call refused.

  A lowering recalls every lease first.  Setting a remaining balance,
  or taking money away, freezes the balance (`lowering`: no lease can be
  taken), recalls it, waits (up to `lease_recall_wait`) until every
  relay holding a lease has answered, then writes the new figure as one
  conditional update and lifts the freeze.  What the relays still hold
  after answering is what their running calls reserved and what they
  charged and have not applied yet: it stays theirs (calls already
  running may finish), so `quota` is set to the new figure itself and the
  balance never ends below it.  A relay spends from a lease only while
  it has read `recalls` lately, so one that did not answer in time (slow,
  dead, or cut off from the database) cannot spend it after the change:
  what it held unreserved is forfeit when it answers or is reclaimed.

One writer for money: the usage record is the source of truth.  A charge
exists only as a usage record; the balances are made from records,
idempotently.  Settling a call does, without an await in between: take the
cost from the in-memory lease and put the record (with its process id P and
a dense sequence number n) in the journal (relay/money/journal.py).  Each flush
tick (every quarter of `usage_flush_interval`; relay/money/flusher.py) then, in
this order and whatever the load:

  1. inserts one bounded batch of the oldest records (insert_many; a record
     already there is a duplicate by _id, code 11000, and harmless);
  2. applies the records it stored and has not applied yet to the balances
     and the rollups, once every two intervals (or once 4,000 wait), with
     one bulk write per collection of one conditional update per touched
     document, so a key called ten times in a second is one update:
         {_id, applied.<P> < first seq of the batch (or absent)}
         -> $inc {leases.<P>: -spent, used_quota: +spent}, $set {applied.<P>: last seq}
     so a batch applied twice changes nothing (a key that is not limited
     only counts used_quota; a record whose lease is gone, see below, is
     paid from `quota`);
  3. notes `applied_upto` and `flushed_at` in the process document;
  4. when it applied, reads the touched documents back (one find per
     collection: the same read that shows what each update of step 2 did):
     they are the truth every relay's quota warnings are decided from (the
     database, plus what other relays charged and have not applied yet,
     which they apply within two intervals), and what this relay sizes its
     leases by;
  5. returns idle leases (`lease_idle_release` seconds without a call; at
     most 32 a tick);
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

from models.store import ReturnDocument
from relay.errors import RelayError
from relay.money.journal import Journal
from relay.money.processes import Processes
from relay.money.recalls import Recalls
from relay.money.refusals import BUDGET, TOKEN, USER, BillingUnavailable, QuotaExhausted
from relay.money.shown import Shown, figures
from relay.serving.buglog import reason

log = logging.getLogger("relay.billing")

__all__ = ["Leases", "QuotaExhausted", "BillingUnavailable", "USER", "TOKEN", "BUDGET",
           "COLLECTIONS"]

# Budgets by period are balances too, one document per subject and period
# (relay/money/budgets.py), with string ids.
COLLECTIONS = {USER: "users", TOKEN: "tokens", BUDGET: "budgets"}
# A relay leases at most this share of what is left of a balance, split by
# the relays holding a lease on it: with three relays at most a twelfth
# each, so three quarters of a balance stay in the database for whichever
# relay a call reaches next, and a lease still covers many calls.
LEASE_SHARE = 4
AFTER = ReturnDocument.AFTER


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
    ahead: asyncio.Task | None = None  # the next lease, being taken in the background
    # From the last document read: `quota + sum(leases)` (None: never read)
    # and how many relays hold a lease on it, this one included.
    total: int | None = None
    holders: int = 1
    acked: int = 0       # the recall counter this relay last answered
    giving: asyncio.Task | None = None  # a give-back after a settle, under way

    @property
    def available(self) -> int:
        return self.held - self.reserved


class Leases(Recalls, Processes):
    """Balances this process holds: leased from the store, spent in memory
    (the flusher that makes charges durable: relay/money/flusher.py)."""

    collections = COLLECTIONS

    def __init__(self, store, process_id: str, lease_chunk: int, flush_interval: float,
                 idle_release: float, journal: Journal, stale_after: float = 60.0,
                 db_timeout: float = 5.0, direct_below: int = 0, recall_wait: float = 1.0):
        self.store = store
        self.pid = process_id
        self.own_ids = {process_id}   # a fenced process has had more than one
        self.chunk = lease_chunk
        self.direct_below = direct_below
        self.recall_wait = recall_wait
        self.flush_interval = flush_interval
        self.tick = flush_interval / 4
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
        # fn(kind, doc, paid) for each balance document a flush read back
        # after applying `paid` units to it (billing publishes the truth),
        # and which accounts' balances (and their keys') are worth reading
        # back: fn(user_id) -> bool; None: every one.
        self.on_applied = []
        self.watched = None
        self.relays = 0   # relays alive on this database, as the last heartbeat pass counted
        Recalls.__init__(self)

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

    # ---- how much to hold ---------------------------------------------------
    def direct(self, b: _Balance) -> bool:
        """True when this relay holds nothing of `b` ahead of its calls: it
        has not read the balance yet, or other relays run and little is left."""
        return b.total is None or (self.relays > 1 and b.total + b.credit < self.direct_below)

    def lease_size(self, b: _Balance) -> int:
        """What one lease of `b` may take now (0: lease per call)."""
        if self.direct(b):
            return 0
        return max(min(self.chunk, (b.total + b.credit) // (LEASE_SHARE * b.holders)), 0)

    def _learn(self, b: _Balance, doc: dict) -> None:
        """Take what is left of a balance, and who holds it, from a document."""
        b.shown.keep(doc)
        leases = doc.get("leases") or {}
        b.total = figures(doc)[0]
        b.holders = len({p for p, v in leases.items() if int(v) > 0} | {self.pid})

    # ---- leasing ------------------------------------------------------------
    def lease_ahead(self, b: _Balance) -> None:
        """After a reserve: with less than half a lease left unreserved, take
        the next one in the background, so that the reserves after this one
        find it there.  Waiting for it on the request path held every
        reserve of the balance for a database round trip each time a lease
        ran out: up to a third of a second on a database loaded by 10,000
        streams (bench/streams.py, 2026-11-25).  Nothing ahead when the
        balance is leased per call."""
        size = self.lease_size(b)
        if (b.ahead is not None or not size or b.available >= size // 2 or self.journal.closed
                or self.recalls_stale()):
            return
        self._spawn(b, "ahead", self._lease_ahead(b))

    def _spawn(self, b: _Balance, slot: str, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        setattr(b, slot, task)
        self._ahead.add(task)
        task.add_done_callback(self._ahead.discard)

    async def _lease_ahead(self, b: _Balance) -> None:
        try:
            await asyncio.wait_for(self._lease(b, 0, ahead=True), self.db_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a reserve that needs it leases in the foreground
            log.debug("leasing ahead on %s %s: %s", b.kind, b.id, reason(exc))
        finally:
            b.ahead = None

    async def wait_ahead(self, b: _Balance) -> None:
        """A reserve that finds too little waits for the lease already on
        its way rather than leasing one of its own."""
        task = b.ahead
        if task is not None:
            await asyncio.wait({task})

    async def _lease(self, b: _Balance, amount: int, ahead: bool = False,
                     wait: bool = True, partial: bool = False) -> None:
        """Lease from the store until `b.available >= amount`, or raise.

        `ahead` (before anyone needs it): one lease of `lease_size`, and
        nothing when the store has less.  Otherwise a short balance that
        other relays hold leases on is recalled and waited for (up to
        `lease_recall_wait`; `wait=False`: not at all) before QuotaExhausted;
        a balance being lowered is waited for too (BillingUnavailable if
        that outlasts twice the wait).  `partial`: when the store has less
        than needed, take what it has (a charge above its reservation)."""
        coll = self.store.db[COLLECTIONS[b.kind]]
        lease = f"leases.{self.pid}"
        deadline = recalled = None
        cap = None   # what the store was last seen to have
        try:
            while True:
                async with b.lock:
                    size = self.lease_size(b)
                    if b.available >= (size // 2 if ahead else amount):
                        return
                    need = amount - b.available
                    take = size if ahead else max(need, size)
                    if cap is not None:
                        take = max(min(take, cap), need)
                    if take <= 0:
                        return
                    doc = await coll.find_one_and_update(
                        {"_id": b.id, "quota": {"$gte": take - b.credit},
                         "lowering": {"$exists": False}},
                        {"$inc": {"quota": -take, lease: take}}, return_document=AFTER)
                    if doc is not None:
                        b.held += take
                        self._learn(b, doc)
                        return
                    if ahead:
                        return
                    cur = await coll.find_one({"_id": b.id})
                    if cur is None:
                        raise RelayError(401, f"{b.kind} {b.id} no longer exists",
                                         "authentication_error", "invalid_api_key")
                    self._learn(b, cur)
                    free = int(cur.get("quota", 0)) + b.credit
                    lowering = cur.get("lowering")
                    if not lowering and free >= need and cap != free:
                        cap = free   # take what is there (at least what is needed)
                        continue
                    if partial and not lowering and 0 < free < need and cap != free:
                        amount, cap = b.available + free, free
                        continue
                # Short, or being lowered: wait (with the lock let go, so that
                # this relay's own give-backs and settles go on).
                now = time.monotonic()
                if not wait:
                    raise QuotaExhausted(b.kind)
                if lowering:
                    await self.stale_lowering(b.kind, cur)
                elif free < need:
                    if not self._others_hold(cur):
                        raise QuotaExhausted(b.kind)
                    if recalled is None:
                        recalled = await self.request_recall(b)
                if deadline is None:
                    deadline = now + self.recall_wait
                if now >= deadline + (self.recall_wait if lowering else 0):
                    if lowering:
                        raise BillingUnavailable("its balance is being changed")
                    raise QuotaExhausted(b.kind)
                cap = None
                await asyncio.sleep(self.tick / 2)
        finally:
            if recalled is not None:
                await self.end_recall(b, recalled)

    def _others_hold(self, doc: dict) -> bool:
        return any(int(v) > 0 for p, v in (doc.get("leases") or {}).items()
                   if p not in self.own_ids)

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

    # ---- giving back --------------------------------------------------------
    def give_back_later(self, b: _Balance) -> None:
        """After a settle on a balance leased per call: give back what the
        call did not use, off the request path (once at a time: a give-back
        under way takes whatever is unreserved when it runs)."""
        if b.giving is None and b.available > 0 and self.direct(b) and not self.journal.closed:
            self._spawn(b, "giving", self._give_back(b))

    async def _give_back(self, b: _Balance) -> None:
        try:
            await asyncio.wait_for(self._release(b), self.db_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the idle release tries again
            log.warning("giving back on %s %s: %s", b.kind, b.id, reason(exc))
        finally:
            b.giving = None

    async def _release(self, b: _Balance, ack: int = 0) -> None:
        """Give this process's unreserved lease on `b` back to `quota`;
        with `ack`, also answer recall number `ack` (relay/money/recalls.py;
        a lease a change counted out while this relay was late to answer is
        forfeit instead).

        What is given back leaves `held` before the database is asked, so
        that no reserve can take it meanwhile; if the answer is lost it
        counts as given (the database may have taken it): at worst it waits
        in the lease until this process is reclaimed, never spent twice."""
        if time.monotonic() - self._last_heartbeat > self.stale_after * 3 / 8:
            # Cut off as long as check_open() refuses calls for: another
            # relay may have declared us dead and returned this lease already;
            # given back again, it would be in `quota` twice.  It waits in the
            # lease until our next heartbeat (which fences us if we were
            # declared dead) or our reclaim.
            return
        async with b.lock:
            give = max(b.available, 0)
            b.held -= give
            coll = self.store.db[COLLECTIONS[b.kind]]
            lease, mark = f"leases.{self.pid}", f"applied.{self.pid}"
            unmarked = {f"forfeit.{self.pid}": {"$exists": False}}
            doc = None
            tidy = b.reserved == 0 and b.held == 0 and not b.shown.holding
            if tidy:
                # Nothing of ours is left on this balance: tidy the document.
                doc = await coll.find_one_and_update(
                    {"_id": b.id, lease: give, **unmarked},
                    {"$inc": {"quota": give},
                     "$unset": {lease: "", mark: "", f"ack.{self.pid}": ""}},
                    return_document=AFTER)
                if doc is not None:
                    b.shown.unmarked(self.pid)
            if doc is None:
                update: dict = {"$inc": {"quota": give, lease: -give}} if give else {}
                if ack:
                    update["$max"] = {f"ack.{self.pid}": ack}
                if update:
                    doc = await coll.find_one_and_update({"_id": b.id, **unmarked}, update,
                                                         return_document=AFTER)
                if doc is None and (update or tidy):
                    # Refused: a change counted this lease out while this
                    # relay was late to answer (or, tidying, it holds more).
                    doc = await self.forfeit_or_return(coll, b, give, ack)
            if doc is not None:
                self._learn(b, doc)
