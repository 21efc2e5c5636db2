"""Relay processes sharing a database: heartbeats, fencing and the reclaim pass.

Each relay process has a document in `processes`: its heartbeat, how far
its usage records are applied (`applied_upto`), and when the last flush
completed (`flushed_at`).  A process whose heartbeat stopped is reclaimed by
any other: the records it wrote are applied, its leases go back to `quota`,
whatever else it held comes back through `on_reclaim` (the concurrency
slots of relay/money/limits.py), and its document becomes a tombstone
(`dead: true`) kept TOMBSTONE_DAYS for a late spill replay.  This is the
one notion of a live process: one heartbeat, one staleness rule.
relay/money/leases.py explains the whole design.
"""
from __future__ import annotations

import logging
import time
import uuid

log = logging.getLogger("relay.billing")

# A tombstone (and the applied.<P> markers it vouches for) is kept this long
# for a late spill replay of a dead process.
TOMBSTONE_DAYS = 7
# The heartbeat another relay writes when it claims a stale process for
# reclaiming: below any time, so still stale, and never written by a live one.
CLAIMED = -1.0


class Processes:
    """Mixin of Leases: this process's document, and reclaiming dead ones
    (whose records it applies with Flusher._apply, relay/money/flusher.py)."""

    async def register(self) -> None:
        now = time.time()
        await self.store.db.processes.update_one(
            {"_id": self.pid}, {"$set": {"heartbeat": now, "dead": False,
                                         "applied_upto": self.applied_upto},
                                "$min": {"started_at": now}}, upsert=True)
        self._last_heartbeat = time.monotonic()

    async def heartbeat(self) -> None:
        # Not once another relay has claimed us for reclaiming (CLAIMED): we
        # fence ourselves instead, as it may be returning our leases.
        r = await self.store.db.processes.update_one(
            {"_id": self.pid, "dead": False, "heartbeat": {"$gte": 0}},
            {"$set": {"heartbeat": time.time()}})
        if r.matched_count == 0:
            await self._fence()
        self._last_heartbeat = time.monotonic()

    async def _fence(self) -> None:
        """We were declared dead (cut off too long) and our leases returned:
        carry on under a new process id with no lease."""
        old, self.pid = self.pid, f"{self.pid.split('~')[0]}~{uuid.uuid4().hex[:6]}"
        self.own_ids.add(self.pid)
        log.error("this relay was declared dead by another (no heartbeat for %.0fs); "
                  "continuing as %s", self.stale_after, self.pid)
        for b in self._bal.values():
            b.held = 0
        for hook in self.on_fence:
            hook(old, self.pid)
        # Our old records not yet in the database are paid from `quota`; if
        # we die before they are, the next reclaim of the old id applies them.
        await self.store.db.processes.update_one({"_id": old}, {"$set": {"dead": False,
                                                                         "heartbeat": 0}})
        self.applied_upto = 0
        await self.register()

    async def reclaim_stale(self) -> int:
        """Reclaim processes whose heartbeat stopped; GC old tombstones."""
        # Declared dead at 3/4 of the threshold: with a heartbeat and a check
        # every 1/12 of it, a dead process's leases are back within it.
        cutoff = time.time() - self.stale_after * 3 / 4
        returned = await self.reclaim_claimed(await self.stale_ids(cutoff), cutoff)
        # The relays alive now (this one included): leases are taken per
        # call only where more than one may spend a balance (leases.py).
        self.relays = await self.store.db.processes.count_documents({"dead": False})
        await self._forget_tombstones()
        return returned

    async def stale_ids(self, cutoff: float) -> list[str]:
        return [d["_id"] async for d in self.store.db.processes.find(
            {"dead": False, "heartbeat": {"$lt": cutoff}}, {"_id": 1}) if d["_id"] != self.pid]

    async def reclaim_claimed(self, pids: list[str], cutoff: float) -> int:
        """Reclaim each of `pids` that is still stale when claimed.  A
        heartbeat that landed since they were read means the process lives
        and may be spending its leases: returned then, they would be spent
        twice.  The claim is atomic with that check, and a claimed process's
        own heartbeat no longer matches (it fences itself); a claim whose
        reclaimer died is still stale, so the next pass takes it over."""
        returned = 0
        for pid in pids:
            r = await self.store.db.processes.update_one(
                {"_id": pid, "dead": False, "heartbeat": {"$lt": cutoff}},
                {"$set": {"heartbeat": CLAIMED}})
            if r.matched_count:
                returned += await self.reclaim(pid)
        return returned

    async def reclaim(self, pid: str, first_spilled: int | None = None,
                      spilled_since: float | None = None) -> int:
        """Apply what dead process `pid` wrote and return its leases.

        A process without a document either never reached the database
        (then its records came from a spill file, from `first_spilled` on)
        or was forgotten long ago: then nothing is applied twice."""
        state = await self.store.db.processes.find_one({"_id": pid})
        if state is None and first_spilled is None:
            return 0
        upto = int((state or {}).get("applied_upto") or 0) if state else first_spilled - 1
        # By creation time (an index the log has anyway; one on (proc, seq)
        # would slow every insert for a pass that runs when a relay dies):
        # records after the last applied one were made after it, or are in
        # a spill file replayed just now.
        # A process that applied nothing made its records after it started:
        # reading from 0 walked the whole log (10 s a start at a million).
        since = float((state or {}).get("applied_created") or
                      (state or {}).get("started_at") or 0) - 60
        if spilled_since is not None:
            since = min(since, spilled_since - 60)
        records = [r async for r in self.store.db.usage.find(
            {"proc": pid, "created_at": {"$gte": since}}) if int(r.get("seq") or 0) > upto]
        records.sort(key=lambda r: int(r["seq"]))
        dense = []
        for r in records:
            if int(r["seq"]) != upto + len(dense) + 1:
                log.warning("records of %s after seq %d wait for the rest of a spill file",
                            pid, upto + len(dense))
                break
            dense.append(r)
        if dense:
            await self._apply(dense)
            upto = int(dense[-1]["seq"])
        returned = forfeit_total = 0
        lease = f"leases.{pid}"
        marks = {f"ack.{pid}": "", f"forfeit.{pid}": ""}
        fields = {"leases": 1, "ack": 1, "forfeit": 1}
        for kind, coll in self.collections.items():
            async for doc in self.store.db[coll].find({lease: {"$exists": True}}, fields):
                for _ in range(5):
                    amount = int((doc.get("leases") or {}).get(pid, 0))
                    # A change made while it did not answer a recall counted
                    # its lease out already (relay/money/recalls.py).
                    mark = int((doc.get("forfeit") or {}).get(pid, 0))
                    forfeit = mark > int((doc.get("ack") or {}).get(pid, 0))
                    r = await self.store.db[coll].update_one(
                        {"_id": doc["_id"], lease: amount},
                        {"$inc": {"quota": 0 if forfeit else amount},
                         "$unset": {lease: "", **marks}})
                    if r.matched_count:
                        if forfeit and amount:
                            forfeit_total += amount
                            await self.store.db.ledger.insert_one(
                                {"kind": kind, "subject": doc["_id"], "amount": -amount,
                                 "reason": "lease forfeit: a change was made before this relay "
                                           "answered its recall", "created_at": time.time(),
                                 "proc": pid})
                        else:
                            returned += amount
                        break
                    doc = await self.store.db[coll].find_one({"_id": doc["_id"]}, fields)
                    if doc is None or pid not in (doc.get("leases") or {}):
                        break
        for hook in self.on_reclaim:
            await hook(pid)
        await self.store.db.processes.update_one(
            {"_id": pid}, {"$set": {"dead": True, "applied_upto": upto, "reclaimed_at": time.time()}},
            upsert=True)
        if returned or dense or forfeit_total:
            log.warning("reclaimed process %s: applied %d record(s), returned %d units%s",
                        pid, len(dense), returned,
                        f", {forfeit_total} forfeit (a change it did not answer)"
                        if forfeit_total else "")
        return returned

    async def _forget_tombstones(self) -> None:
        cutoff = time.time() - TOMBSTONE_DAYS * 86400
        async for d in self.store.db.processes.find({"dead": True,
                                                     "reclaimed_at": {"$lt": cutoff}}):
            mark = f"applied.{d['_id']}"
            for coll in self.collections.values():
                async for doc in self.store.db[coll].find({mark: {"$exists": True}}, {"_id": 1}):
                    await self.store.db[coll].update_one({"_id": doc["_id"]},
                                                         {"$unset": {mark: ""}})
            await self.store.db.processes.delete_one({"_id": d["_id"]})
