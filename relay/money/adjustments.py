"""Money outside of a call: what a person sees of a balance, an
administrator's credit, debit or new figure, and what the bus is told
when a balance changes.  A mixin of relay/money/billing.Billing (it reads
the leases and the lowering of relay/money/leases.py and recalls.py); a
charge or a refund of a call goes through Billing itself.
"""
from __future__ import annotations

import time

from models.store import DuplicateKeyError
from relay.money.leases import AFTER, BUDGET, COLLECTIONS, TOKEN, USER


class Adjustments:
    # ---- balances for people ------------------------------------------------
    async def balance(self, kind: str, ident: int) -> tuple[int, int]:
        """(remaining, used) as a person should see them, live."""
        doc = await self.store.db[COLLECTIONS[kind]].find_one(
            {"_id": ident}, {"quota": 1, "used_quota": 1, "leases": 1, "applied": 1})
        if doc is None:
            return 0, 0
        b = self._bal.get((kind, ident))
        if b is not None:
            self._learn(b, doc)
        return self.view_from_doc(kind, doc)

    async def credit(self, kind: str, ident: int, amount: int, reason: str = "",
                     ledger_id: str | None = None, allow_negative: bool = False) -> bool:
        """Add (or with a negative amount, remove) quota outside of a call.

        With a ledger_id the credit happens at most once.  A debit never takes
        the balance below zero unless allow_negative; it first recalls what
        every relay leases of it (so it is refused only when the balance
        itself is short, and no relay spends what it took away).
        """
        amount = int(amount)
        entry = {"kind": kind, "subject": ident, "amount": amount, "reason": reason,
                 "created_at": time.time()}
        if ledger_id is not None:
            try:
                await self.store.db.ledger.insert_one({"_id": ledger_id, **entry})
            except DuplicateKeyError:
                return False
        if amount >= 0:
            doc = await self.store.db[COLLECTIONS[kind]].find_one_and_update(
                {"_id": ident}, {"$inc": {"quota": amount}}, return_document=AFTER)
        else:
            floor = None if allow_negative else 0
            async with self.lowering(kind, ident) as low:
                done = low and await self.rewrite(
                    low, lambda was: None if floor is not None and was + amount < floor
                    else was + amount)
            doc = done[0] if done else None
        if doc is None:
            if ledger_id is not None:
                await self.store.db.ledger.delete_one({"_id": ledger_id})
            return False
        if ledger_id is None:
            await self.store.db.ledger.insert_one(entry)
        self._changed(kind, doc, -amount)
        return True

    async def set_remaining(self, kind: str, ident: int, target: int) -> None:
        """Make what new calls can spend of a balance `target` (admin edits).

        Every relay's lease on it is recalled first (relay/money/recalls.py),
        so that none spends the old figure once this returns.  What calls
        already running reserved stays theirs: `quota` itself becomes
        `target`, and what those calls do not use comes back on top of it.
        """
        async with self.lowering(kind, ident) as low:
            done = low and await self.rewrite(low, lambda was: int(target))
        if not done:
            return
        doc, was, new = done
        if new != was:
            await self.store.db.ledger.insert_one(
                {"kind": kind, "subject": ident, "amount": new - was,
                 "reason": "set by admin", "created_at": time.time()})
        self._changed(kind, doc, was - new)

    def _changed(self, kind: str, doc: dict, paid: int) -> None:
        """A balance document written outside of a call: learn it, and tell
        the bus (`paid`: what the write took from it, negative if it added)."""
        ident = doc["_id"]
        b = self._bal.get((kind, ident))
        if b is not None:
            self._learn(b, doc)
        if kind == BUDGET:
            return
        self._publish_applied(kind, doc, paid)
        if kind == USER:
            self._publish(ident, None, user_doc=doc)
        else:
            self._publish(doc.get("user_id"), ident, token_doc=doc)

    def _publish_applied(self, kind: str, doc: dict, paid: int) -> None:
        """The balance a document shows, for decisions that must be made from
        the truth (notify/rules.py): what is left now, and before `paid`."""
        if self.bus is None or (kind == TOKEN and doc.get("unlimited_quota")):
            return
        if kind == BUDGET:
            limit, used = int(doc.get("limit") or 0), int(doc.get("used_quota") or 0)
            if limit and used * 5 >= limit * 4:   # 80% used: notify/rules.py, once a period
                self.bus.publish("budget_used", {
                    "counter_id": doc["_id"], "user_id": doc.get("user_id"),
                    "token_id": doc.get("token_id"), "period": doc.get("period"),
                    "limit": limit, "used": used})
            return
        remaining, _ = self.view_from_doc(kind, doc)
        self.bus.publish("balance_applied", {
            "kind": kind, "user_id": doc["_id"] if kind == USER else doc.get("user_id"),
            "token_id": doc["_id"] if kind == TOKEN else None,
            "remaining": remaining, "before": remaining + paid})

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
