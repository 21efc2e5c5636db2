"""Limits on concurrent upstream calls, one per kind of work.

Streams, plain calls and uploads each pass their own Gate
(relay/upstream/client.py), so thousands of open streams never make a plain call
queue behind them; a call that cannot get in within a bounded wait is
answered 503 with Retry-After.
"""
from __future__ import annotations

import asyncio
from collections import deque

from relay.errors import RelayError


class Gate:
    """A limit on concurrent upstream calls of one kind, with a bounded wait.

    Each kind of work (streams, plain calls, uploads) has its own gate, so a
    crowd of one kind never queues another behind it.  Entering is free
    while under the limit; past it a call waits its turn (first come, first
    served) for at most `wait` seconds, then gets False.
    """

    def __init__(self, kind: str, limit: int, wait: float):
        self.kind = kind
        self.limit = limit
        self.wait = wait
        self.active = 0
        self._waiters: deque = deque()

    def try_enter(self) -> bool:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return True
        return False

    async def enter(self) -> bool:
        if self.try_enter():
            return True
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(self.wait, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            if not fut.done():  # the waiting call itself was cancelled
                fut.cancel()

    def leave(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)  # the place passes on; active is unchanged
                return
        self.active -= 1


def _expire(fut) -> None:
    if not fut.done():
        fut.set_result(False)


def busy(kind: str, gate: Gate) -> RelayError:
    what = {"stream": "streaming calls", "call": "calls", "upload": "uploads"}[kind]
    err = RelayError(503, f"The relay is at its limit of {gate.limit} concurrent {what}; "
                          "retry shortly.", "server_error", "relay_overloaded")
    err.retry_after = max(1, int(gate.wait))
    return err
