"""Rollups for the records made before there were rollups (a relay upgraded
from one that kept none), so that charts and totals cover the whole log.

It runs once, at the first start that finds no note of it in `migrations`,
before billing starts (server.start_workers): one UTC day at a time, oldest
first, it sums the day's records by what each rollup keys on, hour and
process, and adds the sums to the rollups with the flusher's own
conditional updates (relay/money/applier.rollup_ops, the form for a mark
that is not there yet), then notes the day as done.  On the embedded
database SQLite sums them in the file (models/store.Store.sum_usage, a
reader beside the server: a million records in seconds); on a real
MongoDB the records are read through the reports connection, a chunk at a
time, and summed here.

Why it is exact:
- only records made before the note's `t0` (the first start of this
  version) are read; every later one is this version's, applied by the
  flusher itself;
- each update adds one process's records to one day's document only where
  that process has no mark there yet, and sets the mark to its last
  sequence number: a day done again after a crash adds nothing twice, and
  the records of a dead relay that billing applies after this (its spill
  file, its last unapplied batch) come after those marks, so they are added
  once, by billing, as the flusher adds any record;
- it finishes before billing reclaims anything, so no mark it relies on is
  set by anyone else meanwhile.
"""
from __future__ import annotations

import logging
import time

from models import queries
from models.store import DuplicateKeyError, bulk_apply
from relay.money import rollups
from relay.money.applier import rollup_ops

log = logging.getLogger("relay.usage")

NOTE = "rollups"


async def backfill(store, clock=time.time) -> int:
    """Make the missing rollups; returns how many records were added."""
    note = await store.db.migrations.find_one({"_id": NOTE})
    if note is not None and note.get("done"):
        return 0
    if note is None:
        oldest = await store.db.usage.find({}, {"created_at": 1}).sort(
            "created_at", 1).limit(1).to_list(1)
        note = {"_id": NOTE, "t0": clock(), "done": not oldest,
                "day": rollups.day_of(oldest[0]["created_at"]) if oldest else 0}
        try:
            await store.db.migrations.insert_one(note)
        except DuplicateKeyError:  # another relay on the same database began it
            note = await store.db.migrations.find_one({"_id": NOTE})
        if note.get("done"):
            return 0
        log.warning("making daily rollups of the usage log kept before this version, a day at "
                    "a time (once; calls are served when it is done)")
    t0, day, added = float(note["t0"]), int(note["day"]), 0
    while day < t0:
        end = min(day + rollups.DAY, t0)
        sums = await store.sum_usage(rollups.GRAIN, list(rollups.SOURCES.values()), day, end)
        if sums is not None:
            moves = rollups.from_sums(sums)
            n = sum(int(r["n"]) for r in sums)
        else:
            moves, n = await _read_and_sum(store, day, end)
        if moves:
            plan: dict[str, list] = {}
            for d in moves:
                plan.setdefault(d.collection, []).extend(rollup_ops(d, False))
            for coll, ops in plan.items():
                await bulk_apply(store.db[coll], ops)
            added += n
        day += rollups.DAY
        await store.db.migrations.update_one({"_id": NOTE}, {"$set": {"day": day}})
    await store.db.migrations.update_one({"_id": NOTE}, {"$set": {"done": True}})
    if added:
        log.warning("rollups made of %d usage record(s) kept before this version", added)
    return added


async def _read_and_sum(store, day: float, end: float) -> tuple[list, int]:
    """The day's rollup changes from its records, read a chunk at a time."""
    records: list[dict] = []
    flt = queries.usage_filter({}, since=day, until=end)
    async for chunk in queries.usage_chunks(store.reports.usage, flt, 5000):
        records += chunk
    # Records from before sequence numbers: one pseudo-process a day, added
    # in one update per document like the rest.
    legacy = [r for r in records if r.get("proc") is None]
    records = [r for r in records if r.get("proc") is not None] + [
        {**r, "proc": "legacy", "seq": len(legacy)} for r in legacy]
    return rollups.deltas(records), len(records)
