"""`python server.py` on a clock of the test's choosing.

- NOTIFY_CLOCK_SHIFT names a file holding a number of seconds added to the
  real time of the notifier's clock, which the test moves: a browser test
  crosses an hour boundary and waits 60 minutes without waiting (the
  rolling-hour warning limit).
- RELAY_CLOCK_SHIFT is a number of seconds added to the whole process's
  wall clock (time.time), as on a host whose clock is that far off: what
  relays sharing a database must not depend on (their clocks disagree).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SKEW = float(os.environ.get("RELAY_CLOCK_SHIFT") or 0)
if _SKEW:
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + _SKEW
    time.time_ns = lambda: _real_time_ns() + int(_SKEW * 1e9)

import notify.service  # noqa: E402
import server  # noqa: E402

SHIFT_FILE = os.environ.get("NOTIFY_CLOCK_SHIFT", "")


def shifted_clock() -> float:
    try:
        with open(SHIFT_FILE) as fh:
            return time.time() + float(fh.read().strip() or 0)
    except (OSError, ValueError):
        return time.time()


_install = notify.service.install


def install(app) -> None:
    app.settings["notify_clock"] = shifted_clock
    _install(app)


if SHIFT_FILE:
    notify.service.install = install

if __name__ == "__main__":
    server.main()
