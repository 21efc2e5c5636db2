"""Budgets by period and the account's time zone on /api: the bounds of
every field a client controls, the bars' figures on /api/token/ and
/api/user/self, and an administrator's lowering of a spent limit."""
from __future__ import annotations

import uuid

import pytest
import requests

from tests.helpers import USER_PASSWORD, Api, eventually

MODEL = "budget-api-model"


@pytest.fixture(scope="module")
def env(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL], name="budget-api")
    admin.set_price(MODEL, call_price=0.001)      # 500 units a call
    name = "ba" + uuid.uuid4().hex[:8]
    user = admin.create_user(name, quota=10 ** 9)
    api = Api.login(relay.url, name, USER_PASSWORD)
    return {"admin": admin, "api": api, "user": user, "url": relay.url}


def call(env, key):
    return requests.post(env["url"] + "/v1/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("budgets,message", [
    ({"hour": 5}, "unknown period"),
    ({"day": -1}, "whole number"),
    ({"day": 1.5}, "whole number"),
    ({"day": "5"}, "whole number"),
    ({"day": True}, "whole number"),
    ({"day": 10 ** 15 + 1}, "whole number"),
    ([5], "object"),
])
def test_bad_budgets_are_refused(env, budgets, message):
    r = env["api"].post("/api/token/", {"name": "b", "budgets": budgets}, expect=400)
    assert message in r["message"]
    r = env["api"].put("/api/user/self", {"budgets": budgets}, expect=400)
    assert message in r["message"]


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "x" * 65, 5, None, "../../etc/passwd"])
def test_unknown_time_zones_are_refused(env, tz):
    r = env["api"].put("/api/user/self", {"timezone": tz}, expect=400)
    assert "IANA" in r["message"]
    env["admin"].put("/api/user/", {"id": env["user"]["id"], "timezone": tz}, expect=400)


def test_budgets_at_their_bounds_and_their_bars(env):
    api = env["api"]
    me = api.put("/api/user/self", {"timezone": "Asia/Shanghai",
                                    "budgets": {"day": 10 ** 15, "week": 0}})["data"]
    assert me["timezone"] == "Asia/Shanghai" and me["budgets"] == {"day": 10 ** 15}
    assert me["budget_use"][0]["period"] == "day" and me["budget_use"][0]["used"] == 0
    tok = api.create_token(name="bars", remain_quota=10 ** 9, budgets={"day": 1000, "month": 0})
    assert tok["budgets"] == {"day": 1000} and tok["budget_use"][0]["limit"] == 1000
    assert call(env, tok["key"]).status_code == 200
    assert call(env, tok["key"]).status_code == 200
    r = call(env, tok["key"])
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
    assert int(r.headers["Retry-After"]) >= 1

    def bar():
        listed = {k["id"]: k for k in api.get("/api/token/?size=100")["data"]["items"]}
        assert listed[tok["id"]]["budget_use"][0]["used"] == 1000
    eventually(bar, timeout=10)
    me = api.get("/api/user/self")["data"]
    assert me["budget_use"][0]["used"] == 1000    # the account's day counts the key's calls
    # Raising the limit lets the key go on at once, on the period's counter.
    api.put("/api/token/", {"id": tok["id"], "budgets": {"day": 1500}})
    assert call(env, tok["key"]).status_code == 200
    assert call(env, tok["key"]).status_code == 429
    # Lowering it below what is used: refused until the next day, used kept.
    got = api.put("/api/token/", {"id": tok["id"], "budgets": {"day": 500}})["data"]
    assert got["budget_use"][0]["limit"] == 500
    assert call(env, tok["key"]).status_code == 429
    api.put("/api/user/self", {"budgets": {}})


def test_openapi_describes_budgets_and_rate_tiers(env):
    spec = requests.get(env["url"] + "/api/openapi.json", timeout=10).json()
    token_put = spec["paths"]["/api/token/"]["put"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert "budgets" in token_put
    self_put = spec["paths"]["/api/user/self"]["put"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert {"budgets", "timezone"} <= set(self_put)
    group_post = spec["paths"]["/api/group/"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert {"input_tiers", "spend_tiers"} <= set(group_post)
