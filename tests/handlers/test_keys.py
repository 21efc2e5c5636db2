"""Keys: fields, storage at rest, allow-list with CIDR, model lock, and cache
invalidation on the very next request (also across processes)."""
import time

import pytest
import requests
from pymongo import MongoClient

from tests.helpers import Api, RelayProcess

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def w(relay, admin, fake, mongo_url):
    admin.create_channel(fake.url, [MODEL, "other-model"], groups=["default", "vip"])
    admin.set_price(MODEL, input_price=1, output_price=1)
    admin.set_price("other-model", input_price=1, output_price=1)
    admin.create_user("gina", quota=100_000_000)
    api = Api.login(relay.url, "gina", "Blue-Kettle-Harbor-42")
    return {"admin": admin, "api": api, "url": relay.url,
            "db": MongoClient(mongo_url)[relay.db_name], "relay": relay}


def chat(w, key, model=MODEL):
    return requests.post(w["url"] + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                         json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_token_fields(w):
    t = w["api"].create_token(name="fields", remain_quota=1234, expired_time=-1,
                              allow_ips="127.0.0.1\n10.0.0.0/8", model_limits_enabled=True,
                              model_limits=[MODEL], billing_mode="per_call")
    assert t["key"].startswith("sk-") and len(t["key"]) == 51
    for f in ("id", "name", "key", "status", "remain_quota", "used_quota", "unlimited_quota",
              "expired_time", "group", "allow_ips", "model_limits_enabled", "model_limits",
              "billing_mode", "created_time", "accessed_time"):
        assert f in t
    assert (t["status"], t["remain_quota"], t["group"], t["model_limits"]) == (1, 1234, "default", MODEL)
    listed = w["api"].get("/api/token/?p=1&size=50")["data"]
    row = next(i for i in listed["items"] if i["id"] == t["id"])
    assert "*" in row["key"] and row["key"] != t["key"]  # masked in lists
    assert w["api"].get(f"/api/token/{t['id']}")["data"]["key"] == t["key"]  # shown to the owner
    found = w["api"].get("/api/token/search?keyword=fiel")["data"]["items"]
    assert [i["id"] for i in found] == [t["id"]]
    found = w["api"].get(f"/api/token/search?keyword={t['key']}")["data"]["items"]
    assert [i["id"] for i in found] == [t["id"]]


def test_keys_are_not_readable_in_a_database_dump(w):
    t = w["api"].create_token(name="secret", remain_quota=1)
    dump = str(list(w["db"].tokens.find({})))
    assert t["key"] not in dump and t["key"][3:] not in dump and t["key"][-12:] not in dump
    ch = w["admin"].create_channel("http://127.0.0.1:9", ["x"], key="sk-upstream-secret-value")
    assert "sk-upstream-secret-value" not in str(list(w["db"].channels.find({})))
    assert ch["key"] != "sk-upstream-secret-value" and "*" in ch["key"]
    got = w["admin"].get(f"/api/channel/{ch['id']}")["data"]
    assert "upstream-secret" not in got["key"]


def test_other_users_cannot_see_or_change_my_keys(w):
    t = w["api"].create_token(name="mine", remain_quota=1)
    w["admin"].create_user("harry")
    other = Api.login(w["url"], "harry", "Blue-Kettle-Harbor-42")
    other.get(f"/api/token/{t['id']}", expect=404)
    other.put("/api/token/", {"id": t["id"], "name": "stolen"}, expect=404)
    other.delete(f"/api/token/{t['id']}", expect=404)
    assert all(i["id"] != t["id"] for i in other.get("/api/token/")["data"]["items"])


def test_validation_errors(w):
    api = w["api"]
    assert "not an IP" in api.post("/api/token/", {"name": "x", "allow_ips": "10.0.0.300"},
                                   expect=400)["message"]
    api.post("/api/token/", {"name": "x", "group": "nope"}, expect=400)
    api.post("/api/token/", {"name": "x", "billing_mode": "free"}, expect=400)
    api.post("/api/token/", {"name": "x", "remain_quota": -5}, expect=400)
    api.post("/api/token/", {"name": "x", "expired_time": 1000}, expect=400)
    api.post("/api/token/", {"name": "x", "remain_quota": 1.5}, expect=400)
    r = requests.post(w["url"] + "/api/token/", data="{bad", headers=api.s.headers)
    assert r.status_code == 400 and r.json()["success"] is False


def test_allow_list_with_cidr(w):
    t = w["api"].create_token(name="cidr", remain_quota=1_000_000, allow_ips="10.1.0.0/16")
    assert chat(w, t["key"]).status_code == 403
    w["api"].put("/api/token/", {"id": t["id"], "allow_ips": "192.168.0.0/24,127.0.0.0/8"})
    assert chat(w, t["key"]).status_code == 200  # the very next request
    w["api"].put("/api/token/", {"id": t["id"], "allow_ips": "::1, 127.0.0.1/32"})
    assert chat(w, t["key"]).status_code == 200
    w["api"].put("/api/token/", {"id": t["id"], "allow_ips": "127.0.0.2"})
    assert chat(w, t["key"]).status_code == 403


def test_model_lock(w):
    t = w["api"].create_token(name="lock", remain_quota=1_000_000, model_limits_enabled=True,
                              model_limits="other-model")
    assert chat(w, t["key"]).status_code == 403
    assert chat(w, t["key"], "other-model").status_code == 200
    models = requests.get(w["url"] + "/v1/models",
                          headers={"Authorization": f"Bearer {t['key']}"}).json()
    assert [m["id"] for m in models["data"]] == ["other-model"]
    w["api"].put("/api/token/", {"id": t["id"], "model_limits_enabled": False})
    assert chat(w, t["key"]).status_code == 200


def test_every_key_change_applies_to_the_very_next_request(w):
    api, admin = w["api"], w["admin"]
    t = api.create_token(name="cache", remain_quota=1_000_000)
    assert chat(w, t["key"]).status_code == 200  # now cached
    api.put("/api/token/?status_only=true", {"id": t["id"], "status": 2})
    assert chat(w, t["key"]).status_code == 401
    api.put("/api/token/?status_only=true", {"id": t["id"], "status": 1})
    assert chat(w, t["key"]).status_code == 200
    api.put("/api/token/", {"id": t["id"], "remain_quota": 0})
    assert chat(w, t["key"]).status_code == 403
    api.put("/api/token/", {"id": t["id"], "unlimited_quota": True})
    assert chat(w, t["key"]).status_code == 200
    admin.post("/api/group/", {"name": "g2", "rate": 1})
    admin.put("/api/user/", {"id": api.get("/api/user/self")["data"]["id"],
                             "usable_groups": ["g2"]})
    api.put("/api/token/", {"id": t["id"], "group": "g2"})
    r = chat(w, t["key"])  # no channel of g2 lists the model (8825c88: 404, not 503)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    api.put("/api/token/", {"id": t["id"], "group": "default"})
    assert chat(w, t["key"]).status_code == 200
    me = api.get("/api/user/self")["data"]
    admin.post("/api/user/manage", {"id": me["id"], "action": "disable"})
    assert chat(w, t["key"]).status_code == 401
    admin.post("/api/user/manage", {"id": me["id"], "action": "enable"})
    assert chat(w, t["key"]).status_code == 200
    api.delete(f"/api/token/{t['id']}")
    assert chat(w, t["key"]).status_code == 401


def test_changes_reach_another_relay_process(w, tmp_path):
    """A second process sharing the database sees a disabled key within its
    invalidation poll (half a second by default)."""
    other = RelayProcess(w["relay"].mongo_url, str(tmp_path), db_name=w["relay"].db_name).start()
    try:
        t = w["api"].create_token(name="shared", remain_quota=1_000_000)
        r = requests.post(other.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {t['key']}"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200
        w["api"].put("/api/token/?status_only=true", {"id": t["id"], "status": 2})
        time.sleep(1.5)
        r = requests.post(other.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {t['key']}"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401
    finally:
        other.stop()


def test_accessed_time_is_recorded(w):
    t = w["api"].create_token(name="accessed", remain_quota=1_000_000)
    assert t["accessed_time"] == 0
    before = int(time.time())
    assert chat(w, t["key"]).status_code == 200
    for _ in range(30):
        got = w["api"].get(f"/api/token/{t['id']}")["data"]["accessed_time"]
        if got:
            break
        time.sleep(0.1)
    assert got >= before
