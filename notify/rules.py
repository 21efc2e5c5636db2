"""Threshold rules: turn balance changes into warning events.

A warning is decided from the truth, not from one relay's view of a
balance: billing's flusher reads back every balance it applied a batch of
charges to and publishes `balance_applied` on the bus (so does a credit,
from the document it wrote): what the database holds, plus what other
relays charged and have not applied yet, which they apply within two
flush intervals (relay/money/leases.py).  So whichever relay applies the
charge that takes a balance below a threshold sees it fall below, within
two flush intervals of the call, whatever relays the calls went through.

The handlers here only compare numbers against subscriptions cached in
memory and remember the last balance seen; anything that needs the
database (loading subscriptions the cache lacks, writing the event) runs
in a background task, so a flush never waits for notifications.

A warning is raised when a balance crosses a threshold downwards: it is
below now, and it was at or above it just before this change (`before`:
the balance plus what the change took) or when this process last saw it.
Events.raise_warning throttles to one per subject in any 60 minutes,
across all processes: of several relays that see the same crossing, one
raises it.
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
        return [bus.subscribe("balance_applied", self.on_applied),
                bus.subscribe("budget_used", self.on_budget),
                bus.subscribe("storage", self.on_storage)]

    def on_budget(self, topic: str, data: dict) -> None:
        """A budget's counter read back at 80% used or more (billing): raise
        `budget_warning` once for its period.  The event's id is the
        counter's, which names the period, so of all relays and read-backs
        one insert wins; the others are remembered here and not tried again."""
        cid = data.get("counter_id")
        if not cid or data.get("user_id") is None:
            return
        if self._remember(("budget", cid), 1) is not None:
            return
        self._spawn(self.events.raise_event(
            f"budget_warning:{cid}", "budget_warning",
            {"user_id": data["user_id"], "token_id": data.get("token_id"), "counter": cid,
             "period": data.get("period"), "limit": int(data["limit"]),
             "used": int(data["used"]), "balance": int(data["limit"]) - int(data["used"])}))

    def watching(self, user_id: int) -> bool:
        """Whether the account's balances (and its keys') are worth reading
        back after a flush: it has a quota warning subscription, or its
        subscriptions are not cached (the read-back then loads them).
        No I/O: billing asks at every flush."""
        subs = self.subs.cached(user_id)
        if subs is None:
            return True
        return any(s.get("enabled", True) and ("user_quota_warning" in s.get("event_types", ())
                                               or "key_quota_warning" in s.get("event_types", ()))
                   for s in subs)

    def on_storage(self, topic: str, data: dict) -> None:
        """The database near or at its ceiling (relay/money/retention.py)."""
        self._spawn(self.events.raise_storage_warning(
            int(data.get("bytes") or 0), int(data.get("max_bytes") or 0),
            bool(data.get("pruning"))))

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

    # ---- bus handler (no I/O) ------------------------------------------------
    def on_applied(self, topic: str, data: dict) -> None:
        """`data`: kind ("user" or "token"), user_id, token_id, remaining,
        before (remaining plus what the change took)."""
        user_id, remaining = data.get("user_id"), data.get("remaining")
        token_id = data.get("token_id") if data.get("kind") == "token" else None
        if user_id is None or remaining is None or (data.get("kind") == "token" and token_id is None):
            return
        new = int(remaining)
        before = int(data.get("before", new))
        key = ("token", token_id) if token_id is not None else ("user", user_id)
        last = self._remember(key, new)
        prev = before if last is None else max(last, before)
        etype = "key_quota_warning" if token_id is not None else "user_quota_warning"
        subs = self.subs.cached(user_id)
        if subs is None:
            self._spawn(self._check_later(user_id, token_id, prev, new))
        elif self._crossed(subs, etype, token_id, prev, new):
            self._spawn(self.events.raise_warning(etype, user_id, token_id, new))

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
