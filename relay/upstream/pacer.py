"""Pacing of new upstream connections, per upstream address.

A burst of new connections to one upstream (thousands of streams opened at
once to an HTTP/1.1 server, one connection each) overflows its accept
backlog: the kernel drops the SYNs that find the queue full, the connecting
side resends them only after 1 s, then 3 s and 7 s, and the whole burst
resends in step and overflows again (issue 33: 524 "Connecting to the
upstream timed out" for most of 10,000 streams, and first bytes after 4, 7
and 19 s).  So the connections still connecting to one address are bounded
by a window, and the rest wait their turn here, first come first served,
within their call's connect timeout.  A transfer that reuses a pooled
connection never opens a socket and never waits.

The window is adaptive, as TCP's congestion window is, because the relay
cannot see the upstream's backlog: it starts small, grows by one with each
connection that opens quickly, and halves when a connect times out (a SYN
went unanswered).  What a connect takes is learnt per address (a moving
average), and an attempt that takes far longer than that is given up and
made again by relay/upstream/client.py: it sent nothing, so that is as safe
as retrying a refused connect, and a fresh SYN beats waiting for the
kernel's resend.
"""
from __future__ import annotations

import asyncio
from collections import deque

# Seconds: the shortest a connect attempt is given, and the first attempt
# to an address whose connects were never timed (the kernel's own first SYN
# resend comes after 1 s).
ATTEMPT_FLOOR = 0.25
ATTEMPT_UNKNOWN = 1.0
# An attempt gets this many times what connects to its address take.
ATTEMPT_FACTOR = 4.0
# Where the window of a new address starts (slow start from here).
WINDOW_START = 4.0


class Origin:
    """One upstream address (scheme://host:port): its window, what is
    connecting to it, and who waits to."""

    __slots__ = ("key", "window", "connecting", "waiters", "took", "dialing")

    def __init__(self, key: str, window: float):
        self.key = key
        self.window = window
        self.connecting = 0
        self.waiters: deque = deque()
        self.took = 0.0  # moving average of a connect's seconds; 0: none seen
        self.dialing: set = set()  # transfers connecting a socket of their own

    def attempt_timeout(self, failures: int) -> float:
        """Seconds for the next connect attempt of a call whose attempts
        have timed out `failures` times: doubling, as the kernel's SYN
        resends do, but from what this address usually takes."""
        base = max(ATTEMPT_FLOOR, ATTEMPT_FACTOR * self.took) if self.took else ATTEMPT_UNKNOWN
        return base * (2 ** min(failures, 8))


class Pacer:
    """The windows of all upstream addresses of one process.

    `max_window` bounds the connections connecting to one address at once;
    `max_waiting` the calls queued for one (past it a call is refused at
    once, as the relay's other limits are)."""

    def __init__(self, max_window: int = 64, max_waiting: int = 20000):
        self.max_window = max(1, max_window)
        self.max_waiting = max_waiting
        self.origins: dict[str, Origin] = {}

    def origin(self, url: str) -> Origin:
        # scheme://authority: what libcurl pools connections by.
        end = url.find("/", url.find("//") + 2)
        key = url if end < 0 else url[:end]
        o = self.origins.get(key)
        if o is None:
            if len(self.origins) > 10000:  # a relay talks to few; don't grow for ever
                self.origins = {k: v for k, v in self.origins.items()
                                if v.connecting or v.waiters}
            o = self.origins[key] = Origin(key, min(WINDOW_START, self.max_window))
        return o

    def take(self, o: Origin) -> bool:
        """A place in the window now, if there is one and nobody waits."""
        waiters = o.waiters
        while waiters and waiters[0].done():  # gave up waiting
            waiters.popleft()
        if waiters:
            return False
        if o.connecting >= int(o.window) and o.dialing:
            self.reap(o)
        if o.connecting < int(o.window):
            o.connecting += 1
            return True
        return False

    def reap(self, o: Origin) -> None:
        """Give back the places of connects the kernel has completed that
        libcurl has not seen complete yet: with thousands of streams the
        loop gets to a new connection late, and the window counts what the
        upstream's backlog sees."""
        for t in list(o.dialing):
            t.if_established()

    def full(self, o: Origin) -> bool:
        return len(o.waiters) >= self.max_waiting

    async def wait(self, o: Origin, timeout: float) -> bool:
        """Wait for a place in the window, at most `timeout` seconds.
        True: the caller holds a place (and must `release` it)."""
        if self.take(o):
            return True
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        o.waiters.append(fut)
        timer = loop.call_later(max(0.0, timeout), _expire, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.release(o)  # granted as the waiting call was cancelled
            raise
        finally:
            timer.cancel()

    def release(self, o: Origin, took: float | None = None, timed_out: bool = False) -> None:
        """A place is given back: the connection opened (after `took`
        seconds), its connect timed out, or the transfer ended otherwise."""
        o.connecting -= 1
        if timed_out:
            o.window = max(1.0, o.window / 2)
        elif took is not None:
            o.took = took if not o.took else 0.8 * o.took + 0.2 * took
            # One more place per connection opened: it doubles in a round
            # of connects, as TCP's slow start does.
            o.window = min(float(self.max_window), o.window + 1)
        while o.waiters and o.connecting < int(o.window):
            fut = o.waiters.popleft()
            if not fut.done():
                o.connecting += 1
                fut.set_result(True)


def _expire(fut) -> None:
    if not fut.done():
        fut.set_result(False)
