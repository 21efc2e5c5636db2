"""Budgets by period through real relays on one database (README, "Budgets
by period"): three relays behind a round-robin client serve a key's day
budget to the unit and refuse the rest with 429 `budget_exceeded` and
Retry-After, and the 80% notice is sent once; two relays whose clocks are
either side of midnight in Shanghai count two days; a streaming call that
would cross the limit is refused in its route family's body before
anything streams, and one that fits is served."""
from __future__ import annotations

import datetime as dt
import time
import uuid
from zoneinfo import ZoneInfo

import pytest
import requests

from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, eventually
from tests.relay.money.across import RoundRobin, served_everywhere, start_relays, stop_relays
from tests.relay.money.money_env import MODEL, PRICE, client

SHANGHAI = ZoneInfo("Asia/Shanghai")
# Clocks minutes apart must not make the relays think each other dead.
PATIENT = ["--lease-stale-after", "3600"]


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI(record=False).start()
    yield f
    f.stop()


def _setup(relays, fake):
    admin = Api.login(relays[0].url)
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=2, output_price=2, call_price=0.001)  # 500 units a call
    return admin


def tenant(admin, url, budgets=None, tz=None, per_call=True):
    name = "b" + uuid.uuid4().hex[:8]
    user = admin.create_user(name, quota=10 ** 10)
    api = Api.login(url, name, USER_PASSWORD)
    if tz:
        api.put("/api/user/self", {"timezone": tz})
    key = api.create_token(name="k", remain_quota=10 ** 9, budgets=budgets or {},
                           billing_mode="per_call" if per_call else "per_token")
    return user, api, key


def chat(url, key, stream=False, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            **extra}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {key}"})


@pytest.mark.slow
def test_a_day_budget_over_three_relays_is_exact_and_warns_once(mongo_url, tmp_path, fake):
    relays = start_relays(mongo_url, tmp_path)
    hooks = NotifyReceivers().start()
    try:
        urls = [r.url for r in relays]
        admin = _setup(relays, fake)
        _, _, warm = tenant(admin, urls[0])
        served_everywhere(relays, warm["key"])
        user, api, key = tenant(admin, urls[0], {"day": 20 * PRICE}, "Asia/Shanghai")
        api.post("/api/subscription/", {
            "name": "budget", "event_types": ["budget_warning"], "channel_type": "webhook",
            "channel_config": {"url": f"{hooks.url}/hook/ok/budget"}, "enabled": True})
        time.sleep(1.0)   # the key and the subscription reach the other relays' caches
        calls = RoundRobin(urls, [key["key"]], threads=3).run(26)
        codes = sorted((c.status, c.code) for c in calls)
        assert codes == [(200, "")] * 20 + [(429, "budget_exceeded")] * 6, codes
        for url in urls:
            r = chat(url, key["key"], stream=True)
            assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
            now = dt.datetime.now(SHANGHAI)
            midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(),
                                           SHANGHAI)
            assert 0 < int(r.headers["Retry-After"]) <= (midnight - now).total_seconds() + 2
        db = client(mongo_url)[relays[0].db_name]
        cid = f"t{key['id']}/day/{dt.datetime.now(SHANGHAI).date().isoformat()}"

        def books():
            doc = db.budgets.find_one({"_id": cid})
            assert doc["used_quota"] == 20 * PRICE and doc["limit"] == 20 * PRICE, doc
            mine = api.get(f"/api/token/{key['id']}")["data"]
            assert mine["used_quota"] == 20 * PRICE
            assert mine["budget_use"] == [{"period": "day", "limit": 20 * PRICE,
                                           "used": 20 * PRICE,
                                           "resets_at": mine["budget_use"][0]["resets_at"]}]
        eventually(books, timeout=10)
        got = eventually(lambda: hooks.delivered("webhook", "/hook/ok/budget") or
                         (_ for _ in ()).throw(AssertionError("no notice yet")), timeout=10)
        time.sleep(2.0)
        assert len(hooks.delivered("webhook", "/hook/ok/budget")) == 1
        assert got[0]["json"]["event_type"] == "budget_warning"
        assert db.notify_events.count_documents({"type": "budget_warning"}) == 1
    finally:
        hooks.stop()
        assert stop_relays(relays) == [0, 0, 0]


@pytest.mark.slow
def test_either_side_of_midnight_in_shanghai_counts_two_days(mongo_url, tmp_path, fake):
    now = time.time()
    local = dt.datetime.fromtimestamp(now, SHANGHAI)
    midnight = dt.datetime.combine(local.date() + dt.timedelta(days=1), dt.time(),
                                   SHANGHAI).timestamp()
    # Relay 0 lives two minutes before midnight in Shanghai, relay 1 three after.
    shifts = {0: midnight - 120 - now, 1: midnight + 180 - now}
    relays = start_relays(mongo_url, tmp_path, n=2, args=PATIENT, extra={
        i: {"script": "tests/clocked_server.py", "env": {"RELAY_CLOCK_SHIFT": str(s)}}
        for i, s in shifts.items()})
    try:
        admin = _setup(relays, fake)
        _, _, warm = tenant(admin, relays[0].url)
        served_everywhere(relays, warm["key"])
        _, api, key = tenant(admin, relays[0].url, {"day": 2 * PRICE}, "Asia/Shanghai")
        time.sleep(1.0)
        before, after = relays[0].url, relays[1].url
        assert [chat(before, key["key"]).status_code for _ in range(3)] == [200, 200, 429]
        r = chat(before, key["key"])
        assert r.json()["error"]["code"] == "budget_exceeded"
        assert 0 < int(r.headers["Retry-After"]) <= 120
        # The other side of midnight: a new day, nothing reset it.
        assert [chat(after, key["key"]).status_code for _ in range(3)] == [200, 200, 429]
        r = chat(after, key["key"])
        assert 86_400 - 180 - 60 < int(r.headers["Retry-After"]) <= 86_400 - 180 + 2
        # In UTC both instants are the same day (Shanghai's midnight is 16:00 UTC).
        _, api2, key2 = tenant(admin, relays[0].url, {"day": 2 * PRICE})
        time.sleep(1.0)
        assert [chat(u, key2["key"]).status_code for u in (before, after, before)] == [
            200, 200, 429]
    finally:
        stop_relays(relays)


def test_a_stream_that_would_cross_the_limit_is_refused_before_it_streams(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL], name="budget-" + uuid.uuid4().hex[:4])
    admin.set_price(MODEL, input_price=2, output_price=2)   # a token is a unit
    _, api, key = tenant(admin, relay.url, {"day": 3000}, per_call=False)
    usage = {"prompt_tokens": 10, "completion_tokens": 1000}
    for _ in range(2):   # each reserves its prompt plus 1,000 tokens out and costs 1,010
        r = chat(relay.url, key["key"], stream=True, max_tokens=1000, fake_usage=usage)
        assert r.status_code == 200 and b"[DONE]" in r.content
    r = chat(relay.url, key["key"], stream=True, max_tokens=1000, fake_usage=usage)
    assert r.status_code == 429 and r.headers["Content-Type"].startswith("application/json")
    assert r.json()["error"]["code"] == "budget_exceeded" and int(r.headers["Retry-After"]) > 0
    # Anthropic's own body on /v1/messages.
    m = requests.post(relay.url + "/v1/messages", timeout=30, headers={
        "x-api-key": key["key"], "anthropic-version": "2023-06-01"}, json={
        "model": MODEL, "max_tokens": 1000, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]})
    assert m.status_code == 429 and m.json()["type"] == "error", m.text
    assert "budget" in m.json()["error"]["message"]
    # One that fits what is left (980, less the prompt's worst case) is served,
    # and the key stays within its budget.
    r = chat(relay.url, key["key"], stream=True, max_tokens=400,
             fake_usage={"prompt_tokens": 10, "completion_tokens": 400})
    assert r.status_code == 200 and b"[DONE]" in r.content

    def use():
        got = api.get(f"/api/token/{key['id']}")["data"]["budget_use"][0]
        assert got["used"] == 2 * 1010 + 410 and got["limit"] == 3000
    eventually(use, timeout=10)
