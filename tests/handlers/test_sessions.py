"""Sessions that really end, client addresses behind a trusted proxy, sign-in
throttling with backoff, and the password rule."""
import time
import uuid

import pytest
import requests

from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    """The relay behind a (pretend) proxy on 127.0.0.1: its forwarded headers count."""
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("sess")),
                     env={"RELAY_TRUSTED_PROXIES": "127.0.0.1/32, 10.9.0.0/16"}).start()
    yield p
    p.stop()


def fresh_user(admin) -> str:
    name = "s" + uuid.uuid4().hex[:8]
    admin.create_user(name, quota=10_000_000)
    return name


def login(base, name, password=USER_PASSWORD, ip=None, session=None):
    s = session or requests.Session()
    h = {"X-Forwarded-For": ip} if ip else {}
    r = s.post(base + "/api/user/login", json={"username": name, "password": password}, headers=h)
    return s, r


# ---- sessions ----------------------------------------------------------------
def test_logout_revokes_the_session_on_the_server(relay, admin):
    name = fresh_user(admin)
    s, r = login(relay.url, name)
    csrf = r.json()["data"]["csrf_token"]
    stolen = requests.Session()
    stolen.cookies.update(s.cookies)
    assert stolen.get(relay.url + "/api/user/self").status_code == 200
    r = s.post(relay.url + "/api/user/logout", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200, r.text
    # The old cookie, replayed, is dead: the session is gone server-side.
    r = stolen.get(relay.url + "/api/user/self")
    assert r.status_code == 401 and r.json()["success"] is False


def test_get_logout_is_refused(relay, admin):
    name = fresh_user(admin)
    s, _ = login(relay.url, name)
    r = s.get(relay.url + "/api/user/logout")
    assert r.status_code == 405 and r.json()["success"] is False
    assert s.get(relay.url + "/api/user/self").status_code == 200


def test_logout_needs_csrf(relay, admin):
    name = fresh_user(admin)
    s, _ = login(relay.url, name)
    assert s.post(relay.url + "/api/user/logout").status_code == 403
    assert s.get(relay.url + "/api/user/self").status_code == 200


def test_sign_out_everywhere(relay, admin):
    name = fresh_user(admin)
    s1, r1 = login(relay.url, name)
    s2, _ = login(relay.url, name)
    listed = s1.get(relay.url + "/api/user/sessions").json()["data"]
    assert len(listed) == 2 and sum(x["current"] for x in listed) == 1
    r = s1.post(relay.url + "/api/user/logout", json={"everywhere": True},
                headers={"X-CSRF-Token": r1.json()["data"]["csrf_token"]})
    assert r.status_code == 200, r.text
    assert s1.get(relay.url + "/api/user/self").status_code == 401
    assert s2.get(relay.url + "/api/user/self").status_code == 401
    s3, _ = login(relay.url, name)
    assert s3.get(relay.url + "/api/user/self").status_code == 200


def test_end_one_other_session(relay, admin):
    name = fresh_user(admin)
    s1, r1 = login(relay.url, name)
    s2, _ = login(relay.url, name)
    other = [x for x in s1.get(relay.url + "/api/user/sessions").json()["data"] if not x["current"]]
    r = s1.delete(relay.url + f"/api/user/sessions/{other[0]['id']}",
                  headers={"X-CSRF-Token": r1.json()["data"]["csrf_token"]})
    assert r.status_code == 200, r.text
    assert s2.get(relay.url + "/api/user/self").status_code == 401
    assert s1.get(relay.url + "/api/user/self").status_code == 200


def test_rotating_the_access_token_needs_post_and_csrf(relay, admin):
    name = fresh_user(admin)
    s, r = login(relay.url, name)
    csrf = r.json()["data"]["csrf_token"]
    assert s.get(relay.url + "/api/user/token").status_code == 405
    assert s.post(relay.url + "/api/user/token").status_code == 403
    r = s.post(relay.url + "/api/user/token", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200
    old = r.json()["data"]
    api = Api(relay.url, old)
    new = api.post("/api/user/token")["data"]  # a bearer caller needs no CSRF
    assert requests.get(relay.url + "/api/user/self",
                        headers={"Authorization": f"Bearer {old}"}).status_code == 401
    assert Api(relay.url, new).get("/api/user/self")["data"]["username"] == name


def test_cookie_secure_only_over_https(relay, admin):
    name = fresh_user(admin)
    _, r = login(relay.url, name)
    assert "secure" not in r.headers["Set-Cookie"].lower()
    r = requests.post(relay.url + "/api/user/login", json={"username": name,
                                                            "password": USER_PASSWORD},
                      headers={"X-Forwarded-Proto": "https"})
    cookies = r.headers["Set-Cookie"].lower()
    assert "session=" in cookies and "; secure" in cookies


def test_forwarded_headers_from_untrusted_peers_are_ignored(mongo_url, tmp_path, admin):
    # Loopback is trusted by default: here only a network this test is not on.
    p = RelayProcess(mongo_url, str(tmp_path / "plain"),
                     env={"RELAY_TRUSTED_PROXIES": "10.9.0.0/16"}).start()
    try:
        a = Api.login(p.url)
        a.create_user("plainuser")
        r = requests.post(p.url + "/api/user/login", headers={"X-Forwarded-Proto": "https"},
                          json={"username": "plainuser", "password": USER_PASSWORD})
        assert r.status_code == 200 and "secure" not in r.headers["Set-Cookie"].lower()
    finally:
        p.stop()


# ---- the real client address -------------------------------------------------
@pytest.fixture(scope="module")
def keyed(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL], name="c")
    admin.set_price(MODEL, input_price=1, output_price=2)
    name = fresh_user(admin)
    api = Api.login(relay.url, name, USER_PASSWORD)
    key = api.create_token(name="ip", remain_quota=1_000_000, allow_ips="203.0.113.7")["key"]
    return api, key


def chat(relay, key, xff=None, **headers):
    h = {"Authorization": f"Bearer {key}", **headers}
    if xff:
        h["X-Forwarded-For"] = xff
    return requests.post(relay.url + "/v1/chat/completions", headers=h,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


def test_allow_list_sees_the_client_behind_the_proxy(relay, keyed):
    api, key = keyed
    assert chat(relay, key).status_code == 403  # the proxy itself is not on the list
    r = chat(relay, key, "203.0.113.7")
    assert r.status_code == 200, r.text
    # through two proxies we trust
    assert chat(relay, key, "203.0.113.7, 10.9.1.2").status_code == 200
    # X-Real-IP when there is no X-Forwarded-For
    assert chat(relay, key, None, **{"X-Real-IP": "203.0.113.7"}).status_code == 200
    rec = eventually(lambda: _log_with_ip(api, "203.0.113.7"), timeout=15)
    assert rec["client_ip"] == "203.0.113.7"


def _log_with_ip(api, ip):
    items = api.get("/api/log/self?size=50")["data"]["items"]
    hits = [i for i in items if i["client_ip"] == ip]
    assert hits
    return hits[0]


def test_a_client_cannot_forge_its_address(relay, keyed):
    _, key = keyed
    # The client wrote 203.0.113.7 itself; our proxy appended what it saw.
    r = chat(relay, key, "203.0.113.7, 198.51.100.20")
    assert r.status_code == 403 and "198.51.100.20" in r.json()["error"]["message"]


# ---- throttling --------------------------------------------------------------
def test_backoff_per_account_tells_how_long(relay, admin):
    name = fresh_user(admin)
    for i in range(5):
        _, r = login(relay.url, name, "wrong-password", ip=f"198.51.100.{i + 1}")
        assert r.status_code == 401
    # From yet another address: the account itself is slowed.
    _, r = login(relay.url, name, ip="198.51.100.99")
    assert r.status_code == 429, r.text
    body = r.json()
    wait = int(r.headers["Retry-After"])
    assert 1 <= wait <= 60 and body["data"]["retry_after"] == wait
    assert "try again in" in body["message"]


def test_owner_on_a_known_device_is_not_locked_out_by_a_stranger(relay, admin):
    name = fresh_user(admin)
    owner, r = login(relay.url, name, ip="192.0.2.10")
    assert r.status_code == 200
    for i in range(8):
        login(relay.url, name, "guess-" + str(i), ip=f"198.51.100.{50 + i}")
    _, r = login(relay.url, name, ip="198.51.100.77")
    assert r.status_code == 429  # a new device waits
    owner.cookies.pop("session", None)
    _, r = login(relay.url, name, ip="192.0.2.10", session=owner)
    assert r.status_code == 200, r.text  # the owner's browser does not


def test_backoff_per_address_across_accounts(relay, admin):
    names = [fresh_user(admin) for _ in range(3)]
    ip = "198.51.100.200"
    for i in range(20):
        _, r = login(relay.url, names[i % 3] + "x" * (i // 3), "nope", ip=ip)
        assert r.status_code == 401, r.text
    _, r = login(relay.url, names[0], ip=ip)
    assert r.status_code == 429
    _, r = login(relay.url, names[0], ip="198.51.100.201")
    assert r.status_code == 200


def test_waiting_out_the_backoff(relay, admin):
    name = fresh_user(admin)
    for i in range(5):
        login(relay.url, name, "wrong-password", ip="198.51.100.150")
    _, r = login(relay.url, name, ip="198.51.100.150")
    assert r.status_code == 429
    time.sleep(int(r.headers["Retry-After"]) + 0.2)
    _, r = login(relay.url, name, ip="198.51.100.150")
    assert r.status_code == 200, r.text


# ---- passwords ---------------------------------------------------------------
@pytest.mark.parametrize("password,why", [("short1", "at least 8"),
                                          ("password123", "common"),
                                          ("qwertyuiop", "stronger"),
                                          ("aaaaaaaaaaaa", "stronger")])
def test_weak_passwords_are_refused(relay, password, why):
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": "w" + uuid.uuid4().hex[:6], "password": password})
    assert r.status_code == 400, r.text
    assert why in r.json()["message"].lower()


def test_password_like_the_user_name_is_refused(relay):
    name = "harborkettle"
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": name, "password": name + "1"})
    assert r.status_code == 400, r.text


def test_strong_password_is_accepted(relay):
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": "w" + uuid.uuid4().hex[:6], "password": USER_PASSWORD})
    assert r.status_code == 200, r.text


def test_a_refused_method_keeps_the_connection_usable(relay, admin):
    """405 is answered after the request is read, on a connection the next
    request can use (a POST is not retried by clients on a dead one)."""
    name = fresh_user(admin)
    s, r = login(relay.url, name)
    csrf = r.json()["data"]["csrf_token"]
    for _ in range(5):
        r = s.get(relay.url + "/api/user/token")
        assert r.status_code == 405 and r.headers.get("Connection", "").lower() != "close"
        assert s.post(relay.url + "/api/user/token", headers={"X-CSRF-Token": csrf}).status_code == 200
