"""Sign-in throttling: failures are counted per account and per client
address, and each count past its free allowance makes the next attempt wait
twice as long (up to a cap).  The database holds the counts, so every relay
process sharing it sees them.

A stranger guessing at someone's account slows that account down, but must
not lock its owner out.  So a browser that has signed in to an account
before carries a signed `device` cookie naming it (by id); its attempts are
counted per device and account instead of per account and per address.
The owner, on a known device, is never slowed by anyone else's failures; on
a new device, waits at most ACCOUNT's cap (a minute).

An attempt cannot be raced past the count: it is counted as a failure
before the password is checked (claim), in one conditional update per
count that also sets the wait the count now calls for, and given back when
the password was right (release).  Thirty guesses sent at once are thirty
claims in turn: the allowance passes, the rest wait.  Accounts are counted
by id, names that are no account by their lower case, so no spelling of a
name is a count of its own.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from models.store import DuplicateKeyError


@dataclass(frozen=True)
class Rule:
    free: int      # failures before the first wait
    cap: float     # the longest wait, seconds


ACCOUNT = Rule(free=5, cap=60.0)
ADDRESS = Rule(free=20, cap=900.0)
DEVICE = Rule(free=5, cap=300.0)
# A count with no new failure for this long starts again from zero (and is
# pruned: models/housekeeping.py).
FORGET_AFTER = 3600.0
# Claims that lose a race this often in a row wait a second instead.
_TRIES = 8


def wait_for(rule: Rule, failures: int) -> float:
    """Seconds to wait after `failures` failures: 0 below the allowance,
    then 2, 4, 8, ... up to the cap."""
    over = failures - rule.free + 1
    if over <= 0:
        return 0.0
    return min(rule.cap, 2.0 ** min(over, 30))


@dataclass
class Claim:
    """One attempt counted in advance: (key, the wait before it, the version
    it set, the wait its count calls for)."""
    held: list


class LoginThrottle:
    def __init__(self, store, clock=time.time):
        self.coll = store.db.login_failures
        self.clock = clock

    @staticmethod
    def keys(account: str, ip: str, device: str | None) -> list[tuple[str, Rule]]:
        """`account`: the account's id, or "name:<lower-cased name>" for a
        name that is no account; `device`: "<device id>:<account id>" when
        the browser signed in to that account before."""
        if device:
            return [("dev:" + device, DEVICE)]
        return [("acct:" + account, ACCOUNT), ("ip:" + ip, ADDRESS)]

    async def claim(self, keys) -> tuple[int, Claim | None]:
        """Count this attempt as a failure on every key, or on none: (0,
        claim) when it may go on, else (seconds to wait, None)."""
        claim = Claim([])
        for key, rule in keys:
            wait = await self._claim_one(key, rule, claim)
            if wait:
                await self.release(claim)
                return wait, None
        return 0, claim

    async def _claim_one(self, key: str, rule: Rule, claim: Claim) -> int:
        for _ in range(_TRIES):
            now = self.clock()
            doc = await self.coll.find_one({"_id": key})
            if doc is None:
                until = now + wait_for(rule, 1)
                try:
                    await self.coll.insert_one({"_id": key, "n": 1, "last": now, "until": until,
                                                "v": 1})
                except DuplicateKeyError:
                    continue  # a racing attempt counted first: count after it
                claim.held.append((key, 0.0, 1, until - now))
                return 0
            fresh = now - doc.get("last", 0) < FORGET_AFTER
            if fresh and doc.get("until", 0) > now:
                return math.ceil(doc["until"] - now)
            n = (doc.get("n", 0) if fresh else 0) + 1
            until = now + wait_for(rule, n)
            # Only if no other attempt counted since the read: each count
            # moves an integer version on (a double written by $set reads
            # back rounded on nx-27017, so none is compared).
            version = doc.get("v", 0) + 1
            r = await self.coll.update_one(
                {"_id": key, "v": doc["v"] if "v" in doc else {"$exists": False}},
                {"$set": {"n": n, "last": now, "until": until, "v": version}})
            if r.matched_count:
                claim.held.append((key, doc.get("until", 0) if fresh else 0.0, version,
                                   until - now))
                return 0
        return 1

    async def release(self, claim: Claim | None) -> None:
        """Give back what `claim` counted: the attempt was no failure (the
        password was right, or it was never checked)."""
        for key, before, version, _wait in (claim.held if claim else ()):
            r = await self.coll.update_one({"_id": key, "v": version, "n": {"$gt": 0}},
                                           {"$inc": {"n": -1, "v": 1}, "$set": {"until": before}})
            if not r.matched_count:  # counted on since: only the count goes back
                await self.coll.update_one({"_id": key, "n": {"$gt": 0}},
                                           {"$inc": {"n": -1, "v": 1}})
        if claim:
            claim.held = []

    async def failed(self, claim: Claim | None) -> None:
        """The password was wrong: the wait its count calls for runs from now,
        not from the claim (a check that took seconds on a busy machine
        would otherwise have used the wait up)."""
        now = self.clock()
        for key, _before, _version, wait in (claim.held if claim else ()):
            if wait > 0:
                await self.coll.update_one({"_id": key, "until": {"$lt": now + wait}},
                                           {"$set": {"until": now + wait}})

    async def succeeded(self, keys, claim: Claim | None) -> None:
        """The password was right: the attempt is given back, and a device
        starts again from zero.  An account's or an address's count goes on
        counting a stranger's failures (who could otherwise clear the
        address's count by signing in to an account of their own)."""
        await self.release(claim)
        for key, _rule in keys:
            if key.startswith("dev:"):
                await self.coll.delete_one({"_id": key})
