"""The in-process event bus.

Producers (billing, usage log, admin announcements) call `publish`, which
never blocks and never raises: a slow or failing subscriber cannot slow a
relay request.  Subscribers are plain callables (sync, or async functions,
which are scheduled as tasks).

Topics in use:
- "balance"        {user_id, quota, used_quota}
- "token_balance"  {user_id, token_id, remain_quota, used_quota}
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
        self._subs: dict[str, list[Callable]] = defaultdict(list)

    def subscribe(self, topic: str, fn: Callable[[str, dict], Any]) -> Callable[[], None]:
        """Register fn(topic, data) for a topic ("*" for all); returns an unsubscribe."""
        self._subs[topic].append(fn)

        def unsubscribe() -> None:
            try:
                self._subs[topic].remove(fn)
            except ValueError:
                pass
        return unsubscribe

    def publish(self, topic: str, data: dict) -> None:
        for fn in list(self._subs.get(topic, ())) + list(self._subs.get("*", ())):
            try:
                if inspect.iscoroutinefunction(fn):
                    task = asyncio.get_running_loop().create_task(fn(topic, data))
                    task.add_done_callback(_log_failure)
                else:
                    fn(topic, data)
            except Exception:
                log.exception("bus subscriber failed on %s", topic)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("bus subscriber failed", exc_info=task.exception())
