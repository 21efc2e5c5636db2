"""The in-process event bus.

Producers (billing, usage log, admin announcements) call `publish`, which
never blocks and never raises: a slow or failing subscriber cannot slow a
relay request.  Subscribers are plain callables (sync, or async functions,
which are scheduled as tasks).

Topics in use:
- "balance"        {user_id, quota, used_quota}  (this relay's live view, for the console)
- "token_balance"  {user_id, token_id, remain_quota, used_quota}
- "balance_applied" {kind, user_id, token_id, remaining, before}  (the truth, read back
                   after a flush or a credit: what quota warnings are decided from)
- "budget_used"    {counter_id, user_id, token_id, period, limit, used}  (a budget's
                   counter read back at 80% used or more: notify/rules.py)
- "usage"          {user_id, record}
- "announcement"   {id, title, content, kind: "announcement"|"marketing"}
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections import defaultdict
from typing import Any, Callable

log = logging.getLogger("relay.bus")


class Bus:
    def __init__(self):
        # topic -> [(fn, is a coroutine function)]: publish runs after every
        # settle, so what inspect would tell each time is asked once.
        self._subs: dict[str, list[tuple[Callable, bool]]] = defaultdict(list)

    def subscribe(self, topic: str, fn: Callable[[str, dict], Any]) -> Callable[[], None]:
        """Register fn(topic, data) for a topic ("*" for all); returns an unsubscribe."""
        entry = (fn, inspect.iscoroutinefunction(fn))
        self._subs[topic].append(entry)

        def unsubscribe() -> None:
            try:
                self._subs[topic].remove(entry)
            except ValueError:
                pass
        return unsubscribe

    def publish(self, topic: str, data: dict) -> None:
        subs = self._subs.get(topic)
        anyone = self._subs.get("*")
        if not subs and not anyone:
            return
        for fn, is_async in (subs or []) + (anyone or []):
            try:
                if is_async:
                    task = asyncio.get_running_loop().create_task(fn(topic, data))
                    task.add_done_callback(_log_failure)
                else:
                    fn(topic, data)
            except Exception:
                log.exception("bus subscriber failed on %s", topic)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("bus subscriber failed", exc_info=task.exception())
