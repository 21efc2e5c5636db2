"""Small helpers shared by the notification tests."""
from __future__ import annotations

import time
import uuid

from models.store import Store


class Clock:
    """The time the notifier reads (its `clock=`), moved by the test."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def fresh_store(mongo_url: str, prefix: str, users=(), tokens=()) -> Store:
    """A started Store on a database of its own (named `prefix` + a random
    tail) on the test's server, with these users and tokens in it."""
    store = Store(mongo_url, db_name=prefix + uuid.uuid4().hex[:8])
    await store.start()
    if users:
        await store.db.users.insert_many(list(users))
    if tokens:
        await store.db.tokens.insert_many(list(tokens))
    return store


def wait_for(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def subscribe(api, channel_type, config, events=("announcement",), **kw) -> dict:
    body = {"name": channel_type, "event_types": list(events), "channel_type": channel_type,
            "channel_config": config, "enabled": True}
    body.update(kw)
    return api.post("/api/subscription/", body)["data"]
