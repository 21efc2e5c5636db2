"""Billing through the relay, to the unit: per-token, per-call, cached tokens,
group rates and per-group prices; both the key and the account move; a
usage record per call whose costs add up to used_quota."""
import time

import pytest
import requests

from tests.helpers import Api, eventually

MODEL = "gpt-4o"


@pytest.fixture(scope="module")
def w(relay, admin, fake):
    admin.post("/api/group/", {"name": "double", "rate": 2, "description": "x2"})
    admin.post("/api/group/", {"name": "half", "rate": "0.5"})
    admin.create_channel(fake.url, [MODEL, "percall-model"], groups=["default", "double", "half"])
    # $2.5/M in, $10/M out, $1.25/M cached; a per-call price of $0.01
    admin.set_price(MODEL, input_price=2.5, output_price=10, cache_price=1.25, call_price=0.01)
    # the "half" group has its own price for this model
    admin.set_price(MODEL, input_price=5, output_price=20, cache_price=2.5, group="half")
    admin.set_price("percall-model", call_price=0.002)
    user = admin.create_user("carol", quota=100_000_000)
    admin.put("/api/user/", {"id": user["id"], "usable_groups": ["double", "half"]})
    api = Api.login(relay.url, "carol", "Blue-Kettle-Harbor-42")
    return {"admin": admin, "api": api, "user": user, "url": relay.url}


def call(w, key, usage, model=MODEL, stream=False):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "fake_usage": usage,
            "stream": stream}
    r = requests.post(w["url"] + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    if stream:
        assert b"[DONE]" in r.content
    return r.headers["X-Request-Id"]


def balances(w, token_id):
    u = w["api"].get("/api/user/self")["data"]
    t = w["api"].get(f"/api/token/{token_id}")["data"]
    return u["quota"], u["used_quota"], t["remain_quota"], t["used_quota"]


def record(w, rid):
    for _ in range(50):
        items = w["api"].get("/api/log/self?size=100")["data"]["items"]
        for i in items:
            if i["request_id"] == rid:
                return i
        time.sleep(0.1)
    raise AssertionError(f"no usage record for {rid}")


@pytest.mark.parametrize("stream", [False, True])
def test_per_token_exact(w, stream):
    tok = w["api"].create_token(name=f"pt{stream}", remain_quota=10_000_000)
    before = balances(w, tok["id"])
    rid = call(w, tok["key"], {"prompt_tokens": 12000, "completion_tokens": 3500}, stream=stream)
    # (12000*2.5 + 3500*10)/1e6 = 0.065 USD = 32500 units
    after = balances(w, tok["id"])
    assert before[0] - after[0] == 32500 and after[1] - before[1] == 32500
    assert before[2] - after[2] == 32500 and after[3] - before[3] == 32500
    rec = record(w, rid)
    assert (rec["quota"], rec["prompt_tokens"], rec["completion_tokens"]) == (32500, 12000, 3500)
    assert rec["estimated"] is False


def test_cached_tokens(w):
    tok = w["api"].create_token(name="cache", remain_quota=10_000_000)
    before = balances(w, tok["id"])
    rid = call(w, tok["key"], {"prompt_tokens": 10000, "completion_tokens": 1000,
                               "cached_tokens": 8000})
    # (2000*2.5 + 8000*1.25 + 1000*10)/1e6 = 0.025 USD = 12500 units
    assert before[0] - balances(w, tok["id"])[0] == 12500
    assert record(w, rid)["cached_tokens"] == 8000


def test_group_rate(w):
    tok = w["api"].create_token(name="dbl", remain_quota=10_000_000, group="double")
    before = balances(w, tok["id"])
    call(w, tok["key"], {"prompt_tokens": 12000, "completion_tokens": 3500})
    assert before[2] - balances(w, tok["id"])[2] == 65000


def test_new_key_takes_the_users_group(w):
    w["admin"].put("/api/user/", {"id": w["user"]["id"], "group": "double"})
    tok = w["api"].create_token(name="inherits", remain_quota=10_000_000)
    assert tok["group"] == "double"
    w["admin"].put("/api/user/", {"id": w["user"]["id"], "group": "default"})


def test_group_price_override_and_rate(w):
    tok = w["api"].create_token(name="half", remain_quota=10_000_000, group="half")
    before = balances(w, tok["id"])
    call(w, tok["key"], {"prompt_tokens": 12000, "completion_tokens": 3500})
    # the group's own price (2x base) at rate 0.5: 0.13 USD * 0.5 = 0.065 USD
    assert before[2] - balances(w, tok["id"])[2] == 32500


def test_per_call_key(w):
    tok = w["api"].create_token(name="pc", remain_quota=10_000_000, billing_mode="per_call",
                                group="default")
    before = balances(w, tok["id"])
    for n in (10, 100000):
        call(w, tok["key"], {"prompt_tokens": n, "completion_tokens": n})
    # $0.01 per call whatever the tokens: 5000 units each
    assert before[2] - balances(w, tok["id"])[2] == 10000


def test_call_priced_model(w):
    tok = w["api"].create_token(name="cp", remain_quota=10_000_000, group="default")
    before = balances(w, tok["id"])
    call(w, tok["key"], {"prompt_tokens": 500, "completion_tokens": 500}, model="percall-model")
    assert before[2] - balances(w, tok["id"])[2] == 1000


def test_unlimited_key_is_bounded_by_the_account(w):
    w["admin"].create_user("dave", quota=40000)
    api = Api.login(w["url"], "dave", "Blue-Kettle-Harbor-42")
    tok = api.create_token(name="unl", unlimited_quota=True)
    r = requests.post(w["url"] + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": MODEL, "max_tokens": 10, "fake_usage":
                            {"prompt_tokens": 12000, "completion_tokens": 3500},
                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    me = api.get("/api/user/self")["data"]
    assert (me["quota"], me["used_quota"]) == (7500, 32500)
    t = api.get(f"/api/token/{tok['id']}")["data"]
    assert t["used_quota"] == 32500 and t["unlimited_quota"] is True
    r = requests.post(w["url"] + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "user_quota_exhausted"


def test_charge_above_the_reservation_never_overdraws(w):
    """The upstream reports more usage than we reserved and the key cannot
    pay it all: the key stops at zero, not below."""
    tok = w["api"].create_token(name="tight", remain_quota=6000, group="default")
    r = requests.post(w["url"] + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": MODEL, "max_tokens": 50,
                            "fake_usage": {"prompt_tokens": 10, "completion_tokens": 100000},
                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    t = w["api"].get(f"/api/token/{tok['id']}")["data"]
    assert t["remain_quota"] == 0 and t["used_quota"] == 6000


def test_usage_records_add_up_to_used_quota(w):
    # The totals come from the rollups, which the flusher keeps as it applies
    # records to the balances, every two flush intervals (relay/money/flusher.py).
    def check():
        me = w["api"].get("/api/user/self")["data"]
        logs = w["api"].get("/api/log/self?size=200")["data"]
        assert logs["totals"]["quota"] == me["used_quota"]
    eventually(check, timeout=10)


def test_redemption_once(w):
    codes = w["admin"].post("/api/redemption/", {"name": "promo", "quota": 12345, "count": 2})["data"]
    assert len(codes) == 2 and codes[0] != codes[1]
    before = w["api"].get("/api/user/self")["data"]["quota"]
    assert w["api"].post("/api/user/topup", {"key": codes[0]})["data"] == 12345
    assert w["api"].get("/api/user/self")["data"]["quota"] == before + 12345
    r = w["api"].post("/api/user/topup", {"key": codes[0]}, expect=409)
    assert "already been used" in r["message"]
    w["api"].post("/api/user/topup", {"key": "nope"}, expect=404)
    assert w["api"].get("/api/user/self")["data"]["quota"] == before + 12345
