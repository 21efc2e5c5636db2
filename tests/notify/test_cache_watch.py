"""The key_cache_collapse alert (notify/cache_watch.py): usage records
published on the real Bus as billing publishes them, a clock moved by
minutes, two notifier "processes" on the embedded database: one alert per
key in any 60 minutes, to the subscriptions watching that key, in the
subscriber's language."""
from __future__ import annotations

import asyncio

from models.secrets import Vault
from notify.bus import Bus
from notify.cache_watch import MIN_TOKENS, CacheWatch
from notify.events import Events
from notify.subscriptions import Subscriptions
from tests.notify.notify_helpers import Clock, fresh_store


class Proc:
    def __init__(self, store, vault, clock):
        self.bus = Bus()
        self.subs = Subscriptions(store, vault, ttl=60)
        self.events = Events(store, self.subs, clock=clock)
        self.watch = CacheWatch(self.events, clock=clock)
        self.watch.attach(self.bus)

    async def calls(self, token_id: int, n: int, prompt: int, cached: int) -> None:
        for _ in range(n):
            self.bus.publish("usage", {"user_id": 1, "record": {
                "token_id": token_id, "user_id": 1, "prompt_tokens": prompt,
                "cached_tokens": cached, "status": 200}})
        await asyncio.sleep(0)
        await self.watch.drain()


async def setup(mongo_url):
    store = await fresh_store(
        mongo_url, "t_cw_",
        users=[{"_id": 1, "username": "ann", "email": "a@x.test", "language": "zh-CN"}],
        tokens=[{"_id": 11, "user_id": 1, "name": "agent"},
                {"_id": 12, "user_id": 1, "name": "batch"}])
    return store, Vault("test-secret")


def sub(**kw):
    return {"name": "s", "event_types": ["key_cache_collapse"], "channel_type": "webhook",
            "channel_config": {"url": "http://127.0.0.1:9/x"}, **kw}


async def an_hour_of_reads(p, clock, token_id=11):
    for _ in range(60):  # 90% read from the cache, 120k input a minute
        await p.calls(token_id, 4, 30_000, 27_000)
        clock.t += 60


def test_a_collapse_is_told_once_an_hour_across_processes(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        a, b = Proc(store, vault, clock), Proc(store, vault, clock)
        await a.subs.create({"_id": 1}, sub())
        await an_hour_of_reads(a, clock)
        await an_hour_of_reads(b, clock)
        assert await store.db.notify_outbox.count_documents({}) == 0  # steady: nothing
        for _ in range(4):  # then nearly nothing is read, on both relays
            await a.calls(11, 4, 30_000, 1_000)
            await b.calls(11, 4, 30_000, 1_000)
            clock.t += 60
        for p in (a, b):
            await p.calls(11, 1, 30_000, 1_000)
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert len(out) == 1 and out[0]["event_type"] == "key_cache_collapse"
        # The key's name is the user's text: only in the body, quoted (issue 31).
        assert "#11" in out[0]["title"] and "提示缓存" in out[0]["title"]
        assert "agent" not in out[0]["title"] and "\u201cagent\u201d" in out[0]["content"]
        assert "90%" in out[0]["content"]
        # Still collapsed 30 minutes on: no second alert within the hour.
        for _ in range(30):
            await a.calls(11, 4, 30_000, 1_000)
            clock.t += 60
        assert await store.db.notify_outbox.count_documents({}) == 1
        await store.close()
    asyncio.run(go())


def test_too_little_input_or_a_low_share_is_no_collapse(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        await p.subs.create({"_id": 1}, sub())
        for _ in range(60):  # a share that was never worth watching
            await p.calls(11, 4, 30_000, 3_000)
            clock.t += 60
        for _ in range(12):
            await p.calls(11, 4, 30_000, 0)
            clock.t += 60
        for _ in range(60):  # a high share, on too little input
            await p.calls(12, 1, (MIN_TOKENS // 60) // 2, (MIN_TOKENS // 60) // 3)
            clock.t += 60
        for _ in range(12):
            await p.calls(12, 1, (MIN_TOKENS // 60) // 2, 0)
            clock.t += 60
        assert await store.db.notify_outbox.count_documents({}) == 0
        await store.close()
    asyncio.run(go())


def test_only_the_subscriptions_watching_that_key(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        await p.subs.create({"_id": 1}, sub(name="other", key_ids=[12]))
        await p.subs.create({"_id": 1}, sub(name="all"))
        await an_hour_of_reads(p, clock)
        for _ in range(11):
            await p.calls(11, 4, 30_000, 500)
            clock.t += 60
        out = await store.db.notify_outbox.find({}).to_list(None)
        subs = {s["_id"]: s["name"] for s in await store.db.notify_subscriptions.find(
            {}).to_list(None)}
        assert [subs[o["sub_id"]] for o in out] == ["all"]
        await store.close()
    asyncio.run(go())
