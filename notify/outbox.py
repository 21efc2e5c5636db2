"""The outbox worker: delivers outbox records, retries, never twice at once.

Claiming is one atomic find-and-modify: a record is due when it is pending
and its `next_at` has come, or when it is "sending" and the claim (whose
expiry is kept in `next_at` too) has run out because its process died.  The
claim sets status "sending", the owner and a new expiry, and bumps
`attempts`; the result is written back only if the record is still this
owner's claim of this attempt.  So two workers, in one process or many,
never hold the same record, and a killed process's records are picked up
again when their claim expires.  The claim lasts well past the longest send
(the send timeout), so a live worker's claim never expires under it.

A failure is retried after retry_base * 2^(attempts-1) seconds (capped at an
hour) until retry_window has passed since the record was made; then the
record is "failed" for good, with its last error, and the subscription shows
that error to its owner.
"""
from __future__ import annotations

import asyncio
import logging
import time

from models.store import ReturnDocument
from notify.channels.base import DeliveryError
from notify.http import Refused
from relay.serving.background import cancel_and_wait

log = logging.getLogger("relay.notify")

MAX_DELAY = 3600.0


class Worker:
    def __init__(self, store, deliver, on_final_failure=None, clock=time.time,
                 owner: str = "w", poll: float = 1.0, concurrency: int = 8,
                 lease: float = 120.0, retry_base: float = 30.0, retry_window: float = 86400.0,
                 send_timeout: float = 20.0):
        self.store = store
        self.deliver = deliver            # async (record) -> receipt; raises on failure
        self.on_final_failure = on_final_failure
        self.clock = clock
        self.owner = owner
        self.poll = poll
        self.concurrency = max(1, concurrency)
        self.lease = max(lease, send_timeout * 3 + 10)
        self.retry_base = retry_base
        self.retry_window = retry_window
        self.send_timeout = send_timeout
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self.delivered = 0

    @property
    def coll(self):
        return self.store.db.notify_outbox

    def wake(self) -> None:
        """New records were written in this process: look now, not at the next poll."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop claiming; let sends in flight finish (they are bounded by the timeout)."""
        await cancel_and_wait(self._task)
        self._task = None
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.send_timeout + 2)
        for t in list(self._inflight):
            t.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                claimed = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox poll failed")
                claimed = 0
            if claimed == 0 or len(self._inflight) >= self.concurrency:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.poll)
                except asyncio.TimeoutError:
                    pass

    async def run_once(self) -> int:
        """Claim as many due records as there are free slots; returns how many."""
        n = 0
        while len(self._inflight) < self.concurrency:
            doc = await self.claim()
            if doc is None:
                break
            n += 1
            task = asyncio.get_running_loop().create_task(self._process(doc))
            self._inflight.add(task)
            task.add_done_callback(self._finished)
        return n

    def _finished(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        self._wake.set()  # a slot is free: claim the next record without waiting a poll

    async def claim(self) -> dict | None:
        """Atomically take one due record, or None when nothing is due: a
        send whose lease ran out (its relay gone) first, then the oldest
        pending one.  Each by status equality and next_at, which the
        (status, next_at) index answers: on the embedded server `$in` is
        "any element of", a walk of the whole outbox (every delivery kept
        for the console) once a second on every relay."""
        now = self.clock()
        for status in ("sending", "pending"):
            doc = await self.coll.find_one_and_update(
                {"status": {"$eq": status}, "next_at": {"$lte": now}},
                {"$set": {"status": "sending", "owner": self.owner, "next_at": now + self.lease,
                          "claimed_at": now, "updated_at": now},
                 "$inc": {"attempts": 1}},
                sort=[("next_at", 1)], return_document=ReturnDocument.AFTER)
            if doc is not None:
                return doc
        return None

    async def _process(self, doc: dict) -> None:
        mine = {"_id": doc["_id"], "owner": self.owner, "attempts": doc["attempts"],
                "status": "sending"}
        try:
            receipt = await asyncio.wait_for(self.deliver(doc), self.send_timeout * 2 + 5)
        except asyncio.CancelledError:
            # Stopping mid-send: hand the record back for another try.
            await self.coll.update_one(mine, {"$set": {"status": "pending",
                                                       "next_at": self.clock()}})
            raise
        except Exception as exc:
            await self._failed(doc, mine, exc)
            return
        now = self.clock()
        await self.coll.update_one(mine, {"$set": {
            "status": "sent", "sent_at": now, "updated_at": now, "receipt": str(receipt)[:200],
            "last_error": ""}})
        self.delivered += 1

    async def _failed(self, doc: dict, mine: dict, exc: Exception) -> None:
        if isinstance(exc, DeliveryError):
            error, permanent = exc.message, exc.permanent
        elif isinstance(exc, Refused):
            error, permanent = str(exc), True
        elif isinstance(exc, asyncio.TimeoutError):
            error, permanent = "The send timed out.", False
        else:
            error, permanent = f"{type(exc).__name__}: {exc}", False
            if not isinstance(exc, (ConnectionError, OSError)):
                log.exception("delivery of %s failed", doc["_id"], exc_info=exc)
        now = self.clock()
        delay = min(self.retry_base * 2 ** (doc["attempts"] - 1), MAX_DELAY)
        final = permanent or now + delay > doc["created_at"] + self.retry_window
        update = {"last_error": error[:500], "updated_at": now,
                  "history_tail": {"at": now, "error": error[:200]}}
        if final:
            update.update(status="failed", failed_at=now)
        else:
            update.update(status="pending", next_at=now + delay)
        res = await self.coll.update_one(mine, {"$set": update})
        if final and res.modified_count and self.on_final_failure is not None:
            await self.on_final_failure(doc, error)
