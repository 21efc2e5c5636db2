"""An account's language (of the console and of its notifications): set at
sign-up from the browser's `lang` cookie or Accept-Language, at the first
sign-in of an account that has none, or by the user (the console's switch)
and an administrator; refused when the console does not have it; described
in /api/openapi.json.  Refusals the console words itself carry a code."""
from __future__ import annotations

import uuid

import pytest
import requests

from console import strings
from handlers.openapi import spec
from tests.helpers import USER_PASSWORD, Api


def register(base: str, headers: dict | None = None, cookies: dict | None = None,
             **body) -> requests.Response:
    name = "l" + uuid.uuid4().hex[:10]
    return requests.post(base + "/api/user/register", headers=headers or {}, cookies=cookies,
                         json={"username": name, "password": USER_PASSWORD, **body})


def me(base: str, username: str, headers: dict | None = None) -> dict:
    r = requests.post(base + "/api/user/login", headers=headers or {},
                      json={"username": username, "password": USER_PASSWORD})
    assert r.status_code == 200, r.text
    return r.json()["data"]


@pytest.mark.parametrize("headers, cookies, body, want", [
    ({"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"}, None, {}, "zh-CN"),
    ({"Accept-Language": "zh-TW"}, None, {}, "zh-CN"),
    ({"Accept-Language": "de-DE,en;q=0.5"}, None, {}, "en"),
    ({"Accept-Language": "zh-CN"}, {"lang": "en"}, {}, "en"),      # the switch, signed out
    ({"Accept-Language": "en"}, None, {"language": "ZH-cn"}, "zh-CN"),  # the form says
    ({}, None, {}, ""),                                             # a script: not chosen
])
def test_sign_up_takes_the_browsers_language(relay, headers, cookies, body, want):
    r = register(relay.url, headers, cookies, **body)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["language"] == want


@pytest.mark.parametrize("bad", ["fr", "zh_CN", "x" * (strings.MAX_TAG + 1), 7, ["zh-CN"], ""])
def test_a_language_the_console_lacks_is_refused(relay, admin, bad):
    r = register(relay.url, language=bad)
    assert r.status_code == 400 and "language" in r.json()["message"], r.text
    user = admin.create_user("b" + uuid.uuid4().hex[:10])
    r = admin.put("/api/user/", {"id": user["id"], "language": bad}, expect=400)
    assert "language" in r["message"]
    api = Api.login(relay.url, user["username"], USER_PASSWORD)
    r = api.put("/api/user/self", {"language": bad}, expect=400)
    assert "language" in r["message"]
    if isinstance(bad, str) and len(bad) <= strings.MAX_TAG:
        assert "en, zh-CN" in r["message"]


def test_first_sign_in_sets_a_missing_language_once(relay, admin):
    name = "f" + uuid.uuid4().hex[:10]
    admin.create_user(name)          # an administrator chose none
    assert me(relay.url, name)["language"] == ""                     # a script says nothing
    assert me(relay.url, name, {"Accept-Language": "zh-CN"})["language"] == "zh-CN"
    assert me(relay.url, name, {"Accept-Language": "en-US"})["language"] == "zh-CN"  # kept


def test_the_user_and_an_administrator_change_it(relay, admin):
    name = "c" + uuid.uuid4().hex[:10]
    user = admin.post("/api/user/", {"username": name, "password": USER_PASSWORD,
                                     "language": "zh-cn"})["data"]
    assert user["language"] == "zh-CN"
    api = Api.login(relay.url, name, USER_PASSWORD)
    assert api.put("/api/user/self", {"language": "en"})["data"]["language"] == "en"
    assert api.get("/api/user/self")["data"]["language"] == "en"
    admin.put("/api/user/", {"id": user["id"], "language": "zh-CN"})
    assert api.get("/api/user/self")["data"]["language"] == "zh-CN"


def test_refusals_the_console_translates_carry_a_code(relay, admin):
    r = requests.post(relay.url + "/api/user/login",
                      json={"username": "nobody-" + uuid.uuid4().hex[:6], "password": "x" * 9})
    assert r.status_code == 401 and r.json()["data"] == {"code": "wrong_credentials"}
    table = strings.table("zh-CN")
    assert table["err.wrong_credentials"] != strings.table("en")["err.wrong_credentials"]
    api = Api.login(relay.url, admin.create_user("t" + uuid.uuid4().hex[:10])["username"],
                    USER_PASSWORD)
    r = api.post("/api/user/topup", {"key": "no-such-code"}, expect=404)
    assert r["data"] == {"code": "no_such_code"} and "err.no_such_code" in table


def test_console_pages_speak_the_choice(relay, admin):
    """The cookie (this browser's switch) first, then the account's language,
    then Accept-Language; the switch lists each language in its own words."""
    html = requests.get(relay.url + "/console/login",
                        headers={"Accept-Language": "zh-CN,zh;q=0.9"}).text
    assert '<html lang="zh-CN">' in html and "<title>登录" in html
    assert '<option value="zh-CN" lang="zh-CN" selected>简体中文</option>' in html
    assert '<option value="en" lang="en">English</option>' in html
    html = requests.get(relay.url + "/console/login", cookies={"lang": "en"},
                        headers={"Accept-Language": "zh-CN"}).text
    assert '<html lang="en">' in html
    name = "p" + uuid.uuid4().hex[:10]
    admin.post("/api/user/", {"username": name, "password": USER_PASSWORD, "language": "zh-CN"})
    s = requests.Session()
    assert s.post(relay.url + "/api/user/login",
                  json={"username": name, "password": USER_PASSWORD}).status_code == 200
    assert '<html lang="zh-CN">' in s.get(relay.url + "/console/keys",
                                           headers={"Accept-Language": "en"}).text
    r = s.get(relay.url + "/console/admin/users", headers={"Accept-Language": "en"})
    assert r.status_code == 403 and r.text == "仅限管理员访问。"


def test_openapi_describes_the_language():
    paths = spec()["paths"]
    langs = strings.available()

    def field(path, method):
        body = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]
        return body["properties"]["language"]
    for path, method in (("/api/user/register", "post"), ("/api/user/self", "put"),
                         ("/api/user/", "post"), ("/api/user/", "put")):
        assert field(path, method)["enum"] == langs, (path, method)
