"""`python server.py` whose notifier reads the time from a clock the test
moves: the number of seconds in the file named by NOTIFY_CLOCK_SHIFT is
added to the real time.  Lets a browser test cross an hour boundary and
wait 60 minutes without waiting (the rolling-hour warning limit)."""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import notify.service  # noqa: E402
import server  # noqa: E402

SHIFT_FILE = os.environ["NOTIFY_CLOCK_SHIFT"]


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


notify.service.install = install

if __name__ == "__main__":
    server.main()
