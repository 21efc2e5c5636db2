"""The one object through which all money moves: reserve, settle, refund, credit.

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

Idempotency.  reserve/settle/refund are keyed by request id: a second settle
or refund of the same reservation does nothing.  `reverse` (refund after the
fact, e.g. a failed Midjourney task) is made idempotent by a unique ledger id.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from models.store import DuplicateKeyError
from relay.errors import RelayError

log = logging.getLogger("relay.billing")

USER, TOKEN = "user", "token"
_COLL = {USER: "users", TOKEN: "tokens"}
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


@dataclass
class Reservation:
    request_id: str
    user_id: int
    token_id: int | None
    token_limited: bool
    amount: int
    done: bool = False
    charged: int = 0


class Billing:
    def __init__(self, store, bus=None, process_id: str = "p", lease_chunk: int = 2_000_000,
                 flush_interval: float = 0.25, idle_release: float = 10.0):
        self.store = store
        self.bus = bus
        self.pid = process_id
        self.chunk = lease_chunk
        self.flush_interval = flush_interval
        self.idle_release = idle_release
        self._bal: dict[tuple[str, int], _Balance] = {}
        self._open: dict[str, Reservation] = {}
        self._flusher: asyncio.Task | None = None
        self._flush_lock = asyncio.Lock()
        self.before_flush = []  # async callables run at each flush (usage log)

    # ---- reserve / settle / refund ------------------------------------------
    def _get(self, kind: str, ident: int) -> _Balance:
        b = self._bal.get((kind, ident))
        if b is None:
            b = self._bal[(kind, ident)] = _Balance(kind, ident)
        b.touched = time.monotonic()
        return b

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

    async def _lease(self, b: _Balance, amount: int) -> None:
        """Lease from the store until `b.available >= amount`, or raise."""
        async with b.lock:
            if b.available >= amount:
                return
            need = amount - b.available
            coll = self.store.db[_COLL[b.kind]]
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

    # ---- balances for people ------------------------------------------------
    async def balance(self, kind: str, ident: int) -> tuple[int, int]:
        """(remaining, used) as a person should see them, live."""
        doc = await self.store.db[_COLL[kind]].find_one({"_id": ident},
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
        doc = await self.store.db[_COLL[kind]].find_one_and_update(
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
            doc = docs[kind] = await self.store.db[_COLL[kind]].find_one_and_update(
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
            coll = self.store.db[_COLL[b.kind]]
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
            for coll in _COLL.values():
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
