"""At most N uses of something in any rolling window, exact across every
relay process sharing the database (test sends: 5 an hour per user; e-mail
confirmations: 3 an hour per user).

A key has N slots (`allowances`, ids "<key>#0" ... "<key>#N-1"), each busy
until a time; a use claims a free slot with one conditional update (or
inserts it, the first times), so racing uses cannot both take the last
one.  Slots idle for a day are pruned (models/housekeeping.py).
"""
from __future__ import annotations

import math
import time

from models.store import DuplicateKeyError


async def take(store, key: str, limit: int, window: float, clock=time.time) -> int:
    """0 if a use of `key` is allowed now (and it is counted), else the whole
    seconds until the oldest use leaves the window."""
    coll = store.db.allowances
    now = clock()
    ids = [f"{key}#{i}" for i in range(limit)]
    got = await coll.find_one_and_update({"_id": {"$in": ids}, "until": {"$lte": now}},
                                         {"$set": {"until": now + window}})
    if got is not None:
        return 0
    held = {d["_id"]: d.get("until", 0) async for d in coll.find({"_id": {"$in": ids}})}
    for slot in ids:
        if slot not in held:
            try:
                await coll.insert_one({"_id": slot, "until": now + window})
                return 0
            except DuplicateKeyError:  # a racing use took it
                held[slot] = now + window
    return max(1, math.ceil(min(held.values()) - now))
