"""Recalls: how a relay gets back what other relays lease of a balance, and
how a change that lowers a balance binds every relay.

relay/money/leases.py explains when (a short balance, a lowering); this is
how, through the database alone:

- A balance document counts its recalls (`recall`, raised with $inc, so
  each recall has its own number) and holds what each relay answered
  (`ack.<P>`, the highest number P answered).  `recalls` names the
  recalls under way, one small document each (`{_id: "user:7:12"}`: the
  balance and the recall's number), so that a relay finds them all with
  one read of a small collection, and each recall's document comes and
  goes on its own.
- Each relay reads `recalls` every flush tick, in a loop of its own (a slow
  flush does not delay it), and for each balance it holds whose number it
  has not answered gives back the unreserved part of its lease and writes
  the number, in one conditional update (Leases._release).  A relay that
  has answered holds only what its running calls reserved and what it
  charged and has not applied yet.
- A relay spends from its leases only while its last completed read of
  `recalls` began less than half of `lease_recall_wait` ago; past that, a
  reserve waits for the next read (while the database answers at all: when
  it does not, the relay goes on from its leases as README's "What a crash
  costs" says, until it stops taking calls).  So a relay that has not
  answered a recall within `lease_recall_wait` cannot spend a lease any
  more without reading the recall first.
- A lowering freezes the balance (`lowering: <token>`: no lease can be
  taken), recalls it, waits up to `lease_recall_wait` for every relay
  holding a lease to answer, then writes the new `quota` in one update
  conditional on the figure it read and on the freeze, and lifts the
  freeze.  A relay that had not answered gets `forfeit.<P>: n` in that same
  update: what it gives back next goes nowhere (the change counted it out;
  a ledger entry says so), unless its `ack.<P>` shows it answered `n`
  after all.  The recall document of such a lowering stays until
  `lease_stale_after`, so the late relay still finds it; a relay that died
  meanwhile forfeits its lease at its reclaim (relay/money/processes.py).
- The one who recalled for a short balance removes the `recalls` document
  when it is done (if nobody recalled again since); one left by a relay
  that died is removed by whoever sees it unchanged for `lease_stale_after`
  seconds.  A freeze left by a relay that died is lifted by whoever sees
  the same token for LOWERING_STALE seconds of its own monotonic clock
  (never a comparison of two hosts' clocks).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from models.store import ReturnDocument
from relay.money.refusals import BillingUnavailable
from relay.serving.buglog import reason

log = logging.getLogger("relay.money.billing")

# Most recall documents one read takes (a short balance is recalled for a
# second or two; more than this at once would be thousands of balances
# short at the same moment).
RECALL_SCAN = 1000
LOWERING_STALE = 10.0
AFTER = ReturnDocument.AFTER


@dataclass
class Lowering:
    """A balance frozen for a change: its document once every relay that
    holds a lease answered the recall (or the wait ran out), the recall's
    number and the token the change's conditional update must name."""
    kind: str
    ident: int
    n: int
    token: str
    doc: dict


class Recalls:
    """Mixin of Leases: recalling, answering recalls, lowering."""

    def __init__(self):
        self._recall_seen: dict[tuple, float] = {}
        self._lowering_seen: dict[tuple, float] = {}
        self._recaller: asyncio.Task | None = None
        self.recalls_read = 0.0        # monotonic start of the last completed read
        self.recalls_failing = False   # the last read failed: the database is away
        self._recalls_done = asyncio.Event()

    # ---- the relay that is short ----------------------------------------------
    async def request_recall(self, b) -> int:
        """Ask every relay holding a lease on `b` to give back its unreserved
        part; returns the recall's number."""
        coll = self.store.db[self.collections[b.kind]]
        doc = await coll.find_one_and_update({"_id": b.id}, {"$inc": {"recall": 1}},
                                             return_document=AFTER)
        n = int((doc or {}).get("recall", 0))
        if n:
            await self.store.db.recalls.insert_one({"_id": f"{b.kind}:{b.id}:{n}"})
        return n

    async def end_recall(self, b, n: int) -> None:
        try:
            await self.store.db.recalls.delete_one({"_id": f"{b.kind}:{b.id}:{n}"})
        except Exception as exc:   # left for the stale rule
            log.debug("ending recall of %s %s: %s", b.kind, b.id, exc)

    # ---- every relay, every tick --------------------------------------------------
    async def _recall_loop(self) -> None:
        # Every tick, and at least four times within the wait, so that a
        # relay serving calls is never short of a recent read (recalls_stale).
        period = min(self.tick, self.recall_wait / 4)
        while True:
            started = time.monotonic()
            try:
                await self._db(self.answer_recalls())   # not wait_for: see Flusher._db
                self.recalls_read, self.recalls_failing = started, False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.recalls_failing:
                    log.warning("reading recalls: %s; going on from the leases held",
                                reason(exc))
                self.recalls_failing = True
            done, self._recalls_done = self._recalls_done, asyncio.Event()
            done.set()
            await asyncio.sleep(max(period - (time.monotonic() - started), 0))

    def recalls_stale(self) -> bool:
        """True when this relay must read `recalls` before spending a lease."""
        return (self._recaller is not None and not self.recalls_failing
                and time.monotonic() - self.recalls_read > self.recall_wait / 2)

    async def recalls_fresh(self) -> bool:
        """Wait until a read of `recalls` begun from now on has completed (or
        failed: the database is away); False if none did within the
        database timeout."""
        since = time.monotonic()
        until = since + self.db_timeout
        while self.recalls_read < since and not self.recalls_failing:
            left = until - time.monotonic()
            if left <= 0 or self._recaller is None:
                return False
            try:
                await asyncio.wait_for(self._recalls_done.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    async def answer_recalls(self) -> int:
        """Give back the unreserved leases of recalled balances this relay
        holds; returns how many it answered."""
        if not self._bal:
            return 0
        docs = await self.store.db.recalls.find({}).limit(RECALL_SCAN).to_list(RECALL_SCAN)
        now = time.monotonic()
        seen, latest = {}, {}
        for r in docs:
            try:
                kind, ident, n = str(r["_id"]).split(":")
                # Accounts and keys have whole-number ids, budgets' counters names.
                key, n = (kind, int(ident) if ident.isdigit() else ident), int(n)
            except ValueError:
                continue
            seen[r["_id"]] = self._recall_seen.get(r["_id"], now)
            latest[key] = max(latest.get(key, 0), n)
        answered = 0
        for key, n in latest.items():
            b = self._bal.get(key)
            if b is None or n <= b.acked:
                continue
            await self._release(b, ack=n)
            b.acked = max(b.acked, n)
            answered += 1
        self._recall_seen = seen
        for rid, first in seen.items():
            if now - first > self.stale_after:   # its relay died before removing it
                await self.store.db.recalls.delete_one({"_id": rid})
        return answered

    # ---- lowering -----------------------------------------------------------------
    @asynccontextmanager
    async def lowering(self, kind: str, ident: int):
        """Freeze balance (kind, ident), recall every lease on it and wait for
        the answers (up to `lease_recall_wait`); yields a Lowering (None if
        the balance does not exist) for rewrite(), and lifts the freeze."""
        coll = self.store.db[self.collections[kind]]
        token = uuid.uuid4().hex
        until = time.monotonic() + 2 * self.recall_wait
        while True:
            doc = await coll.find_one_and_update(
                {"_id": ident, "lowering": {"$exists": False}},
                {"$inc": {"recall": 1}, "$set": {"lowering": token}}, return_document=AFTER)
            if doc is not None:
                break
            cur = await coll.find_one({"_id": ident})
            if cur is None:
                yield None
                return
            await self.stale_lowering(kind, cur)
            if time.monotonic() > until:
                raise BillingUnavailable("another change of this balance is under way")
            await asyncio.sleep(self.tick / 2)
        n = int(doc["recall"])
        key = f"{kind}:{ident}:{n}"
        low = Lowering(kind, ident, n, token, doc)
        try:
            await self.store.db.recalls.insert_one({"_id": key})
            b = self._bal.get((kind, ident))
            if b is not None:
                b.acked = max(b.acked, n)
                await self._release(b, ack=n)
            deadline = time.monotonic() + self.recall_wait
            while True:
                low.doc = await coll.find_one({"_id": ident}) or low.doc
                if not self.unanswered(low.doc, n) or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(self.tick / 4)
            yield low
        finally:
            try:
                await coll.update_one({"_id": ident, "lowering": token},
                                      {"$unset": {"lowering": ""}})
                if not self.unanswered(low.doc, n):
                    await self.store.db.recalls.delete_one({"_id": key})
            except Exception as exc:   # lifted by others after LOWERING_STALE
                log.error("could not lift the freeze on %s %s: %s", kind, ident, exc)

    async def rewrite(self, low: Lowering, new_quota) -> tuple[dict, int, int] | None:
        """Set the frozen balance's `quota` to new_quota(old quota), in one
        update conditional on the old figure (a flush may pay a charge from
        `quota`, a dead relay's lease may come back, a top-up may land:
        then it is read again).  Relays that have not answered the recall
        forfeit what they hold unreserved.  Returns (document, old, new),
        or None when new_quota refuses (returns None) or the balance is gone."""
        coll = self.store.db[self.collections[low.kind]]
        doc = low.doc
        for _ in range(8):
            was = int(doc.get("quota", 0))
            new = new_quota(was)
            if new is None:
                return None
            late = self.unanswered(doc, low.n)
            update: dict = {"quota": int(new)}
            update.update({f"forfeit.{p}": low.n for p in late})
            after = await coll.find_one_and_update(
                {"_id": low.ident, "quota": was, "lowering": low.token}, {"$set": update},
                return_document=AFTER)
            if after is not None:
                if late:
                    log.warning("%s %s changed before relay(s) %s answered the recall (no "
                                "answer within %.1fs): what they hold unreserved is forfeit",
                                low.kind, low.ident, ", ".join(late), self.recall_wait)
                low.doc = after
                return after, was, int(new)
            doc = await coll.find_one({"_id": low.ident})
            if doc is None:
                return None
        raise BillingUnavailable("the balance kept changing")

    def unanswered(self, doc: dict, n: int) -> list[str]:
        """Relays holding a lease on `doc` that have not answered recall n."""
        acks = doc.get("ack") or {}
        return sorted(p for p, v in (doc.get("leases") or {}).items()
                      if int(v) > 0 and p not in self.own_ids and int(acks.get(p, 0)) < n)

    async def stale_lowering(self, kind: str, doc: dict) -> None:
        """Lift a freeze whose relay died: one seen unchanged for
        LOWERING_STALE seconds here."""
        token = doc.get("lowering")
        if not token:
            return
        now = time.monotonic()
        key = (kind, doc["_id"], token)
        first = self._lowering_seen.setdefault(key, now)
        if now - first < max(LOWERING_STALE, 5 * self.recall_wait):
            return
        self._lowering_seen = {k: t for k, t in self._lowering_seen.items()
                               if now - t < 2 * LOWERING_STALE}
        r = await self.store.db[self.collections[kind]].update_one(
            {"_id": doc["_id"], "lowering": token}, {"$unset": {"lowering": ""}})
        if r.modified_count:
            log.warning("lifted a freeze on %s %s left by a relay that stopped", kind, doc["_id"])

    # ---- what a late relay gives back ---------------------------------------------
    async def forfeit_or_return(self, coll, b, give: int, ack: int) -> dict | None:
        """Give back `give` units of `b` when the document carries a forfeit
        mark for this relay: into `quota` if this relay answered that recall
        in time after all (its `ack` reached the mark), else nowhere (the
        change that set the mark counted them out), with a ledger entry."""
        lease, fmark, amark = (f"leases.{self.pid}", f"forfeit.{self.pid}", f"ack.{self.pid}")
        for _ in range(4):
            cur = await coll.find_one({"_id": b.id})
            if cur is None:
                return None
            mark = int((cur.get("forfeit") or {}).get(self.pid, 0))
            update: dict = {"$unset": {fmark: ""}}
            if ack:
                update["$max"] = {amark: ack}
            if not mark:
                update = {"$inc": {"quota": give, lease: -give}} if give else {}
                if ack:
                    update["$max"] = {amark: ack}
                if not update:
                    return cur
                return await coll.find_one_and_update({"_id": b.id}, update,
                                                      return_document=AFTER)
            answered = int((cur.get("ack") or {}).get(self.pid, 0)) >= mark
            if give:
                update["$inc"] = {lease: -give} if not answered else {"quota": give,
                                                                      lease: -give}
            doc = await coll.find_one_and_update({"_id": b.id, fmark: mark}, update,
                                                 return_document=AFTER)
            if doc is None:
                continue
            if give and not answered:
                await self.store.db.ledger.insert_one(
                    {"kind": b.kind, "subject": b.id, "amount": -give,
                     "reason": "lease forfeit: a change was made before this relay answered "
                               "its recall", "created_at": time.time(), "proc": self.pid})
                log.warning("%s %s: %d unit(s) of this relay's lease forfeit (a change was "
                            "made before it answered recall %d)", b.kind, b.id, give, mark)
            return doc
        return None
