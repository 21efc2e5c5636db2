"""The usage log around the money journal: live events, key access times.

A usage record is written by billing (relay/money/billing.py settle and reverse),
because a record is the charge itself: relay/money/leases.py explains how records
become durable and balances follow from them.  This module shows each
record live on the bus and writes keys' last-access times, from the billing
flusher's tick, off the hot path; relay/money/retention.py prunes old records.
"""
from __future__ import annotations

import time
from typing import Any

from models.store import Op, bulk_apply
from relay.money.pricing import USAGE_FIELDS

# A record stores a field only when it differs from these: most calls have
# no cache, audio, image or reasoning tokens, no shortfall and no error, and
# the embedded server's CPU per record grows with the record's size (14 of
# a plain call's 39 fields; about 12% of its insert cost, bench/store.py).  Totals
# `$sum` a missing field as 0 (tests/models/test_store_fidelity.py), and every
# reader of a stored record goes through expand().
DEFAULTS: dict[str, Any] = {**{f: 0 for f in USAGE_FIELDS
                               if f not in ("prompt_tokens", "completion_tokens")},
                            "unpaid": 0, "estimated": False, "error": "", "service_tier": "",
                            "session": "", "cache_saved": 0, "cache_unread": 0,
                            # the group's rate rule that applied (relay/money/rates.py)
                            "rate_rule": "flat"}


def stored(record: dict) -> dict:
    """The record as written to the database: defaults left out."""
    return {k: v for k, v in record.items()
            if k not in DEFAULTS or v != DEFAULTS[k] or type(v) is not type(DEFAULTS[k])}


def expand(doc: dict) -> dict:
    """A stored record with the fields stored() left out put back."""
    return {**DEFAULTS, **doc}


class UsageLog:
    def __init__(self, store, bus=None, billing=None):
        self.store = store
        self.bus = bus
        self.billing = billing
        self._accessed: dict[int, int] = {}
        if billing is not None:
            billing.on_record.append(self.published)
            billing.after_flush.append(self.flush)

    def touch(self, token_id: int) -> None:
        """Note a key's use; its accessed_time is written with the next flush."""
        self._accessed[token_id] = int(time.time())

    def published(self, record: dict[str, Any]) -> None:
        """Show a charged record live (called by billing, no await)."""
        record.setdefault("created_at", time.time())
        if self.bus is not None:
            self.bus.publish("usage", {"user_id": record.get("user_id"), "record": record})

    @property
    def pending(self) -> int:
        return self.billing.journal.pending if self.billing is not None else 0

    async def flush(self) -> None:
        """Keys' last-access times, one bulk write whatever their number
        (2,000 keys in use made 2,000 round trips a tick)."""
        if self._accessed:
            accessed, self._accessed = self._accessed, {}
            await bulk_apply(self.store.db.tokens, [
                Op(tid, {"_id": tid}, {"$max": {"accessed_time": ts}})
                for tid, ts in accessed.items()])
