"""The money journal: usage records on their way to the database.

A usage record is the fact that a call was charged (relay/money/leases.py explains
why records are the source of truth).  The journal holds the records that
are not in the database yet, in the order they were made:

  memory  records of the current flush interval;
  spill   <data_dir>/spill.jsonl, an append-only file of JSON lines for
          records the database did not take in time (unreachable, or slower
          than the load).  It is bounded (`spill_max_mb`); at the bound the
          relay refuses billable calls (503) instead of losing money.

The file is read back in order, one bounded batch per flush tick, and
removed once everything in it is in the database; the next start of a relay
on the same data directory replays whatever a dead relay left in it.  A
replayed record already in the database is a duplicate by _id (code 11000)
and changes nothing.  Writes are not fsync'd: a dead process loses nothing
it wrote, a dead machine may lose the last seconds the kernel had not
written yet.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import deque

log = logging.getLogger("relay.billing")

SPILL_NAME = "spill.jsonl"


class Spill:
    """The append-only overflow file, with a read cursor."""

    def __init__(self, data_dir: str, max_bytes: int):
        self.path = os.path.join(os.path.abspath(data_dir), SPILL_NAME)
        self.max_bytes = max_bytes
        self.offset = 0          # bytes already in the database
        self.full = False

    @property
    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    @property
    def empty(self) -> bool:
        return self.size <= self.offset

    def append(self, records: list[dict]) -> bool:
        """Write records at the end; False (and nothing written) past the bound."""
        if not records:
            return True
        data = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n"
                       for r in records).encode()
        if self.size + len(data) > self.max_bytes:
            if not self.full:
                log.critical("spill file %s is full (%d bytes): refusing billable calls until "
                             "the database takes the backlog", self.path, self.size)
            self.full = True
            return False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "ab") as fh:
            fh.write(data)
        return True

    def read(self, limit: int) -> tuple[list[dict], int]:
        """Up to `limit` records from the cursor, and the offset after them."""
        out: list[dict] = []
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return out, self.offset
        with fh:
            fh.seek(self.offset)
            end = self.offset
            while len(out) < limit:
                line = fh.readline()
                if not line.endswith(b"\n"):
                    break  # a torn last line (the writer died mid-write): not a record
                end += len(line)
                try:
                    out.append(json.loads(line))
                except ValueError:
                    log.error("unreadable line in %s at byte %d skipped", self.path, end - len(line))
        return out, end

    def advance(self, offset: int) -> None:
        """Everything before `offset` is in the database; drop the file once all is."""
        self.offset = offset
        if self.offset >= self.size:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            self.offset = 0
            if self.full:
                log.warning("spill file drained; billable calls accepted again")
            self.full = False


class Journal:
    """Records not yet in the database: the spill file first, then memory."""

    def __init__(self, data_dir: str, spill_max_bytes: int, batch: int):
        self.memory: deque[tuple[float, dict]] = deque()
        self.spill = Spill(data_dir, spill_max_bytes)
        self.batch = batch
        self.inflight: list[tuple[float, dict]] = []   # taken by a tick, not yet stored
        self.inflight_spilled = False
        # Set when billing has stopped: nothing will flush memory any more,
        # so a late record (a call that ended after the books closed) is
        # written to the spill file at once, for the next start to apply.
        self.closed = False

    def add(self, record: dict) -> None:
        if self.closed:
            if self.spill.append([record]):
                return
            log.critical("usage record %s came after shutdown and the spill file is full",
                         record.get("_id"))
        self.memory.append((time.monotonic(), record))

    @property
    def pending(self) -> int:
        return len(self.memory) + len(self.inflight)

    def take(self) -> tuple[list[dict], int | None]:
        """The oldest records: (batch, spill offset after it, or None if from memory).

        While the spill file holds records, new ones queue behind them, so
        every process's records reach the database in sequence order.
        """
        if not self.spill.empty:
            return self.spill.read(self.batch)
        n = min(self.batch, len(self.memory))
        self.inflight = [self.memory.popleft() for _ in range(n)]
        self.inflight_spilled = False
        return [r for _, r in self.inflight], None

    def done(self, offset: int | None) -> None:
        """The batch from take() is in the database (the flusher applies it
        to the balances then or a little later: relay/money/flusher.py)."""
        if offset is not None:
            self.spill.advance(offset)
        self.inflight = []

    def failed(self) -> None:
        """The batch from take() did not make it: it goes to the spill file."""
        if self.inflight and not self.inflight_spilled:
            if not self.spill.append([r for _, r in self.inflight]):
                self.memory.extendleft(reversed(self.inflight))
        self.inflight = []

    def guard(self, max_age: float) -> None:
        """Move records older than `max_age` from memory to the spill file.

        Runs on its own timer, so a tick stuck on a database that does not
        answer cannot hold records in memory longer than that.  The batch a
        stuck tick holds goes first (it is older); if that tick succeeds
        after all, the copy in the file is applied again, which changes
        nothing (see relay/money/leases.py).
        """
        cutoff = time.monotonic() - max_age
        if self.inflight and not self.inflight_spilled and self.inflight[0][0] < cutoff:
            if not self.spill.append([r for _, r in self.inflight]):
                return
            self.inflight_spilled = True
        n = 0
        while n < len(self.memory) and self.memory[n][0] < cutoff:
            n += 1
        if n and self.spill.append([self.memory[i][1] for i in range(n)]):
            for _ in range(n):
                self.memory.popleft()

    def drain_all(self) -> bool:
        """Everything in memory to the spill file (shutdown without a database)."""
        self.failed()
        ok = self.spill.append([r for _, r in self.memory])
        if ok:
            self.memory.clear()
        return ok
