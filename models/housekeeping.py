"""Collections of short-lived records, pruned so they do not grow forever.

    invalidations   documents of one change each, as relays before the log
                    wrote them: kept INVALIDATIONS_KEPT (10 minutes).  The
                    log itself (relay/catalog.py) is one document without
                    `ts`, bounded to its last 256 entries, never pruned here
    login_failures  sign-in counts (handlers/login_throttle.py), forgotten
                    after an hour without a failure anyway
    allowances      the slots of per-hour limits (models/allowance.py),
                    free once their hour is over

Every TICK seconds, each collection loses at most BATCH of its expired
records (found by an indexed range, deleted by id): a backlog is worked off
over several ticks, never in one long sweep.  A tick a minute is enough:
the sign-in failures and invalidations a minute brings are far fewer than
BATCH.  Every relay prunes; they delete the same records, which is
harmless.  The embedded server has no TTL indexes, so this is the one way
that works on both.
"""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import PyMongoError

log = logging.getLogger("relay.housekeeping")

TICK = 60.0
BATCH = 2000
INVALIDATIONS_KEPT = 600.0
# (collection, field, seconds after which a record is done with)
RULES = (("invalidations", "ts", INVALIDATIONS_KEPT),
         ("login_failures", "last", 3600.0),
         ("allowances", "until", 3600.0))


async def prune_once(store, now: float | None = None) -> dict[str, int]:
    """One tick: how many records each collection lost."""
    now = time.time() if now is None else now
    out = {}
    for coll, field, age in RULES:
        c = store.db[coll]
        ids = [d["_id"] async for d in c.find({field: {"$lt": now - age}}, {"_id": 1})
               .limit(BATCH)]
        if ids:
            out[coll] = (await c.delete_many({"_id": {"$in": ids}})).deleted_count
    return out


def install(app) -> None:
    """Prune in the background from start to stop."""
    s = app.settings
    task: list = [None]

    async def loop() -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                await prune_once(s["store"])
            except asyncio.CancelledError:
                raise
            except PyMongoError as exc:
                log.warning("pruning failed: %s", exc)

    async def on_start(_app) -> None:
        task[0] = asyncio.get_running_loop().create_task(loop())

    async def on_stop(_app) -> None:
        if task[0] is not None:
            task[0].cancel()
            try:
                await task[0]
            except (asyncio.CancelledError, Exception):
                pass

    s["on_start"].append(on_start)
    s["on_stop"].append(on_stop)
