"""The console in a real browser, a user's flows: Debian's headless
Chromium driven by selenium against a real relay process, a fake upstream
and a local webhook receiver.  Saves screenshots of the main pages to
test-artifacts/tmp/screenshots/ (tests/ui/browser.py says how to refresh the
README's pictures)."""
from __future__ import annotations

import base64
import re

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from tests.ui import browser as chromium
from tests.ui.console_env import (EMAIL, MARKS, PASSWORD, PNG_1PX, WebhookReceiver,
                               ensure_browser_key, make_usage, no_script_errors, own_requests,
                               quota_of)
from tests.ui.console_env import b, env, upstream  # noqa: F401  (fixtures)

pytestmark = MARKS


@pytest.fixture
def fresh_b():
    br = chromium.Browser()
    yield br
    br.quit()


def test_login_shows_errors_then_signs_in_by_email_with_the_keyboard(relay, env, fresh_b):
    b = fresh_b
    b.get(relay.url + "/console/keys")
    assert "/console/login?next=" in b.driver.current_url
    b.type("#username", "dora")
    b.type("#password", "wrong-password")
    b.click("#login-submit")
    b.wait(lambda d: "Wrong user name or password" in b.text("#login-status"), what="error")
    b.screenshot("login")
    # Keyboard only: the e-mail address instead of the user name, Tab, Enter.
    field = b.find("#username")
    field.clear()
    field.send_keys(EMAIL, Keys.TAB)
    active = b.driver.switch_to.active_element
    assert active.get_attribute("id") == "password"
    active.clear()
    active.send_keys(PASSWORD, Keys.ENTER)
    b.wait(lambda d: d.current_url.endswith("/console/keys"), what="redirect back to keys")
    b.find("#live-dot.open")
    no_script_errors(b)


def test_dashboard_plots_usage_and_times_base_addresses(relay, env, b, upstream):
    make_usage(relay, env)
    b.get(relay.url + "/console/")
    chart = b.find("#chart canvas")  # uPlot draws on a canvas
    assert chart.size["width"] > 200
    b.wait(lambda d: {"gpt-4o", "gpt-4o-mini"} <= set(
        b.find("#chart").get_attribute("data-models").split(",")), what="a series per model")
    assert b.find("#chart").get_attribute("data-points") == "30"
    models = b.find("#chart").get_attribute("data-models").split(",")
    assert len(b.all("#chart .u-legend .u-series")) == 2 + len(models)  # time, total, models
    row = b.wait(lambda d: b.all("#bases tbody tr[data-ms]"), what="a measured latency")[0]
    assert row.get_attribute("data-url") == relay.url
    assert "ms" in row.text and "fastest" in row.text
    b.wait(lambda d: b.text("#requests-30") == str(own_requests(env)), what="request count")
    b.screenshot("dashboard")
    no_script_errors(b)


# ---- keys ----------------------------------------------------------------------
def test_create_key_with_group_allow_list_and_model_lock(relay, env, b):
    b.get(relay.url + "/console/keys")
    b.find("#keys-table tbody tr")
    b.click("#new-key")
    b.type("#k-name", "browser-key")
    Select(b.find("#k-group")).select_by_value("origin")
    b.wait(lambda d: b.text("#k-group-info").startswith("×1 on every call."),
           what="group rate shown")
    b.find("#k-unlimited").click()
    assert not b.find("#k-quota").is_enabled()
    b.type("#k-ips", "127.0.0.1\n300.1.2.3")
    b.wait(lambda d: "300.1.2.3" in b.text("#k-ips-error"), what="IP validation")
    b.type("#k-ips", "127.0.0.1\n10.0.0.0/8\n::1")
    assert b.text("#k-ips-error") == ""
    b.find("#k-lock").click()
    b.wait(lambda d: len(b.all("#k-models-list input")) == 2, what="models of the group")
    b.find("#k-models-list input[value='gpt-4o-mini']").click()
    b.type("#k-rpm", "60")
    b.type("#k-conc", "4")
    b.screenshot("key-form")
    b.click("#key-save")
    created = b.visible("#key-created-value")
    assert created.text.startswith("sk-")
    b.click("#key-created-close")
    row = b.wait(lambda d: [r for r in b.all("#keys-table tbody tr")
                            if r.get_attribute("data-name") == "browser-key"], what="row")[0]
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[2] == "origin" and cells[3] == "Unlimited"
    assert cells[6] == "127.0.0.1, 10.0.0.0/8, ::1" and cells[7] == "gpt-4o-mini"
    assert "*" in row.find_element(By.CSS_SELECTOR, ".masked").text  # masked in the table
    tok = [k for k in env["api"].get("/api/token/")["data"]["items"] if k["name"] == "browser-key"][0]
    assert tok["group"] == "origin" and tok["model_limits_enabled"] and tok["model_limits"] == "gpt-4o-mini"
    assert tok["allow_ips"] == "127.0.0.1\n10.0.0.0/8\n::1" and tok["unlimited_quota"]
    assert (tok["rpm_limit"], tok["tpm_limit"], tok["concurrency_limit"]) == (60, 0, 4)
    b.screenshot("keys")
    no_script_errors(b)


def test_chat_button_streams_a_reply_and_the_balance_ticks_down(relay, env, b, upstream, admin,
                                                                 tmp_path):
    ensure_browser_key(env)
    b.get(relay.url + "/console/keys")
    b.press("#keys-table tbody tr", "browser-key", "button.chat")
    b.wait(lambda d: "/console/chat?" in d.current_url, what="chat page")
    b.find("body[data-ready='1']")
    assert b.find("#chat-model").get_attribute("value") == "gpt-4o-mini"
    assert b.find("#chat-base").get_attribute("value") == relay.url
    assert Select(b.find("#chat-key")).first_selected_option.text.startswith("browser-key")
    b.wait(lambda d: quota_of(b) > 0, what="balance")
    before = quota_of(b)
    sent_before = len(upstream.requests)
    b.type("#chat-text", "Say hello")
    b.click("#chat-send")
    reply = b.find(".msg.assistant[data-done='1']", timeout=60)
    assert "Hello from the fake upstream." in reply.text
    assert upstream.requests[sent_before:][-1]["body"]["model"] == "gpt-4o-mini"
    # The balance changes without a reload: pushed over the websocket.
    b.wait(lambda d: 0 <= quota_of(b) < before, what="balance to tick down")
    b.screenshot("chat")
    # An admin's adjustment shows up live too.
    now = quota_of(b)
    admin.post(f"/api/user/{env['user']['id']}/quota", {"amount": 500_000, "reason": "gift"})
    b.wait(lambda d: quota_of(b) == now + 500_000, what="pushed adjustment")
    # The conversation survives a reload (kept in the browser).
    b.driver.refresh()
    b.wait(lambda d: len(b.all(".msg")) == 2, what="history restored")
    # An uploaded image goes to the model as a data URL, with the history.
    png = tmp_path / "dot.png"
    png.write_bytes(base64.b64decode(PNG_1PX))
    b.find("body[data-ready='1']")
    b.find("#chat-image").send_keys(str(png))
    b.wait(lambda d: b.text("#chat-image-name") == "dot.png", what="image read")
    b.type("#chat-text", "What is in this picture?")
    b.click("#chat-send")
    b.wait(lambda d: len(b.all(".msg")) == 4 and b.all(".msg")[-1].get_attribute("data-done"),
           timeout=60, what="the reply about the picture")
    assert b.find(".msg.user img.chat-img").get_attribute("src").startswith("data:image/png")
    sent = upstream.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"][1]["image_url"]["url"] == "data:image/png;base64," + PNG_1PX
    no_script_errors(b)


def test_stop_button_cancels_a_reply(relay, env, b):
    key = env["api"].create_token("stopper", unlimited_quota=True)
    b.get(relay.url + f"/console/chat?key_id={key['id']}&model=slow-model")
    b.find("body[data-ready='1']")
    b.click("#chat-clear")
    b.type("#chat-text", "Tell me a long story")
    b.click("#chat-send")
    # The slow upstream waits a second before each piece: stop after the first.
    b.wait(lambda d: b.all(".msg.assistant.streaming")
           and b.find(".msg.assistant .body").text.strip(), timeout=60, what="first piece")
    assert not b.find("#chat-send").is_enabled()
    b.click("#chat-stop")
    b.wait(lambda d: "Stopped." in b.find(".msg.assistant").text, timeout=60, what="stopped")
    assert b.find("#chat-send").is_enabled() and not b.find("#chat-stop").is_enabled()
    assert "Hello from the fake upstream." not in b.find(".msg.assistant").text
    no_script_errors(b)


def test_keys_edit_disable_enable_delete(relay, env, b):
    env["api"].create_token("throwaway", remain_quota=1_000_000)
    b.get(relay.url + "/console/keys")

    def row():
        return next((r for r in b.all("#keys-table tbody tr") if r.get_attribute("data-name") in
                     ("throwaway", "renamed")), None)
    b.wait(lambda d: row(), what="row")

    def press(button: str, name: str = "renamed") -> None:
        b.press("#keys-table tbody tr", name, button)

    assert row().find_element(By.CSS_SELECTOR, ".remain").text == "2.00"
    # Renaming alone keeps the quota, even if the key spent while the form was open.
    press("button.edit", "throwaway")
    b.type("#k-name", "renamed")
    tok = [k for k in env["api"].get("/api/token/")["data"]["items"] if k["name"] == "throwaway"][0]
    env["api"].put("/api/token/", {"id": tok["id"], "remain_quota": 900_000})  # spent meanwhile
    b.click("#key-save")
    b.wait(lambda d: (r := row()) and r.get_attribute("data-name") == "renamed", what="renamed")
    assert [k for k in env["api"].get("/api/token/")["data"]["items"]
            if k["id"] == tok["id"]][0]["remain_quota"] == 900_000
    press("button.edit")
    b.type("#k-quota", "3")
    b.click("#key-save")
    b.wait(lambda d: (r := row()) and r.get_attribute("data-name") == "renamed"
           and r.find_element(By.CSS_SELECTOR, ".remain").text == "3.00", what="edited")
    press("button.toggle")
    b.wait(lambda d: (r := row()) and "Disabled" in r.text, what="disabled")
    press("button.toggle")
    b.wait(lambda d: (r := row()) and "Enabled" in r.text, what="enabled")
    press("button.delete")
    b.driver.switch_to.alert.accept()
    b.wait(lambda d: not [r for r in b.all("#keys-table tbody tr")
                          if r.get_attribute("data-name") == "renamed"], what="deleted")
    assert "renamed" not in [k["name"] for k in env["api"].get("/api/token/")["data"]["items"]]
    no_script_errors(b)


def test_budgets_show_as_bars_on_keys_the_account_and_the_dashboard(relay, env, b):
    api = env["api"]
    tok = api.create_token("budgeted", remain_quota=1_000_000, budgets={"day": 1_000_000})
    r = requests.post(relay.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    b.get(relay.url + "/console/keys")
    bar = b.wait(lambda d: b.all("#keys-table tbody tr[data-name='budgeted'] .budget"),
                 what="the key's bar")[0]
    assert bar.text.startswith("Today: ") and bar.text.endswith(" of 2.00"), bar.text
    assert bar.find_element(By.CSS_SELECTOR, "progress").get_attribute("max") == "1000000"
    b.get(relay.url + "/console/account")
    b.wait(lambda d: b.find("#b-timezone").get_attribute("value") == "UTC", what="the zone")
    b.type("#b-timezone", "Mars/Olympus")
    b.click("#budget-save")
    b.wait(lambda d: "IANA" in b.text("#budget-status"), what="an unknown zone refused")
    b.type("#b-timezone", "Asia/Shanghai")
    b.type("#b-week", "5")
    b.click("#budget-save")
    b.wait(lambda d: b.all("#b-bars .budget"), what="the account's bar")
    me = api.get("/api/user/self")["data"]
    assert me["timezone"] == "Asia/Shanghai" and me["budgets"] == {"week": 2_500_000}
    b.get(relay.url + "/console/")
    b.wait(lambda d: "This week: " in b.text("#budget-bars"), what="the dashboard's bar")
    no_script_errors(b)
    api.put("/api/user/self", {"budgets": {}, "timezone": "UTC"})
    api.delete(f"/api/token/{tok['id']}")


def test_markdown_renders_safely(relay, b):
    b.get(relay.url + "/console/chat")
    b.find("body[data-ready='1']")
    out = b.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/js/markdown.js').then((m) => {
          const box = document.createElement('div');
          box.append(m.render('<img src=x onerror="window.pwned=1"> **bold** [x](javascript:alert(1))\\n'
            + '```js\\nconst a = "<b>";\\n```\\n- one\\n- two'));
          done({html: box.innerHTML, imgs: box.querySelectorAll('img').length,
                code: box.querySelector('pre code').textContent,
                strong: box.querySelector('strong') && box.querySelector('strong').textContent,
                links: box.querySelectorAll('a').length, items: box.querySelectorAll('li').length,
                pwned: !!window.pwned});
        });
    """)
    assert out["imgs"] == 0 and not out["pwned"] and out["links"] == 0
    assert out["code"] == 'const a = "<b>";' and out["strong"] == "bold" and out["items"] == 2
    assert "&lt;img" in out["html"]


def test_usage_page_filters_and_exports(relay, env, b):
    key = env["api"].create_token("parts", unlimited_quota=True)
    r = requests.post(relay.url + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {key['key']}"},
                      json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
                            "fake_usage": {"prompt_tokens": 1200, "completion_tokens": 30,
                                           "cached_tokens": 1024}}, timeout=60)
    assert r.status_code == 200
    rid = r.headers["X-Request-Id"]
    make_usage(relay, env)  # and waits for the records
    b.get(relay.url + "/console/usage")
    b.wait(lambda d: len(b.texts("#usage-table tbody tr[data-id]")) == own_requests(env),
           what="records")
    # a call's usage parts beyond text in and out are shown with it
    cell = f"#usage-table tbody tr[data-id='{rid}'] td:nth-child(4)"
    text = re.sub(r"(?<=\d)[^\d\s/](?=\d{3})", "", b.text(cell))  # no thousands separator
    assert text.split() == ["1200", "/", "30", "1024", "cached"], b.text(cell)
    b.type("#f-model", "gpt-4o-mini")
    b.click("#usage-filter button[type='submit']")
    b.wait(lambda d: all("gpt-4o-mini" in t for t in b.texts("#usage-table tbody tr"))
           and b.text("#t-requests") == str(own_requests(env, "gpt-4o-mini")),
           what="filtered records")
    href = b.find("#usage-csv").get_attribute("href")
    assert "/api/log/self/export?" in href and "model=gpt-4o-mini" in href
    b.screenshot("usage")
    no_script_errors(b)


def test_redeem_a_code(relay, env, b, admin):
    code = admin.post("/api/redemption/", {"name": "promo", "quota": 1_000_000, "count": 1})["data"][0]
    b.get(relay.url + "/console/topup")
    assert "Pay 0.7 per credit (30.0% off" in b.text("#purchase-rate")
    b.wait(lambda d: quota_of(b) > 0, what="balance")
    before = quota_of(b)
    b.type("#redeem-code", code)
    b.click("#redeem-submit")
    b.wait(lambda d: "Added 2.00 credits" in b.text("#redeem-status"), what="redeemed")
    b.wait(lambda d: quota_of(b) == before + 1_000_000, what="new balance")
    b.screenshot("topup")
    b.type("#redeem-code", code)
    b.click("#redeem-submit")
    b.wait(lambda d: "already been used" in b.text("#redeem-status"), what="second use refused")
    no_script_errors(b)


def test_notification_subscription_and_test_to_a_local_webhook(relay, env, b):
    hook = WebhookReceiver()
    try:
        b.get(relay.url + "/console/notify")
        b.find("body[data-ready='1']")
        b.click("#new-sub")
        b.type("#s-name", "ops hook")
        b.find("#ev-announcement").click()
        b.find("#ev-user").click()
        b.type("#s-user-threshold", "1.5")
        Select(b.find("#s-channel")).select_by_value("webhook")
        b.type("#channel-fields [data-field='url']", hook.url)
        b.type("#channel-fields [data-field='body_template']",
               '{"text": "{{title}}"}')
        b.click("#preview-btn")
        b.wait(lambda d: b.text("#preview-out") != "", what="preview")
        b.js("document.querySelector('#preview-out').scrollIntoView({block: 'center'})")
        b.screenshot("notifications-test")
        b.click("#sub-save")
        row = b.wait(lambda d: b.all("#subs-table tbody tr[data-id]"), what="saved row")[0]
        assert "ops hook" in row.text
        sub = env["api"].get("/api/subscription/")["data"]
        sub = (sub if isinstance(sub, list) else sub["items"])[0]
        assert sub["event_types"] == ["announcement", "user_quota_warning"]
        assert sub["user_threshold"] == 750_000 and sub["channel_type"] == "webhook"
        row.find_element(By.CSS_SELECTOR, "button.test").click()
        b.wait(lambda d: hook.received, timeout=60, what="the test delivery")
        b.find("#subs-table tr[data-test='sent']")
        assert hook.received[0]["path"] == "/hook"
        no_script_errors(b)
    finally:
        hook.stop()


def test_account_lists_sessions_signs_one_out_and_then_everywhere(relay, admin, fresh_b):
    admin.create_user("wren", PASSWORD)
    phone = requests.Session()  # another browser of the same account
    r = phone.post(relay.url + "/api/user/login", json={"username": "wren", "password": PASSWORD},
                   headers={"User-Agent": "PhoneBrowser/1.0"})
    assert r.status_code == 200, r.text
    laptop = requests.Session()
    r = laptop.post(relay.url + "/api/user/login", json={"username": "wren", "password": PASSWORD},
                    headers={"User-Agent": "LaptopBrowser/2.0"})
    assert r.status_code == 200, r.text
    b = fresh_b
    b.login(relay.url, "wren", PASSWORD)
    b.get(relay.url + "/console/account")
    b.find("body[data-ready='1']")
    rows = b.wait(lambda d: len(b.texts("#sessions-table tbody tr")) == 3
                  and b.texts("#sessions-table tbody tr"), what="three sessions")
    assert sum("This browser" in r for r in rows) == 1
    assert any("PhoneBrowser/1.0" in r for r in rows) and any("LaptopBrowser/2.0" in r for r in rows)
    # One other browser signed out: its cookie is refused at once.
    phone_id = [s["id"] for s in requests.get(relay.url + "/api/user/sessions",
                                              cookies=phone.cookies).json()["data"]
                if s["agent"] == "PhoneBrowser/1.0"][0]
    b.click(f"#sessions-table tr[data-id='{phone_id}'] button.end")
    b.wait(lambda d: len(b.texts("#sessions-table tbody tr")) == 2, what="two sessions left")
    assert phone.get(relay.url + "/api/user/self").status_code == 401
    assert laptop.get(relay.url + "/api/user/self").status_code == 200
    # Everywhere: this browser goes to the sign-in page, the laptop is out too.
    b.click("#sign-out-everywhere")
    b.driver.switch_to.alert.accept()
    b.wait(lambda d: "/console/login" in d.current_url, what="the sign-in page")
    assert laptop.get(relay.url + "/api/user/self").status_code == 401
    b.get(relay.url + "/console/account")
    assert "/console/login" in b.driver.current_url
    no_script_errors(b)
