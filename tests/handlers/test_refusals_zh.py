"""Refusals as a Chinese user meets them, over real sockets: each names a
stable code and its variable parts in `data` (the message stays English),
and the console's zh-CN table words it in Chinese with every placeholder
filled (console/strings.translator fills them as ui/static/js/i18n.js
does).  The sample: a bad field, a key cap, an allow-list too long and one
with a wrong entry, a budget's time zone and limit, a notification
setting, a wrong and a weak password, a broken body, and the /api rate
limit (429) last."""
from __future__ import annotations

import re
import uuid

import pytest
import requests

from console import strings
from models import netlist
from models.records import MAX_QUOTA
from tests.helpers import USER_PASSWORD, Api, RelayProcess

RATE = 40     # /api units a minute for a user
KEYS = 2      # keys an account may have
ZH = {"Accept-Language": "zh-CN,zh;q=0.9"}
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("zh")),
                     env={"RELAY_API_RATE_LIMIT": str(RATE),
                          "RELAY_MAX_KEYS_PER_USER": str(KEYS)}).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def admin(relay) -> Api:
    return Api.login(relay.url)


def chinese_user(admin: Api, relay) -> Api:
    """A new account that speaks zh-CN (its own choice), signed in."""
    name = "zh" + uuid.uuid4().hex[:8]
    admin.post("/api/user/", {"username": name, "password": USER_PASSWORD, "language": "zh-CN"})
    api = Api.login(relay.url, name, USER_PASSWORD)
    api.s.headers.update(ZH)
    assert api.get("/api/user/self")["data"]["language"] == "zh-CN"
    return api


def refused(r, status: int, code: str, **values) -> dict:
    """The refusal's data, checked: status, code, values; and its Chinese words."""
    doc = r.json() if isinstance(r, requests.Response) else r
    if isinstance(r, requests.Response):
        assert r.status_code == status, r.text
    assert doc["success"] is False
    data = doc["data"]
    assert data["code"] == code, doc
    for k, v in values.items():
        assert data[k] == v, (k, doc)
    assert doc["message"] and not CJK.search(doc["message"])  # API clients read English
    words = strings.translator("zh-CN")(f"err.{code}", **data)
    assert words != f"err.{code}" and CJK.search(words), words
    assert not re.search(r"\{\w+\}", words), f"a placeholder left unfilled: {words}"
    return data


def test_a_field_over_its_bound(relay, admin):
    api = chinese_user(admin, relay)
    refused(api.post("/api/token/", {"name": "n" * 65}, expect=None), 400, "field_too_long",
            field="name", max=64)
    # Past what is read at all (relay/serving/values.py: the same family).
    refused(api.post("/api/token/", {"name": "n" * 1001}, expect=None), 400, "field_too_long",
            field="name", max=1000)
    refused(api.post("/api/token/", {"remain_quota": "lots"}, expect=None), 400,
            "field_not_whole", field="remain_quota")
    refused(api.post("/api/token/", {"remain_quota": MAX_QUOTA + 1}, expect=None), 400,
            "field_range", field="remain_quota", min=0, max=MAX_QUOTA)
    refused(api.post("/api/token/", {"group": "nope"}, expect=None), 400, "no_group",
            group="nope")
    refused(api.s.post(relay.url + "/api/token/", data=b"{nope",
                       headers={"Content-Type": "application/json"}), 400, "body_invalid")
    refused(api.s.patch(relay.url + "/api/token/"), 405, "method_not_allowed")


def test_allow_lists_too_long_or_wrong(relay, admin):
    api = chinese_user(admin, relay)
    many = [f"10.0.{i // 250}.{i % 250}" for i in range(netlist.MAX_ENTRIES + 1)]
    refused(api.post("/api/token/", {"allow_ips": many}, expect=None), 400,
            "allow_ips_entries", max=netlist.MAX_ENTRIES, given=netlist.MAX_ENTRIES + 1)
    refused(api.post("/api/token/", {"allow_ips": "x" * (netlist.MAX_TEXT + 1)}, expect=None),
            400, "allow_ips_text", max_kb=netlist.MAX_TEXT // 1024)
    refused(api.post("/api/token/", {"allow_ips": "10.0.0.1\n300.1.2.3"}, expect=None), 400,
            "allow_ips_entry", entry="300.1.2.3")
    # Every other address: none merge, so past MAX_NETWORKS once collapsed.
    apart = [f"10.1.{i // 128}.{(i % 128) * 2}" for i in range(netlist.MAX_NETWORKS + 1)]
    refused(api.post("/api/token/", {"allow_ips": apart}, expect=None), 400,
            "allow_ips_networks", networks=netlist.MAX_NETWORKS + 1, max=netlist.MAX_NETWORKS)


def test_the_key_cap(relay, admin):
    api = chinese_user(admin, relay)
    for i in range(KEYS):
        api.create_token(name=f"k{i}")
    refused(api.post("/api/token/", {"name": "one more"}, expect=None), 409, "key_cap",
            max=KEYS)


def test_budgets_and_their_time_zone(relay, admin):
    api = chinese_user(admin, relay)
    refused(api.put("/api/user/self", {"timezone": "Mars/Olympus"}, expect=None), 400,
            "timezone", value="Mars/Olympus")
    refused(api.put("/api/user/self", {"budgets": {"fortnight": 5}}, expect=None), 400,
            "budget_period", period="fortnight")
    refused(api.put("/api/user/self", {"budgets": {"day": -1}}, expect=None), 400,
            "budget_value", period="day", max=10 ** 15)


def test_a_notification_setting(relay, admin):
    api = chinese_user(admin, relay)
    refused(api.post("/api/subscription/", {"channel_type": "email", "event_types": []},
                     expect=None), 400, "event_types")
    refused(api.post("/api/subscription/", {"channel_type": "pigeon",
                                            "event_types": ["announcement"]}, expect=None),
            400, "field_choice", field="channel_type")
    refused(api.post("/api/subscription/", {"channel_type": "email", "user_threshold": -5,
                                            "event_types": ["user_quota_warning"]},
                     expect=None), 400, "field_units", field="user_threshold")
    # A channel's own check names its refusal too (notify/channels).
    refused(api.post("/api/subscription/", {"channel_type": "group_bot",
                                            "channel_config": {"vendor": "dingtalk"},
                                            "event_types": ["announcement"]}, expect=None),
            400, "field_required", field="webhook_url")
    refused(api.post("/api/subscription/", {"channel_type": "webhook",
                                            "channel_config": {"url": "ftp://x"},
                                            "event_types": ["announcement"]}, expect=None),
            400, "field_url", field="url")
    # A template's error is English from jinja: its kind is named, the text is the detail.
    data = refused(api.post("/api/subscription/", {
        "channel_type": "webhook", "event_types": ["announcement"],
        "channel_config": {"url": "http://127.0.0.1:9/", "body_template": "{{ nope("}},
        expect=None), 400, "subscription_invalid")
    assert "template" in data["detail"]


def test_wrong_and_weak_passwords(relay, admin):
    api = chinese_user(admin, relay)
    refused(api.put("/api/user/self", {"original_password": "not it", "password": "x"},
                    expect=None), 403, "wrong_password")
    refused(api.put("/api/user/self", {"original_password": USER_PASSWORD, "password": "short"},
                    expect=None), 400, "password_short", min=8)
    refused(api.put("/api/user/self", {"original_password": USER_PASSWORD,
                                       "password": "password123"}, expect=None),
            400, "password_weak")
    r = requests.post(relay.url + "/api/user/login", headers=ZH,
                      json={"username": "nobody-" + uuid.uuid4().hex[:6], "password": "wrong"})
    refused(r, 401, "wrong_credentials")


def test_the_api_rate_limit(relay, admin):
    api = chinese_user(admin, relay)
    for _ in range(RATE + 10):
        r = api.s.get(relay.url + "/api/user/self")
        if r.status_code == 429:
            break
    data = refused(r, 429, "rate_limited", per_minute=RATE)
    assert data["wait"] == data["retry_after"] == int(r.headers["Retry-After"]) >= 1
