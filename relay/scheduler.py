"""Channel choice: priority, weight, retries and health.

Candidates for (group, model) are ordered by priority, highest first, and
within one priority by a weighted random draw, so weight 3 gets three times
the traffic of weight 1.  A failing channel is not disabled for good: after
`trip_after` consecutive failures it rests for a cool-down that doubles with
each further trip (30 s up to 10 min) and then gets traffic again; one
success resets it.  The health is mirrored to the store for the console.

A burst is one trip: only attempts that began after the last trip, and
outside a rest, count towards the next.  A burst of concurrent calls that
all fail together (an upstream's accept backlog overflowing) otherwise
tripped the breaker once per `trip_after` of them within milliseconds,
doubling the rest each time (30 s to 8 minutes for one burst); and calls
sent to a resting channel because every channel rests are not evidence
that its rest should grow.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

log = logging.getLogger("relay.scheduler")


@dataclass
class Health:
    failures: int = 0
    trips: int = 0
    resting_until: float = 0.0
    tripped_at: float = 0.0
    last_error: str = ""


class Scheduler:
    def __init__(self, catalog, store=None, trip_after: int = 5, base_rest: float = 30.0,
                 max_rest: float = 600.0, rng: random.Random | None = None):
        self.catalog = catalog
        self.store = store
        self.trip_after = trip_after
        self.base_rest = base_rest
        self.max_rest = max_rest
        self.rng = rng or random.Random()
        self.health: dict[int, Health] = {}
        self._serving: dict[tuple[str, str], list] = {}
        self._version = -1

    def serving(self, group: str, model: str) -> list:
        """Enabled channels for (group, model), cached until the catalog changes."""
        if self._version != self.catalog.version:
            self._serving.clear()
            self._version = self.catalog.version
        key = (group, model)
        chans = self._serving.get(key)
        if chans is None:
            chans = self._serving[key] = [c for c in self.catalog.channels
                                          if c.enabled and group in c.groups and model in c.models]
        return chans

    def candidates(self, group: str, model: str) -> list:
        """Channels to try, in order.  Resting channels go last, not away:
        when every channel rests, trying one beats refusing the call."""
        chans = self.serving(group, model)
        if len(chans) <= 1:
            return list(chans)
        now = time.monotonic()
        awake = [c for c in chans if self._health(c.id).resting_until <= now]
        resting = [c for c in chans if c not in awake]
        return self._order(awake) + self._order(resting)

    def awake(self, channel) -> bool:
        """Whether the channel is not resting after repeated failures."""
        h = self.health.get(channel.id)
        return h is None or h.resting_until <= time.monotonic()

    def _order(self, chans: list) -> list:
        out = []
        for prio in sorted({c.priority for c in chans}, reverse=True):
            pool = [c for c in chans if c.priority == prio]
            while pool:
                weights = [max(c.weight, 0) for c in pool]
                if sum(weights) <= 0:
                    pick = pool[0]
                else:
                    pick = self.rng.choices(pool, weights=weights)[0]
                out.append(pick)
                pool.remove(pick)
        return out

    def _health(self, cid: int) -> Health:
        h = self.health.get(cid)
        if h is None:
            h = self.health[cid] = Health()
        return h

    def success(self, channel) -> None:
        h = self._health(channel.id)
        if h.failures or h.trips:
            h.failures, h.trips, h.resting_until = 0, 0, 0.0

    def failure(self, channel, reason: str, began: float | None = None) -> None:
        """A failed attempt on `channel` that began at `began` (monotonic;
        None: now)."""
        h = self._health(channel.id)
        h.last_error = reason
        now = time.monotonic()
        began = now if began is None else began
        if began < h.tripped_at or began < h.resting_until:
            return  # part of the burst that tripped it, or sent while it rests
        h.failures += 1
        if h.failures >= self.trip_after:
            rest = min(self.base_rest * (2 ** h.trips), self.max_rest)
            h.trips += 1
            h.failures = 0
            h.tripped_at = now
            h.resting_until = now + rest
            log.warning("channel %s (%s) rests %.0fs after repeated failures: %s",
                        channel.id, channel.name, rest, reason)

    def snapshot(self) -> dict[int, dict]:
        now = time.monotonic()
        return {cid: {"failures": h.failures, "resting_seconds": max(0, int(h.resting_until - now)),
                      "last_error": h.last_error} for cid, h in self.health.items()}
