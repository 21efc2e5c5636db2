"""Warnings from balance changes: crossing detection, the rolling 60-minute
throttle (with an injected clock, across an hour boundary) in two notifier
"processes" sharing one database, and per-key targeting.  The rules are
driven through the real Bus, as billing's flusher drives them after it
reads back the balances it applied (`balance_applied`), against the
embedded MongoDB-compatible server."""
from __future__ import annotations

import asyncio

from models.secrets import Vault
from models.store import Store
from notify.bus import Bus
from notify.events import Events
from notify.rules import Rules
from notify.subscriptions import Subscriptions
from tests.notify.notify_helpers import Clock, fresh_store


class Proc:
    """One relay process's notification parts."""

    def __init__(self, store, vault, clock):
        self.bus = Bus()
        self.subs = Subscriptions(store, vault, ttl=60)
        self.events = Events(store, self.subs, clock=clock)
        self.rules = Rules(self.subs, self.events)
        self.rules.attach(self.bus)

    async def settle(self, user_id, quota, token_id=None, remain=None):
        """A flush read the balances back (billing's `balance_applied`)."""
        self.bus.publish("balance_applied", {"kind": "user", "user_id": user_id,
                                             "token_id": None, "remaining": quota,
                                             "before": quota})
        if token_id is not None:
            self.bus.publish("balance_applied", {"kind": "token", "user_id": user_id,
                                                 "token_id": token_id, "remaining": remain,
                                                 "before": remain})
        await asyncio.sleep(0)
        await self.rules.drain()


async def setup(mongo_url):
    store = await fresh_store(
        mongo_url, "t_thr_",
        users=[{"_id": 1, "username": "ann", "email": "a@x.test"},
               {"_id": 2, "username": "bob", "email": "b@x.test"}],
        tokens=[{"_id": 11, "user_id": 1, "name": "k-one"},
                {"_id": 12, "user_id": 1, "name": "k-two"},
                {"_id": 13, "user_id": 1, "name": "k-three"}])
    return store, Vault("test-secret")


def sub_body(**kw):
    body = {"name": "s", "event_types": ["user_quota_warning", "key_quota_warning"],
            "user_threshold": 1000, "key_threshold": 500, "channel_type": "webhook",
            "channel_config": {"url": "http://127.0.0.1:9/x"}}
    body.update(kw)
    return body


async def count(store, etype=None):
    flt = {"type": etype} if etype else {}
    return await store.db.notify_events.count_documents(flt)


HOUR_MARK = 1_800_000_000.0  # a whole hour: 1_800_000_000 % 3600 == 0


def test_crossing_many_times_in_an_hour_sends_one(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        await p.subs.create({"_id": 1}, sub_body())
        await p.settle(1, 5000)
        assert await count(store) == 0
        for low in (900, 800, 700):       # cross down, back up, down, ...
            await p.settle(1, low)
            await p.settle(1, 5000)
        assert await count(store, "user_quota_warning") == 1
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert len(out) == 1 and out[0]["vars"]["balance"] == 900
        assert out[0]["vars"]["threshold"] == 1000 and out[0]["status"] == "pending"
        await p.settle(1, 600)
        await p.settle(1, 500)            # staying below is not a new crossing
        clock.t += 3600                   # 60 minutes later a new crossing is sent again
        await p.settle(1, 400)
        assert await store.db.notify_outbox.count_documents({}) == 1
        await p.settle(1, 5000)
        await p.settle(1, 300)
        assert await store.db.notify_outbox.count_documents({}) == 2
        await store.close()
    asyncio.run(go())


def test_the_limit_is_a_rolling_hour_not_a_clock_hour(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock(HOUR_MARK - 120)    # 23:58
        a, b = Proc(store, vault, clock), Proc(store, vault, clock)
        await a.subs.create({"_id": 1}, sub_body())
        await a.settle(1, 5000, 11, 2000)
        await a.settle(1, 900, 11, 400)   # both the wallet and key 11 cross
        await a.settle(1, 5000, 11, 2000)
        clock.t = HOUR_MARK + 60          # 00:01: a new clock hour, 3 minutes later
        await b.settle(1, 5000, 11, 2000)
        await b.settle(1, 800, 11, 300)   # the other process sees both cross again
        await a.settle(1, 5000, 11, 2000)
        await a.settle(1, 700, 11, 200)
        sent = await store.db.notify_outbox.find({}).to_list(None)
        assert sorted(o["event_type"] for o in sent) == ["key_quota_warning",
                                                         "user_quota_warning"]
        clock.t = HOUR_MARK - 120 + 3599  # 59 min 59 s after the first: still held back
        await b.settle(1, 5000, 11, 2000)
        await b.settle(1, 600, 11, 100)
        assert await store.db.notify_outbox.count_documents({}) == 2
        clock.t = HOUR_MARK - 120 + 3600  # 60 minutes after the first: sent again
        await a.settle(1, 5000, 11, 2000)
        await a.settle(1, 500, 11, 50)
        sent = await store.db.notify_outbox.find({}).sort("created_at", 1).to_list(None)
        assert [(o["event_type"], o["vars"]["balance"]) for o in sent[2:]] in (
            [("user_quota_warning", 500), ("key_quota_warning", 50)],
            [("key_quota_warning", 50), ("user_quota_warning", 500)])
        assert len({o["_id"] for o in sent}) == 4
        await store.close()
    asyncio.run(go())


def test_limit_holds_across_processes(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        a, b = Proc(store, vault, clock), Proc(store, vault, clock)
        await a.subs.create({"_id": 1}, sub_body())
        # Both processes see the account cross in the same hour.
        await asyncio.gather(a.settle(1, 900), b.settle(1, 800))
        await asyncio.gather(a.settle(1, 5000), b.settle(1, 5000))
        await asyncio.gather(a.settle(1, 100), b.settle(1, 50))
        assert await count(store, "user_quota_warning") == 1
        assert await store.db.notify_outbox.count_documents({}) == 1
        await store.close()
    asyncio.run(go())


def test_racing_raises_from_separate_connections_send_exactly_one(mongo_url):
    """Many processes (each its own database connection) raise the same
    warning at the same instant, first ever and again an hour later."""
    async def go():
        store, vault = await setup(mongo_url)
        others = []
        for _ in range(3):
            other = Store(mongo_url, db_name=store.db_name)
            await other.start()
            others.append(other)
        clock = Clock()
        procs = [Proc(s, vault, clock) for s in [store, *others]]
        await procs[0].subs.create({"_id": 1}, sub_body())
        for round_ in (1, 2):
            won = await asyncio.gather(*[p.events.raise_warning("user_quota_warning", 1, None, 10)
                                         for p in procs for _ in range(5)])
            assert sum(won) == 1, won
            assert await store.db.notify_outbox.count_documents({}) == round_
            clock.t += 3600
        for other in others:
            await other.close()
        await store.close()
    asyncio.run(go())


def test_an_unfinished_warning_holds_the_next_until_recovered(mongo_url):
    """A process died between recording a warning and fanning it out: the
    next warning waits, recovery delivers the first, then the limit runs on."""
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        sub = await p.subs.create({"_id": 1}, sub_body())
        await store.db.notify_events.insert_one({
            "_id": "user_quota_warning:1", "type": "user_quota_warning",
            "occurrence": f"user_quota_warning:1@{int(clock() * 1000)}", "created_at": clock(),
            "fanned_out": False, "payload": {"user_id": 1, "token_id": None, "balance": 900}})
        clock.t += 7200
        assert not await p.events.raise_warning("user_quota_warning", 1, None, 10)
        assert await p.events.recover() == 1
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert [o["vars"]["balance"] for o in out] == [900]
        assert out[0]["_id"] == f"user_quota_warning:1@{int((clock() - 7200) * 1000)}|{sub['_id']}"
        assert await p.events.raise_warning("user_quota_warning", 1, None, 10)
        assert await store.db.notify_outbox.count_documents({}) == 2
        await store.close()
    asyncio.run(go())


def test_key_warning_fires_for_the_key_that_crossed_only(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        await p.subs.create({"_id": 1}, sub_body(event_types=["key_quota_warning"],
                                                 key_ids=[11, 12]))
        for tok in (11, 12, 13):
            await p.settle(1, 10_000, tok, 2000)
        await p.settle(1, 10_000, 12, 400)    # key 12 crosses
        await p.settle(1, 10_000, 13, 100)    # key 13 crosses, but is not subscribed
        await p.settle(1, 10_000, 11, 1500)   # key 11 stays above
        events = await store.db.notify_events.find({}).to_list(None)
        assert [(e["type"], e["payload"]["token_id"]) for e in events] == [
            ("key_quota_warning", 12)]
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert len(out) == 1 and out[0]["vars"]["key_name"] == "k-two"
        # The key by id in the title; its name (the user's text) only quoted in the body.
        assert out[0]["title"] == "API key #12 is running low"
        assert out[0]["vars"]["balance"] == 400 and "\u201ck-two\u201d" in out[0]["content"]
        # Each key has its own hourly limit: key 11 crossing now is still sent.
        await p.settle(1, 10_000, 11, 200)
        assert await count(store, "key_quota_warning") == 2
        assert await count(store, "user_quota_warning") == 0
        await store.close()
    asyncio.run(go())


def test_disabled_or_other_users_subscriptions_get_nothing(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        p = Proc(store, vault, Clock())
        await p.subs.create({"_id": 1}, sub_body(enabled=False))
        await p.subs.create({"_id": 2}, sub_body())
        await p.settle(1, 5000)
        await p.settle(1, 10)
        assert await count(store) == 0
        await p.settle(2, 5000)
        await p.settle(2, 10)
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert [o["user_id"] for o in out] == [2]
        await store.close()
    asyncio.run(go())


def test_unfinished_fan_out_is_recovered(mongo_url):
    async def go():
        store, vault = await setup(mongo_url)
        clock = Clock()
        p = Proc(store, vault, clock)
        s = await p.subs.create({"_id": 1}, sub_body(event_types=["announcement"]))
        # A process recorded the event and died before fanning it out.
        await store.db.notify_events.insert_one({
            "_id": "announcement:99", "type": "announcement", "created_at": clock(),
            "fanned_out": False, "payload": {"title": "T", "content": "C", "announcement": {
                "_id": 99, "title": "T", "content": "C", "kind": "announcement",
                "created_at": 1}}})
        assert await p.events.recover() == 1
        assert (await store.db.announcements.find_one({"_id": 99}))["title"] == "T"
        assert await p.events.recover() == 0
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert [(o["_id"], o["title"]) for o in out] == [(f"announcement:99|{s['_id']}", "T")]
        await store.close()
    asyncio.run(go())


def test_a_crossing_seen_first_after_the_change_that_made_it(mongo_url):
    """A relay that reads a balance for the first time right after its own
    flush took it below the threshold: `before` says it was above."""
    async def go():
        store, vault = await setup(mongo_url)
        p = Proc(store, vault, Clock())
        await p.subs.create({"_id": 1}, sub_body())
        p.bus.publish("balance_applied", {"kind": "user", "user_id": 1, "token_id": None,
                                          "remaining": 400, "before": 300})
        await asyncio.sleep(0)
        await p.rules.drain()
        assert await count(store) == 0     # it was below before too: no crossing
        q = Proc(store, vault, Clock())
        q.bus.publish("balance_applied", {"kind": "user", "user_id": 1, "token_id": None,
                                          "remaining": 900, "before": 1200})
        await asyncio.sleep(0)
        await q.rules.drain()
        out = await store.db.notify_outbox.find({}).to_list(None)
        assert [o["vars"]["balance"] for o in out] == [900]
        await store.close()
    asyncio.run(go())
