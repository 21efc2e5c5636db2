"""The console in Chinese, in a real browser whose language is zh-CN: every
page (and the key and subscription forms) at 1366x768 and at a phone's
390x844 shows no English the console wrote (beyond a short allow-list of
names and units), has no script errors, no text sticking out of the screen
or clipped, no button or menu entry broken over two lines, and dates and
numbers in the locale.  The header's switch changes the language (cookie
and account).  Screenshots go to test-artifacts/tmp/screenshots/zh-*.png."""
from __future__ import annotations

import json
import re
import time

import pytest
import requests
from selenium.webdriver.support.ui import Select

from console import strings
from models import netlist
from tests.ui import browser as chromium
from tests.ui.console_env import MARKS, WebhookReceiver, no_script_errors
from tests.ui.console_env import upstream  # noqa: F401  (fixture)
from tests.helpers import ADMIN_PASSWORD

pytestmark = MARKS

# Latin words the Chinese console may show in its own text: names of
# products, protocols and units, and words vendors' Chinese pages keep too.
ALLOWED_WORDS = {
    "API", "ID", "IP", "CIDR", "CSV", "URL", "UID", "JSON", "HTTP", "Token", "Webhook", "Bot",
    "Chat", "CorpID", "AgentId", "Secret", "SendKey", "WxPusher", "Server", "Telegram",
    "Signature", "Retry", "After", "Ctrl", "Enter", "sk", "MB", "ms", "Base", "UTC",
    "English",  # the switch names each language in its own words
}
# Elements whose text the console writes (not data: names, models, messages).
CHROME = ("h1, h2, th, button, legend, summary, label, .label, .stat > span, nav a, .badge, "
          "p.muted, .form-status, td.empty, option")
# What must stay on one line (a button or a menu entry broken in two, a name).
ONE_LINE = ("button, nav a, th, .badge, h1, .stat > span, legend, summary, td.name, "
            ".row > .check label")
# Data shown in those elements: model checkboxes, a group's description, the
# catalogue's package name, a user's own entries.
DATA = (".model-list, #k-group-info, #catalogue-version, .msg, #chat-image-name, #preview-vars, "
        ".u-legend .u-series:nth-child(n+3), "  # the chart's models (the date and total are ours)
        "#k-group, #chat-key, #f-key, #s-keys, #p-group, datalist, #lang-switch")  # names

# (path, screenshot at 1366x768, at 390x844, an action that opens a form)
PAGES = [
    ("/console/", "zh-dashboard", "zh-phone-dashboard", None),
    ("/console/keys", "zh-keys", "zh-phone-keys", None),
    ("/console/keys", "zh-key-form", "zh-phone-key-form", "#new-key"),
    ("/console/chat", "zh-chat", "zh-phone-chat", None),
    ("/console/usage", "zh-usage", "zh-phone-usage", None),
    ("/console/topup", "zh-topup", "zh-phone-topup", None),
    ("/console/notify", "zh-notify", "zh-phone-notify", None),
    ("/console/notify", "zh-notify-form", "zh-phone-notify-form", "#new-sub"),
    ("/console/account", "zh-account", "zh-phone-account", None),
    ("/console/admin/users", "zh-admin-users", "zh-phone-admin-users", None),
    ("/console/admin/codes", "zh-admin-codes", "zh-phone-admin-codes", None),
    ("/console/admin/groups", "zh-admin-groups", "zh-phone-admin-groups", None),
    ("/console/admin/prices", "zh-admin-prices", "zh-phone-admin-prices", None),
    ("/console/admin/channels", "zh-admin-channels", "zh-phone-admin-channels", None),
    ("/console/admin/announcements", "zh-admin-announcements", "zh-phone-admin-announcements",
     None),
    ("/console/admin/settings", "zh-admin-settings", "zh-phone-admin-settings", None),
]
SIGNED_OUT = [("/console/login", "zh-login", "zh-phone-login"),
              ("/console/register", "zh-register", "zh-phone-register")]

# Counts the page's fetches in flight, so that a check runs once the page has
# drawn what it loads (the pages fetch from /api after they open).
TRACK_FETCHES = """
window.__pending = 0;
const f = window.fetch;
window.fetch = function (...args) {
  window.__pending += 1;
  return f.apply(this, args).finally(() => { window.__pending -= 1; });
};
"""

# What the page shows: its text, its attributes that people read, and the
# text of the elements the console writes, each with its line count.
LOOK = """
const chrome = arguments[0], data = arguments[1], oneLine = arguments[2];
const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden'
  && !e.closest('.sr-only, .offscreen, .skip');
// Lines of text: the boxes of its text, a new line where one starts below
// the last one's bottom (a marker or a mix of fonts is not a second line).
const lines = (e) => {
  const boxes = [];
  const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (!n.textContent.trim()) continue;
    const rg = document.createRange(); rg.selectNodeContents(n);
    boxes.push(...[...rg.getClientRects()].filter((r) => r.width > 0));
  }
  boxes.sort((a, b) => a.top - b.top);
  let count = 0, bottom = -Infinity;
  for (const r of boxes) { if (r.top >= bottom - 2) { count += 1; bottom = r.bottom; } else bottom = Math.max(bottom, r.bottom); }
  return count;
};
// An element's text without the data inside it (a version number in a sentence).
const own = (e) => {
  if (e.tagName === 'OPTION' || !e.querySelector(data)) return (e.tagName === 'OPTION' ? e.textContent : e.innerText).trim();
  const c = e.cloneNode(true);
  c.querySelectorAll(data).forEach((x) => x.remove());
  return c.textContent.trim();
};
const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (typeof e.className === 'string' && e.className ? '.' + e.className : '');
const attrs = [];
for (const e of document.querySelectorAll('[placeholder], [aria-label], [title], [alt]')) {
  for (const a of ['placeholder', 'aria-label', 'title', 'alt']) {
    if (e.hasAttribute(a) && !e.closest(data)) attrs.push(e.getAttribute(a));
  }
}
return {
  title: document.title, lang: document.documentElement.lang,
  text: document.body.innerText, attrs,
  chrome: [...document.querySelectorAll(chrome)]
    .filter((e) => (e.tagName === 'OPTION' ? shown(e.parentElement) : shown(e)) && !e.closest(data))
    .map((e) => [name(e), own(e)]),
  lines: [...document.querySelectorAll(oneLine)].filter(shown)
    .map((e) => [name(e), e.innerText.trim(), lines(e)]).filter((x) => x[2] > 1),
};
"""

# Whatever sticks out of the screen (and is not inside something that
# scrolls sideways on purpose, as a wide table does), or is cut off.
FIT = """
const vw = innerWidth;
const scrolls = (e) => {
  for (let a = e.parentElement; a; a = a.parentElement) {
    const o = getComputedStyle(a).overflowX;
    if (o === 'auto' || o === 'scroll') return true;
  }
  return false;
};
const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '');
// Clipped away on purpose (a phone's card table hides its header row so).
const clipped = (e) => {
  for (let a = e; a; a = a.parentElement) if (getComputedStyle(a).clip.startsWith('rect(0')) return true;
  return false;
};
const out = [];
if (document.documentElement.scrollWidth > vw + 1) out.push(['page scrolls sideways', document.documentElement.scrollWidth]);
// On a desktop screen a table shows all its columns, its actions too.
if (vw >= 1000) for (const w of document.querySelectorAll('.table-wrap')) {
  if (w.getClientRects().length && w.scrollWidth > w.clientWidth + 1) out.push(['table scrolls sideways', name(w.querySelector('table')), w.scrollWidth, w.clientWidth]);
}
for (const e of document.querySelectorAll('body *')) {
  if (!e.getClientRects().length || e.closest('.sr-only, .offscreen, .skip, .toast, .u-legend, .chart')) continue;
  const cs = getComputedStyle(e);
  if (cs.visibility === 'hidden' || cs.display === 'contents') continue;
  const r = e.getBoundingClientRect();
  if (!r.width) continue;
  if (clipped(e)) continue;
  if ((r.right > vw + 1 || r.left < -1) && !scrolls(e)) out.push(['outside the screen', name(e), Math.round(r.left), Math.round(r.right), e.innerText && e.innerText.slice(0, 40)]);
  const clips = ['hidden', 'clip'].includes(cs.overflowX) || cs.textOverflow === 'ellipsis';
  if (clips && e.scrollWidth > e.clientWidth + 1 && (e.innerText || '').trim()) out.push(['cut off', name(e), e.scrollWidth, e.clientWidth]);
}
return out;
"""


def english_values() -> list[tuple[str, re.Pattern]]:
    """(key, pattern) of every English string a zh-CN page must not show:
    those whose translation differs, and that are not part of a Chinese one
    (e.g. "Webhook" in "Webhook 回调")."""
    en, zh = strings.table("en"), strings.table("zh-CN")
    all_zh = "\n".join(zh.values())
    out = []
    for k, v in en.items():
        if k.startswith(("notice.", "lang.")) or zh.get(k) == v or v in all_zh \
                or not re.search(r"[A-Za-z]{2}", v):
            continue
        parts = re.split(r"\{\w+\}", v)
        pattern = r"\b" + r".{1,80}?".join(re.escape(p) for p in parts) + r"\b" \
            if v[0].isalnum() and v[-1].isalnum() else ".{1,80}?".join(re.escape(p) for p in parts)
        out.append((k, re.compile(pattern)))
    return out


ENGLISH = english_values()


def english_in(look: dict) -> list:
    """English strings of the table on the page, and Latin words in what the console wrote."""
    found = []
    everything = "\n".join([look["title"], look["text"], *look["attrs"]])
    for key, pattern in ENGLISH:
        m = pattern.search(everything)
        if m:
            found.append((key, m.group(0)))
    for where, text in look["chrome"]:
        # Paths and placeholders are code ("{base}/v1/chat/completions").
        prose = re.sub(r"\S*[/{}]\S*", " ", text)
        words = set(re.findall(r"[A-Za-z]{2,}", prose)) - ALLOWED_WORDS
        if words:
            found.append((where, text))
    return found


def settle(br, signed_in: bool = True) -> None:
    """Wait until the page has loaded, its fetches are answered and it drew them."""
    if signed_in:
        br.find("#live-dot.open")
    quiet = [0]

    def idle(d):
        done = br.js("return document.readyState === 'complete' && window.__pending === 0")
        quiet[0] = quiet[0] + 1 if done else 0
        return quiet[0] >= 3
    br.wait(idle, what="the page's requests")


def check_page(br, what: str) -> dict:
    look = br.js(LOOK, CHROME, DATA, ONE_LINE)
    assert look["lang"] == "zh-CN", what
    found = english_in(look)
    assert not found, f"{what} shows English: {found}"
    assert not look["lines"], f"{what} breaks over lines: {look['lines']}"
    misfit = br.js(FIT)
    assert not misfit, f"{what} does not fit: {misfit}"
    no_script_errors(br)
    return look


def zh_browser(width: int, height: int) -> chromium.Browser:
    br = chromium.Browser(width=width, height=height, lang="zh-CN")
    br.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TRACK_FETCHES})
    return br


@pytest.fixture(scope="module")
def data(relay, admin, upstream):  # noqa: F811
    """root's console with something on every page: keys, usage records, a
    subscription with a sent test, an announcement, codes, a channel."""
    admin.create_channel(upstream.url, ["gpt-4o-mini", "gpt-4o"], groups=["default", "vip"],
                         name="fake-openai")
    admin.set_price("gpt-4o-mini", input_price=2, output_price=8)
    admin.put("/api/console/options", {"purchase_rate": 0.7, "base_addresses": [
        {"url": relay.url, "region": "华东"}]})
    admin.put("/api/user/self", {"language": "zh-CN"})
    # The administrator of a Chinese service describes its groups in Chinese.
    for name, description in (("default", "标准分组：共享渠道，官方价格。"),
                              ("origin", "仅官方上游，官方价格。"),
                              ("svip", "高级渠道，优先路由，最高限额。"),
                              ("vip", "专属渠道，更高的速率限制。"),
                              ("vvip", "为企业负载预留的容量。")):
        admin.put("/api/group/", {"name": name, "description": description})
    admin.post("/api/user/1/quota", {"amount": 50 * 500_000, "reason": "test"})
    key = admin.create_token("production-backend", remain_quota=2_000_000,
                             allow_ips="127.0.0.1\n10.0.0.0/8", model_limits_enabled=True,
                             model_limits=["gpt-4o-mini"])
    admin.create_token("staging", unlimited_quota=True, group="vip")
    for model in ("gpt-4o-mini", "gpt-4o-mini", "gpt-4o-mini"):
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {key['key']}"},
                          json={"model": model, "messages": [{"role": "user", "content": "你好"}],
                                "fake_usage": {"prompt_tokens": 12345, "completion_tokens": 678,
                                               "cached_tokens": 1024}}, timeout=60)
        assert r.status_code == 200, r.text
    admin.create_user("xiaoming", "Blue-Kettle-Harbor-42", quota=3 * 500_000)
    admin.post("/api/redemption/", {"name": "新用户礼包", "quota": 1_000_000, "count": 2})
    admin.post("/api/announcement/", {"title": "系统维护通知",
                                      "content": "今晚 02:00 至 02:10 升级，期间请求可能短暂失败。",
                                      "kind": "announcement"})
    hook = WebhookReceiver()
    sub = admin.post("/api/subscription/", {
        "name": "余额提醒", "event_types": ["user_quota_warning", "key_quota_warning"],
        "channel_type": "webhook", "channel_config": {"url": hook.url},
        "user_threshold": 5 * 500_000, "key_threshold": 500_000, "enabled": True})["data"]
    assert admin.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    sent = json.loads(hook.received[-1]["body"])
    assert sent["title"].startswith("【测试】"), sent
    hook.stop()
    time.sleep(1.0)  # the usage records are flushed
    return {"key": key}


@pytest.mark.parametrize("width, height", [(1366, 768), (390, 844)])
def test_every_page_in_chinese(relay, data, width, height):
    phone = width < 600
    br = zh_browser(width, height)
    try:
        for path, desk, mobile in SIGNED_OUT:
            br.get(relay.url + path)
            settle(br, signed_in=False)
            check_page(br, path)
            br.screenshot(mobile if phone else desk)
        br.login(relay.url, "root", ADMIN_PASSWORD)
        for path, desk, mobile, opener in PAGES:
            br.get(relay.url + path)
            settle(br)
            if opener:
                br.click(opener)
                settle(br, signed_in=False)
                if opener == "#new-sub":
                    Select(br.find("#s-channel")).select_by_value("group_bot")
                    br.find("#ev-user").click()
            look = check_page(br, f"{path} {opener or ''} at {width}")
            if path == "/console/usage":
                # Dates and counts in the locale: "2026年11月25日 20:53:12", "37,035".
                assert re.search(r"\d{4}年\d{1,2}月\d{1,2}日 \d{1,2}:\d{2}:\d{2}", look["text"]), \
                    look["text"]
                assert "39,069" in look["text"] and "12,345 / 678" in look["text"]
                assert "缓存命中 1,024" in look["text"]
            if path == "/console/notify" and opener:
                words = [t for _, t in look["chrome"]]
                assert {"平台 *", "Webhook 地址 *", "加签密钥", "钉钉", "企业微信"} <= set(words), words
            if phone and not opener and br.all("#nav-toggle"):
                assert br.js("return document.querySelector('#nav-toggle').innerText") == "菜单"
            br.screenshot(mobile if phone else desk)
        if phone:  # the menu, open
            br.get(relay.url + "/console/keys")
            settle(br)
            br.click("#nav-toggle")
            check_page(br, "the open menu")
            br.screenshot("zh-phone-menu")
    finally:
        br.quit()


def test_the_switch_changes_the_language_of_the_console_and_the_account(relay, data, admin):
    br = zh_browser(1366, 768)
    try:
        br.login(relay.url, "root", ADMIN_PASSWORD)
        assert br.js("return document.documentElement.lang") == "zh-CN"
        Select(br.find("#lang-switch")).select_by_value("en")
        br.wait(lambda d: br.js("return document.documentElement.lang") == "en", what="English")
        settle(br)
        assert br.text("h1") == "Dashboard" and br.text("#logout") == "Sign out"
        assert br.driver.get_cookie("lang")["value"] == "en"
        assert admin.get("/api/user/self")["data"]["language"] == "en"
        Select(br.find("#lang-switch")).select_by_value("zh-CN")
        br.wait(lambda d: br.js("return document.documentElement.lang") == "zh-CN", what="Chinese")
        assert br.text("h1") == "数据看板"
        assert admin.get("/api/user/self")["data"]["language"] == "zh-CN"
        no_script_errors(br)
    finally:
        br.quit()



def test_refusals_are_shown_in_chinese(relay, data):
    """The server refuses in English and names the refusal (data.code, with
    its values); the page says it in Chinese, the values in place: a key
    whose allow-list has too many entries (the page checks each entry's
    form, not their number), and a time zone that is none."""
    br = zh_browser(1366, 768)
    try:
        br.login(relay.url, "root", ADMIN_PASSWORD)
        br.get(relay.url + "/console/keys")
        settle(br)
        br.click("#new-key")
        settle(br, signed_in=False)
        br.type("#k-name", "太多地址")
        many = "\n".join(f"10.0.{i // 250}.{i % 250}" for i in range(netlist.MAX_ENTRIES + 1))
        br.js("const e = document.querySelector('#k-ips'); e.value = arguments[0];"
              "e.dispatchEvent(new Event('input'));", many)
        br.click("#key-save")
        br.wait(lambda d: br.text("#key-form-status"), what="the key's refusal")
        assert br.text("#key-form-status") == \
            f"IP 白名单最多 {netlist.MAX_ENTRIES} 条（当前 {netlist.MAX_ENTRIES + 1} 条）。"
        check_page(br, "the key form's refusal")
        br.screenshot("zh-key-refused")
        # A field is named by its label (field.<name>), as every page's api() call does.
        said = br.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "import('/static/js/api.js').then((m) => m.post('/api/token/', {name: 'n'.repeat(65)}))"
            ".then(() => done('accepted'), (e) => done(e.message));")
        assert said == "“名称”超过了 64 个字符。"
        br.get(relay.url + "/console/account")
        settle(br)
        br.type("#b-timezone", "Mars/Olympus")
        br.click("#budget-save")
        br.wait(lambda d: br.text("#budget-status"), what="the time zone's refusal")
        assert br.text("#budget-status") == \
            "Mars/Olympus 不是有效的时区名称，例如 UTC 或 Asia/Shanghai。"
        no_script_errors(br)
    finally:
        br.quit()
