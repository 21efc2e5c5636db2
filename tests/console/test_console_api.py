"""The console's pages and JSON endpoints without a browser: access rules,
CSP and CSRF, public status, the daily chart data, CSV export, the models
of a group and the admin's console settings."""
from __future__ import annotations

import csv
import io
import time

import pytest
import requests

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api

PASSWORD = "Blue-Kettle-Harbor-42"


@pytest.fixture(scope="module")
def upstream():
    fake = FakeOpenAI().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def carol(relay, admin, upstream):
    admin.post("/api/group/", {"name": "gold", "rate": 0.5, "description": "Fast lane"})
    admin.create_channel(upstream.url, ["gpt-4o-mini", "=cmd|calc"], groups=["default"])
    admin.create_channel(upstream.url, ["gpt-4o"], groups=["gold"], name="gold")
    admin.set_price("gpt-4o-mini", input_price=1, output_price=2)
    admin.set_price("=cmd|calc", input_price=1, output_price=2)
    admin.create_user("carol", PASSWORD, quota=5_000_000)
    api = Api.login(relay.url, "carol", PASSWORD)
    key = api.create_token("carol-key", unlimited_quota=True)
    for model in ("gpt-4o-mini", "gpt-4o-mini", "=cmd|calc"):
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {key['key']}"},
                          json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                          timeout=60)
        assert r.status_code == 200, r.text
    time.sleep(1.0)  # usage records are flushed every 0.125 s
    return {"api": api, "key": key}


def cookie_session(base: str, username: str, password: str) -> tuple[requests.Session, str]:
    s = requests.Session()
    r = s.post(base + "/api/user/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return s, r.json()["data"]["csrf_token"]


def test_pages_need_a_session_and_admin_pages_an_admin(relay, carol):
    r = requests.get(relay.url + "/console/keys", allow_redirects=False, timeout=10)
    assert r.status_code == 302 and r.headers["Location"].startswith("/console/login?next=")
    s, _ = cookie_session(relay.url, "carol", PASSWORD)
    assert s.get(relay.url + "/console/keys", timeout=10).status_code == 200
    assert s.get(relay.url + "/console/admin/channels", timeout=10).status_code == 403
    r = requests.get(relay.url + "/", allow_redirects=False, timeout=10)
    assert r.status_code in (301, 302) and r.headers["Location"] == "/console/"


def test_pages_send_csp_and_have_no_inline_script(relay, carol):
    s, _ = cookie_session(relay.url, "carol", PASSWORD)
    r = s.get(relay.url + "/console/", timeout=10)
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    html = r.text
    assert "<script>" not in html and "<script type=\"module\">" not in html
    assert " style=" not in html and " onclick=" not in html
    assert carol["key"]["key"] not in html  # no secrets in pages


def test_page_output_is_escaped(relay, admin):
    admin.put("/api/console/options", {"site_name": "<script>alert(1)</script>"})
    try:
        html = requests.get(relay.url + "/console/login", timeout=10).text
        assert "<script>alert(1)</script>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    finally:
        admin.put("/api/console/options", {"site_name": "Relay"})


def test_status_is_public_with_own_address_by_default(relay):
    d = requests.get(relay.url + "/api/status", timeout=10).json()["data"]
    assert d["site_name"] and d["registration_enabled"] in (True, False)
    assert d["base_addresses"][0]["url"] == relay.url


def test_console_options_validate_and_apply(relay, admin, carol):
    bad = admin.put("/api/console/options", {"base_addresses": [{"url": "ftp://x"}]}, expect=400)
    assert "ftp://x" in bad["message"]
    assert "purchase rate" in admin.put("/api/console/options", {"purchase_rate": "-1"},
                                        expect=400)["message"]
    admin.put("/api/console/options", {"purchase_rate": 0.7, "registration_enabled": False,
                                       "base_addresses": [
                                           {"url": relay.url + "/", "region": "local"},
                                           {"url": "https://eu.example.test", "region": "EU"}]})
    try:
        d = requests.get(relay.url + "/api/status", timeout=10).json()["data"]
        assert d["purchase_rate"] == 0.7 and d["discount_percent"] == 30.0
        assert d["registration_enabled"] is False
        assert [b["region"] for b in d["base_addresses"]] == ["local", "EU"]
        r = requests.post(relay.url + "/api/user/register",
                          json={"username": "newbie", "password": "Blue-Kettle-Harbor-42"}, timeout=10)
        assert r.status_code == 403
        assert 'id="register-closed"' in requests.get(relay.url + "/console/register",
                                                      timeout=10).text
        assert "/console/register" not in requests.get(relay.url + "/console/login",
                                                       timeout=10).text
        s, _ = cookie_session(relay.url, "carol", PASSWORD)
        page = s.get(relay.url + "/console/topup", timeout=10)
        assert "Pay 0.7 per credit (30.0% off" in page.text
        assert "https://eu.example.test" in page.headers["Content-Security-Policy"]
        carol["api"].put("/api/console/options", {"purchase_rate": 1}, expect=403)
    finally:
        admin.put("/api/console/options", {"registration_enabled": True, "base_addresses": [],
                                           "purchase_rate": ""})


def test_state_changes_with_the_cookie_need_the_csrf_header(relay, admin):
    s, csrf = cookie_session(relay.url, "root", "root-test-password")
    r = s.put(relay.url + "/api/console/options", json={"site_name": "X"}, timeout=10)
    assert r.status_code == 403 and "CSRF" in r.json()["message"]
    r = s.put(relay.url + "/api/console/options", json={"site_name": "Relay"},
              headers={"X-CSRF-Token": csrf}, timeout=10)
    assert r.status_code == 200


def test_daily_chart_data_per_model(relay, carol):
    d = carol["api"].get("/api/log/self/daily?days=30&tz_offset=0")["data"]
    assert len(d["days"]) == 30 and len(d["timestamps"]) == 30
    assert set(d["models"]) == {"gpt-4o-mini", "=cmd|calc"}
    assert d["requests"]["gpt-4o-mini"][-1] == 2 and d["requests"]["=cmd|calc"][-1] == 1
    assert d["total_requests"][-1] == 3 and sum(d["total_requests"]) == 3
    assert d["total_quota"][-1] == sum(d["quota"][m][-1] for m in d["models"]) > 0
    assert carol["api"].get("/api/log/self/daily?tz_offset=9999", expect=400)


def test_usage_records_come_newest_first(relay, carol):
    items = carol["api"].get("/api/log/self?size=50")["data"]["items"]
    times = [i["created_at"] for i in items]
    assert len(times) == 3 and times == sorted(times, reverse=True)
    assert items[0]["model"] == "=cmd|calc"  # the last call made


def test_csv_export_filters_and_neutralises_formulas(relay, carol):
    r = carol["api"].s.get(relay.url + "/api/log/self/export?model=gpt-4o-mini", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    *rows, total = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 2 and {row["model"] for row in rows} == {"gpt-4o-mini"}
    assert total["request_id"] == "TOTAL"
    assert int(total["quota"]) == sum(int(row["quota"]) for row in rows)
    assert "channel_id" not in rows[0]
    r = carol["api"].s.get(relay.url + "/api/log/self/export", timeout=10)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert "'=cmd|calc" in {row["model"] for row in rows}


def test_group_models_for_the_key_form(relay, carol, admin):
    assert carol["api"].get("/api/user/models?group=default")["data"] == ["=cmd|calc",
                                                                         "gpt-4o-mini"]
    assert carol["api"].get("/api/user/models?group=gold")["data"] == ["gpt-4o"]
    carol["api"].get("/api/user/models?group=nope", expect=404)
    admin.put("/api/group/", {"name": "gold", "enabled": False})
    try:
        carol["api"].get("/api/user/models?group=gold", expect=404)
    finally:
        admin.put("/api/group/", {"name": "gold", "enabled": True})


def test_ping_answers_cross_origin(relay):
    r = requests.get(relay.url + "/api/ping", timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
