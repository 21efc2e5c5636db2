"""The `key_cache_collapse` alert: a key whose share of input read from the
upstreams' prompt caches collapsed.

Fed every usage record this process settles (the bus topic "usage"), it
keeps per key the input and cached tokens of each of the last minutes, in
memory, and compares the last RECENT minutes with the BEFORE minutes
preceding them.  The share collapsed when it was at least FLOOR and is now
below half of that, with enough input on both sides to mean something
(MIN_TOKENS before, a quarter of it since).  Typical causes: a key's
conversations spread over channels (each switch turns reads into writes),
a cache-breaking change at the start of its prompts, a channel whose
upstream stopped caching.

Each relay judges the calls it serves (behind a balancer, a fair sample of
every key's); Events.raise_key_alert throttles to one alert per key in any
60 minutes across every process.  No I/O on the request path: raising runs
in a background task.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

log = logging.getLogger("relay.notify")

RECENT, BEFORE = 10, 60   # minutes
FLOOR = 0.3               # a share worth watching
MIN_TOKENS = 100_000      # input before the window, to judge by
MAX_KEYS = 50_000


class CacheWatch:
    def __init__(self, events, clock=time.time):
        self.events = events
        self.clock = clock
        # token id -> (user id, {minute: [input, cached]}, minute judged last, quiet until)
        self.keys: OrderedDict[int, list] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()

    def attach(self, bus) -> list:
        return [bus.subscribe("usage", self.on_usage)]

    def on_usage(self, topic: str, data: dict) -> None:
        r = data.get("record") or {}
        tid, prompt = r.get("token_id"), int(r.get("prompt_tokens") or 0)
        if tid is None or prompt <= 0 or int(r.get("status") or 200) >= 400:
            return
        now = self.clock()
        minute = int(now // 60)
        entry = self.keys.get(tid)
        if entry is None:
            entry = self.keys[tid] = [data.get("user_id"), {}, 0, 0.0]
            if len(self.keys) > MAX_KEYS:
                self.keys.popitem(last=False)
        self.keys.move_to_end(tid)
        counts = entry[1]
        cell = counts.get(minute)
        if cell is None:
            cell = counts[minute] = [0, 0]
            for m in [m for m in counts if m <= minute - RECENT - BEFORE]:
                del counts[m]
        cell[0] += prompt
        cell[1] += int(r.get("cached_tokens") or 0)
        if entry[2] != minute and now >= entry[3]:
            entry[2] = minute
            self._judge(tid, entry, minute)

    def _judge(self, tid: int, entry: list, minute: int) -> None:
        counts = entry[1]
        recent = [0, 0]
        before = [0, 0]
        for m, (p, c) in counts.items():
            side = recent if m > minute - RECENT else before
            side[0] += p
            side[1] += c
        if before[0] < MIN_TOKENS or recent[0] < MIN_TOKENS // 4:
            return
        was, now = before[1] / before[0], recent[1] / recent[0]
        if was < FLOOR or now >= was / 2:
            return
        entry[3] = self.clock() + 3600  # this process says it once an hour at most
        payload = {"before": round(was, 4), "now": round(now, 4), "minutes": RECENT,
                   "tokens": recent[0]}
        self._spawn(self.events.raise_key_alert("key_cache_collapse", entry[0], tid, payload))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("raising a cache alert failed", exc_info=task.exception())

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
