"""The management API: envelope, sign-in, CSRF, roles, groups, prices,
channels, users and redemption codes."""
import requests
from pymongo import MongoClient

from models.secrets import mask
from tests.helpers import USER_PASSWORD, Api


def envelope(r):
    body = r.json()
    assert set(body) == {"success", "message", "data"}
    return body


def test_login_by_name_or_email_and_session_cookie(relay, admin):
    admin.create_user("ivy", email="Ivy@Example.test")
    s = requests.Session()
    r = s.post(relay.url + "/api/user/login", json={"username": "ivy@example.test",
                                                    "password": "Blue-Kettle-Harbor-42"})
    body = envelope(r)
    assert r.status_code == 200 and body["success"] and body["data"]["username"] == "ivy"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    me = envelope(s.get(relay.url + "/api/user/self"))["data"]
    for f in ("quota", "used_quota", "group"):
        assert f in me
    assert "password_hash" not in me


def test_wrong_password_and_rate_limit(relay, admin):
    admin.create_user("jack")
    for _ in range(5):
        r = requests.post(relay.url + "/api/user/login", json={"username": "jack", "password": "nope-nope"})
        assert r.status_code == 401 and envelope(r)["success"] is False
    r = requests.post(relay.url + "/api/user/login", json={"username": "jack", "password": "Blue-Kettle-Harbor-42"})
    assert r.status_code == 429


def test_csrf_required_for_cookie_writes(relay, admin):
    admin.create_user("kate")
    s = requests.Session()
    csrf = s.post(relay.url + "/api/user/login",
                  json={"username": "kate", "password": "Blue-Kettle-Harbor-42"}).json()["data"]["csrf_token"]
    r = s.post(relay.url + "/api/token/", json={"name": "x"})
    assert r.status_code == 403 and "CSRF" in envelope(r)["message"]
    r = s.post(relay.url + "/api/token/", json={"name": "x"}, headers={"X-CSRF-Token": "wrong"})
    assert r.status_code == 403
    r = s.post(relay.url + "/api/token/", json={"name": "x"}, headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200 and envelope(r)["success"]


def test_access_token_acts_as_user(relay, admin):
    admin.create_user("liam")
    api = Api.login(relay.url, "liam", "Blue-Kettle-Harbor-42")
    assert api.get("/api/user/self")["data"]["username"] == "liam"
    r = requests.get(relay.url + "/api/user/self", headers={"Authorization": "Bearer at-wrong"})
    assert r.status_code == 401


def test_roles(relay, admin):
    admin.create_user("mia")
    api = Api.login(relay.url, "mia", "Blue-Kettle-Harbor-42")
    for path in ("/api/user/", "/api/channel/", "/api/redemption/", "/api/option/", "/api/log/"):
        api.get(path, expect=403)
        r = requests.get(relay.url + path)
        assert r.status_code == 401 and envelope(r)["success"] is False
    api.post("/api/group/", {"name": "mine", "rate": 0}, expect=403)
    api.post("/api/price/", {"model": "m", "input_price": 0}, expect=403)


def test_seeded_groups(admin):
    groups = {g["name"]: g for g in admin.get("/api/group/")["data"]}
    assert {"default", "origin", "vip", "svip", "vvip"} <= set(groups)
    assert groups["default"]["rate"] == 1 and groups["origin"]["rate"] == 1
    assert all(g["description"] for g in groups.values())


def test_group_crud_and_validation(admin):
    g = admin.post("/api/group/", {"name": "team", "rate": "1.25", "description": "d"})["data"]
    assert g["rate"] == 1.25
    admin.post("/api/group/", {"name": "team", "rate": 1}, expect=409)
    admin.post("/api/group/", {"name": "bad", "rate": -1}, expect=400)
    admin.post("/api/group/", {"name": "bad", "rate": "lots"}, expect=400)
    assert admin.put("/api/group/", {"name": "team", "enabled": False})["data"]["enabled"] is False
    admin.put("/api/group/", {"name": "ghost", "rate": 1}, expect=404)
    admin.delete("/api/group/team")
    admin.delete("/api/group/team", expect=404)


def test_prices_base_and_per_group(admin):
    admin.set_price("m1", input_price=0.15, output_price=0.6, cache_price=0.075)
    admin.set_price("m1", input_price=0.1, group="vip")
    prices = [p for p in admin.get("/api/price/")["data"] if p["model"] == "m1"]
    assert {(p["group"], p["input_price"]) for p in prices} == {("", 0.15), ("vip", 0.1)}
    admin.post("/api/price/", {"model": " m1", "input_price": 1}, expect=400)
    admin.post("/api/price/", {"model": "m2", "input_price": "x"}, expect=400)
    admin.post("/api/price/", {"model": "m2", "input_price": 1, "group": "nope"}, expect=400)
    admin.delete("/api/price/?model=m1&group=vip")
    admin.delete("/api/price/?model=m1&group=vip", expect=404)


def test_channel_crud(admin):
    ch = admin.create_channel("https://api.example.test/v1/", ["a", "b"], groups=["default", "vip"],
                              key="sk-abcdefghijklmnop", priority=3, weight=2,
                              model_mapping={"a": "a-2024"})
    assert ch["base_url"] == "https://api.example.test/v1" and ch["key"] == "sk-a********mnop"
    upd = admin.put("/api/channel/", {"id": ch["id"], "key": ch["key"], "enabled": False})["data"]
    assert upd["key"] == ch["key"] and upd["enabled"] is False  # masked key leaves it unchanged
    admin.post("/api/channel/", {"name": "x", "type": "nope", "base_url": "http://a", "key": "k",
                                 "models": ["m"]}, expect=400)
    admin.post("/api/channel/", {"name": "x", "type": "openai", "base_url": "ftp://a", "key": "k",
                                 "models": ["m"]}, expect=400)
    admin.post("/api/channel/", {"name": "x", "type": "openai", "base_url": "http://a",
                                 "key": "k"}, expect=400)
    admin.put("/api/channel/", {"id": ch["id"], "model_mapping": "[1]"}, expect=400)
    listed = admin.get("/api/channel/")["data"]["items"]
    assert any(c["id"] == ch["id"] for c in listed)
    admin.delete(f"/api/channel/{ch['id']}")
    admin.get(f"/api/channel/{ch['id']}", expect=404)


def test_unknown_ids_get_a_404_naming_them(admin):
    """Every admin route that looks a channel or a user up by id answers an
    unknown one alike, over the real API."""
    missing = 987654321
    for method, path, body, what in [
            ("GET", f"/api/channel/{missing}", None, "channel"),
            ("POST", f"/api/channel/{missing}/test", {}, "channel"),
            ("GET", f"/api/user/{missing}", None, "user"),
            ("POST", f"/api/user/{missing}/quota", {"amount": 5, "reason": "r"}, "user"),
            ("POST", "/api/user/manage", {"id": missing, "action": "disable"}, "user")]:
        out = admin.call(method, path, expect=404, **({"json": body} if body is not None else {}))
        assert out["message"] == f"No {what} with id {missing}.", (path, out)


def test_users_admin(relay, admin):
    u = admin.create_user("noah", group="vip")
    assert u["group"] == "vip" and u["quota"] == 0
    admin.post("/api/user/", {"username": "noah", "password": "Blue-Kettle-Harbor-42"}, expect=409)
    admin.post("/api/user/", {"username": "x", "password": "short"}, expect=400)
    admin.post("/api/user/", {"username": "ok_name", "password": "Blue-Kettle-Harbor-42", "group": "nope"},
               expect=400)
    got = admin.get(f"/api/user/{u['id']}")["data"]
    assert got["username"] == "noah"
    assert any(i["id"] == u["id"] for i in admin.get("/api/user/?keyword=noa")["data"]["items"])
    admin.post(f"/api/user/{u['id']}/quota", {"amount": 1000, "reason": "gift"})
    admin.post(f"/api/user/{u['id']}/quota", {"amount": -400, "reason": "fix"})
    admin.post(f"/api/user/{u['id']}/quota", {"amount": -5000, "reason": "too much"}, expect=409)
    admin.post(f"/api/user/{u['id']}/quota", {"amount": 5}, expect=400)  # no reason
    assert admin.get(f"/api/user/{u['id']}")["data"]["quota"] == 600
    admin.delete(f"/api/user/{u['id']}")
    r = requests.post(relay.url + "/api/user/login", json={"username": "noah", "password": "Blue-Kettle-Harbor-42"})
    assert r.status_code == 403


def test_redemption_admin(admin):
    codes = admin.post("/api/redemption/", {"name": "batch", "quota": 500, "count": 3})["data"]
    assert len(set(codes)) == 3
    admin.post("/api/redemption/", {"name": "bad", "quota": 0, "count": 1}, expect=400)
    admin.post("/api/redemption/", {"name": "bad", "quota": 5, "count": 0}, expect=400)
    listed = admin.get("/api/redemption/?size=100")["data"]["items"]
    # Shown once: listed only as a hint.
    assert {c["key"] for c in listed} >= {mask(c, 4) for c in codes}
    assert not {c["key"] for c in listed} & set(codes)


def test_redemption_codes_are_stored_as_keyed_hashes(relay, admin, mongo_url):
    codes = admin.post("/api/redemption/", {"name": "hashed", "quota": 7, "count": 2})["data"]
    db = MongoClient(mongo_url)[relay.db_name]
    stored = list(db.redemptions.find({"name": "hashed"}))
    assert len(stored) == 2
    for doc in stored:
        assert "key" not in doc and doc["key_hash"] and not set(codes) & set(map(str, doc.values()))
    # A code stored in plain text by an older version is hashed at the next start.
    db.redemptions.insert_one({"_id": 99_001, "name": "legacy", "key": "legacy-code-0001",
                               "quota": 5, "status": 1, "created_time": 0})
    port = relay.port
    relay.stop()
    relay.start(port)
    doc = db.redemptions.find_one({"_id": 99_001})
    assert "key" not in doc and doc["key_hint"] == mask("legacy-code-0001", 4)
    admin.create_user("redeemer")
    user = Api.login(relay.url, "redeemer", USER_PASSWORD)
    assert user.post("/api/user/topup", {"key": "legacy-code-0001"})["data"] == 5
    assert user.post("/api/user/topup", {"key": codes[0]})["data"] == 7


def test_registration_switch(relay, admin):
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": "olga", "password": "Blue-Kettle-Harbor-42", "email": "o@x.test"})
    assert r.status_code == 200
    admin.put("/api/option/", {"key": "registration_enabled", "value": False})
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": "paul", "password": "Blue-Kettle-Harbor-42"})
    assert r.status_code == 403
    admin.put("/api/option/", {"key": "registration_enabled", "value": True})


def test_change_password_signs_out_other_sessions(relay, admin):
    admin.create_user("quinn")
    s1, s2 = requests.Session(), requests.Session()
    c1 = s1.post(relay.url + "/api/user/login", json={"username": "quinn", "password": "Blue-Kettle-Harbor-42"}).json()["data"]["csrf_token"]
    s2.post(relay.url + "/api/user/login", json={"username": "quinn", "password": "Blue-Kettle-Harbor-42"})
    r = s1.put(relay.url + "/api/user/self", json={"original_password": "Blue-Kettle-Harbor-42",
                                                   "password": "Quiet-Lantern-Orbit-88"},
               headers={"X-CSRF-Token": c1})
    assert r.status_code == 200
    assert s1.get(relay.url + "/api/user/self").status_code == 200
    assert s2.get(relay.url + "/api/user/self").status_code == 401
