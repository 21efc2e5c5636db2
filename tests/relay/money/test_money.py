"""Shortfall is recorded: a call that costs more than the balance holds is
charged what is there, and its record says cost, quota (charged) and
unpaid; the log's totals and CSV export show them.  An account's credit
limit lets it go a bounded way below zero; used_quota stays the sum of the
records' quota either way."""
import csv
import io

import pytest
import requests

from tests.helpers import USER_PASSWORD, Api, eventually

MODEL = "gpt-4o"


@pytest.fixture(scope="module")
def w(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=2.5, output_price=10)
    return {"admin": admin, "url": relay.url}


def _call(w, key, prompt=12000, completion=3500):
    r = requests.post(w["url"] + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 10, "messages": [
                          {"role": "user", "content": "hi"}],
                          "fake_usage": {"prompt_tokens": prompt, "completion_tokens": completion}})
    return r


def _record(api, rid):
    def find():
        items = api.get("/api/log/self?size=100")["data"]["items"]
        hit = [i for i in items if i["request_id"] == rid]
        assert hit
        return hit[0]
    return eventually(find)


def test_a_key_whose_call_costs_more_than_it_holds(w):
    w["admin"].create_user("shorty", quota=10_000_000)
    api = Api.login(w["url"], "shorty", USER_PASSWORD)
    tok = api.create_token(name="small", remain_quota=6000)
    r = _call(w, tok["key"])          # costs 32,500 units
    assert r.status_code == 200
    rec = _record(api, r.headers["X-Request-Id"])
    assert (rec["cost"], rec["quota"], rec["unpaid"]) == (32500, 6000, 26500)
    t = api.get(f"/api/token/{tok['id']}")["data"]
    assert (t["remain_quota"], t["used_quota"]) == (0, 6000)
    me = api.get("/api/user/self")["data"]
    assert (me["quota"], me["used_quota"]) == (10_000_000 - 6000, 6000)
    # an exhausted key refuses the next call
    assert _call(w, tok["key"]).status_code == 403

    ok = _call(w, api.create_token(name="big", remain_quota=1_000_000)["key"])
    assert ok.status_code == 200
    _record(api, ok.headers["X-Request-Id"])
    want = {"requests": 2, "quota": 6000 + 32500, "cost": 65000, "unpaid": 26500,
            "prompt_tokens": 24000, "completion_tokens": 7000, "cached_tokens": 0,
            "cache_write_5m_tokens": 0, "cache_write_1h_tokens": 0, "cache_saved": 0,
            "cache_unread": 0}

    def totals_applied():
        # The totals are the rollups, applied by the flush that stored the
        # record a moment after the record itself.
        got = api.get("/api/log/self")["data"]["totals"]
        assert got == want
        return got
    totals = eventually(totals_applied)
    me = api.get("/api/user/self")["data"]
    assert me["used_quota"] == totals["quota"]
    # the admin's view and the CSV export say the same, with a total row
    uid = me["id"]
    assert w["admin"].get(f"/api/log/?user_id={uid}")["data"]["totals"] == totals
    text = w["admin"].s.get(w["url"] + f"/api/log/export?user_id={uid}").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["unpaid"] for r in rows[:-1]].count("26500") == 1
    assert rows[-1]["request_id"] == "TOTAL"
    assert (rows[-1]["quota"], rows[-1]["cost"], rows[-1]["unpaid"]) == ("38500", "65000", "26500")


def test_credit_limit_allows_a_bounded_negative_balance(w):
    user = w["admin"].create_user("credited", quota=10_000)
    api = Api.login(w["url"], "credited", USER_PASSWORD)
    tok = api.create_token(name="unl", unlimited_quota=True)
    r = _call(w, tok["key"])         # 32,500 > 10,000: without credit 22,500 unpaid
    rec = _record(api, r.headers["X-Request-Id"])
    assert (rec["quota"], rec["unpaid"]) == (10_000, 22_500)
    w["admin"].put("/api/user/", {"id": user["id"], "credit_limit": 50_000})
    assert w["admin"].get(f"/api/user/{user['id']}")["data"]["credit_limit"] == 50_000
    r = _call(w, tok["key"])
    rec = _record(api, r.headers["X-Request-Id"])
    assert (rec["quota"], rec["unpaid"]) == (32_500, 0)
    me = api.get("/api/user/self")["data"]
    assert (me["quota"], me["used_quota"]) == (-32_500, 42_500)
    # the limit binds: 17,500 more is all the account may spend
    r = _call(w, tok["key"])
    rec = _record(api, r.headers["X-Request-Id"])
    assert (rec["quota"], rec["unpaid"]) == (17_500, 15_000)
    me = api.get("/api/user/self")["data"]
    assert (me["quota"], me["used_quota"]) == (-50_000, 60_000)
    def totals_applied():
        assert api.get("/api/log/self")["data"]["totals"]["quota"] == me["used_quota"]
    eventually(totals_applied)
    assert _call(w, tok["key"]).status_code == 403
    w["admin"].put("/api/user/", {"id": user["id"], "credit_limit": -1}, expect=400)
