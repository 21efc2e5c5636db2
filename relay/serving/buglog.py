"""Tracebacks for real bugs only, and not a flood of them.

A refusal (a bad request, an upstream that failed) is one line in the
access log.  An unexpected exception logs its traceback; the same bug (same
exception type at the same line) hit again within WINDOW seconds logs one
line instead, and at most BURST tracebacks are written per window in all,
so that a client replaying a request that hits a bug cannot fill the disk.
"""
from __future__ import annotations

import logging
import time

WINDOW = 60.0
BURST = 10


class TracebackLimiter:
    def __init__(self, window: float = WINDOW, burst: int = BURST, clock=time.monotonic):
        self.window = window
        self.burst = burst
        self.clock = clock
        self._seen: dict[tuple, float] = {}
        self._start = -1e18
        self._count = 0

    def allow(self, exc: BaseException) -> bool:
        now = self.clock()
        if now - self._start > self.window:
            self._start, self._count = now, 0
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.window}
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = (type(exc), tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb else (type(exc),)
        if now - self._seen.get(where, -1e18) < self.window or self._count >= self.burst:
            return False
        self._seen[where] = now
        self._count += 1
        return True


_limiter = TracebackLimiter()


def log_bug(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """Log an unexpected exception: with its traceback if the limiter allows."""
    if _limiter.allow(exc):
        logger.error("unexpected error in %s", what, exc_info=(type(exc), exc, exc.__traceback__))
    else:
        logger.error("unexpected error in %s: %s: %s (traceback logged recently)", what,
                     type(exc).__name__, str(exc)[:200])


def reason(exc: BaseException) -> str:
    """What went wrong, for a one-line log: an exception with no text (a
    TimeoutError, most often) by its type, not as an empty string."""
    return str(exc) or type(exc).__name__
