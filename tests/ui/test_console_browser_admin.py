"""The console in a real browser: the admin pages, a phone-width screen and
reconnecting after a server restart."""
from __future__ import annotations

import time

import requests
from selenium.webdriver.common.by import By

from models.secrets import mask
from tests.ui import browser as chromium
from tests.ui.console_env import MARKS, PASSWORD, Api, no_script_errors, quota_of
from tests.ui.console_env import admin_b, b, env, upstream  # noqa: F401  (fixtures)

pytestmark = MARKS


# ---- admin ---------------------------------------------------------------------
def test_admin_adds_a_channel_and_a_price(relay, admin, admin_b, upstream):
    br = admin_b
    br.get(relay.url + "/console/admin/channels")
    br.find("#channels-table tbody tr")
    br.click("#new-channel")
    br.type("#ch-name", "second-upstream")
    br.type("#ch-base", upstream.url)
    br.type("#ch-key", "upstream-secret")
    br.type("#ch-models", "gpt-4.1-mini, gpt-4o-mini")
    br.type("#ch-priority", "5")
    br.type("#ch-weight", "3")
    br.type("#ch-mapping", '{"gpt-4.1-mini": "gpt-4o-mini"}')
    br.click("#channel-save")
    row = br.wait(lambda d: [r for r in br.all("#channels-table tbody tr")
                             if r.get_attribute("data-name") == "second-upstream"], what="row")[0]
    row.find_element(By.CSS_SELECTOR, "button.test").click()
    br.wait(lambda d: "ms" in row.find_element(By.CSS_SELECTOR, ".test-result").text,
            timeout=60, what="channel test")
    assert "✓" in row.find_element(By.CSS_SELECTOR, ".test-result").text
    br.screenshot("admin-channels")
    chans = admin.get("/api/channel/?size=100")["data"]["items"]
    ch = [c for c in chans if c["name"] == "second-upstream"][0]
    assert ch["priority"] == 5 and ch["weight"] == 3
    assert ch["model_mapping"] == {"gpt-4.1-mini": "gpt-4o-mini"}
    assert ch["models"] == ["gpt-4.1-mini", "gpt-4o-mini"] and "upstream-secret" not in ch["key"]

    br.get(relay.url + "/console/admin/prices")
    br.find("#prices-table tbody tr")
    br.type("#p-model", "gpt-4.1-mini")
    br.type("#p-input", "0.4")
    br.type("#p-output", "1.6")
    br.click("#price-save")
    br.wait(lambda d: [r for r in br.all("#prices-table tbody tr")
                       if r.get_attribute("data-model") == "gpt-4.1-mini"
                       and r.get_attribute("data-source") == "override"], what="price row")
    price = [p for p in admin.get("/api/price/")["data"] if p["model"] == "gpt-4.1-mini"][0]
    assert price["input_price"] == 0.4 and price["output_price"] == 1.6
    br.screenshot("admin-prices")
    no_script_errors(br)


def test_a_channel_shows_what_it_was_learnt_to_refuse_and_forgets_it(relay, admin, admin_b,
                                                                     env, upstream):
    """A channel that turned out to speak only chat completions shows it on
    its row; "Forget" makes the next call try the Responses API again."""
    ch = admin.create_channel(upstream.url + "/mode/chatonly", ["chat-only-model"],
                              name="chat-only")
    admin.set_price("chat-only-model", input_price=1, output_price=1)
    key = env["api"].create_token("learner", unlimited_quota=True)["key"]
    r = requests.post(relay.url + "/v1/responses", json={"model": "chat-only-model",
                                                         "input": "x"},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    br = admin_b
    br.get(relay.url + "/console/admin/channels")
    fact = br.wait(lambda d: [li for li in br.all("#channels-table tbody tr li.learned-fact")
                              if li.get_attribute("data-kind") == "wire"], what="learnt")[0]
    assert "chat completions only" in fact.text
    fact.find_element(By.CSS_SELECTOR, "button.forget").click()
    br.wait(lambda d: not br.all("li.learned-fact[data-kind='wire']"), what="forgotten")
    assert admin.get(f"/api/channel/{ch['id']}")["data"]["learned"] == []
    no_script_errors(br)


def test_admin_users_codes_groups_and_settings(relay, admin, admin_b, env):
    br = admin_b
    br.get(relay.url + "/console/admin/users")
    row = br.wait(lambda d: [r for r in br.all("#users-table tbody tr")
                             if r.get_attribute("data-name") == "dora"], what="dora's row")[0]
    before = admin.get(f"/api/user/{env['user']['id']}")["data"]["quota"]
    row.find_element(By.CSS_SELECTOR, "button.adjust").click()
    br.type("#a-amount", "-0.5")
    br.click("#adjust-form button[type='submit']")
    br.wait(lambda d: "reason" in br.text("#adjust-status"), what="reason required")
    br.type("#a-reason", "refund of a test")
    br.click("#adjust-form button[type='submit']")
    br.wait(lambda d: admin.get(f"/api/user/{env['user']['id']}")["data"]["quota"]
            == before - 250_000, what="adjusted balance")
    ledger_reason = "refund of a test"
    br.screenshot("admin-users")

    br.get(relay.url + "/console/admin/codes")
    br.find("#codes-table tbody tr")
    br.type("#c-name", "launch")
    br.type("#c-quota", "3")
    br.type("#c-count", "2")
    br.click("#code-form button[type='submit']")
    codes = br.visible("#new-codes").text.split("\n")
    assert len(codes) == 2
    listed = admin.get("/api/redemption/?size=100")["data"]["items"]
    assert {c["key"] for c in listed if c["name"] == "launch"} == {mask(c, 4) for c in codes}
    assert all(c["quota"] == 1_500_000 for c in listed if c["name"] == "launch")

    br.get(relay.url + "/console/admin/groups")
    br.find("#groups-table tbody tr")
    br.type("#g-name", "team")
    br.type("#g-rate", "0.8")
    br.type("#g-desc", "Our own team")
    br.click("#group-form button[type='submit']")
    br.wait(lambda d: [r for r in br.all("#groups-table tbody tr")
                       if r.get_attribute("data-name") == "team"], what="group row")
    team = [g for g in admin.get("/api/group/")["data"] if g["name"] == "team"][0]
    assert team["rate"] == 0.8 and team["description"] == "Our own team"
    # A rate rule: tiers typed as JSON, refused unsorted, shown in words.
    br.type("#g-input-tiers", '[{"from": 50, "factor": 1}, {"from": 10, "factor": 1}]')
    br.click("#group-form button[type='submit']")
    br.wait(lambda d: "sorted" in br.text("#group-status"), what="unsorted tiers refused")
    br.type("#g-input-tiers", '[{"from": 32000, "factor": 0.6}]')
    br.click("#group-form button[type='submit']")
    br.wait(lambda d: [r for r in br.texts("#groups-table tbody tr") if r.startswith("team")
                       and "×0.48 for a prompt of 32,000 input tokens or more" in r],
            what="the rule in words")
    team = [g for g in admin.get("/api/group/")["data"] if g["name"] == "team"][0]
    assert team["input_tiers"] == [{"from": 32000, "factor": 0.6}]

    br.get(relay.url + "/console/admin/settings")
    br.click("#add-base")
    br.type("#bases-editor .base-row:last-child .b-url", "ftp://nope")
    br.click("#settings-form button[type='submit']")
    br.wait(lambda d: "ftp://nope" in br.text("#settings-status"), what="bad address refused")
    br.type("#bases-editor .base-row:last-child .b-url", relay.url)
    br.type("#bases-editor .base-row:last-child .b-region", "Local test")
    br.click("#add-base")
    br.type("#bases-editor .base-row:last-child .b-url", "http://127.0.0.1:9")
    br.type("#bases-editor .base-row:last-child .b-region", "Nowhere")
    br.click("#settings-form button[type='submit']")
    br.wait(lambda d: br.text("#settings-status") == "Saved.", what="saved")
    br.screenshot("admin-settings")
    try:
        st = requests.get(relay.url + "/api/status", timeout=10).json()["data"]
        assert [(x["url"], x["region"]) for x in st["base_addresses"]] == [
            (relay.url, "Local test"), ("http://127.0.0.1:9", "Nowhere")]
        # The dashboard times both and marks the reachable one as the fastest.
        br.get(relay.url + "/console/")
        br.wait(lambda d: len(br.all("#bases tbody tr.unreachable")) == 1
                and len(br.all("#bases tbody tr.best")) == 1, timeout=60, what="pings")
        assert br.find("#bases tbody tr.best").get_attribute("data-url") == relay.url
        assert "Nowhere" in br.find("#bases tbody tr.unreachable").text
    finally:
        admin.put("/api/console/options", {"base_addresses": []})
    assert ledger_reason
    no_script_errors(br)


def test_admin_chooses_which_groups_users_may_put_keys_in(relay, admin, admin_b):
    """Usable groups from the console: a group's list for its users, then one
    user's own list, then back to the group's; what the user's key form is
    offered follows, and a key in a group no longer allowed is refused."""
    admin.post("/api/group/", {"name": "ug-cheap", "rate": 0.1})
    admin.post("/api/group/", {"name": "ug-vip", "rate": 2})
    admin.post("/api/group/", {"name": "ug-staff", "rate": 1})
    admin.create_user("ivo", PASSWORD)
    admin.put("/api/user/", {"id": [u for u in admin.get("/api/user/?size=100")["data"]["items"]
                                    if u["username"] == "ivo"][0]["id"], "group": "ug-staff"})
    ivo = Api.login(relay.url, "ivo", PASSWORD)

    def offered() -> set:
        return {g["name"] for g in ivo.get("/api/group/")["data"]}

    assert offered() == {"ug-staff"}
    br = admin_b
    br.get(relay.url + "/console/admin/groups")
    br.press("#groups-table tbody tr", "ug-staff", "button")  # its Edit button comes first
    br.wait(lambda d: br.find("#g-name").get_attribute("value") == "ug-staff", what="staff in the form")
    br.type("#g-usable", "ug-vip, nope")
    br.click("#group-form button[type='submit']")
    br.wait(lambda d: "nope" in br.text("#group-status"), what="unknown group refused")
    br.type("#g-usable", "ug-vip")
    br.click("#group-form button[type='submit']")
    br.wait(lambda d: [r for r in br.texts("#groups-table tbody tr") if r.startswith("ug-staff")
                       and "ug-vip" in r], what="staff's list shown")
    assert offered() == {"ug-staff", "ug-vip"}

    br.get(relay.url + "/console/admin/users")
    br.press("#users-table tbody tr", "ivo", "button.groups")
    assert br.find("#ug-inherit").is_selected()
    br.click("#ug-inherit")
    br.type("#ug-list", "ug-cheap")
    br.click("#groups-form button[type='submit']")
    br.wait(lambda d: offered() == {"ug-staff", "ug-cheap"}, what="ivo's own list")
    key = ivo.post("/api/token/", {"name": "k", "group": "ug-cheap"})["data"]
    assert ivo.post("/api/token/", {"name": "k2", "group": "ug-vip"}, expect=403)
    # Back to the group's list: the key in "ug-cheap" is now refused at its call.
    br.press("#users-table tbody tr", "ivo", "button.groups")
    br.wait(lambda d: br.find("#ug-list").get_attribute("value") == "ug-cheap", what="list shown")
    br.click("#ug-inherit")
    br.click("#groups-form button[type='submit']")
    br.wait(lambda d: offered() == {"ug-staff", "ug-vip"}, what="the group's list again")
    r = requests.post(relay.url + "/v1/chat/completions", json={
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key['key']}"}, timeout=30)
    assert r.status_code == 403 and "ug-cheap" in r.json()["error"]["message"], r.text
    no_script_errors(br)


def test_announcement_published_reaches_open_consoles(relay, admin_b, b):
    b.get(relay.url + "/console/")
    b.find("#live-dot.open")
    admin_b.get(relay.url + "/console/admin/announcements")
    admin_b.type("#an-title", "Planned maintenance")
    admin_b.type("#an-content", "Sunday 02:00 UTC")
    admin_b.click("#ann-form button[type='submit']")
    admin_b.wait(lambda d: admin_b.text("#ann-status") == "Published.", what="published")
    b.wait(lambda d: "Planned maintenance" in b.text("#announcements"), what="pushed banner")
    no_script_errors(b)


def test_phone_width_layout(relay, env):
    br = chromium.Browser(width=390, height=844)
    try:
        br.login(relay.url, "dora", PASSWORD)
        # (tests/ui/test_console_fit.py pictures the keys and usage pages' cards)
        for path, shot in (("/console/", "phone-dashboard"), ("/console/keys", ""),
                           ("/console/chat", "phone-chat"), ("/console/usage", "")):
            br.get(relay.url + path)
            br.find("#live-dot.open")
            time.sleep(0.5)
            overflow = br.js("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{path} is wider than the phone by {overflow}px"
            if shot:
                br.screenshot(shot)
        assert not br.find("#nav").is_displayed()
        br.click("#nav-toggle")
        assert br.find("#nav").is_displayed()
        assert br.find("#nav-toggle").get_attribute("aria-expanded") == "true"
        no_script_errors(br)
    finally:
        br.quit()


def test_live_connection_reconnects_after_a_server_restart(fresh_relay):
    proc = fresh_relay()
    Api.login(proc.url).create_user("erin", PASSWORD, quota=500_000)
    br = chromium.Browser()
    try:
        br.login(proc.url, "erin", PASSWORD)
        port = proc.port
        proc.stop()
        br.wait(lambda d: br.find("#live-dot").get_attribute("data-state") != "open",
                what="the socket to notice")
        # A call made while the server is away fails with a clear message.
        msg = br.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            import('/static/js/api.js').then((m) => m.get('/api/user/self'))
              .then(() => done('answered'), (e) => done(e.message));""")
        assert msg == "The server cannot be reached; try again in a moment."
        proc.start(port=port)
        br.find("#live-dot.open", timeout=90)
        # The hello after reconnecting carries the balance again.
        br.wait(lambda d: quota_of(br) == 500_000, what="balance after reconnect")
        # Failed socket attempts while the server was down or starting are
        # expected (refused, or closed before the handshake); nothing else.
        assert [e for e in br.errors() if "Failed to load resource" not in e
                and "WebSocket connection to" not in e] == []
    finally:
        br.quit()


def test_login_page_explains_the_rate_limit(fresh_relay):
    proc = fresh_relay()  # its own process: the lock-out does not touch other tests
    br = chromium.Browser()
    try:
        br.get(proc.url + "/console/login")
        for _ in range(5):
            br.type("#username", "root")
            br.type("#password", "not-the-password")
            br.click("#login-submit")
            br.wait(lambda d: "Wrong user name or password" in br.text("#login-status"),
                    what="a failed attempt")
            br.js("document.querySelector('#login-status').textContent = ''")
        br.type("#password", "not-the-password")
        br.click("#login-submit")
        br.wait(lambda d: "Too many failed attempts" in br.text("#login-status"),
                what="the lock-out message")
        assert br.find("#login-status").get_attribute("role") == "alert"
    finally:
        br.quit()
