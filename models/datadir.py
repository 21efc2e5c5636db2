"""One relay per data directory.

The data directory holds the embedded database, the secret and the money
journal's spill file; two relays on it would kill each other's database
and replay each other's spill.  So a relay holds an exclusive lock on
<data_dir>/relay.lock (flock: the kernel releases it when the process dies,
kill -9 included, so a crash never leaves a stale lock) and writes into it
who holds it: pid, port and the billing process id.  The next owner reads
that to name the holder when it must refuse, and to know which billing
process died with the previous owner (relay/money/billing.py start_up).
"""
from __future__ import annotations

import fcntl
import json
import os
import time


class DataDirBusy(Exception):
    """The directory belongs to a live relay; str() is the one-line reason,
    `holder` what that relay wrote into the lock (pid, port, database)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class DataDirLock:
    def __init__(self, data_dir: str):
        self.dir = os.path.abspath(data_dir)
        self.path = os.path.join(self.dir, "relay.lock")
        self._fh = None
        self.previous: dict = {}

    def acquire(self) -> dict:
        """Lock the directory; returns what the previous owner wrote (or {}).

        Raises DataDirBusy without changing anything if a live relay holds it.
        """
        os.makedirs(self.dir, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            try:
                holder = json.loads(fh.read() or "{}")
            except ValueError:
                holder = {}
            fh.close()
            raise DataDirBusy(f"data directory {self.dir} is in use by the relay with pid "
                              f"{holder.get('pid', '?')} on port {holder.get('port', '?')}",
                              holder) from None
        fh.seek(0)
        try:
            self.previous = json.loads(fh.read() or "{}")
        except ValueError:
            self.previous = {}
        self._fh = fh
        return self.previous

    def write(self, **info) -> None:
        """Say who holds the directory now."""
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(json.dumps({"pid": os.getpid(), "started": time.time(), **info}))
        self._fh.flush()

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
