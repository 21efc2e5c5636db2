"""Sign-in throttling: failures are counted per account and per client
address, and each count past its free allowance makes the next attempt wait
twice as long (up to a cap).  The database holds the counts, so every relay
process sharing it sees them.

A stranger guessing at someone's account slows that account down, but must
not lock its owner out.  So a browser that has signed in to an account
before carries a signed `device` cookie naming it; its attempts are counted
per device instead of per account and per address.  The owner, on a known
device, is never slowed by anyone else's failures; on a new device, waits
at most ACCOUNT's cap (a minute).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    free: int      # failures before the first wait
    cap: float     # the longest wait, seconds


ACCOUNT = Rule(free=5, cap=60.0)
ADDRESS = Rule(free=20, cap=900.0)
DEVICE = Rule(free=5, cap=300.0)
# A count with no new failure for this long starts again from zero.
FORGET_AFTER = 3600.0


def wait_for(rule: Rule, failures: int) -> float:
    """Seconds to wait after `failures` failures: 0 below the allowance,
    then 2, 4, 8, ... up to the cap."""
    over = failures - rule.free + 1
    if over <= 0:
        return 0.0
    return min(rule.cap, 2.0 ** min(over, 30))


class LoginThrottle:
    def __init__(self, store, clock=time.time):
        self.coll = store.db.login_failures
        self.clock = clock

    @staticmethod
    def keys(name: str, ip: str, device: str | None) -> list[tuple[str, Rule]]:
        if device:
            return [("dev:" + device, DEVICE)]
        return [("acct:" + name.lower(), ACCOUNT), ("ip:" + ip, ADDRESS)]

    async def retry_after(self, keys) -> int:
        """Whole seconds until an attempt is allowed (0: now)."""
        now = self.clock()
        wait = 0.0
        for key, _rule in keys:
            doc = await self.coll.find_one({"_id": key})
            if doc and now - doc.get("last", 0) < FORGET_AFTER:
                wait = max(wait, doc.get("until", 0) - now)
        return math.ceil(wait) if wait > 0 else 0

    async def failed(self, keys) -> None:
        now = self.clock()
        for key, rule in keys:
            old = await self.coll.find_one({"_id": key})
            if old and now - old.get("last", 0) >= FORGET_AFTER:
                await self.coll.delete_one({"_id": key})
            doc = await self.coll.find_one_and_update(
                {"_id": key}, {"$inc": {"n": 1}, "$set": {"last": now}}, upsert=True,
                return_document=True)
            await self.coll.update_one({"_id": key},
                                       {"$set": {"until": now + wait_for(rule, doc["n"])}})

    async def succeeded(self, keys) -> None:
        # Only a device's count starts again: an account's or an address's
        # goes on counting a stranger's failures (who could otherwise clear
        # the address's count by signing in to an account of their own).
        for key, _rule in keys:
            if key.startswith("dev:"):
                await self.coll.delete_one({"_id": key})
