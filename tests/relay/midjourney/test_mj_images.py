"""/mj/image/{id} as an attacker would try it (issue 31, item 5): a
third-party Midjourney proxy answering its image URL with HTML, or pointing
it at a loopback service, and strangers asking for someone else's image.
Real relay, a fake midjourney-proxy and a bystander service on 127.0.0.1."""
from __future__ import annotations

import time

import pytest
import requests

from tests.fakes.media_upstream import PNG_1PX
from tests.fakes.mj_upstream import FakeMidjourney
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess
from tests.tenant import Tenant

# Many password hashes, mails or polled tasks: the slow set (CI runs it).
pytestmark = pytest.mark.slow

ENV = {"RELAY_MJ_POLL_INTERVAL": "0.2", "RELAY_ALLOW_PRIVATE_WEBHOOKS": "false"}


@pytest.fixture(scope="module")
def mj():
    f = FakeMidjourney().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("mjimg")), env=ENV).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def admin(relay, mj) -> Api:
    a = Api.login(relay.url)
    a.create_channel(mj.url, ["mj_imagine"], name="mj", type="midjourney", key=mj.secret)
    a.set_price("mj_imagine", call_price="0.01")
    return a


@pytest.fixture(autouse=True)
def plain_images(mj):
    yield
    mj.image_url, mj.image_type, mj.image_body = None, "image/png", PNG_1PX


def finished_task(relay, key: str) -> str:
    tid = requests.post(relay.url + "/mj/submit/imagine", json={"prompt": "a cat"},
                        headers={"mj-api-secret": key}).json()["result"]
    for _ in range(200):
        t = requests.get(relay.url + f"/mj/task/{tid}/fetch", headers={"mj-api-secret": key}).json()
        if t["status"] == "SUCCESS":
            return tid
        time.sleep(0.1)
    raise AssertionError("the task did not finish")


def image(relay, tid: str, key: str | None = None, **kw):
    headers = {"mj-api-secret": key} if key else {}
    return requests.get(relay.url + f"/mj/image/{tid}", headers=headers, **kw)


def test_only_the_owner_gets_the_image_and_it_cannot_run(relay, admin):
    owner = Tenant(admin, relay.url)
    tid = finished_task(relay, owner.key)
    r = image(relay, tid, owner.key)
    assert r.status_code == 200 and r.content == PNG_1PX
    assert r.headers["Content-Type"] == "image/png"
    assert r.headers["Content-Security-Policy"] == "default-src 'none'"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    # The owner's console session will do too (an <img> on the console).
    s = requests.Session()
    name = admin.get(f"/api/user/{owner.user_id}")["data"]["username"]
    assert s.post(relay.url + "/api/user/login",
                  json={"username": name, "password": USER_PASSWORD}).status_code == 200
    assert s.get(relay.url + f"/mj/image/{tid}").content == PNG_1PX
    # Nobody else: no key, another account's key, another account's session.
    assert image(relay, tid).status_code == 404
    stranger = Tenant(admin, relay.url)
    r = image(relay, tid, stranger.key)
    assert r.status_code == 404 and r.json()["code"] == 3
    assert image(relay, tid, "sk-wrong").status_code == 401


@pytest.mark.parametrize("ctype,body", [
    ("text/html", b"<html><script>alert(document.cookie)</script></html>"),
    ("image/svg+xml", b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>"),
    ("application/octet-stream", PNG_1PX)])
def test_an_answer_that_is_not_a_raster_image_is_not_served(relay, admin, mj, ctype, body):
    owner = Tenant(admin, relay.url)
    mj.image_type, mj.image_body = ctype, body
    tid = finished_task(relay, owner.key)
    r = image(relay, tid, owner.key)
    assert r.status_code == 502 and r.json()["code"] == 4
    assert b"<script>" not in r.content and b"alert" not in r.content


def test_an_image_url_elsewhere_goes_through_the_ssrf_guard(relay, admin, mj):
    bystander = FakeOpenAI().start()  # a loopback service that is not the channel
    try:
        owner = Tenant(admin, relay.url)
        for url in (bystander.url + "/v1/models",
                    f"http://[64:ff9b::7f00:1]:{bystander.port}/v1/models",
                    f"http://[::ffff:127.0.0.1]:{bystander.port}/v1/models",
                    f"http://localhost:{bystander.port}/v1/models"):
            mj.image_url = url
            tid = finished_task(relay, owner.key)
            r = image(relay, tid, owner.key)
            assert r.status_code == 502 and "private or loopback" in r.json()["description"] \
                or "localhost" in r.json()["description"], (url, r.text)
        assert not bystander.requests
    finally:
        bystander.stop()


def test_public_image_links_when_the_operator_wants_them(mongo_url, tmp_path, mj):
    p = RelayProcess(mongo_url, str(tmp_path / "pub"),
                     env={**ENV, "RELAY_MJ_PUBLIC_IMAGES": "true"}).start()
    try:
        a = Api.login(p.url)
        a.create_channel(mj.url, ["mj_imagine"], name="mj", type="midjourney", key=mj.secret)
        a.set_price("mj_imagine", call_price="0.01")
        tid = finished_task(p, Tenant(a, p.url).key)
        r = image(p, tid)
        assert r.status_code == 200 and r.content == PNG_1PX
        assert r.headers["Content-Security-Policy"] == "default-src 'none'"
    finally:
        p.stop()
