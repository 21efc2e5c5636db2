"""The one object through which all money moves: reserve, settle, refund, credit.

Balances are held as leases (relay/leases.py explains why and how they
persist); this module is the money API on top of them.

Idempotency.  reserve/settle/refund are keyed by request id: a second settle
or refund of the same reservation does nothing.  `reverse` (refund after the
fact, e.g. a failed Midjourney task) is made idempotent by a unique ledger id.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from models.store import DuplicateKeyError
from relay.leases import COLLECTIONS, TOKEN, USER, Leases, QuotaExhausted

__all__ = ["Billing", "Reservation", "QuotaExhausted", "USER", "TOKEN"]


@dataclass
class Reservation:
    request_id: str
    user_id: int
    token_id: int | None
    token_limited: bool
    amount: int
    done: bool = False
    charged: int = 0


class Billing(Leases):
    """Reserve, settle, refund, credit and reverse: every movement of money."""

    def __init__(self, store, bus=None, process_id: str = "p", lease_chunk: int = 2_000_000,
                 flush_interval: float = 0.25, idle_release: float = 10.0):
        super().__init__(store, process_id, lease_chunk, flush_interval, idle_release)
        self.bus = bus
        self._open: dict[str, Reservation] = {}

    # ---- reserve / settle / refund ------------------------------------------
    async def reserve(self, request_id: str, user_id: int, token_id: int | None,
                      token_limited: bool, amount: int) -> Reservation:
        """Promise `amount` units from the account and (if limited) the key.

        Raises QuotaExhausted naming the side that cannot pay.
        """
        if request_id in self._open:
            return self._open[request_id]
        amount = max(int(amount), 0)
        subjects = [self._get(USER, user_id)]
        if token_id is not None and token_limited:
            subjects.append(self._get(TOKEN, token_id))
        for _ in range(8):
            for b in subjects:
                if b.available < amount:
                    await self._lease(b, amount)
            # No await from here on: the check and the subtraction are atomic.
            if all(b.available >= amount for b in subjects):
                for b in subjects:
                    b.reserved += amount
                res = Reservation(request_id, user_id, token_id, token_limited, amount)
                self._open[request_id] = res
                return res
        raise QuotaExhausted(USER)

    async def settle(self, res: Reservation, cost: int) -> int:
        """Turn a reservation into a charge of `cost`; returns what was charged.

        A cost above the reservation is taken from the balance if it can be;
        the charge is capped at what is there, never below zero.
        """
        if res.done:
            return res.charged
        cost = max(int(cost), 0)
        res.done = True
        self._open.pop(res.request_id, None)
        limited = [self._get(USER, res.user_id)]
        if res.token_id is not None and res.token_limited:
            limited.append(self._get(TOKEN, res.token_id))
        for b in limited:
            b.reserved -= res.amount
        if cost > res.amount:
            for b in limited:
                if b.available < cost:
                    try:
                        await self._lease(b, cost)
                    except QuotaExhausted:
                        pass
            cost = min([cost] + [b.available for b in limited])
            cost = max(cost, 0)
        for b in limited:
            b.held -= cost
        everyone = list(limited)
        if res.token_id is not None and not res.token_limited:
            everyone.append(self._get(TOKEN, res.token_id))
        for b in everyone:
            b.spent += cost
            b.dirty = True
        res.charged = cost
        self._publish(res.user_id, res.token_id)
        return cost

    async def refund(self, res: Reservation) -> None:
        await self.settle(res, 0)

    # ---- balances for people ------------------------------------------------
    async def balance(self, kind: str, ident: int) -> tuple[int, int]:
        """(remaining, used) as a person should see them, live."""
        doc = await self.store.db[COLLECTIONS[kind]].find_one({"_id": ident},
                                                         {"quota": 1, "used_quota": 1, "leases": 1})
        if doc is None:
            return 0, 0
        b = self._bal.get((kind, ident))
        if b is not None:
            self._absorb(b, doc)
            return b.store_quota + b.other_leases + b.held, b.store_used + b.spent
        leases = doc.get("leases") or {}
        return (int(doc.get("quota", 0)) + sum(int(v) for v in leases.values()),
                int(doc.get("used_quota", 0)))

    async def credit(self, kind: str, ident: int, amount: int, reason: str = "",
                     ledger_id: str | None = None, allow_negative: bool = False) -> bool:
        """Add (or with a negative amount, remove) quota outside of a call.

        With a ledger_id the credit happens at most once.  A debit never takes
        the stored quota below zero unless allow_negative.
        """
        amount = int(amount)
        entry = {"kind": kind, "subject": ident, "amount": amount, "reason": reason,
                 "created_at": time.time()}
        if ledger_id is not None:
            try:
                await self.store.db.ledger.insert_one({"_id": ledger_id, **entry})
            except DuplicateKeyError:
                return False
        flt: dict = {"_id": ident}
        if amount < 0 and not allow_negative:
            flt["quota"] = {"$gte": -amount}
        doc = await self.store.db[COLLECTIONS[kind]].find_one_and_update(
            flt, {"$inc": {"quota": amount}}, return_document=True)
        if doc is None:
            if ledger_id is not None:
                await self.store.db.ledger.delete_one({"_id": ledger_id})
            return False
        if ledger_id is None:
            await self.store.db.ledger.insert_one(entry)
        b = self._bal.get((kind, ident))
        if b is not None:
            self._absorb(b, doc)
        if kind == USER:
            self._publish(ident, None, user_doc=doc)
        else:
            self._publish(doc.get("user_id"), ident, token_doc=doc)
        return True

    async def reverse(self, ledger_id: str, user_id: int, token_id: int | None,
                      amount: int, reason: str) -> bool:
        """Give back an earlier charge, once: returns False if already given."""
        try:
            await self.store.db.ledger.insert_one(
                {"_id": ledger_id, "kind": "refund", "user_id": user_id, "token_id": token_id,
                 "amount": amount, "reason": reason, "created_at": time.time()})
        except DuplicateKeyError:
            return False
        docs = {}
        for kind, ident in ((USER, user_id), (TOKEN, token_id)):
            if ident is None:
                continue
            doc = docs[kind] = await self.store.db[COLLECTIONS[kind]].find_one_and_update(
                {"_id": ident}, {"$inc": {"quota": amount, "used_quota": -amount}},
                return_document=True)
            b = self._bal.get((kind, ident))
            if b is not None and doc is not None:
                self._absorb(b, doc)
        self._publish(user_id, token_id, docs.get(USER), docs.get(TOKEN))
        return True

    async def set_remaining(self, kind: str, ident: int, target: int) -> None:
        """Make the live remaining balance equal `target` (admin edits).

        This process's unreserved lease goes back first, so a lowered balance
        binds the very next request here.
        """
        b = self._bal.get((kind, ident))
        if b is not None:
            await self._write(b, release=True)
        remaining, _ = await self.balance(kind, ident)
        if target != remaining:
            await self.credit(kind, ident, target - remaining, "set by admin",
                              allow_negative=True)

    def _publish(self, user_id, token_id, user_doc: dict | None = None,
                 token_doc: dict | None = None) -> None:
        """Tell the bus the new balances; a subject this process does not
        hold is shown from the document the caller just wrote, if given."""
        if self.bus is None or user_id is None:
            return
        view = self.live_view(USER, user_id)
        if view is None and user_doc is not None:
            view = self.view_from_doc(USER, user_doc)
        if view is not None:
            self.bus.publish("balance", {"user_id": user_id, "quota": view[0], "used_quota": view[1]})
        if token_id is not None:
            tv = self.live_view(TOKEN, token_id)
            if tv is None and token_doc is not None:
                tv = self.view_from_doc(TOKEN, token_doc)
            if tv is not None:
                self.bus.publish("token_balance", {"user_id": user_id, "token_id": token_id,
                                                   "remain_quota": tv[0], "used_quota": tv[1]})

    # ---- persistence --------------------------------------------------------
    async def stop(self) -> None:
        """Flush everything and give every lease back (graceful shutdown)."""
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except (asyncio.CancelledError, Exception):
                pass
            self._flusher = None
        for res in list(self._open.values()):
            await self.refund(res)
        await self.flush(release_all=True)
        await self.store.db.processes.delete_one({"_id": self.pid})
