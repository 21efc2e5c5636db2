"""Verified contact points (issue 31, item 4), tried as a spammer would over
real sockets: naming someone else's address, test sends by the dozen from
two relays on one database, a key named like a phishing line, and a
WxPusher UID typed in.  Mail goes to an SMTP sink on 127.0.0.1."""
from __future__ import annotations

import re
import uuid

import pytest
import requests

from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.smtp_sink import SmtpSink
from tests.helpers import USER_PASSWORD, Api, RelayProcess
from tests.notify.notify_helpers import subscribe, wait_for
from tests.notify.test_notify_api import notify_env

# Many password hashes, mails or polled tasks: the slow set (CI runs it).
pytestmark = pytest.mark.slow

VICTIM = "ceo@victim-corp.example"


@pytest.fixture(scope="module")
def fake():
    f = NotifyReceivers().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def sink():
    s = SmtpSink().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def relays(mongo_url, tmp_path_factory, fake, sink):
    """Two relays on one database."""
    a = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("cpa")),
                     env=notify_env(fake, sink)).start()
    b = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("cpb")), db_name=a.db_name,
                     env=notify_env(fake, sink)).start()
    yield a, b
    b.stop()
    a.stop()


@pytest.fixture(scope="module")
def root(relays) -> Api:
    return Api.login(relays[0].url)


def someone(root, relay) -> tuple[dict, Api]:
    name = "c" + uuid.uuid4().hex[:8]
    user = root.create_user(name, email=f"{name}@owner.example")
    return user, Api.login(relay.url, name, USER_PASSWORD)


def mails_to(sink, address: str) -> list:
    return [m["message"] for m in sink.messages if address in m["to"]]


def code_in(mail) -> str:
    return re.search(r"^ +([A-Z2-9]{10})\s*$", mail.get_content(), re.M).group(1)


def test_a_new_address_is_the_accounts_only_once_its_code_comes_back(relays, root, sink):
    relay = relays[0]
    user, api = someone(root, relay)
    victim = f"{uuid.uuid4().hex[:6]}-{VICTIM}"
    r = api.put("/api/user/self", {"email": victim})
    assert r["data"]["email"] == user["email"] and r["data"]["pending_email"] == victim
    mail = wait_for(lambda: mails_to(sink, victim), what="the confirmation mail")[0]
    code = code_in(mail)
    # Our own words only: nothing the user chose reaches the stranger.
    assert user["username"] not in mail.get_content() and "http" not in mail.get_content()
    # Until confirmed, notifications go to the old address, and the new one signs nobody in.
    sub = subscribe(api, "email", {})
    assert api.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    wait_for(lambda: mails_to(sink, user["email"]), what="the test mail")
    assert len(mails_to(sink, victim)) == 1
    r = requests.post(relay.url + "/api/user/login",
                      json={"username": victim, "password": USER_PASSWORD})
    assert r.status_code == 401
    r = api.post("/api/user/self/email", {"code": "WRONGCODE2"}, expect=400)
    assert "wrong" in r["message"] and r["data"]["code"] == "email_code_wrong"
    me = api.post("/api/user/self/email", {"code": code.lower()})["data"]
    assert me["email"] == victim and me["pending_email"] == ""
    r = requests.post(relay.url + "/api/user/login",
                      json={"username": victim.upper(), "password": USER_PASSWORD})
    assert r.status_code == 200 and r.json()["data"]["id"] == user["id"]
    # The address is taken now: nobody else may have it.
    _, other = someone(root, relay)
    r = other.put("/api/user/self", {"email": victim}, expect=409)
    assert "another account" in r["message"] and r["data"]["code"] == "email_taken"


def test_wrong_codes_drop_the_change_and_mails_are_limited(relays, root, sink):
    relay = relays[0]
    user, api = someone(root, relay)
    target = f"{uuid.uuid4().hex[:6]}@stranger.example"
    api.put("/api/user/self", {"email": target})
    for i in range(4):
        assert "wrong" in api.post("/api/user/self/email", {"code": f"BADCODE{i}AA"},
                                   expect=400)["message"]
    r = api.post("/api/user/self/email", {"code": "BADCODE9AA"}, expect=400)
    assert "dropped" in r["message"] and r["data"]["code"] == "email_code_dropped"
    assert api.get("/api/user/self")["data"]["pending_email"] == ""
    api.post("/api/user/self/email", {"code": "ANYTHING22"}, expect=404)
    # Three confirmation mails an hour per account, whichever addresses.
    for i in range(2):
        api.put("/api/user/self", {"email": f"{i}{target}"})
    r = api.call("PUT", "/api/user/self", json={"email": f"9{target}"}, expect=429)
    assert int(api.s.put(relay.url + "/api/user/self",
                         json={"email": f"8{target}"}).headers["Retry-After"]) > 60
    assert "3 confirmation mails an hour" in r["message"] and r["data"]["code"] == "confirm_mails"
    # Removing the address needs no code.
    me = api.put("/api/user/self", {"email": ""})["data"]
    assert me["email"] == "" and me["pending_email"] == ""


def test_registering_with_an_address_mails_it_a_code(relays, sink):
    relay = relays[0]
    name = "r" + uuid.uuid4().hex[:8]
    address = f"{name}@signup.example"
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": name, "password": USER_PASSWORD, "email": address})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["email"] == "" and r.json()["data"]["pending_email"] == address
    mail = wait_for(lambda: mails_to(sink, address), what="the code")[0]
    assert str(mail["Subject"]) == "Your confirmation code"
    api = Api.login(relay.url, name, USER_PASSWORD)
    assert api.post("/api/user/self/email", {"code": code_in(mail)})["data"]["email"] == address


def test_the_confirmation_mail_is_in_the_accounts_language(relays, sink):
    """Our own words, in the language the account chose at sign-up."""
    relay = relays[0]
    name = "z" + uuid.uuid4().hex[:8]
    address = f"{name}@signup.example"
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": name, "password": USER_PASSWORD, "email": address,
                            "language": "zh-CN"})
    assert r.status_code == 200, r.text
    mail = wait_for(lambda: mails_to(sink, address), what="the code")[0]
    assert str(mail["Subject"]) == "您的验证码" and "24 小时内" in mail.get_content()
    api = Api.login(relay.url, name, USER_PASSWORD)
    assert api.post("/api/user/self/email", {"code": code_in(mail)})["data"]["email"] == address


def test_test_sends_are_five_an_hour_across_relays(relays, root, fake):
    a, b = relays
    user, api_a = someone(root, a)
    api_b = Api(b.url)
    api_b.s.headers.update(api_a.s.headers)  # the same access token, at the other relay
    sub = subscribe(api_a, "webhook", {"url": f"{fake.url}/hook/ok/t{user['id']}"})
    codes = []
    for i in range(8):
        api = (api_a, api_b)[i % 2]
        codes.append(api.s.post(api.base + f"/api/subscription/{sub['id']}/test").status_code)
    assert codes == [200] * 5 + [429] * 3
    assert len(fake.delivered("webhook", f"/hook/ok/t{user['id']}")) == 5
    r = api_b.s.post(b.url + f"/api/subscription/{sub['id']}/test")
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 3600


def test_a_key_name_never_reads_as_our_words(relays, root, sink, fake):
    relay = relays[0]
    user, api = someone(root, relay)
    tok = api.create_token(name="Reset now at https://evil.example/r", remain_quota=10)
    sub = subscribe(api, "email", {}, events=["key_quota_warning"], key_threshold=1000,
                    key_ids=[tok["id"]])
    assert api.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    mail = wait_for(lambda: mails_to(sink, user["email"]), what="the warning")[0]
    assert str(mail["Subject"]) == f"[Test] API key #{tok['id']} is running low"
    body = mail.get_content()
    assert "https://evil.example" not in body and "evil.example" not in body
    assert "(the name given to it: \u201cReset now at https[:]//evil[.]example/r\u201d)" in body
    # A webhook of one's own still gets the name as it is, JSON-escaped.
    hook = subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/k{user['id']}",
                                      "body_template": '{"k": "{{ key_name }}"}'},
                     events=["key_quota_warning"], key_ids=[tok["id"]], key_threshold=1000)
    assert api.post(f"/api/subscription/{hook['id']}/test")["data"]["ok"]
    got = fake.delivered("webhook", f"/hook/ok/k{user['id']}")[-1]["json"]
    assert got == {"k": "Reset now at https://evil.example/r"}


def test_a_wxpusher_uid_comes_only_from_the_binding(relays, root, fake):
    relay = relays[0]
    _, api = someone(root, relay)
    r = api.post("/api/subscription/", {
        "name": "p", "event_types": ["announcement"], "channel_type": "personal_push",
        "channel_config": {"vendor": "wxpusher", "uid": "UID_someone_else"}}, expect=400)
    assert "QR code" in r["message"]
    sub = subscribe(api, "personal_push", {"vendor": "wxpusher"})
    assert "uid" not in sub["channel_config"]
    result = api.post(f"/api/subscription/{sub['id']}/test")["data"]
    assert not result["ok"] and "scan the binding QR code" in result["error"]
    assert not [d for d in fake.delivered("wxpusher") if "UID_someone_else" in str(d["json"])]
