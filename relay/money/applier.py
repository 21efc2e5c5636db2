"""Applying stored usage records to the balances and the usage rollups,
idempotently by sequence number (relay/money/leases.py explains the
balances, relay/money/rollups.py the rollups): one bulk write per
collection, in commands of at most BULK_CHUNK updates, then one read of the
documents written; the few that did not take go the long way.  The billing
flusher (relay/money/flusher.py) runs it every two flush intervals, beside
the ticks that store records, and the reclaim of a dead process runs it on
that process's records."""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import DuplicateKeyError, Op, PyMongoError, bulk_apply, read_marks
from relay.money import rollups
from relay.money.leases import BUDGET, COLLECTIONS, TOKEN, USER, Leases

log = logging.getLogger("relay.billing")

# Updates in one command, at most: the embedded server runs one command at
# a time, so the flusher's next batch of records waits behind at most one
# chunk of an apply, not the whole of it (thousands of keys and rollup
# documents), and is stored before the journal's guard moves it to the
# spill file.
BULK_CHUNK = 256
# What a balance's view needs of its document (relay/money/shown.py figures),
# and what billing's balance_applied says of it (whose key, whether limited).
# What the read-back needs: the figures and marks, and what the on_applied
# hooks publish (balance_applied; a budget's limit and period for budget_used).
BALANCE_FIELDS = {"quota": 1, "used_quota": 1, "leases": 1, "applied": 1,
                  "user_id": 1, "unlimited_quota": 1, "token_id": 1, "limit": 1,
                  "period": 1}


def spend(total: int, paid_from: str | None) -> dict:
    """The $inc of `total` spent: used, and taken from the lease or `quota`
    it was paid from (None: a balance that is not limited takes nothing)."""
    inc = {"used_quota": total}
    if paid_from:
        inc[paid_from] = -total
    return inc


def balance_ops(proc: str, ident: int, leased: bool, items: list[tuple[int, int]],
                marked: bool | None) -> list:
    """The conditional update(s) that apply one process's charges to one
    balance (relay/money/leases.py, step 2): `marked` says whether the
    document has the process's mark (None: not known, then both forms go,
    and at most one of them can match)."""
    mark, lease = f"applied.{proc}", f"leases.{proc}"
    first, last = min(s for s, _ in items), max(s for s, _ in items)
    total = sum(q for _, q in items)
    inc = spend(total, lease if leased else None)
    conds = ([{"$lt": first}] if marked is not False else []) + (
        [{"$exists": False}] if marked is not True else [])
    # Flat filters: a `$or` would need `$and` around it on nx-27017, and a
    # `$and` there is answered by reading every document (models/compat.py).
    return [Op(ident, {"_id": ident, mark: c, **({lease: {"$exists": True}} if leased else {})},
               {"$inc": inc, "$set": {mark: last}}) for c in conds]


def catch_up_op(proc: str, ident: int, leased: bool, items: list[tuple[int, int]],
                doc: dict):
    """The update that applies what `doc` (the balance as just read back)
    shows not applied yet of `items`, conditioned on exactly that state:
    the process's mark as read, and the lease there or not (a lease given
    back meanwhile: its spend comes from `quota`, as the long way does).
    None when the document already has every record."""
    mark, lease = f"applied.{proc}", f"leases.{proc}"
    seen = (doc.get("applied") or {}).get(proc)
    last = max(s for s, _ in items)
    if seen is not None and int(seen) >= last:
        return None
    total = sum(q for s, q in items if seen is None or s > int(seen))
    flt: dict = {"_id": ident, mark: {"$exists": False} if seen is None else int(seen)}
    paid_from = None
    if leased:
        held = proc in (doc.get("leases") or {})
        flt[lease] = {"$exists": held}
        paid_from = lease if held else "quota"
    return Op(ident, flt, {"$inc": spend(total, paid_from), "$set": {mark: last}})


def rollup_ops(d: rollups.Delta, marked: bool | None) -> list:
    """The conditional update(s) that add one process's records to one
    rollup document; the form for an absent mark also makes the document
    (where the mark is there after all, that one fails as a duplicate,
    which bulk_apply lets be)."""
    mark = f"{rollups.MARK}.{d.proc}"
    inc = d.inc()
    out = []
    if marked is not False:
        out.append(Op(d.id, {"_id": d.id, mark: {"$lt": d.first}},
                      {"$inc": inc, "$set": {mark: d.last}}))
    if marked is not True:
        out.append(Op(d.id, {"_id": d.id, mark: {"$exists": False}},
                      {"$inc": inc, "$set": {mark: d.last}, "$setOnInsert": d.dims}, upsert=True))
    return out


def subjects_of(record: dict) -> list[tuple[str, int, bool]]:
    """(kind, id, paid from a lease) for each balance a record moves."""
    out = [(USER, record["user_id"], True)]
    if record.get("token_id") is not None:
        out.append((TOKEN, record["token_id"], bool(record.get("token_limited"))))
    # A budget's counter always counts down what is left of its limit (from
    # the lease its relay took, else from `quota`: relay/money/budgets.py).
    for cid, _ in record.get("budgets") or ():
        out.append((BUDGET, cid, True))
    return out


class Applier(Leases):
    """Applies stored records to balances and rollups (the flusher's second half)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Rollup documents that have this process's mark, by day: which form
        # of update to send (a wrong guess costs one document the long way).
        self._rolled: dict[int, set] = {}

    async def _db(self, aw):
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the
        # result of a call that ends as the task is cancelled, and the cancel
        # is lost, so a loop never stops (tests/relay/money/test_cancel_lands.py).
        async with asyncio.timeout(self.db_timeout):
            return await aw

    async def _apply(self, records: list[dict]) -> dict:
        """Apply records to the balances and the rollups, idempotently (see
        relay/money/leases.py and relay/money/rollups.py): one bulk write per
        collection, whatever the number of distinct keys, accounts and
        rollup documents, then one read of the documents written, which
        shows each one's mark; the few whose mark did not reach their last
        record (a guess about a mark that was wrong, a lease that is gone, a
        batch applied before) go the long way, one by one.  Returns the
        balance documents as they are after it, {(kind, id): document}."""
        plan: dict[str, list] = {}
        groups: dict[tuple, list] = {}
        for r in records:
            for kind, ident, leased in subjects_of(r):
                groups.setdefault((r["proc"], kind, ident, leased), []).append(
                    (int(r["seq"]), int(r.get("quota") or 0)))
        for (proc, kind, ident, leased), items in groups.items():
            b = self._bal.get((kind, ident))
            marked = None if b is None else proc in b.shown.marks
            for op in balance_ops(proc, ident, leased, items, marked):
                plan.setdefault(COLLECTIONS[kind], []).append(op)
        # Sorting and summing a few thousand records: tens of milliseconds
        # that would otherwise stall every call on the event loop.
        moves = await asyncio.to_thread(rollups.deltas, records)
        for d in moves:
            for op in rollup_ops(d, self._rolled_hint(d)):
                plan.setdefault(d.collection, []).append(op)
        changes = {c: sum(1 for d in moves if d.collection == c) for c in rollups.COLLECTIONS}
        seen = {coll: await self._bulk(coll, ops, changes.get(coll, -1))
                for coll, ops in plan.items()}
        await self._catch_up(groups, seen)
        touched: dict[tuple, dict] = {}
        long_way: set[tuple] = set()
        for (proc, kind, ident, leased), items in groups.items():
            doc = seen.get(COLLECTIONS[kind], {}).get(ident)
            last = max(s for s, _ in items)
            if doc is None or int((doc.get("applied") or {}).get(proc, 0)) < last:
                await self._db(self._apply_one(proc, kind, ident, leased, items))
                # What was read is from before this: not the balance after.
                long_way.add((kind, ident))
                touched.pop((kind, ident), None)
            elif (kind, ident) not in long_way:
                touched[(kind, ident)] = doc
                b = self._bal.get((kind, ident))
                if b is not None:
                    self._learn(b, doc)
            b = self._bal.get((kind, ident)) if proc in self.own_ids else None
            run = b.shown.runs.get(proc) if b is not None else None
            if run is not None:
                # By sequence number, so a batch applied again changes nothing.
                run.applied(last, time.monotonic())
        for d in moves:
            got = seen.get(d.collection)
            doc = None if got is None else got.get(d.id)
            if got is not None and (
                    doc is None or int((doc.get(rollups.MARK) or {}).get(d.proc, -1)) < d.last):
                await self._db(self._rollup_one(d))
            if d.proc == self.pid:
                self._rolled.setdefault(int(d.dims["day"]), set()).add(
                    (d.collection, d.id, d.proc))
        self._forget_rolled()
        return touched

    async def _catch_up(self, groups: dict, seen: dict) -> None:
        """The balances the bulk write did not take to their last record (a
        batch part of which was applied before, a lease given back, a wrong
        guess about a mark), in a second bulk write made from the documents
        just read back; `seen` gets what it reads after.  What that misses
        too (a document changed in between) goes the long way."""
        plan: dict[str, list] = {}
        for (proc, kind, ident, leased), items in groups.items():
            coll = COLLECTIONS[kind]
            doc = (seen.get(coll) or {}).get(ident)
            op = None if doc is None else catch_up_op(proc, ident, leased, items, doc)
            if op is not None:
                plan.setdefault(coll, []).append(op)
        for coll, ops in plan.items():
            seen[coll].update(await self._bulk(coll, ops) or {})

    async def _bulk(self, coll: str, ops: list, expected: int = -1) -> dict | None:
        """One collection's updates as commands of BULK_CHUNK, each bounded
        by the database timeout, then its documents read back ({_id:
        document}: the balance's figures, or the rollup's marks).  Each of a rollup's (document, process) changes has at most
        one form that can match, so when `expected` matched, each did:
        nothing is read back (None)."""
        applied = 0
        for i in range(0, len(ops), BULK_CHUNK):
            applied += await self._db(bulk_apply(self.store.db[coll], ops[i:i + BULK_CHUNK]))
        balances = coll in COLLECTIONS.values()
        if not balances and applied == expected:
            return None
        ids = list(dict.fromkeys(op.ident for op in ops))
        out: dict = {}
        for i in range(0, len(ids), BULK_CHUNK):
            out.update(await self._db(read_marks(self.store.db[coll], ids[i:i + BULK_CHUNK],
                                                 BALANCE_FIELDS if balances else
                                                 {rollups.MARK: 1})))
        return out

    def _rolled_hint(self, d: rollups.Delta) -> bool | None:
        """Whether document d has this process's mark (None: not known)."""
        if d.proc != self.pid:
            return None
        return (d.collection, d.id, d.proc) in self._rolled.get(int(d.dims["day"]), ())

    def _forget_rolled(self) -> None:
        """Days before yesterday get no more records of this process."""
        today = rollups.day_of(time.time())
        for day in [d for d in self._rolled if d < today - rollups.DAY]:
            del self._rolled[day]

    async def _rollup_one(self, d: rollups.Delta) -> None:
        """One rollup document the long way: only the records after its mark."""
        coll = self.store.db[d.collection]
        mark = f"{rollups.MARK}.{d.proc}"
        for _ in range(6):
            doc = await coll.find_one({"_id": d.id}, {rollups.MARK: 1})
            seen = None if doc is None else (doc.get(rollups.MARK) or {}).get(d.proc)
            inc = d.inc(-1 if seen is None else int(seen))
            if not inc:
                return
            if seen is None:
                flt = {"_id": d.id, mark: {"$exists": False}}
                update = {"$inc": inc, "$set": {mark: d.last}, "$setOnInsert": d.dims}
            else:
                flt = {"_id": d.id, mark: int(seen)}
                update = {"$inc": inc, "$set": {mark: d.last}}
            try:
                r = await coll.update_one(flt, update, upsert=seen is None)
            except DuplicateKeyError:
                continue  # made meanwhile by another relay: read it again
            if r.matched_count or r.upserted_id is not None:
                return
        raise PyMongoError(f"could not add usage to rollup {d.id}: it kept changing")

    async def _read_back(self, records: list[dict], applied: dict[tuple, dict]) -> None:
        """The balances just applied that someone watches (`watched`:
        accounts with quota warnings), as they are after the apply: the
        truth the hooks decide warnings from (`on_applied`, given what the
        batch took from each), and what this relay sizes its leases by.

        `applied` holds the documents _apply read back after its bulk write
        (one find per collection, which it needs for the marks anyway, and
        which it learnt from already); only the few it applied the long way
        are read again, one find per collection."""
        paid: dict[tuple[str, int], int] = {}
        watched = self.watched
        for r in records:
            # Budgets with a limit are always read back: their 80% notice,
            # and the month's spend that rate tiers are decided from.
            for cid, limited in r.get("budgets") or ():
                if limited or (BUDGET, cid) in self._bal:
                    paid[(BUDGET, cid)] = paid.get((BUDGET, cid), 0) + int(r.get("quota") or 0)
            if watched is not None and not watched(r["user_id"]):
                continue
            for kind, ident, leased in subjects_of(r):
                if kind == BUDGET:
                    continue
                paid[(kind, ident)] = paid.get((kind, ident), 0) + (
                    int(r.get("quota") or 0) if leased else 0)
        for kind, coll in COLLECTIONS.items():
            ids = [i for k, i in paid if k == kind]
            docs = [applied[(kind, i)] for i in ids if (kind, i) in applied]
            rest = [i for i in ids if (kind, i) not in applied]
            if rest:
                async for doc in self.store.db[coll].find({"_id": {"$in": rest}}):
                    b = self._bal.get((kind, doc["_id"]))
                    if b is not None:
                        self._learn(b, doc)
                    docs.append(doc)
            for doc in docs:
                for fn in self.on_applied:
                    fn(kind, doc, paid.get((kind, doc["_id"]), 0))

    async def _apply_one(self, proc: str, kind: str, ident: int, leased: bool,
                         items: list[tuple[int, int]]) -> int:
        """Apply one process's records to one balance; returns the amount
        newly applied by this call (all of the batch's spend is accounted
        for either way: what is not applied now was applied before)."""
        coll = self.store.db[COLLECTIONS[kind]]
        mark, lease = f"applied.{proc}", f"leases.{proc}"
        first, last = min(s for s, _ in items), max(s for s, _ in items)
        total = sum(q for _, q in items)
        # Flat filters, the usual case first: a `$or` would need `$and`
        # around it on nx-27017 (models/compat.py), four times slower there.
        marks: list = [{"$lt": first}, {"$exists": False}]
        for _ in range(6):
            attempts = []
            for m in marks:
                if not leased:
                    attempts.append(({mark: m}, spend(total, None)))
                else:
                    attempts += [({mark: m, lease: {"$exists": True}}, spend(total, lease)),
                                 ({mark: m, lease: {"$exists": False}}, spend(total, "quota"))]
            for flt, inc in attempts:
                r = await coll.update_one({"_id": ident, **flt},
                                          {"$inc": inc, "$set": {mark: last}})
                if r.matched_count:
                    return total
            # Some of it was applied before (a retry, or a reclaim that raced
            # a replay): apply only the records after the stored marker.
            doc = await coll.find_one({"_id": ident}, {"applied": 1})
            if doc is None:
                log.error("usage of %s %s applied to nothing: the %s is gone", kind, ident, kind)
                return total
            seen = int((doc.get("applied") or {}).get(proc, 0))
            rest = [(s, q) for s, q in items if s > seen]
            if not rest:
                return 0
            first, total = min(s for s, _ in rest), sum(q for _, q in rest)
            marks = [seen]
        raise PyMongoError(f"could not apply usage to {kind} {ident}: it kept changing")

