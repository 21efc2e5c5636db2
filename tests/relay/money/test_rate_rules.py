"""Group rate rules: tiers by the call's input tokens and by the account's
spend this calendar month, golden at each boundary, through the API and
the usage record; their validation; the seed's five groups."""
from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
import requests
from pymongo import MongoClient

from models.records import Group, parse_rate_tiers
from relay.money import budgets, rates
from tests.helpers import USER_PASSWORD, Api
from tests.relay.money.money_env import record

MODEL = "rate-rule-model"   # $2 a million input tokens: a token is one unit
USD = 500_000


def group(rate="1", input_tiers=None, spend_tiers=None) -> Group:
    return Group.from_doc({"_id": "g", "rate": rate, "input_tiers": input_tiers or [],
                           "spend_tiers": spend_tiers or []})


VVIP = [{"from": 32000, "factor": "0.6"}]
VIP = [{"from": 50, "factor": "0.9"}, {"from": 200, "factor": "0.8"}]


# ---- the arithmetic ---------------------------------------------------------
def test_input_tiers_apply_from_their_start():
    g = group(input_tiers=VVIP)
    assert rates.rate_for(g, 31_999, None) == (Decimal("1"), "flat")
    assert rates.rate_for(g, 32_000, None) == (Decimal("0.6"), "input>=32000 x0.6")
    assert rates.rate_for(g, 32_001, None)[0] == Decimal("0.6")
    assert rates.highest(g) == Decimal("1")


def test_spend_tiers_apply_from_the_call_that_crosses():
    g = group(spend_tiers=VIP)
    cost = lambda r: int(10_000 * r)   # noqa: E731 ($0.02 at rate 1)
    assert rates.rate_for(g, 0, 49 * USD, cost) == (Decimal("1"), "flat")
    # $49.99 + $0.02 crosses $50: the crossing call is billed at 0.9 itself.
    assert rates.rate_for(g, 0, 49 * USD + 495_000, cost) == (Decimal("0.9"), "spend>=$50 x0.9")
    assert rates.rate_for(g, 0, 50 * USD, cost)[0] == Decimal("0.9")
    assert rates.rate_for(g, 0, 250 * USD, cost) == (Decimal("0.8"), "spend>=$200 x0.8")


def test_both_multiply_and_the_reservation_takes_the_highest():
    g = group("2", input_tiers=[{"from": 10, "factor": "1.5"}], spend_tiers=VIP)
    assert rates.rate_for(g, 10, 60 * USD) == (Decimal("2.70"), "input>=10 x1.5; spend>=$50 x0.9")
    assert rates.highest(g) == Decimal("3.0")


@pytest.mark.parametrize("raw,message", [
    ([{"from": 50, "factor": 1}, {"from": 10, "factor": 1}], "sorted"),
    ([{"from": 10, "factor": 1}, {"from": 10, "factor": 1}], "sorted"),
    ([{"from": 0, "factor": 1}], "sorted"),
    ([{"from": 10, "factor": 0}], "above 0"),
    ([{"from": 10, "factor": -1}], "non-negative"),
    ([{"from": 10, "factor": 1001}], "at most 1000"),
    ([{"from": 10.5, "factor": 1}], "whole number"),
    ([{"from": 10, "factor": 1, "x": 1}], "'from' and 'factor' only"),
    ([{"from": i + 1, "factor": 1} for i in range(9)], "at most 8"),
    ({"from": 10}, "list"),
])
def test_bad_tiers_are_refused(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_rate_tiers(raw, "input_tiers")


def test_periods_are_calendar_aligned_in_the_accounts_zone():
    # 2026-11-26 15:59:59 UTC is 23:59:59 in Shanghai; a second later it is the 27th there.
    t = 1795708799.0
    assert budgets.bounds("day", t, "Asia/Shanghai")[0].isoformat() == "2026-11-26"
    assert budgets.bounds("day", t + 1, "Asia/Shanghai")[0].isoformat() == "2026-11-27"
    assert budgets.bounds("day", t, "Asia/Shanghai")[1] == t + 1
    assert budgets.bounds("day", t + 1, "UTC")[0].isoformat() == "2026-11-26"
    assert budgets.bounds("week", t, "UTC")[0].isoformat() == "2026-11-23"  # a Monday
    start, end = budgets.bounds("month", t + 5 * 86400, "Asia/Shanghai")
    assert start.isoformat() == "2026-12-01" and end == 1798732800.0  # 2027-01-01 00:00 +08


# ---- through the relay -------------------------------------------------------
@pytest.fixture(scope="module")
def env(relay, admin, fake):
    admin.post("/api/group/", {"name": "longtext", "rate": 1, "input_tiers": VVIP})
    admin.post("/api/group/", {"name": "volume", "rate": 1, "spend_tiers": VIP})
    admin.create_channel(fake.url, [MODEL], groups=["default", "longtext", "volume"])
    admin.set_price(MODEL, input_price=2, output_price=2)
    name = "r" + uuid.uuid4().hex[:8]
    user = admin.create_user(name, quota=10 ** 12)
    admin.put("/api/user/", {"id": user["id"], "usable_groups": ["longtext", "volume"]})
    api = Api.login(relay.url, name, USER_PASSWORD)
    db = MongoClient(relay.mongo_url)[relay.db_name]
    yield {"admin": admin, "api": api, "url": relay.url, "user": user, "db": db}


def call(env, key, prompt: int, stream=False):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "fake_usage": {"prompt_tokens": prompt, "completion_tokens": 0}}
    r = requests.post(env["url"] + "/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.headers["X-Request-Id"]


@pytest.mark.parametrize("prompt,units,rate,rule", [
    (31_999, 31_999, "1", "flat"),
    (32_000, 19_200, "0.6", "input>=32000 x0.6"),
    (32_001, 19_201, "0.6", "input>=32000 x0.6"),   # 32,001 units x 0.6 = 19,200.6
])
def test_long_text_tier_golden(env, prompt, units, rate, rule):
    tok = env["api"].create_token(name="lt", remain_quota=10 ** 9, group="longtext")
    for stream in (False, True):
        rec = record(env, call(env, tok["key"], prompt, stream))
        assert (rec["quota"], rec["rate"], rec["rate_rule"]) == (units, rate, rule), rec


def test_spend_crossing_50_mid_month_golden(env):
    # An account of its own: its month counter is made here, before any call.
    name = "s" + uuid.uuid4().hex[:8]
    uid = env["admin"].create_user(name, quota=10 ** 12)["id"]
    env["admin"].put("/api/user/", {"id": uid, "usable_groups": ["volume"]})
    api = Api.login(env["url"], name, USER_PASSWORD)
    env = {**env, "api": api}
    month = budgets.counter("user", uid, "month", 0, time.time(), "UTC").id
    before = 50 * USD - 10_000          # $49.98 spent this month already
    env["db"].budgets.insert_one({"_id": month, "quota": -before, "used_quota": before,
                                  "limit": 0, "user_id": uid, "token_id": None,
                                  "period": "month"})
    groups = {g["name"]: g for g in api.get("/api/group/")["data"]}
    assert groups["volume"]["rate_now"] == 1 and groups["volume"]["month_spend"] == before
    assert groups["volume"]["spend_tiers"] == [{"from": 50, "factor": 0.9},
                                               {"from": 200, "factor": 0.8}]
    tok = api.create_token(name="vol", remain_quota=10 ** 9, group="volume")
    first = record(env, call(env, tok["key"], 5_000))      # $0.01: to $49.99, no crossing
    assert (first["quota"], first["rate"], first["rate_rule"]) == (5_000, "1", "flat")
    crossing = record(env, call(env, tok["key"], 10_000, stream=True))  # $0.02: crosses $50
    assert (crossing["quota"], crossing["rate"], crossing["rate_rule"]) == (
        9_000, "0.9", "spend>=$50 x0.9")
    after = record(env, call(env, tok["key"], 10_000))
    assert (after["quota"], after["rate"]) == (9_000, "0.9")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        doc = env["db"].budgets.find_one({"_id": month})
        if doc["used_quota"] == before + 5_000 + 9_000 + 9_000:
            break
        time.sleep(0.1)
    assert doc["used_quota"] == before + 23_000
    groups = {g["name"]: g for g in api.get("/api/group/")["data"]}
    assert groups["volume"]["rate_now"] == 0.9


def test_group_api_validates_rules(env):
    admin = env["admin"]
    r = admin.post("/api/group/", {"name": "bad1", "input_tiers": [
        {"from": 50, "factor": 1}, {"from": 10, "factor": 1}]}, expect=400)
    assert "sorted" in r["message"]
    r = admin.put("/api/group/", {"name": "volume", "spend_tiers": [{"from": 10, "factor": 0}]},
                  expect=400)
    assert "above 0" in r["message"]
    r = admin.put("/api/group/", {"name": "volume", "spend_tiers": [
        {"from": i + 1, "factor": 1} for i in range(9)]}, expect=400)
    assert "at most 8" in r["message"]
    g = admin.put("/api/group/", {"name": "longtext", "input_tiers": [
        {"from": 1000, "factor": 0.5}]})["data"]
    assert g["input_tiers"] == [{"from": 1000, "factor": 0.5}]
    admin.put("/api/group/", {"name": "longtext", "input_tiers": VVIP})


def test_the_seed_describes_five_groups(env):
    groups = {g["name"]: g for g in env["admin"].get("/api/group/")["data"]}
    assert groups["default"]["rate"] == 1 and not groups["default"]["input_tiers"]
    assert groups["origin"]["rate"] == 1 and not groups["origin"]["spend_tiers"]
    assert groups["svip"]["rate"] == 0.8        # the cheapest
    assert groups["vvip"]["input_tiers"] == [{"from": 32000, "factor": 0.6}]
    assert groups["vip"]["spend_tiers"] == [{"from": 50, "factor": 0.9},
                                            {"from": 200, "factor": 0.8}]
    assert all(g["rate_now"] <= 1 for g in groups.values() if g["name"] in
               ("default", "origin", "svip", "vvip", "vip"))
