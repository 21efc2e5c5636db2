"""Budgets' counters as billing holds them (relay/money/budgets.py says
what a counter is): made on a period's first call, read for the month's
spend that rate tiers need, and moved when a limit changes."""
from __future__ import annotations

import asyncio
import time

from models.store import DuplicateKeyError, PyMongoError
from relay.money.leases import BUDGET, COLLECTIONS, TOKEN, BillingUnavailable


class BudgetCounters:
    """Mixed into Billing (relay/money/billing.py), beside its leases."""

    async def open_counters(self, counters, user_id: int, token_id: int | None) -> None:
        """Make sure each counter's document exists (the first call of a
        period makes it: its limit is what is left) and that this relay has
        read it once.  One insert per counter, period and relay."""
        coll = self.store.db[COLLECTIONS[BUDGET]]
        for c in counters:
            b = self._get(BUDGET, c.id)
            if b.total is not None:
                continue
            doc = {"_id": c.id, "quota": c.limit, "used_quota": 0, "limit": c.limit,
                   "user_id": user_id, "token_id": token_id if c.scope == TOKEN else None,
                   "period": c.period, "ends_at": c.ends_at, "created_at": time.time()}
            try:
                await self._db(coll.insert_one(doc))
            except DuplicateKeyError:
                doc = await self._db(coll.find_one({"_id": c.id}))
            except (PyMongoError, asyncio.TimeoutError):
                raise BillingUnavailable("the database did not answer") from None
            if doc is not None and b.total is None:
                self._learn(b, doc)

    def spent(self, counter_id: str) -> int:
        """What a counter shows charged this period: the database as last
        read, plus this relay's charges since (another relay's reach it
        when this one next applies a charge to it, within a flush)."""
        b = self._bal.get((BUDGET, counter_id))
        return 0 if b is None else b.shown.live()[1]

    async def set_budget_limit(self, counter_id: str, limit: int) -> None:
        """A budget's limit changed: move what is left of the period's
        counter by the difference (a lowering recalls every relay's lease
        first, as for a quota).  Nothing when the period has no counter yet."""
        coll = self.store.db[COLLECTIONS[BUDGET]]
        doc = await coll.find_one({"_id": counter_id}, {"limit": 1})
        if doc is None:
            return
        delta = int(limit) - int(doc.get("limit") or 0)
        if delta:
            await self.credit(BUDGET, counter_id, delta, "budget limit changed",
                              allow_negative=True)
            await coll.update_one({"_id": counter_id}, {"$set": {"limit": int(limit)}})
