"""The console as a person meets it in the first hour, in a real browser at
1366x768 and at a phone's 390x844: the key form's actions stay on screen,
a field that does not apply looks disabled, the phone shows table rows as
cards with every action reachable, the chat's Send button is visible; the
Account page changes a password; an administrator's reset makes the user
choose a new one; the webhook preview carries the live balance and the
form's threshold; and warnings are limited to one per rolling 60 minutes
(the relay's notifier on a clock the test moves across an hour boundary).
Screenshots go to test-artifacts/tmp/screenshots/."""
from __future__ import annotations

import json
import math
import time

import requests
from selenium.webdriver.support.ui import Select

from tests.ui import browser as chromium
from tests.ui.console_env import (MARKS, PASSWORD, WebhookReceiver, make_usage, no_script_errors,
                               quota_of)
from tests.ui.console_env import admin_b, b, env, upstream  # noqa: F401  (fixtures)
from tests.helpers import ADMIN_PASSWORD, Api, RelayProcess

pytestmark = MARKS

NEW_PASSWORD = "Harbor-Tangerine-58"


def line_counts(br, css: str) -> list:
    """(text, lines) of each match: a name broken across lines counts more than one."""
    return br.js("""return [...document.querySelectorAll(arguments[0])].map((td) => {
        const rg = document.createRange(); rg.selectNodeContents(td);
        return [td.textContent, new Set([...rg.getClientRects()].map((x) => Math.round(x.top))).size];
    });""", css)


def hit(br, css: str) -> dict:
    """Where an element is, and whether a click at its centre reaches it
    (visible in the viewport, not covered, not scrolled away)."""
    return br.js("""
        const e = document.querySelector(arguments[0]);
        const r = e.getBoundingClientRect();
        const at = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
        return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                vw: innerWidth, vh: innerHeight, reached: !!at && (at === e || e.contains(at))};
    """, css)


def assert_reachable(br, css: str) -> None:
    h = hit(br, css)
    assert h["reached"] and 0 <= h["top"] and h["bottom"] <= h["vh"] \
        and 0 <= h["left"] and h["right"] <= h["vw"], (css, h)


# ---- 1366x768 ----------------------------------------------------------------
def test_key_form_keeps_its_actions_in_view_and_shows_disabled_fields(relay, env, b):
    b.get(relay.url + "/console/keys")
    b.find("#keys-table tbody tr")
    assert b.js("return [innerWidth, innerHeight]") == [1366, 768]
    b.click("#new-key")
    b.type("#k-name", "layout-key")
    b.find("#k-lock").click()
    b.wait(lambda d: len(b.all("#k-models-list input")) >= 2, what="models")
    b.type("#k-ips", "127.0.0.1\n10.0.0.0/8\n::1\n192.0.2.0/24\n198.51.100.7")
    for css in ("#key-save", "#key-cancel", "#k-billing", "#k-expiry"):
        assert_reachable(b, css)
    # Scrolled either way, Save stays where it can be pressed.
    for where in ("scrollHeight", "0"):
        b.js(f"const d = document.querySelector('#key-dialog'); d.scrollTop = "
             f"{'d.scrollHeight' if where != '0' else 0};")
        assert_reachable(b, "#key-save")

    def look(css):
        return b.js("const s = getComputedStyle(document.querySelector(arguments[0]));"
                    "return [s.backgroundColor, s.borderTopStyle, s.color];", css)
    enabled = look("#k-quota")
    quota_label = b.js("return getComputedStyle(document.querySelector(\"label[for='k-quota']\")).color")
    b.find("#k-unlimited").click()
    assert not b.find("#k-quota").is_enabled()
    disabled = look("#k-quota")
    assert disabled[0] != enabled[0] and disabled[1] == "dashed" and disabled[2] != enabled[2]
    assert b.js("return getComputedStyle(document.querySelector(\"label[for='k-quota']\")).color") \
        != quota_label
    b.find("#k-models-list input[value='gpt-4o-mini']").click()
    b.screenshot("key-form-long")
    b.click("#key-save")
    b.visible("#key-created-value")
    b.click("#key-created-close")
    b.wait(lambda d: "layout-key" in b.texts("#keys-table td.name"), what="the new row")
    lines = line_counts(b, "#keys-table td.name")
    assert all(n == 1 for _, n in lines), lines
    no_script_errors(b)


def test_chat_send_button_is_on_screen_however_long_the_talk(relay, env, b):
    b.get(relay.url + "/console/chat")
    b.find("body[data-ready='1']")
    assert_reachable(b, "#chat-send")
    b.js("""const log = document.querySelector('#chat-log');
            for (let i = 0; i < 40; i++) {
              const m = document.createElement('div'); m.className = 'msg assistant';
              m.textContent = 'A long conversation, line ' + i; log.append(m);
            }""")
    assert_reachable(b, "#chat-send")
    b.screenshot("chat-1366")
    b.js("window.scrollTo(0, document.body.scrollHeight)")
    assert_reachable(b, "#chat-send")
    no_script_errors(b)


def test_usage_status_filter_shows_a_hint_not_a_value(relay, env, b):
    b.get(relay.url + "/console/usage")
    field = b.find("#f-status")
    assert field.get_attribute("value") == ""
    assert "Any" in field.get_attribute("placeholder")
    hint = b.js("const s = getComputedStyle(document.querySelector('#f-status'), '::placeholder');"
                "return [s.fontStyle, s.color];")
    typed = b.js("return getComputedStyle(document.querySelector('#f-status')).color")
    assert hint[0] == "italic" and hint[1] != typed


# ---- 390x844 -----------------------------------------------------------------
def test_phone_tables_are_cards_with_reachable_actions(relay, env, upstream):
    env["api"].create_token("production-backend-service", remain_quota=1_000_000)
    env["api"].create_token("staging", unlimited_quota=True, allow_ips="10.0.0.0/8")
    make_usage(relay, env)
    br = chromium.Browser(width=390, height=844)
    try:
        br.login(relay.url, "dora", PASSWORD)
        for path, table, shot in (("/console/keys", "#keys-table", "phone-keys"),
                                  ("/console/usage", "#usage-table", "phone-usage")):
            br.get(relay.url + path)
            br.wait(lambda d: br.all(f"{table} tbody tr[data-id]"), what=f"rows of {table}")
            time.sleep(0.5)
            assert br.js("return [innerWidth, innerHeight]") == [390, 844]
            sizes = br.js("""
                const w = document.querySelector(arguments[0]).closest('.table-wrap');
                return [document.documentElement.scrollWidth - innerWidth,
                        w.scrollWidth - w.clientWidth];""", table)
            assert sizes[0] <= 1 and sizes[1] <= 1, f"{path} scrolls sideways by {sizes}"
            # Every row's actions: inside the screen, and a tap reaches them.
            buttons = len(br.all(f"{table} td.actions button"))
            for i in range(buttons):
                r = br.js("""const e = document.querySelectorAll(arguments[0])[arguments[1]];
                    e.scrollIntoView({block: 'center'});
                    const r = e.getBoundingClientRect();
                    const at = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
                    return [r.left, r.right, !!at && (at === e || e.contains(at))];""",
                          f"{table} td.actions button", i)
                assert r[0] >= 0 and r[1] <= 390 and r[2], (path, i, r)
            # Names stay whole: each fits on one line.
            lines = line_counts(br, f"{table} td.name")
            assert lines and all(n == 1 for _, n in lines), lines
            # Each value carries its column's name (the header row is hidden).
            assert br.js("return getComputedStyle(document.querySelector(arguments[0] + ' td'),"
                         " '::before').content", table).strip('"')
            br.js("document.querySelector(arguments[0]).scrollIntoView()", table)
            br.screenshot(shot)
        br.get(relay.url + "/console/keys")
        br.press("#keys-table tbody tr", "staging", "button.edit")
        br.visible("#key-save")
        assert_reachable(br, "#key-save")
        br.screenshot("phone-key-form")
        no_script_errors(br)
    finally:
        br.quit()


# ---- accounts ----------------------------------------------------------------
def test_password_change_on_the_account_page(relay, admin):
    admin.create_user("pat", PASSWORD)
    br = chromium.Browser()
    try:
        br.login(relay.url, "pat", PASSWORD)
        br.click("#nav a[href='/console/account']")
        br.find("body[data-ready='1']")
        br.type("#pw-current", "not-my-password")
        br.type("#pw-new", NEW_PASSWORD)
        br.type("#pw-again", NEW_PASSWORD)
        br.click("#password-save")
        br.wait(lambda d: "current password is wrong" in br.text("#password-status"),
                what="wrong current password")
        br.type("#pw-current", PASSWORD)
        br.type("#pw-again", NEW_PASSWORD + "x")
        br.click("#password-save")
        br.wait(lambda d: "differ" in br.text("#password-status"), what="mismatch")
        br.type("#pw-new", "short")
        br.type("#pw-again", "short")
        br.click("#password-save")
        br.wait(lambda d: "8 characters" in br.text("#password-status"), what="too short")
        br.type("#pw-new", NEW_PASSWORD)
        br.type("#pw-again", NEW_PASSWORD)
        br.click("#password-save")
        br.wait(lambda d: "Password changed" in br.text("#password-status"), what="changed")
        assert br.find("#pw-current").get_attribute("value") == ""
        br.screenshot("account")
        # Still signed in here (the session was renewed); the old password is gone.
        br.get(relay.url + "/console/keys")
        assert br.driver.current_url.endswith("/console/keys")
        assert requests.post(relay.url + "/api/user/login", json={
            "username": "pat", "password": PASSWORD}).status_code == 401
        Api.login(relay.url, "pat", NEW_PASSWORD)
        no_script_errors(br)
    finally:
        br.quit()


def test_admin_reset_makes_the_user_choose_a_new_password(relay, admin, admin_b):
    admin.create_user("quill", PASSWORD)
    admin_b.get(relay.url + "/console/admin/users")
    row = admin_b.wait(lambda d: [r for r in admin_b.all("#users-table tbody tr")
                                  if r.get_attribute("data-name") == "quill"], what="row")[0]
    row.find_element("css selector", "button.reset").click()
    admin_b.driver.switch_to.alert.accept()
    temp = admin_b.visible("#reset-value").text
    assert len(temp) >= 16
    admin_b.screenshot("admin-reset-password")
    admin_b.click("#reset-close")
    br = chromium.Browser()
    try:
        br.get(relay.url + "/console/keys")
        br.type("#username", "quill")
        br.type("#password", temp)
        br.click("#login-submit")
        br.wait(lambda d: "/console/account?next=" in d.current_url, what="sent to Account")
        assert "set by someone else" in br.visible("#must-change").text
        br.screenshot("account-must-change")
        br.get(relay.url + "/console/usage")  # nothing else opens until it is changed
        assert "/console/account?next=" in br.driver.current_url
        br.type("#pw-current", temp)
        br.type("#pw-new", NEW_PASSWORD)
        br.type("#pw-again", NEW_PASSWORD)
        br.click("#password-save")
        br.wait(lambda d: d.current_url.endswith("/console/usage"), what="back where it was going")
        br.find("#live-dot.open")
        no_script_errors(br)
    finally:
        br.quit()


# ---- notifications -----------------------------------------------------------
def test_webhook_preview_carries_the_live_balance_and_the_forms_threshold(relay, env, b):
    make_usage(relay, env)  # this relay process now holds a lease of dora's balance
    b.get(relay.url + "/console/notify")
    b.find("body[data-ready='1']")
    assert "every channel" in b.text("#marketing-help")
    assert "No notifications sent yet" in b.text("#deliveries")
    b.click("#new-sub")
    b.type("#s-name", "low balance")
    b.find("#ev-user").click()
    b.type("#s-user-threshold", "0.5")
    Select(b.find("#s-channel")).select_by_value("webhook")
    b.type("#channel-fields [data-field='url']", "http://127.0.0.1:9/hook")
    b.type("#channel-fields [data-field='body_template']",
           '{"balance": "{{ balance }}", "threshold": "{{ threshold }}"}')
    b.click("#preview-btn")
    b.wait(lambda d: b.all("#preview-vars dd[data-var='balance']"), what="preview")
    live = env["api"].get("/api/user/self")["data"]["quota"]
    assert b.text("#preview-vars dd[data-var='balance']") == str(live)
    assert b.text("#preview-vars dd[data-var='threshold']") == "250000"
    assert json.loads(b.text("#preview-out")) == {"balance": str(live), "threshold": "250000"}
    assert quota_of(b) == live
    b.js("document.querySelector('#preview-out').scrollIntoView({block: 'center'})")
    b.screenshot("notifications")
    b.click("#sub-save")
    row = b.wait(lambda d: b.all("#subs-table tbody tr[data-id]"), what="saved row")[0]
    assert "below 0.50" in row.find_element("css selector", "td.events").text
    no_script_errors(b)


def test_warnings_are_limited_to_one_per_rolling_hour(mongo_url, tmp_path):
    shift = tmp_path / "clock-shift"
    # The notifier's time starts 5 minutes before a whole hour.
    now = time.time()
    boundary = math.ceil(now / 3600) * 3600 + 3600
    shift.write_text(str(boundary - 300 - now))
    proc = RelayProcess(mongo_url, str(tmp_path / "relay"), script="tests/clocked_server.py",
                        env={"NOTIFY_CLOCK_SHIFT": str(shift), "RELAY_NOTIFY_POLL_INTERVAL": "0.2"})
    hook = WebhookReceiver()
    br = chromium.Browser()
    try:
        proc.start()
        root = Api.login(proc.url, "root", ADMIN_PASSWORD)
        user = root.create_user("wren", PASSWORD, quota=1_000_000)
        api = Api.login(proc.url, "wren", PASSWORD)
        api.post("/api/subscription/", {
            "name": "wallet", "event_types": ["user_quota_warning"], "user_threshold": 500_000,
            "channel_type": "webhook", "channel_config": {"url": hook.url}})

        def dip() -> None:
            """The balance falls below the threshold, then is topped up again."""
            for amount in (-600_000, 600_000):
                root.post(f"/api/user/{user['id']}/quota", {"amount": amount, "reason": "test"})

        def move_to(t: float) -> None:
            shift.write_text(str(t - time.time()))

        def delivered() -> list:
            return api.get("/api/notify/deliveries")["data"]["items"]

        br.login(proc.url, "wren", PASSWORD)
        dip()
        br.wait(lambda d: len(hook.received) == 1, what="the first warning")
        first = delivered()[0]["created_at"]   # the notifier's time of the first warning
        assert first < boundary - 60
        move_to(boundary + 60)                  # a new clock hour, minutes later
        dip()
        move_to(first + 3540)                   # 59 minutes after the first
        dip()
        time.sleep(2.0)
        assert len(hook.received) == 1 and len(delivered()) == 1
        br.get(proc.url + "/console/notify")
        br.find("body[data-ready='1']")
        assert len(br.all("#deliveries li[data-status]")) == 1
        move_to(first + 3601)                   # 60 minutes after the first
        dip()
        br.wait(lambda d: len(hook.received) == 2, what="the second warning")
        assert [json.loads(h["body"])["event_type"] for h in hook.received] == [
            "user_quota_warning"] * 2
        assert delivered()[0]["created_at"] >= first + 3600
        br.driver.refresh()
        br.wait(lambda d: len(br.all("#deliveries li[data-status='sent']")) == 2,
                what="two sent deliveries listed")
        br.screenshot("notify-rolling-hour")
        no_script_errors(br)
    finally:
        br.quit()
        hook.stop()
        proc.stop()
