"""Control of one upstream transfer from outside: the client going away
(abort now, or read on for the usage within a bound), and pausing the
upstream's socket while our own client reads slowly.  relay/upstream/client.py
binds a Cancel to its transfer when the transfer starts."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pycurl
from tornado.ioloop import IOLoop

if TYPE_CHECKING:
    from relay.upstream.transfer import Transfer


class Cancel:
    """Control of one transfer from outside.

    `cancelled = True` aborts it.  `pause()`/`resume()` stop and restart
    reading from the upstream socket: a slow reader of ours then backs up
    into TCP instead of into our memory.  `leave()` is the client going
    away: the transfer is aborted, unless `drain` (seconds, bytes) says the
    call may still learn its usage by reading on, for at most that long and
    that much (relay/service.py sets it for streams that hide reasoning).
    """

    __slots__ = ("_cancelled", "paused", "resumed", "_transfer", "left", "drain", "drained")

    def __init__(self):
        self._cancelled = False
        self.paused = False
        self.resumed = 0.0  # when it was last resumed (silence is timed from then)
        self._transfer: Transfer | None = None
        self.left = False            # the client went away
        self.drain: tuple[float, int] | None = None
        self.drained = 0             # bytes read since the client left

    def leave(self) -> None:
        """The client is gone: stop now, or read on within `drain`."""
        if self.left:
            return
        self.left = True
        if self.drain is None or self._cancelled:
            self.cancelled = True
            return
        if self.paused:
            self.resume()   # nobody is reading behind us any more
        IOLoop.current().call_later(self.drain[0], self._drained)

    def _drained(self) -> None:
        if not self._cancelled:
            self.cancelled = True

    def read_on(self, size: int) -> None:
        """Count what was read after the client left; stop past the bound."""
        self.drained += size
        if self.drain is not None and self.drained > self.drain[1] and not self._cancelled:
            self.cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancelled = value
        t = self._transfer
        if value and t is not None and t.curl is not None:
            # Not from inside whatever set it (possibly our own chunk callback).
            IOLoop.current().add_callback(t.client.abort, t)

    def pause(self) -> None:
        t = self._transfer
        if t is not None and t.curl is not None and not self.paused:
            try:
                t.curl.pause(pycurl.PAUSE_RECV)
                self.paused = True
            except pycurl.error:
                pass

    def resume(self) -> None:
        t = self._transfer
        if t is not None and t.curl is not None and self.paused:
            self.paused = False
            self.resumed = time.monotonic()
            try:
                t.curl.pause(pycurl.PAUSE_CONT)
            except pycurl.error:
                pass
            # Ask libcurl to act now instead of on its next timer.
            t.client._set_timeout(0)
