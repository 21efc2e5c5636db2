"""A rate limit per signed-in user on /api, weighted by what a call costs.

Each user has a bucket of `api_rate_limit` units that refills at that many
a minute; a call takes its handler's cost (ApiHandler.api_cost: 1 for most,
more for the usage log, statistics and exports, which read many records).
A call the bucket cannot pay gets 429 with Retry-After.  Exports and
statistics ("heavy" handlers) may also run at most HEAVY_AT_ONCE at a time
per user, so that no one keeps the database busy with them.

Administrators are not limited.  The buckets are per relay process (this is
a bound on work, not money: with N relays a user gets N times the rate).
"""
from __future__ import annotations

import math
import time

from cachetools import TTLCache

HEAVY_AT_ONCE = 2
# A heavy call still counted after this long has lost its end (a client
# gone mid-export): it no longer holds its place.
HEAVY_FORGET = 600.0


class ApiRate:
    def __init__(self, per_minute: int, clock=time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        # user id -> [units left, when counted]; an idle minute refills a
        # bucket, so one untouched for longer may go.
        self._buckets: TTLCache = TTLCache(maxsize=200_000, ttl=120)
        self._heavy: dict[int, list[float]] = {}

    def take(self, user_id: int, cost: int) -> int:
        """0 if the user may make a call of `cost` now (and it is counted),
        else the whole seconds until they may."""
        if self.per_minute <= 0:
            return 0
        now = self.clock()
        cost = min(cost, self.per_minute)
        units, then = self._buckets.get(user_id) or (self.per_minute, now)
        units = min(self.per_minute, units + (now - then) * self.per_minute / 60.0)
        if units < cost:
            self._buckets[user_id] = (units, now)
            return max(1, math.ceil((cost - units) * 60.0 / self.per_minute))
        self._buckets[user_id] = (units - cost, now)
        return 0

    def enter_heavy(self, user_id: int) -> bool:
        """Count a heavy call in; False if the user has HEAVY_AT_ONCE running."""
        now = self.clock()
        running = [t for t in self._heavy.get(user_id, []) if now - t < HEAVY_FORGET]
        if len(running) >= HEAVY_AT_ONCE:
            self._heavy[user_id] = running
            return False
        running.append(now)
        self._heavy[user_id] = running
        return True

    def leave_heavy(self, user_id: int) -> None:
        running = self._heavy.get(user_id)
        if running:
            running.pop(0)
            if not running:
                del self._heavy[user_id]
