"""The one object through which all money moves: reserve, settle, refund, credit.

Balances are held as leases, and a charge is a usage record (relay/money/leases.py
explains both and how they persist); this module is the money API on top.
Money outside of a call (credit, set_remaining, the balance a person sees,
what the bus is told) is relay/money/adjustments.py, a part of Billing.

Idempotency.  reserve/settle/refund are keyed by request id: a second settle
or refund of the same reservation does nothing.  `reverse` (refund after the
fact, e.g. a failed Midjourney task) is made idempotent by a unique ledger id.

Lowering.  A change that sets a balance or takes money away (set_remaining,
a debit by credit()) first recalls every relay's lease on it and waits for
their answers (relay/money/recalls.py), so that no relay spends what was
taken away; a top-up is a plain $inc.

Warnings.  After each flush the balances it applied are read back and
published on the bus as `balance_applied` (the truth quota warnings are
decided from, notify/rules.py); a credit publishes its document the same way.

Budgets by period.  A call also reserves from, and is charged to, the
counters of its key's and account's budgets (relay/money/budgets.py):
balances like the others, in `budgets`, so a limit is exact across
relays.  A spent budget refuses with 429 `budget_exceeded` and
Retry-After to the next period; a call that costs more than it reserved
is charged in full to its account and key and to its counters, which may
then show more used than their limit (by at most that difference).

Shortfall.  No balance goes below zero (or below an account's credit limit):
a call whose real cost is above what is there is charged what is there, and
its record says so: `cost` (the full price), `quota` (charged) and `unpaid`.
`used_quota` is always the sum of the records' `quota`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from models.store import DuplicateKeyError, PyMongoError, insert_records
from relay.serving.background import cancel_and_wait
from relay.errors import RelayError
from relay.money.adjustments import Adjustments
from relay.money.flusher import Flusher
from relay.money.journal import Journal
from relay.money.budget_counters import BudgetCounters
from relay.money.budgets import Counter
from relay.money.leases import (BUDGET, TOKEN, USER, BillingUnavailable,
                                QuotaExhausted)
from relay.money.refusals import BudgetExceeded
from relay.money.usage import stored

log = logging.getLogger("relay.billing")

__all__ = ["Billing", "Reservation", "QuotaExhausted", "BillingUnavailable", "BudgetExceeded",
           "USER", "TOKEN", "BUDGET"]


@dataclass
class Reservation:
    request_id: str
    user_id: int
    token_id: int | None
    token_limited: bool
    amount: int
    done: bool = False
    charged: int = 0
    # Given back at shutdown while its call still ran: if that call settles
    # after all, its charge is still recorded (see stop()).
    orphaned: bool = False
    # The budgets' counters it is charged to (those with a limit reserved too).
    counters: tuple = ()


class Billing(Adjustments, BudgetCounters, Flusher):
    """Reserve, settle, refund, credit and reverse: every movement of money."""

    def __init__(self, store, bus=None, process_id: str = "p", lease_chunk: int = 2_000_000,
                 flush_interval: float = 0.5, idle_release: float = 10.0,
                 data_dir: str = "./data", spill_max_mb: int = 256, batch: int = 1000,
                 stale_after: float = 60.0, direct_below: int = 0, recall_wait: float = 1.0):
        journal = Journal(data_dir, spill_max_mb * 1024 * 1024, batch)
        super().__init__(store, process_id, lease_chunk, flush_interval, idle_release, journal,
                         stale_after, direct_below=direct_below, recall_wait=recall_wait)
        self.bus = bus
        self._open: dict[str, Reservation] = {}
        self.on_record = []  # callables given each charged record (the live usage view)
        self.on_applied.append(self._publish_applied)

    # ---- reserve / settle / refund ------------------------------------------
    async def reserve(self, request_id: str, user_id: int, token_id: int | None,
                      token_limited: bool, amount: int, credit_limit: int = 0,
                      counters: tuple[Counter, ...] = ()) -> Reservation:
        """Promise `amount` units from the account, (if limited) the key, and
        the budgets' counters that have a limit.

        Raises QuotaExhausted naming the side that cannot pay,
        BudgetExceeded naming a spent budget, and BillingUnavailable when a
        charge could not be made durable.
        """
        if request_id in self._open:
            return self._open[request_id]
        self.check_open()
        amount = max(int(amount), 0)
        subjects = [self._get(USER, user_id)]
        subjects[0].credit = max(int(credit_limit), 0)
        if token_id is not None and token_limited:
            subjects.append(self._get(TOKEN, token_id))
        limits = {}
        if counters:
            await self.open_counters(counters, user_id, token_id)
            for c in counters:
                if c.limit:
                    subjects.append(self._get(BUDGET, c.id))
                    limits[c.id] = c
        for _ in range(8):
            if self.recalls_stale() and not await self.recalls_fresh():
                # Not sure no lease here was recalled, and no read of
                # `recalls` came back in time (relay/money/recalls.py).
                raise BillingUnavailable("the database is too slow to confirm this relay's "
                                         "leases")
            for b in subjects:
                if b.available < amount:
                    await self.wait_ahead(b)
                if b.available < amount:
                    try:
                        await self._db(self._lease(b, amount))
                    except (PyMongoError, asyncio.TimeoutError):
                        raise BillingUnavailable("the database did not answer") from None
                    except QuotaExhausted:
                        if b.kind != BUDGET:
                            raise
                        c = limits[b.id]
                        raise BudgetExceeded(c.scope, c.period, c.limit,
                                             int(c.ends_at - time.time()) + 1) from None
            # No await from here on: the check and the subtraction are atomic.
            if all(b.available >= amount for b in subjects):
                for b in subjects:
                    b.reserved += amount
                    self.lease_ahead(b)
                res = Reservation(request_id, user_id, token_id, token_limited, amount,
                                  counters=tuple(counters))
                self._open[request_id] = res
                return res
        raise QuotaExhausted(USER)

    async def settle(self, res: Reservation, cost: int, record: dict | None = None) -> int:
        """Turn a reservation into a charge of `cost`; returns what was charged.

        A cost above the reservation is taken from the balance if it can be;
        the charge is capped at what is there.  `record` is the call's usage
        record: it is given `cost`, `quota` (charged) and `unpaid`, and
        becomes the charge itself (see relay/money/leases.py); without one (a
        refund) nothing is charged.
        """
        if res.done:
            if not (res.orphaned and record is not None):
                return res.charged
            # Its reservation went back when the books closed: charged from
            # what is left, the rest unpaid, but never unrecorded (once).
            res.amount, res.orphaned = 0, False
        cost = max(int(cost), 0) if record is not None else 0
        if record is not None:
            record.setdefault("created_at", time.time())
        res.done = True
        self._open.pop(res.request_id, None)
        limited = [self._get(USER, res.user_id)]
        if res.token_id is not None and res.token_limited:
            limited.append(self._get(TOKEN, res.token_id))
        # A budget limits calls, it does not pay: it never caps a charge.
        budgets = [self._get(BUDGET, c.id) for c in res.counters if c.limit]
        for b in limited + budgets:
            b.reserved -= res.amount
        charged = cost
        if cost > res.amount:
            for b in limited + budgets:
                if b.available < cost:
                    try:
                        await self._db(self._lease(b, cost, wait=False, partial=True))
                    except (QuotaExhausted, RelayError, PyMongoError, asyncio.TimeoutError):
                        pass
            charged = max(min([cost] + [b.available for b in limited]), 0)
        # From here to the journal, no await: the spend and its record are one.
        res.charged = charged
        if record is not None:
            record.update(cost=cost, quota=charged, unpaid=cost - charged,
                          token_limited=bool(res.token_limited))
            if res.counters:
                record["budgets"] = [[c.id, bool(c.limit)] for c in res.counters]
            self.journal_record(record)
            self._spend(record)
            for hook in self.on_record:
                hook(record)
        for b in limited + budgets:
            self.give_back_later(b)
        self._publish(res.user_id, res.token_id)
        return charged

    def _spend(self, record: dict) -> None:
        """Move a journaled record's `quota` (negative: give back) from the
        leases to the unapplied spend."""
        amount = int(record["quota"])
        subjects = [self._get(USER, record["user_id"])]
        if record.get("token_id") is not None:
            subjects.append(self._get(TOKEN, record["token_id"]))
        for b in subjects:
            paid = b.kind == USER or bool(record.get("token_limited"))
            if paid:
                b.held -= amount
            b.shown.charge(record["proc"], record["seq"], amount, paid)
        for cid, limited in record.get("budgets") or ():
            b = self._get(BUDGET, cid)
            if limited:
                b.held -= amount
            b.shown.charge(record["proc"], record["seq"], amount, bool(limited))

    async def refund(self, res: Reservation) -> None:
        await self.settle(res, 0)

    async def reverse(self, ledger_id: str, record: dict, reason: str) -> bool:
        """Give back an earlier charge, once: returns False if already given.

        `record` is the refund's usage record, with the negative `quota` to
        give back; like a charge it reaches the balances through the journal.
        """
        amount = -int(record["quota"])
        try:
            await self.store.db.ledger.insert_one(
                {"_id": ledger_id, "kind": "refund", "user_id": record["user_id"],
                 "token_id": record.get("token_id"), "amount": amount, "reason": reason,
                 "created_at": time.time()})
        except DuplicateKeyError:
            return False
        limited = False
        if record.get("token_id") is not None:
            doc = await self.store.db.tokens.find_one({"_id": record["token_id"]},
                                                      {"unlimited_quota": 1})
            limited = bool(doc) and not doc.get("unlimited_quota")
        record.update(cost=-amount, unpaid=0, token_limited=limited)
        self.journal_record(record)
        self._spend(record)
        for hook in self.on_record:
            hook(record)
        # What came back is held here until given back (at once, per call).
        for kind, ident in ((USER, record["user_id"]), (TOKEN, record.get("token_id"))):
            b = self._bal.get((kind, ident))
            if b is not None:
                self.give_back_later(b)
        self._publish(record["user_id"], record.get("token_id"))
        return True

    # ---- persistence --------------------------------------------------------
    async def start_up(self, previous: list[str]) -> None:
        """Before serving: put a dead predecessor's spill file into the
        database, then reclaim the predecessors (known dead: we hold their
        data directory) at once, and register this process."""
        spill = self.journal.spill
        first_spilled: dict[str, int] = {}
        since: dict[str, float] = {}
        while not spill.empty:
            batch, offset = spill.read(self.journal.batch)
            await insert_records(self.store.db.usage, [stored(r) for r in batch])
            for r in batch:
                if r.get("proc"):
                    first_spilled[r["proc"]] = min(first_spilled.get(r["proc"], r["seq"]), r["seq"])
                    at = float(r.get("created_at") or 0)
                    since[r["proc"]] = min(since.get(r["proc"], at), at)
            spill.advance(offset)
            if batch:
                log.warning("replayed %d usage record(s) from %s", len(batch), spill.path)
        await self.register()
        for pid in sorted((set(previous) | set(first_spilled)) - {self.pid, ""}):
            await self.reclaim(pid, first_spilled.get(pid), since.get(pid))
        await self.reclaim_stale()

    async def stop(self, timeout: float = 10.0) -> None:
        """Flush everything and give every lease back (graceful shutdown).

        Bounded by `timeout`: with the database gone, what is not written
        goes to the spill file and the leases stay for the next start."""
        deadline = time.monotonic() + timeout
        for task in (self._flusher, self._guard, self._beat, self._recaller):
            await cancel_and_wait(task)
        self._flusher = self._guard = self._beat = self._recaller = None
        # A chunk being leased ahead is let arrive, so that the books close
        # with it given back; with the database gone it may not, and the
        # next start's reclaim returns it.
        if self._ahead:
            await asyncio.wait(set(self._ahead), timeout=max((deadline - time.monotonic()) / 2, 0.1))
        for res in list(self._open.values()):
            await self.refund(res)
            res.orphaned = True
        try:
            while time.monotonic() < deadline:
                busy = await asyncio.wait_for(self.flush(), max(deadline - time.monotonic(), 0.1))
                if not busy and not self.journal.pending:
                    break
            await asyncio.wait_for(self.flush(release_all=True),
                                   max(deadline - time.monotonic(), 0.1))
            # Reclaim ourselves: returns any lease a lost reply left behind
            # and leaves a tombstone, not a deletion, that says what is
            # applied, so a later reclaim of this id applies nothing twice.
            await asyncio.wait_for(self.reclaim(self.pid), max(deadline - time.monotonic(), 0.1))
        except (asyncio.TimeoutError, PyMongoError, OSError) as exc:
            left = self.journal.pending
            if self.journal.drain_all():
                log.error("database unavailable at shutdown (%s): %d usage record(s) written to "
                          "%s; the next start applies them", str(exc) or type(exc).__name__, left,
                          self.journal.spill.path)
            else:
                log.critical("database unavailable at shutdown and the spill file is full: "
                             "%d usage record(s) lost", self.journal.pending)
        self.journal.closed = True
