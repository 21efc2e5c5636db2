"""Durability across real relay processes sharing one database: delivery
resumes after kill -9 with work in the outbox (both records waiting for a
retry and a record claimed mid-send), and two relays never deliver one
outbox record twice."""
from __future__ import annotations

import time
import uuid
from collections import Counter

import pymongo
import pytest

import openai

from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api
from tests.notify.notify_helpers import subscribe, wait_for


@pytest.fixture(scope="module")
def fake():
    f = NotifyReceivers().start()
    yield f
    f.stop()


def env(**kw) -> dict:
    out = {"RELAY_NOTIFY_RETRY_BASE": "0.5", "RELAY_NOTIFY_POLL_INTERVAL": "0.2",
           "RELAY_NOTIFY_SEND_TIMEOUT": "2", "RELAY_NOTIFY_CLAIM_LEASE": "5"}
    out.update(kw)
    return out


def user_api(root, base) -> Api:
    name = "d" + uuid.uuid4().hex[:8]
    root.create_user(name)
    return Api.login(base, name, "Blue-Kettle-Harbor-42")


@pytest.mark.slow
def test_delivery_resumes_after_kill9(fresh_relay, fake):
    tag = uuid.uuid4().hex[:6]
    fake.closed.update({f"a{tag}", f"b{tag}"})
    r1 = fresh_relay(env=env())
    root = Api.login(r1.url)
    api = user_api(root, r1.url)
    waiting = subscribe(api, "webhook", {"url": f"{fake.url}/hook/gate/a{tag}"})
    held = subscribe(api, "webhook", {"url": f"{fake.url}/hook/gatehang/b{tag}"})
    root.post("/api/announcement/", {"title": f"Kill {tag}", "content": "c"})

    def first_item(sub):
        items = api.get(f"/api/subscription/{sub['id']}/deliveries")["data"]["items"]
        return items[0] if items else None
    # One record is waiting for a retry after a 503, the other is claimed mid-send.
    wait_for(lambda: (first_item(waiting) or {}).get("attempts", 0) >= 1
             and "503" in first_item(waiting)["last_error"], what="a failed first attempt")
    wait_for(lambda: (first_item(held) or {}).get("in_flight"), what="a claimed record")
    r1.kill9()
    fake.closed.difference_update({f"a{tag}", f"b{tag}"})
    r2 = fresh_relay(env=env(), db_name=r1.db_name)
    api2 = Api(r2.url, api.s.headers["Authorization"].split(" ", 1)[1])

    def all_sent():
        items = [api2.get(f"/api/subscription/{s['id']}/deliveries")["data"]["items"][0]
                 for s in (waiting, held)]
        return all(i["status"] == "sent" for i in items) and items
    items = wait_for(all_sent, timeout=60, what="delivery after restart")
    assert len(fake.delivered("webhook", f"/hook/gate/a{tag}")) == 1
    assert len(fake.delivered("webhook", f"/hook/gatehang/b{tag}")) == 1
    assert items[1]["attempts"] >= 2  # the dead process's claim was taken over


@pytest.mark.slow
def test_two_relays_never_deliver_one_record_twice(fresh_relay, fake, mongo_url):
    tag = uuid.uuid4().hex[:6]
    r1 = fresh_relay(env=env(RELAY_NOTIFY_CONCURRENCY="3"))
    r2 = fresh_relay(env=env(RELAY_NOTIFY_CONCURRENCY="3"), db_name=r1.db_name)
    root = Api.login(r1.url)
    subs = []
    for _ in range(2):
        api = user_api(root, r1.url)
        for _ in range(3):
            subs.append(subscribe(api, "webhook", {"url": f"{fake.url}/hook/slow/{tag}"}))
    # The same access token on the other process (a second login would replace it).
    root2 = Api(r2.url, root.s.headers["Authorization"].split(" ", 1)[1])
    for i in range(5):   # announcements from both processes
        (root if i % 2 else root2).post("/api/announcement/", {"title": f"T{i} {tag}",
                                                               "content": "c"})
    wait_for(lambda: len(fake.delivered("webhook", f"/hook/slow/{tag}")) >= 30, timeout=90,
             what="30 deliveries")
    time.sleep(2.0)
    got = Counter(r["headers"]["X-Notify-Id"] for r in fake.delivered("webhook", f"/hook/slow/{tag}"))
    assert len(got) == 30 and set(got.values()) == {1}, got.most_common(3)
    assert fake.hook_counts[f"slow/{tag}"] == 30
    owners = Counter(d["owner"] for d in pymongo.MongoClient(mongo_url)[r1.db_name]
                     .notify_outbox.find({}, {"owner": 1}))
    assert len(owners) == 2, f"both relays took records: {dict(owners)}"


@pytest.mark.slow
def test_subscription_written_on_one_relay_is_used_by_another(fresh_relay, fake):
    """Thresholds are cached per process; a write on relay A reaches relay B's
    cache through the cross-process invalidation, well before the cache's TTL."""
    up = FakeOpenAI().start()
    try:
        tag = uuid.uuid4().hex[:6]
        a = fresh_relay(env=env(RELAY_NOTIFY_CACHE_TTL="600"))
        b = fresh_relay(env=env(RELAY_NOTIFY_CACHE_TTL="600"), db_name=a.db_name)
        root = Api.login(a.url)
        model = f"m-{tag}"
        root.create_channel(up.url, [model], name=f"ch-{tag}")
        root.set_price(model, call_price=0.002)               # 1,000 units a call
        name = "x" + tag
        user = root.create_user(name, quota=1_000_000)
        api = Api.login(a.url, name, "Blue-Kettle-Harbor-42")
        key = api.post("/api/token/", {"name": f"K{tag}", "remain_quota": 10_000})["data"]
        client = openai.OpenAI(api_key=key["key"], base_url=b.url + "/v1", max_retries=0)

        def call():
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        # relay B learns of the channel made on A through the invalidation poll
        for _ in range(50):
            try:
                call()    # relay B now caches "no subscriptions" for this user
                break
            except openai.InternalServerError:
                time.sleep(0.1)
        else:
            raise AssertionError("relay B never saw the channel created on relay A")
        time.sleep(1.0)
        subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/x{tag}"},
                  events=["key_quota_warning"], key_threshold=7500)
        time.sleep(2.0)   # a few invalidation polls
        for _ in range(2):  # 9,000 -> 7,000: crosses 7,500 on relay B
            call()
        hooks = wait_for(lambda: fake.delivered("webhook", f"/hook/ok/x{tag}"),
                         what="the warning raised on relay B")
        assert hooks[0]["json"]["key_name"] == f"K{tag}" and user["id"]
    finally:
        up.stop()
