"""Notifications in the user's language, end to end: a real relay process,
the SMTP sink and the vendor fakes on 127.0.0.1.  A zh-CN user's balance
warning arrives in Chinese by e-mail, by a WeCom group bot and through a
webhook's default body, and so does a test send; an English user's in
English; what people wrote stays as written (a webhook body template's own
words, an announcement)."""
from __future__ import annotations

import json
import uuid

import pytest

from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.smtp_sink import SmtpSink
from tests.helpers import USER_PASSWORD, Api, RelayProcess
from tests.notify.notify_helpers import subscribe, wait_for

pytestmark = pytest.mark.slow

CUSTOM = '{"text": "Alert for {{ user }}: {{ title }}"}'


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
def lrelay(mongo_url, tmp_path_factory, fake, sink):
    proc = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("lrelay")), env={
        "RELAY_SMTP_HOST": "127.0.0.1", "RELAY_SMTP_PORT": str(sink.port),
        "RELAY_SMTP_TLS": "none", "RELAY_SMTP_FROM": "relay@example.test",
        "RELAY_NOTIFY_POLL_INTERVAL": "0.2", "RELAY_NOTIFY_SEND_TIMEOUT": "5"}).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def root(lrelay) -> Api:
    return Api.login(lrelay.url)


def mails_to(sink, address: str) -> list:
    with sink.lock:
        return [m["message"] for m in sink.messages if address in m["to"]]


def person(root, lrelay, fake, language: str) -> dict:
    """A user of that language with e-mail, WeCom bot and two webhook subscriptions."""
    tag = uuid.uuid4().hex[:8]
    name = f"n{tag}"
    user = root.post("/api/user/", {"username": name, "password": USER_PASSWORD,
                                    "email": f"{name}@example.test",
                                    "language": language})["data"]
    root.post(f"/api/user/{user['id']}/quota", {"amount": 1_000_000, "reason": "test"})
    api = Api.login(lrelay.url, name, USER_PASSWORD)
    events = ["user_quota_warning", "announcement"]
    fake.wecom_bot_keys.add(f"bot-{tag}")
    subs = {
        "email": subscribe(api, "email", {}, events=events, user_threshold=500_000),
        "bot": subscribe(api, "group_bot", {
            "vendor": "wecom", "webhook_url": f"{fake.url}/cgi-bin/webhook/send?key=bot-{tag}"},
            events=events, user_threshold=500_000),
        "hook": subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/d{tag}"},
                          events=events, user_threshold=500_000),
        "custom": subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/c{tag}",
                                             "body_template": CUSTOM},
                            events=events, user_threshold=500_000)}
    return {"id": user["id"], "name": name, "email": f"{name}@example.test", "tag": tag,
            "api": api, "subs": subs}


def delivered(fake, p: dict) -> dict:
    """What each of p's channels has received so far, oldest first."""
    bot = [r for r in fake.delivered("wecom_bot") if r["query"].get("key") == f"bot-{p['tag']}"]
    return {"bot": [r["json"]["text"]["content"] for r in bot],
            "hook": [r["json"] for r in fake.delivered("webhook", f"/hook/ok/d{p['tag']}")],
            "custom": [json.loads(r["raw"]) for r in fake.delivered("webhook",
                                                                    f"/hook/ok/c{p['tag']}")]}


def test_a_warning_arrives_in_the_users_language(root, lrelay, fake, sink):
    zh = person(root, lrelay, fake, "zh-CN")
    en = person(root, lrelay, fake, "en")
    for p in (zh, en):  # 1,000,000 -> 400,000: below the threshold of 500,000
        root.post(f"/api/user/{p['id']}/quota", {"amount": -600_000, "reason": "test"})
    for p in (zh, en):
        wait_for(lambda: mails_to(sink, p["email"]) and all(delivered(fake, p).values()),
                 what=f"{p['name']}'s warnings")

    mail = mails_to(sink, zh["email"])[0]
    assert mail["Subject"] == "账户余额不足"
    body = mail.get_content()
    assert "您的账户余额为 400000 额度（$0.80），已低于您设置的预警阈值 500000 额度（$1.00）" in body
    got = delivered(fake, zh)
    assert got["bot"][0].startswith("账户余额不足\n\n您的账户余额为 400000 额度")
    assert got["hook"][0]["title"] == "账户余额不足"
    assert got["hook"][0]["content"] == body.strip()
    assert got["hook"][0]["balance"] == "400000"
    # The template's own words are the user's, as written; only {{ title }} is translated.
    assert got["custom"][0] == {"text": f"Alert for {zh['name']}: 账户余额不足"}

    mail = mails_to(sink, en["email"])[0]
    assert mail["Subject"] == "Account balance is low"
    assert "Your account balance is 400000 units ($0.80), below your warning threshold of " \
           "500000 units ($1.00)." in mail.get_content()
    got = delivered(fake, en)
    assert got["hook"][0]["title"] == "Account balance is low"
    assert got["custom"][0] == {"text": f"Alert for {en['name']}: Account balance is low"}

    # The console's history shows the title each was sent with.
    titles = [d["title"] for d in zh["api"].get("/api/notify/deliveries")["data"]["items"]]
    assert titles == ["账户余额不足"] * 4


def test_a_test_send_speaks_the_users_language_and_follows_a_change(root, lrelay, fake, sink):
    p = person(root, lrelay, fake, "zh-CN")
    sub = p["subs"]["email"]
    assert p["api"].post(f"/api/subscription/{sub['id']}/test")["data"]["ok"] is True
    mail = wait_for(lambda: mails_to(sink, p["email"]), what="the test mail")[0]
    assert mail["Subject"] == "【测试】账户余额不足"
    assert mail.get_content().startswith("您的账户余额为 1000000 额度（$2.00）")
    preview = p["api"].post("/api/subscription/preview", {
        "channel_type": "webhook", "channel_config": {}, "event_type": "announcement"})["data"]
    assert json.loads(preview["body"])["title"] == "测试公告"
    # The console's switch changes the account's language: the next message follows it.
    p["api"].put("/api/user/self", {"language": "en"})
    p["api"].post(f"/api/subscription/{sub['id']}/test")
    mail = wait_for(lambda: len(mails_to(sink, p["email"])) == 2 and mails_to(sink, p["email"]),
                    what="the second test mail")[1]
    assert mail["Subject"] == "[Test] Account balance is low"


def test_an_announcement_stays_as_its_author_wrote_it(root, lrelay, fake, sink):
    p = person(root, lrelay, fake, "zh-CN")
    root.post("/api/announcement/", {"title": "Maintenance at 02:00 UTC",
                                     "content": "The relay restarts for a minute.",
                                     "kind": "announcement"})
    mail = wait_for(lambda: mails_to(sink, p["email"]), what="the announcement")[0]
    assert mail["Subject"] == "Maintenance at 02:00 UTC"
    assert mail.get_content().strip() == "The relay restarts for a minute."
    hook = wait_for(lambda: delivered(fake, p)["hook"], what="the webhook")[0]
    assert hook["title"] == "Maintenance at 02:00 UTC"
