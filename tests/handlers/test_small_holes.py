"""The smaller holes of issue 31 (items 7 and 8), each tried as an attacker
would over real sockets: a sign-in posted by a form on another site, a
client's own X-Forwarded-For behind a proxy that sets X-Real-IP, an
administrator debiting root, webhooks to private IPv4 inside IPv6, records
that grow forever, wrong JSON types, and the Secure cookie behind a proxy
on the same host."""
from __future__ import annotations

import asyncio
import json
import time
import types
import uuid

import pytest
import requests
from pymongo import AsyncMongoClient, MongoClient

from models import housekeeping
from notify.subscriptions import EVENT_TYPES
from tests.helpers import USER_PASSWORD, Api, RelayProcess

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    """Default settings but the SSRF guard on (the suite's relays allow private webhooks)."""
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("holes")),
                     env={"RELAY_ALLOW_PRIVATE_WEBHOOKS": "false"}).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def admin(relay, fake) -> Api:
    a = Api.login(relay.url)
    a.create_channel(fake.url, [MODEL], name="c")
    a.set_price(MODEL, input_price=1, output_price=2)
    return a


def someone(admin, relay) -> tuple[str, Api]:
    name = "h" + uuid.uuid4().hex[:8]
    admin.create_user(name, quota=10_000_000)
    return name, Api.login(relay.url, name, USER_PASSWORD)


# ---- 7: JSON only, with a JSON content type --------------------------------------
@pytest.mark.parametrize("path", ["/api/user/login", "/api/user/register"])
def test_sign_in_and_register_take_json_only_as_json(relay, admin, path):
    name, _ = someone(admin, relay)
    body = json.dumps({"username": name if "login" in path else "n" + uuid.uuid4().hex[:8],
                       "password": USER_PASSWORD})
    # What <form enctype="text/plain"> on another site can post without a preflight.
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = requests.post(relay.url + path, data=body, headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["message"], ctype
        assert "Set-Cookie" not in r.headers
    r = requests.post(relay.url + path, data=body,
                      headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


# ---- 7: the client's own X-Forwarded-For never wins --------------------------------
def test_x_real_ip_from_the_proxy_beats_the_clients_own_forwarded_for(relay, admin):
    """nginx with `proxy_set_header X-Real-IP $remote_addr` passes the
    client's X-Forwarded-For on as the client wrote it."""
    _, api = someone(admin, relay)
    key = api.create_token(name="ip", remain_quota=1_000_000, allow_ips="203.0.113.7")["key"]

    def chat(**headers):
        return requests.post(relay.url + "/v1/chat/completions",
                             headers={"Authorization": f"Bearer {key}", **headers},
                             json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    r = chat(**{"X-Real-IP": "198.51.100.9", "X-Forwarded-For": "203.0.113.7"})
    assert r.status_code == 403 and "198.51.100.9" in r.json()["error"]["message"]
    assert chat(**{"X-Real-IP": "203.0.113.7", "X-Forwarded-For": "198.51.100.9"}).status_code == 200
    # Without X-Real-IP, X-Forwarded-For is read from the right, as before.
    assert chat(**{"X-Forwarded-For": "198.51.100.9, 203.0.113.7"}).status_code == 200
    assert chat(**{"X-Forwarded-For": "203.0.113.7, 198.51.100.9"}).status_code == 403


# ---- 7: ranks for money -----------------------------------------------------------------
def test_an_administrator_cannot_adjust_root_or_a_peer(relay, admin):
    names = []
    for _ in range(2):
        name, _ = someone(admin, relay)
        uid = admin.get(f"/api/user/?keyword={name}")["data"]["items"][0]["id"]
        admin.post("/api/user/manage", {"id": uid, "action": "promote"})
        names.append((name, uid))
    sub = Api.login(relay.url, names[0][0], USER_PASSWORD)
    root_id = admin.get("/api/user/self")["data"]["id"]
    for target in (root_id, names[1][1]):
        for amount in (-1, 1):
            r = sub.post(f"/api/user/{target}/quota", {"amount": amount, "reason": "x"},
                         expect=403)
            assert "rank" in r["message"]
    plain, _ = someone(admin, relay)
    plain_id = admin.get(f"/api/user/?keyword={plain}")["data"]["items"][0]["id"]
    assert sub.post(f"/api/user/{plain_id}/quota", {"amount": 5, "reason": "x"})["success"]


# ---- 7: the SSRF guard ---------------------------------------------------------------------
@pytest.mark.parametrize("host", ["[64:ff9b::7f00:1]", "[64:ff9b::a00:1]", "[2002:7f00:1::]",
                                  "[::127.0.0.1]", "[::ffff:127.0.0.1]", "[fec0::1]",
                                  "[64:ff9b:1::808:808]"])
def test_webhooks_to_private_ipv4_inside_ipv6_are_refused(relay, admin, host):
    _, api = someone(admin, relay)
    r = api.post("/api/subscription/", {
        "name": "w", "event_types": ["announcement"], "channel_type": "webhook",
        "channel_config": {"url": f"http://{host}:9/hook"}}, expect=400)
    assert "private or loopback" in r["message"]


# ---- 7: wrong JSON types are 400s, not 500s ---------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("channel_type", ["email"]), ("channel_type", {"a": 1}), ("channel_type", 5),
    ("event_types", [["announcement"]]), ("event_types", [{"a": 1}]), ("event_types", "x"),
    ("key_ids", ["1"]), ("key_ids", 3), ("channel_config", ["x"]), ("name", ["x"] * 100),
    ("user_threshold", [1]), ("enabled", {"x": 1})])
def test_subscription_fields_of_the_wrong_type(relay, admin, field, value):
    _, api = someone(admin, relay)
    body = {"name": "w", "event_types": ["announcement"], "channel_type": "telegram",
            "channel_config": {"bot_token": "1:A", "chat_id": "1"}, field: value}
    r = api.s.post(relay.url + "/api/subscription/", json=body)
    assert r.status_code in (200, 400), (field, value, r.status_code, r.text)
    r = api.s.post(relay.url + "/api/subscription/preview", json=body)
    assert r.status_code in (200, 400), (field, value, r.status_code, r.text)


# ---- 7: records that grew forever ------------------------------------------------------------
def test_invalidations_login_failures_and_allowances_are_pruned(mongo_url):
    name = "prune_" + uuid.uuid4().hex[:8]
    sync = MongoClient(mongo_url)[name]
    now = time.time()
    sync.invalidations.insert_many([{"kind": "token", "ident": i, "ts": now - 3600 - i,
                                     "origin": "x"} for i in range(2500)]
                                   + [{"kind": "user", "ident": 1, "ts": now, "origin": "x"}])
    sync.login_failures.insert_many([{"_id": f"name:g{i}", "n": 1, "last": now - 7200,
                                      "until": now - 7200, "v": 1} for i in range(1200)]
                                    + [{"_id": "acct:1", "n": 3, "last": now, "until": now}])
    sync.allowances.insert_many([{"_id": f"test-send:{i}#0", "until": now - 4000}
                                 for i in range(10)] + [{"_id": "test-send:x#0", "until": now}])

    async def ticks():
        client = AsyncMongoClient(mongo_url)
        store = types.SimpleNamespace(db=client[name])
        try:
            return [await housekeeping.prune_once(store, now) for _ in range(4)]
        finally:
            await client.close()
    done = asyncio.run(ticks())
    # At most BATCH a collection a tick: the backlog goes over several.
    assert housekeeping.BATCH == 2000
    assert done[0] == {"invalidations": 2000, "login_failures": 1200, "allowances": 10}
    assert done[1] == {"invalidations": 500} and done[2] == done[3] == {}
    assert sync.invalidations.count_documents({}) == 1
    assert [d["_id"] for d in sync.login_failures.find({})] == ["acct:1"]
    assert [d["_id"] for d in sync.allowances.find({})] == ["test-send:x#0"]
    MongoClient(mongo_url).drop_database(name)


# ---- 8: a proxy on the same host is trusted as it comes ----------------------------------------
def test_cookies_behind_a_proxy_on_the_same_host_are_secure(relay, admin, mongo_url, tmp_path):
    name, _ = someone(admin, relay)
    r = requests.post(relay.url + "/api/user/login", headers={"X-Forwarded-Proto": "https"},
                      json={"username": name, "password": USER_PASSWORD})
    assert r.status_code == 200
    assert "; secure" in r.headers["Set-Cookie"].lower()
    r = requests.post(relay.url + "/api/user/login",
                      json={"username": name, "password": USER_PASSWORD})
    assert "; secure" not in r.headers["Set-Cookie"].lower()
    # Trusting nobody: the header is the client's word, and ignored.
    p = RelayProcess(mongo_url, str(tmp_path / "none"),
                     env={"RELAY_TRUSTED_PROXIES": "none"}).start()
    try:
        Api.login(p.url).create_user("plain")
        r = requests.post(p.url + "/api/user/login", headers={"X-Forwarded-Proto": "https"},
                          json={"username": "plain", "password": USER_PASSWORD})
        assert r.status_code == 200 and "; secure" not in r.headers["Set-Cookie"].lower()
    finally:
        p.stop()


@pytest.mark.parametrize("field,value,needle", [
    ("key_ids", list(range(1, 1002)), "at most 1000 keys"),
    # Twice the known types at most (read from EVENT_TYPES, whatever their number).
    ("event_types", ["announcement"] * (2 * len(EVENT_TYPES) + 1), "event_types"),
    ("channel_config", {"url": "http://8.8.8.8/x", "headers": {f"X-{i}": "v" for i in range(51)}},
     "at most 50 entries")])
def test_subscription_lists_are_bounded(relay, admin, field, value, needle):
    _, api = someone(admin, relay)
    body = {"name": "w", "event_types": ["announcement"], "channel_type": "webhook",
            "channel_config": {"url": "http://8.8.8.8/x"}, field: value}
    r = api.post("/api/subscription/", body, expect=400)
    assert needle in r["message"]
