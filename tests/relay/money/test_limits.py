"""Rate and concurrency limits per key and per account, through real relay
processes sharing one real database: N parallel calls against a limit of
k let exactly k through in the minute, and the rest get 429 with
Retry-After and the x-ratelimit-* headers, in their family's error body."""
from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually

MODEL = "gpt-4o-mini"  # priced by the catalogue: nobody sets a price here


@pytest.fixture(scope="module")
def w(relay, admin):
    fake = FakeOpenAI().start()
    admin.create_channel(fake.url, [MODEL])
    yield {"relay": relay, "admin": admin, "fake": fake}
    fake.stop()


def account(w, **limits):
    name = "l" + uuid.uuid4().hex[:8]
    user = w["admin"].create_user(name, quota=10 ** 12)
    if limits:
        w["admin"].put("/api/user/", {"id": user["id"], **limits})
    return Api.login(w["relay"].url, name, USER_PASSWORD)


def key(api, **limits) -> dict:
    return api.create_token(name="k" + uuid.uuid4().hex[:6], remain_quota=10 ** 10, **limits)


def same_minute(room: float = 10.0) -> None:
    """Start a burst early enough in a minute that it ends in the same one
    (limits count per calendar minute)."""
    if 60 - time.time() % 60 < room:
        time.sleep(60 - time.time() % 60 + 0.2)


def chat(url, k, stream=False, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            **extra}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=60,
                         headers={"Authorization": f"Bearer {k}"})


def burst(calls) -> list:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda f: f(), calls))


def refused(r, family="openai") -> str:
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    body = r.json()
    if family == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        return body["error"]["message"]
    assert body["error"]["type"] == "rate_limit_error"
    return body["error"]["message"]


def test_rpm_on_a_key(w):
    api = account(w)
    k = key(api, rpm_limit=5)
    assert api.get(f"/api/token/{k['id']}")["data"]["rpm_limit"] == 5
    same_minute()
    rs = burst([lambda: chat(w["relay"].url, k["key"])] * 12)
    assert sorted(r.status_code for r in rs) == [200] * 5 + [429] * 7
    for r in rs:
        if r.status_code == 429:
            assert "5 requests per minute" in refused(r)
            assert r.json()["error"]["code"] == "token_rpm_limit"
            assert r.headers["x-ratelimit-limit-requests"] == "5"
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
    # another key of the same account is not limited by this one
    assert chat(w["relay"].url, key(api)["key"]).status_code == 200


def test_account_limit_spans_its_keys_and_families(w):
    api = account(w, rpm_limit=4)
    assert w["admin"].get("/api/user/?size=1000")["data"]
    k1, k2 = key(api), key(api)
    url = w["relay"].url

    def messages(k):
        return requests.post(url + "/v1/messages", timeout=60, json={
            "model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": k, "anthropic-version": "2023-06-01"})
    same_minute()
    calls = [lambda: chat(url, k1["key"])] * 5 + [lambda: messages(k2["key"])] * 5
    rs = burst(calls)
    assert sum(r.status_code == 200 for r in rs) == 4
    assert sum(r.status_code == 429 for r in rs) == 6
    for i, r in enumerate(rs):
        if r.status_code == 429:
            msg = refused(r, "openai" if i < 5 else "anthropic")
            assert "account's limit of 4 requests per minute" in msg


def test_tokens_per_minute(w):
    api = account(w)
    k = key(api, tpm_limit=100)
    same_minute()
    usage = {"prompt_tokens": 80, "completion_tokens": 30}
    assert chat(w["relay"].url, k["key"], fake_usage=usage).status_code == 200
    time.sleep(0.1)
    r = chat(w["relay"].url, k["key"], fake_usage=usage)
    assert "100 tokens per minute" in refused(r)
    assert r.headers["x-ratelimit-limit-tokens"] == "100"
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"


def test_concurrency_on_a_key(w):
    api = account(w)
    k = key(api, concurrency_limit=3)
    slow = dict(stream=True, fake_delay=0.4, fake_chunks=3)
    rs = burst([lambda: chat(w["relay"].url, k["key"], **slow)] * 8)
    assert sorted(r.status_code for r in rs) == [200] * 3 + [429] * 5
    for r in rs:
        if r.status_code == 429:
            assert "3 concurrent requests" in refused(r)
            assert r.headers["Retry-After"] == "1"
    # the slots come back when the calls end
    assert chat(w["relay"].url, k["key"]).status_code == 200


def test_bad_limits_are_refused(w):
    api = account(w)
    api.post("/api/token/", {"name": "x", "rpm_limit": -1}, expect=400)
    api.post("/api/token/", {"name": "x", "tpm_limit": "many"}, expect=400)
    w["admin"].put("/api/user/", {"id": 1, "concurrency_limit": 1.5}, expect=400)


@pytest.mark.slow
def test_two_processes_share_the_limits(w, tmp_path):
    """Two relays on one database: the limit holds across both, exactly."""
    other = RelayProcess(w["relay"].mongo_url, str(tmp_path), db_name=w["relay"].db_name).start()
    try:
        urls = [w["relay"].url, other.url]
        api = account(w)
        warm = key(api)
        for url in urls:  # both warm (connections, caches): they race evenly
            assert chat(url, warm["key"]).status_code == 200
        # rpm 40: leases of 2, so permits strand in one process unless given back
        k = key(api, rpm_limit=40)
        same_minute(20)
        rs = burst([lambda i=i: chat(urls[i % 2], k["key"]) for i in range(90)])
        assert sum(r.status_code == 200 for r in rs) == 40
        assert sum(r.status_code == 429 for r in rs) == 50
        for r in rs:
            if r.status_code == 429:
                assert "40 requests per minute" in refused(r)
        # both processes served some of them
        assert {r.url.split("/v1")[0] for r in rs if r.status_code == 200} == set(urls)

        # A lease left unused in one process is given back to the other:
        # three calls here hold a lease of 2 twice (one permit spare), then
        # only the other process is called.
        s = key(api, rpm_limit=40)
        same_minute(20)
        assert [chat(urls[0], s["key"]).status_code for _ in range(3)] == [200] * 3
        rs = burst([lambda: chat(urls[1], s["key"])] * 60)
        assert sum(r.status_code == 200 for r in rs) == 37
        assert sum(r.status_code == 429 for r in rs) == 23

        c = key(api, concurrency_limit=2)
        slow = dict(stream=True, fake_delay=0.5, fake_chunks=3)
        rs = burst([lambda i=i: chat(urls[i % 2], c["key"], **slow) for i in range(8)])
        assert sorted(r.status_code for r in rs) == [200] * 2 + [429] * 6
        assert chat(urls[1], c["key"]).status_code == 200
    finally:
        other.stop()


def test_calls_within_a_lease_do_not_touch_the_database(mongo_url, tmp_path):
    """After the first lease, admitting and finishing calls makes no
    database call at all (the store is swapped for one that fails loudly)."""
    import asyncio

    from models.records import Token, User
    from models.store import Store
    from relay.money.limits import Limiter
    from relay.money.pricing import Usage

    class NoDatabase:
        @property
        def db(self):
            raise AssertionError("the hot path touched the database")

    async def run():
        store = Store(mongo_url, str(tmp_path), "lim_" + uuid.uuid4().hex[:8])
        await store.start()
        lim = Limiter(store, "p1")
        tok = Token.from_doc({"_id": 1, "user_id": 1, "rpm_limit": 1600, "tpm_limit": 10 ** 8,
                              "concurrency_limit": 50})
        user = User.from_doc({"_id": 1, "rpm_limit": 3200})
        first = await lim.admit(tok, user)   # leases: 100 requests, 50 slots, ...
        lim.done(first, Usage(10, 5))
        real, lim.store = lim.store, NoDatabase()
        for _ in range(60):                   # well inside the leases, no refill due
            lim.done(await lim.admit(tok, user), Usage(10, 5))
        lim.store = real
        await store.close()
    asyncio.run(run())


@pytest.mark.slow
def test_a_killed_relays_concurrency_slots_come_back_with_its_leases(w, tmp_path):
    """One process registry for quota and limits (relay/money/processes.py): the
    relay that reclaims a dead relay's quota leases gives back the
    concurrency slots it held, by the same heartbeat and threshold."""
    import threading

    from tests.relay.money.money_env import client

    stale = 6.0   # relays sharing a database share the threshold: a database of their own
    args = ["--lease-stale-after", str(stale)]
    mongo_url = w["relay"].mongo_url
    a = RelayProcess(mongo_url, str(tmp_path / "a"), args=args).start()
    b = RelayProcess(mongo_url, str(tmp_path / "b"), db_name=a.db_name, args=args).start()
    try:
        admin = Api.login(a.url)
        admin.create_channel(w["fake"].url, [MODEL])
        admin.create_user("slots", quota=10 ** 12)
        api = Api.login(a.url, "slots", USER_PASSWORD)
        k = api.create_token(name="one", remain_quota=10 ** 10, concurrency_limit=1)["key"]
        for r in (a, b):   # b learns of the channel within invalidation_poll
            eventually(lambda r=r: _served(r.url, k), timeout=10)
        # a call on `a` holds the only slot (a stream slow to start), then `a` dies
        def hold():
            # The slot the calls above used is given back through the
            # database, so `a` may still see it taken for a moment: a 429
            # comes at once, and is tried again (a stream's answer starts
            # only with its first chunk, 20 s on).
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    r = requests.post(a.url + "/v1/chat/completions", timeout=60, stream=True,
                                      headers={"Authorization": f"Bearer {k}"},
                                      json={"model": MODEL, "stream": True, "fake_chunks": 3,
                                            "fake_delay": 20,
                                            "messages": [{"role": "user", "content": "hi"}]})
                    if r.status_code != 429:
                        for _ in r.iter_content(None):
                            pass
                        return
                    r.close()
                except requests.RequestException:
                    return
                time.sleep(0.2)
        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        victim = a.billing_pid()
        db = client(mongo_url)[a.db_name]
        slot = f"token:{api.get('/api/token/')['data']['items'][0]['id']}:concurrency"
        eventually(lambda: _held_by(db, slot, victim, 1), timeout=10)
        assert chat(b.url, k).status_code == 429          # the slot is taken
        a.kill9()
        # back with the leases: b reclaims `a` within the threshold
        eventually(lambda: _served(b.url, k), timeout=stale + 10, interval=0.5)
        assert bool(db.processes.find_one({"_id": victim})["dead"])
        assert victim not in (db.limits.find_one({"_id": slot}).get("held") or {})
        holder.join(30)
    finally:
        a.stop()
        assert b.stop() == 0


def _held_by(db, doc_id, pid, n):
    doc = db.limits.find_one({"_id": doc_id}) or {}
    assert (doc.get("held") or {}).get(pid) == n, doc


def _served(url, k):
    assert chat(url, k).status_code == 200
