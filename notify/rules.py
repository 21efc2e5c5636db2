"""Threshold rules: turn balance changes into warning events.

Billing publishes "balance" and "token_balance" on the bus after every
settle and credit, synchronously inside the request.  The handlers here only
compare numbers against subscriptions cached in memory and remember the last
balance seen; anything that needs the database (loading subscriptions the
cache lacks, writing the event) runs in a background task, so a settle never
waits for notifications.

A warning is raised when a balance crosses a threshold downwards: the last
balance this process saw was at or above it (or none was seen yet) and the
new one is below.  Events.raise_warning throttles to one per subject in
any 60 minutes, across all processes.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

log = logging.getLogger("relay.notify")

MAX_REMEMBERED = 100_000


class Rules:
    def __init__(self, subs, events):
        self.subs = subs
        self.events = events
        self._last: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()

    def attach(self, bus) -> list:
        return [bus.subscribe("balance", self.on_balance),
                bus.subscribe("token_balance", self.on_token_balance)]

    def _remember(self, key: tuple[str, int], value: int) -> int | None:
        prev = self._last.pop(key, None)
        self._last[key] = value
        if len(self._last) > MAX_REMEMBERED:
            self._last.popitem(last=False)
        return prev

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("raising a warning failed", exc_info=task.exception())

    # ---- bus handlers (hot path: no I/O) -------------------------------------
    def on_balance(self, topic: str, data: dict) -> None:
        user_id, quota = data.get("user_id"), data.get("quota")
        if user_id is None or quota is None:
            return
        prev = self._remember(("user", user_id), int(quota))
        subs = self.subs.cached(user_id)
        if subs is None:
            self._spawn(self._check_later(user_id, None, prev, int(quota)))
        elif self._crossed(subs, "user_quota_warning", None, prev, int(quota)):
            self._spawn(self.events.raise_warning("user_quota_warning", user_id, None, int(quota)))

    def on_token_balance(self, topic: str, data: dict) -> None:
        user_id, token_id, remain = data.get("user_id"), data.get("token_id"), data.get("remain_quota")
        if user_id is None or token_id is None or remain is None:
            return
        prev = self._remember(("token", token_id), int(remain))
        subs = self.subs.cached(user_id)
        if subs is None:
            self._spawn(self._check_later(user_id, token_id, prev, int(remain)))
        elif self._crossed(subs, "key_quota_warning", token_id, prev, int(remain)):
            self._spawn(self.events.raise_warning("key_quota_warning", user_id, token_id,
                                                  int(remain)))

    # ---- the rule ------------------------------------------------------------
    @staticmethod
    def _crossed(subs: list[dict], etype: str, token_id, prev: int | None, new: int) -> bool:
        field = "user_threshold" if etype == "user_quota_warning" else "key_threshold"
        for s in subs:
            if not s.get("enabled", True) or etype not in s.get("event_types", ()):
                continue
            if token_id is not None and s.get("key_ids") and token_id not in s["key_ids"]:
                continue
            t = int(s.get(field, 0))
            if t > 0 and new < t and (prev is None or prev >= t):
                return True
        return False

    async def _check_later(self, user_id: int, token_id, prev, new) -> None:
        subs = await self.subs.for_user(user_id)
        etype = "user_quota_warning" if token_id is None else "key_quota_warning"
        if self._crossed(subs, etype, token_id, prev, new):
            await self.events.raise_warning(etype, user_id, token_id, new)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
