"""The outbox worker in-process against the embedded database and the fake
receivers: retries with backoff until a receiver recovers, the final failure
after the retry window (injected clock), two workers never delivering one
record twice, and a dead worker's claim being taken over."""
from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from models.secrets import Vault
from notify.bus import Bus
from notify.service import Notifier
from settings import Settings
from tests.fakes.notify_receivers import NotifyReceivers
from tests.notify.notify_helpers import Clock, fresh_store


@pytest.fixture(scope="module")
def fake():
    f = NotifyReceivers().start()
    yield f
    f.stop()


def make(store, owner="w1", clock=None, **kw):
    cfg = dict(allow_private_webhooks=True, notify_retry_base=30.0, notify_retry_window=86400.0,
               notify_send_timeout=5.0, notify_concurrency=4)
    cfg.update(kw)
    return Notifier(Settings(**cfg), store, Bus(), Vault("test-secret"), owner=owner,
                    clock=clock or Clock())


async def pump(n: Notifier) -> None:
    """Run the worker until nothing is due (the clock does not move)."""
    while True:
        claimed = await n.worker.run_once()
        if n.worker._inflight:
            await asyncio.gather(*list(n.worker._inflight))
        if not claimed:
            return


async def setup(mongo_url, users=1):
    return await fresh_store(mongo_url, "t_ob_", users=[
        {"_id": i, "username": f"u{i}", "email": f"u{i}@x.test"} for i in range(1, users + 1)])


async def hook_sub(n, user_id, url, etype="announcement"):
    return await n.subs.create({"_id": user_id}, {
        "name": "h", "event_types": [etype], "channel_type": "webhook",
        "channel_config": {"url": url}})


def test_retries_with_backoff_until_receiver_recovers(mongo_url, fake):
    async def go():
        store = await setup(mongo_url)
        clock = Clock()
        n = make(store, clock=clock)
        await n.events.ensure_indexes()
        name = uuid.uuid4().hex[:6]
        s = await hook_sub(n, 1, f"{fake.url}/hook/flaky2/{name}")
        await n.events.raise_event("announcement:1", "announcement", {"title": "T", "content": "C"})
        rid = f"announcement:1|{s['_id']}"
        await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": rid})
        assert doc["status"] == "pending" and doc["attempts"] == 1 and "HTTP 500" in doc["last_error"]
        assert doc["next_at"] == clock.t + 30           # first retry after retry_base
        await pump(n)                                   # not due yet: nothing happens
        assert (await store.db.notify_outbox.find_one({"_id": rid}))["attempts"] == 1
        clock.t += 30
        await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": rid})
        assert doc["attempts"] == 2 and doc["next_at"] == clock.t + 60   # doubled
        clock.t += 60
        await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": rid})
        assert doc["status"] == "sent" and doc["attempts"] == 3 and doc["last_error"] == ""
        assert fake.hook_counts[f"flaky2/{name}"] == 3
        assert len(fake.delivered("webhook", f"/hook/flaky2/{name}")) == 1
        await store.close()
    asyncio.run(go())


def test_final_failure_after_retry_window_is_kept_and_shown(mongo_url, fake):
    async def go():
        store = await setup(mongo_url)
        clock = Clock()
        n = make(store, clock=clock, notify_retry_window=100.0)
        s = await hook_sub(n, 1, f"{fake.url}/hook/500/final")
        await n.events.raise_event("announcement:2", "announcement", {"title": "T", "content": "C"})
        for step in (0, 30, 60):
            clock.t += step
            await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": f"announcement:2|{s['_id']}"})
        assert doc["status"] == "failed" and doc["attempts"] == 3
        assert "HTTP 500" in doc["last_error"]
        clock.t += 10_000
        await pump(n)                                   # a failed record is never retried
        assert (await store.db.notify_outbox.find_one({"_id": doc["_id"]}))["attempts"] == 3
        sub = await n.subs.get(s["_id"])
        assert "HTTP 500" in sub["last_error"]
        page = await n.deliveries({"sub_id": s["_id"]}, 1, 10)
        assert page["total"] == 1 and page["items"][0]["status"] == "failed"
        await store.close()
    asyncio.run(go())


def test_two_workers_never_deliver_one_record_twice(mongo_url, fake):
    async def go():
        store = await setup(mongo_url, users=3)
        a = make(store, owner="A", clock=__import__("time").time, notify_concurrency=8)
        b = make(store, owner="B", clock=__import__("time").time, notify_concurrency=8)
        name = uuid.uuid4().hex[:6]
        for u in (1, 2, 3):
            for _ in range(2):
                await hook_sub(a, u, f"{fake.url}/hook/ok/{name}")
        for i in range(10):
            await a.events.raise_event(f"announcement:{i}", "announcement",
                                       {"title": f"T{i}", "content": "C"})
        assert await store.db.notify_outbox.count_documents({}) == 60
        await asyncio.gather(pump(a), pump(b), pump(a), pump(b))
        got = Counter(r["headers"]["X-Notify-Id"] for r in fake.delivered("webhook", f"/hook/ok/{name}"))
        assert len(got) == 60 and set(got.values()) == {1}
        assert a.worker.delivered + b.worker.delivered == 60
        assert a.worker.delivered > 0 and b.worker.delivered > 0
        assert await store.db.notify_outbox.count_documents({"status": "sent"}) == 60
        await store.close()
    asyncio.run(go())


def test_a_dead_workers_claim_is_taken_over_after_its_lease(mongo_url, fake):
    async def go():
        store = await setup(mongo_url)
        clock = Clock()
        n = make(store, owner="alive", clock=clock, notify_claim_lease=50.0)
        name = uuid.uuid4().hex[:6]
        s = await hook_sub(n, 1, f"{fake.url}/hook/ok/{name}")
        await n.events.raise_event("announcement:3", "announcement", {"title": "T", "content": "C"})
        rid = f"announcement:3|{s['_id']}"
        # Another process claimed it and was killed before it could finish.
        await store.db.notify_outbox.update_one({"_id": rid}, {"$set": {
            "status": "sending", "owner": "dead", "attempts": 1, "next_at": clock.t + 50}})
        await pump(n)
        assert not fake.delivered("webhook", f"/hook/ok/{name}")
        clock.t += 51
        await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": rid})
        assert doc["status"] == "sent" and doc["owner"] == "alive" and doc["attempts"] == 2
        assert len(fake.delivered("webhook", f"/hook/ok/{name}")) == 1
        await store.close()
    asyncio.run(go())


def test_deleted_subscription_fails_permanently(mongo_url, fake):
    async def go():
        store = await setup(mongo_url)
        n = make(store)
        s = await hook_sub(n, 1, f"{fake.url}/hook/ok/deleted")
        await n.events.raise_event("announcement:4", "announcement", {"title": "T", "content": "C"})
        await n.subs.delete(s)
        await pump(n)
        doc = await store.db.notify_outbox.find_one({"_id": f"announcement:4|{s['_id']}"})
        assert doc["status"] == "failed" and "deleted" in doc["last_error"]
        await store.close()
    asyncio.run(go())


def test_old_history_is_pruned(mongo_url, fake):
    async def go():
        store = await setup(mongo_url)
        clock = Clock()
        n = make(store, clock=clock, notify_history_days=30)
        s = await hook_sub(n, 1, f"{fake.url}/hook/ok/prune")
        await n.events.raise_event("announcement:5", "announcement", {"title": "T", "content": "C"})
        await n.events.raise_event("announcement:6", "announcement", {"title": "T", "content": "C"})
        await pump(n)
        await store.db.notify_outbox.update_one({"_id": f"announcement:5|{s['_id']}"},
                                                {"$set": {"updated_at": clock.t - 31 * 86400}})
        await n.prune()
        left = await store.db.notify_outbox.find({}).to_list(None)
        assert [d["_id"] for d in left] == [f"announcement:6|{s['_id']}"]
        await store.close()
    asyncio.run(go())
