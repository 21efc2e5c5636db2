"""The usage log stays bounded (relay/money/retention.py): records past their
retention and rollups past theirs go a bounded batch at a time, the space
goes back to the file system, and a storage ceiling warns the
administrators (a real webhook delivery) and then prunes the oldest records
first.  Against the embedded database, as the relay runs it."""
from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from models import bulkload
from models.store import Store
from notify.bus import Bus
from relay.money import retention as retention_mod
from relay.money import rollups
from relay.money.retention import Retention
from tests.fakes.notify_receivers import NotifyReceivers
from tests.helpers import Api, RelayProcess
from tests.notify.notify_helpers import subscribe, wait_for


def run(coro):
    return asyncio.run(coro)


def _records(n: int, start: float, step: float, prefix: str = "r") -> list[dict]:
    return [{"_id": f"{prefix}{i:06d}", "user_id": 1, "token_id": 1, "model": "m",
             "status": 200, "quota": 1, "created_at": start + i * step, "proc": "p",
             "seq": i + 1, "pad": "x" * 600} for i in range(n)]


async def _store(tmp_path) -> Store:
    store = Store("", str(tmp_path / "data"), "relay")
    await store.start()
    return store


def test_old_records_and_rollups_go_a_batch_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(retention_mod, "PRUNE_CHUNK", 50)

    async def go():
        store = await _store(tmp_path)
        try:
            now = time.time()
            old = _records(120, now - 200 * 86400, 1.0, "old")
            new = _records(30, now - 100 * 86400, 1.0, "new")
            await store.db.usage.insert_many(old + new)
            days = {c: rollups.documents(old + new)[c] for c in rollups.COLLECTIONS}
            ancient = rollups.documents(_records(5, now - 800 * 86400, 1.0, "anc"))
            for c in rollups.COLLECTIONS:
                await store.db[c].insert_many(list(days[c].values()) + list(ancient[c].values()))
            r = Retention(store, usage_days=180, rollup_days=730, clock=lambda: now)
            # one bounded batch a step
            assert await r.step(now) is True
            assert await store.db.usage.count_documents({}) == 150 - 50
            while await r.step(now):
                pass
            left = sorted([d["_id"] async for d in store.db.usage.find({}, {"_id": 1})])
            assert left == sorted(d["_id"] for d in new)
            assert r.pruned == 120
            for c in rollups.COLLECTIONS:
                ids = {d["_id"] async for d in store.db[c].find({}, {"_id": 1})}
                assert ids == set(days[c]), c  # the 200-day-old rollups stay: 730 days
        finally:
            await store.close()
    run(go())


def test_pruning_gives_the_space_back(tmp_path, monkeypatch):
    monkeypatch.setattr(retention_mod, "COMPACT_EVERY", 1000)

    async def go():
        store = await _store(tmp_path)
        path = bulkload.db_file(str(tmp_path / "data"))
        try:
            now = time.time()
            for i in range(6):
                await store.db.usage.insert_many(_records(2000, now - 300 * 86400 + i * 2000, 1.0,
                                                          f"b{i}-"))
            await store.db.command({"wal_checkpoint": 1})
            before = os.path.getsize(path)
            r = Retention(store, usage_days=180, clock=lambda: now)
            while await r.step(now):
                pass
            assert await store.db.usage.count_documents({}) == 0
            await store.db.command({"wal_checkpoint": 1})
            after = os.path.getsize(path)
            # 12,000 records of ~800 bytes: most of the file goes back
            assert after < before / 3, (before, after)
        finally:
            await store.close()
    run(go())


def test_a_ceiling_warns_then_prunes_the_oldest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(retention_mod, "COMPACT_EVERY", 500)

    async def go():
        store = await _store(tmp_path)
        bus = Bus()
        seen = []
        bus.subscribe("storage", lambda topic, data: seen.append(data))
        try:
            now = time.time()
            await store.db.usage.insert_many(_records(4000, now - 10 * 86400, 10.0))
            size = await store.disk_bytes()
            # Near the ceiling: told, nothing pruned.
            r = Retention(store, bus, usage_days=180, max_bytes=int(size / 0.9),
                          clock=lambda: now)
            assert await r.step(now) is False
            assert seen and seen[-1]["pruning"] is False and 0.8 <= seen[-1]["share"] < 1
            assert await store.db.usage.count_documents({}) == 4000
            # Over it: the oldest go, until the size is back under 95% of it.
            r.max_bytes = int(size * 0.6)
            r._size_at = 0
            while await r.step(now):
                pass
            assert any(d["pruning"] for d in seen)
            left = [d["created_at"] async for d in store.db.usage.find({}, {"created_at": 1})]
            assert 0 < len(left) < 4000
            assert min(left) == now - 10 * 86400 + (4000 - len(left)) * 10.0  # oldest first
            assert await store.disk_bytes() < r.max_bytes
        finally:
            await store.close()
    run(go())


@pytest.fixture(scope="module")
def receivers():
    f = NotifyReceivers().start()
    yield f
    f.stop()


def test_the_administrator_is_told_by_a_storage_warning(tmp_path, receivers):
    env = {"RELAY_NOTIFY_POLL_INTERVAL": "0.2"}
    relay = RelayProcess("", str(tmp_path / "data"), env=env).start()
    try:
        admin = Api.login(relay.url)
        admin.create_user("plain")
        api = Api.login(relay.url, "plain", "Blue-Kettle-Harbor-42")
        # only administrators may ask for it
        r = api.post("/api/subscription/", {
            "name": "x", "event_types": ["storage_warning"], "channel_type": "webhook",
            "channel_config": {"url": f"{receivers.url}/hook/ok/storage-user"}}, expect=400)
        assert "administrators" in r["message"]
        subscribe(admin, "webhook", {"url": f"{receivers.url}/hook/ok/storage"},
                  events=["storage_warning"])
    finally:
        relay.stop()
    # A ceiling the database is already over: told at the first look.
    relay = RelayProcess("", str(tmp_path / "data"), db_name=relay.db_name,
                         env={**env, "RELAY_STORAGE_MAX_GB": "0.000001"}).start()
    try:
        hooks = wait_for(lambda: receivers.delivered("webhook", "/hook/ok/storage"),
                         timeout=60, what="the storage warning")
        body = json.dumps(hooks[0], default=str)
        assert "storage ceiling" in body and "pruned" in body
        assert not receivers.delivered("webhook", "/hook/ok/storage-user")
    finally:
        relay.stop()


def test_the_storage_warning_speaks_the_administrators_language():
    from notify import words
    for lang, near, at in (("en", "nearly full", "storage ceiling"), ("zh-CN", "即将写满", "存储上限")):
        for pruning, title in ((False, near), (True, at)):
            t, content, ceiling = words.storage(
                {"bytes": 8_100_000_000, "max_bytes": 10_000_000_000, "pruning": pruning}, lang)
            assert title in t and "8.1 GB" in content and "10.0 GB" in content, (lang, t, content)
            assert ceiling == "10.0 GB" and "storage_max_gb" in content
