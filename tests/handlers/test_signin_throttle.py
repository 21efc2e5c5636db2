"""A sign-in throttle that cannot be raced or sidestepped (issue 31, item 3),
tried as an attacker would over real sockets: a twin account whose name
differs in case, guesses sent all at once, a flood of sign-ins from many
addresses, and accounts from before names were unique whatever their case."""
from __future__ import annotations

import concurrent.futures as cf
import uuid

import pytest
import requests
from pymongo import MongoClient

from tests.helpers import USER_PASSWORD, Api, RelayProcess

# Many password hashes, mails or polled tasks: the slow set (CI runs it).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    """Behind a pretend proxy on 127.0.0.1, so each test can be its own address."""
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("throttle")),
                     env={"RELAY_TRUSTED_PROXIES": "127.0.0.1"}).start()
    yield p
    p.stop()


def fresh(admin, **kw) -> str:
    name = "t" + uuid.uuid4().hex[:8]
    admin.create_user(name, **kw)
    return name


def ip() -> str:
    n = uuid.uuid4().int
    return f"198.{18 + n % 2}.{n >> 8 & 255}.{n >> 16 & 255}"


def login(relay, name, password, addr, session=None):
    s = session or requests.Session()
    return s.post(relay.url + "/api/user/login", json={"username": name, "password": password},
                  headers={"X-Forwarded-For": addr})


def test_names_and_addresses_are_unique_whatever_their_case(relay, admin):
    name = fresh(admin)  # with the address <name>@example.test
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": name.upper(), "password": USER_PASSWORD})
    assert r.status_code == 409 and "taken" in r.json()["message"]
    r = admin.s.post(relay.url + "/api/user/", json={"username": name.capitalize(),
                                                     "password": USER_PASSWORD})
    assert r.status_code == 409
    r = admin.s.post(relay.url + "/api/user/", json={
        "username": name + "x", "password": USER_PASSWORD, "email": f"{name.upper()}@Example.TEST"})
    assert r.status_code == 409 and "e-mail" in r.json()["message"]
    other = fresh(admin)
    r = admin.s.put(relay.url + "/api/user/", json={"id": admin.get(
        f"/api/user/?keyword={other}")["data"]["items"][0]["id"], "email": f"{name}@EXAMPLE.test"})
    assert r.status_code == 409
    # Any case of the name signs in to the one account.
    assert login(relay, name.upper(), USER_PASSWORD, ip()).status_code == 200


def test_a_twin_account_gives_no_free_guesses(relay, admin):
    """The issue's attack: an account of one's own, signed in from the same
    browser between guesses, used to reset the guesses' count."""
    victim = fresh(admin)
    # The twin named like the victim but for case, if the relay lets one in
    # (it does not: then an account of any other name).
    mallory = victim.upper()
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": mallory, "password": USER_PASSWORD})
    if r.status_code != 200:
        mallory = fresh(admin)
    addr = ip()
    browser = requests.Session()

    def as_mallory():
        assert login(relay, mallory, USER_PASSWORD, addr, browser).status_code == 200
        for cookie in ("session", "csrf_token"):  # signed out; the device cookie stays
            browser.cookies.pop(cookie, None)
    as_mallory()
    codes = []
    for i in range(30):
        codes.append(login(relay, victim, f"guess-{i}", addr, browser).status_code)
        if codes[-1] == 401:
            as_mallory()
    # Five free, then each waits 2, 4, 8 ... seconds (a slow machine may
    # let one or two through as a wait runs out); before, all thirty were checked.
    assert codes.count(401) <= 8 and codes.count(429) >= 22, codes


def test_guesses_sent_at_once_are_counted_before_they_are_checked(relay, admin):
    victim = fresh(admin)
    with cf.ThreadPoolExecutor(30) as pool:
        codes = list(pool.map(lambda i: login(relay, victim, f"wrong-{i}", ip()).status_code,
                              range(30)))
    # Five free failures for an account; read then written, all thirty were checked.
    assert 1 <= codes.count(401) <= 5 and set(codes) <= {401, 429}, codes


def test_a_right_password_gives_its_count_back(relay, admin):
    owner = fresh(admin)
    addr = ip()
    for i in range(4):
        assert login(relay, owner, f"typo-{i}", addr).status_code == 401
    for _ in range(3):  # counted before the check, given back after it
        assert login(relay, owner, USER_PASSWORD, addr).status_code == 200
    assert login(relay, owner, "typo-last", addr).status_code == 401
    assert login(relay, owner, "typo-over", addr).status_code == 429


def test_a_sign_in_flood_is_refused_rather_than_queued(relay, admin):
    """Eighty sign-ins at once from eighty addresses: the password checks
    that cannot wait in a bounded queue are refused at once (429), so the
    owner signing in afterwards does not wait behind the flood."""
    owner = fresh(admin)

    def flood(i):
        r = login(relay, f"nobody-{uuid.uuid4().hex[:10]}", "whatever-it-is", ip())
        return r.status_code, r.json()["message"]
    with cf.ThreadPoolExecutor(80) as pool:
        got = list(pool.map(flood, range(80)))
    codes = [c for c, _ in got]
    assert set(codes) <= {401, 429} and codes.count(429) >= 1, codes
    assert any("at once" in m for c, m in got if c == 429)
    assert codes.count(401) >= 18  # two workers and sixteen waiting: all were served
    assert login(relay, owner, USER_PASSWORD, ip()).status_code == 200


def test_accounts_from_before_keep_signing_in(mongo_url, tmp_path):
    """Twins made before names were unique whatever their case: both still
    sign in by their own exact names; nobody can add a third."""
    p = RelayProcess(mongo_url, str(tmp_path / "mig")).start()
    try:
        admin = Api.login(p.url)
        bob = admin.create_user("bob", email="bob@example.test")
        p.stop()
        db = MongoClient(mongo_url)[p.db_name]
        db.users.update_many({}, {"$unset": {"name_key": "", "email_key": ""}})
        twin = dict(db.users.find_one({"_id": bob["id"]}), _id=bob["id"] + 100, username="Bob")
        db.users.insert_one(twin)  # an older relay let this in
        p.start()
        for name in ("bob", "Bob"):
            r = requests.post(p.url + "/api/user/login",
                              json={"username": name, "password": USER_PASSWORD})
            assert r.status_code == 200 and r.json()["data"]["username"] == name
        r = requests.post(p.url + "/api/user/login",
                          json={"username": "bob@example.test", "password": USER_PASSWORD})
        assert r.json()["data"]["username"] == "bob"  # the older account, as before
        r = requests.post(p.url + "/api/user/register",
                          json={"username": "BOB", "password": USER_PASSWORD})
        assert r.status_code == 409
    finally:
        p.stop()
