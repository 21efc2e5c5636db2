"""Each delivery channel against a faithful fake of its vendor on 127.0.0.1:
signatures checked to the byte, the enterprise app's access-token flow,
webhook templates with variables, SMTP (plain and STARTTLS) and the SSRF guard."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import socket
from urllib.parse import quote_plus

import pytest

from notify import channels
from notify.channels.base import Context, DeliveryError, Message
from notify.http import HttpClient, Refused
from settings import Settings
from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.smtp_sink import SmtpSink


@pytest.fixture(scope="module")
def fake():
    f = NotifyReceivers().start()
    yield f
    f.stop()


def ctx_for(fake, **kw) -> Context:
    s = Settings(notify_wecom_base=fake.url, notify_telegram_base=fake.url,
                 notify_serverchan_base=fake.url, notify_wxpusher_base=fake.url,
                 notify_wxpusher_app_token=fake.wxpusher_app_token, allow_private_webhooks=True,
                 notify_send_timeout=10.0, **kw)
    return Context(settings=s, http=HttpClient(True, timeout=10.0))


def message(**kw) -> Message:
    base = dict(id="ev1|7", event_type="user_quota_warning", title="Account balance is low",
                content='Balance "50" < 100\nline two', user={"id": 7, "username": "ann",
                                                             "email": "ann@example.test"},
                vars={"event_type": "user_quota_warning", "title": "Account balance is low",
                      "content": 'Balance "50" < 100\nline two', "user": "ann",
                      "key_name": "prod-key", "balance": 50, "threshold": 100,
                      "time": "2026-01-01 00:00:00 UTC"})
    base.update(kw)
    return Message(**base)


def send(ctx, ctype, cfg, msg=None):
    ch = channels.get(ctype)
    clean = ch.clean(cfg)  # renders templates: never on the event loop

    async def go():
        return await ch.send(msg or message(), clean, ctx)
    return asyncio.run(go())


def last(fake, vendor):
    return [r for r in fake.requests if r["vendor"] == vendor][-1]


def test_dingtalk_signature_to_the_byte(fake):
    fake.dingtalk_secrets["dt-token"] = "SEC-dingtalk-secret"
    send(ctx_for(fake), "group_bot", {"vendor": "dingtalk", "secret": "SEC-dingtalk-secret",
                                      "webhook_url": f"{fake.url}/robot/send?access_token=dt-token"})
    r = last(fake, "dingtalk")
    assert r["ok"] and r["json"] == {"msgtype": "text", "text": {"content": message().text()}}
    ts = r["query"]["timestamp"]
    assert len(ts) == 13  # milliseconds
    digest = hmac.new(b"SEC-dingtalk-secret", f"{ts}\nSEC-dingtalk-secret".encode(),
                      hashlib.sha256).digest()
    want = base64.b64encode(digest).decode()
    assert r["query"]["sign"] == want
    assert r["uri"].endswith(f"&timestamp={ts}&sign={quote_plus(want)}")


def test_dingtalk_wrong_secret_is_refused_by_vendor(fake):
    fake.dingtalk_secrets["dt-token2"] = "right"
    with pytest.raises(DeliveryError, match="310000"):
        send(ctx_for(fake), "group_bot", {
            "vendor": "dingtalk", "secret": "wrong",
            "webhook_url": f"{fake.url}/robot/send?access_token=dt-token2"})


def test_feishu_signature_to_the_byte(fake):
    fake.feishu_secrets["hook-1"] = "feishu-secret"
    send(ctx_for(fake), "group_bot", {"vendor": "feishu", "secret": "feishu-secret",
                                      "webhook_url": f"{fake.url}/open-apis/bot/v2/hook/hook-1"})
    r = last(fake, "feishu")
    assert r["ok"]
    ts = r["json"]["timestamp"]
    assert isinstance(ts, str) and len(ts) == 10  # seconds, as a string
    want = base64.b64encode(hmac.new(f"{ts}\nfeishu-secret".encode(), b"",
                                     hashlib.sha256).digest()).decode()
    assert r["json"]["sign"] == want
    assert r["json"]["msg_type"] == "text" and r["json"]["content"]["text"] == message().text()
    with pytest.raises(DeliveryError, match="19021"):
        send(ctx_for(fake), "group_bot", {"vendor": "feishu", "secret": "nope",
                                          "webhook_url": f"{fake.url}/open-apis/bot/v2/hook/hook-1"})


def test_wecom_group_bot(fake):
    fake.wecom_bot_keys.add("bot-key")
    send(ctx_for(fake), "group_bot", {"vendor": "wecom",
                                      "webhook_url": f"{fake.url}/cgi-bin/webhook/send?key=bot-key"})
    r = last(fake, "wecom_bot")
    assert r["ok"] and r["json"]["msgtype"] == "text"
    with pytest.raises(DeliveryError, match="93000"):
        send(ctx_for(fake), "group_bot", {"vendor": "wecom",
                                          "webhook_url": f"{fake.url}/cgi-bin/webhook/send?key=x"})


def test_wecom_app_access_token_flow(fake):
    fake.wecom_corps["ww-corp"] = "app-secret-1"
    ctx = ctx_for(fake)
    cfg = {"corp_id": "ww-corp", "app_secret": "app-secret-1", "agent_id": "1000002"}
    before = fake.gettoken_calls
    send(ctx, "wecom_app", cfg)
    send(ctx, "wecom_app", cfg)
    assert fake.gettoken_calls == before + 1, "the token is cached between sends"
    sends = [r for r in fake.requests if r["path"] == "/cgi-bin/message/send"]
    assert sends[-1]["ok"] and sends[-1]["json"]["agentid"] == 1000002
    assert sends[-1]["json"]["touser"] == "@all"
    assert sends[-1]["query"]["access_token"] == sends[-2]["query"]["access_token"]
    gettoken = [r for r in fake.requests if r["path"] == "/cgi-bin/gettoken"][-1]
    assert gettoken["query"] == {"corpid": "ww-corp", "corpsecret": "app-secret-1"}
    # The vendor expires the token: the channel sees 42001, fetches a new one, resends.
    fake.expire_wecom_tokens()
    send(ctx, "wecom_app", cfg)
    assert fake.gettoken_calls == before + 2
    sends = [r for r in fake.requests if r["path"] == "/cgi-bin/message/send"]
    assert not sends[-2]["ok"] and sends[-1]["ok"]
    with pytest.raises(DeliveryError, match="gettoken"):
        send(ctx, "wecom_app", {**cfg, "app_secret": "wrong"})


def test_wecom_app_burst_fetches_one_token(fake):
    fake.wecom_corps["ww-burst"] = "burst-secret"
    ctx = ctx_for(fake)
    ch = channels.get("wecom_app")
    cfg = ch.clean({"corp_id": "ww-burst", "app_secret": "burst-secret", "agent_id": "7"})
    before = fake.gettoken_calls

    async def go():
        await asyncio.gather(*(ch.send(message(id=f"b{i}"), cfg, ctx) for i in range(5)))
    asyncio.run(go())
    assert fake.gettoken_calls == before + 1


def test_webhook_template_variables_and_signature(fake):
    tpl = ('{"kind": "{{ event_type }}", "msg": "{{ title }}: {{ content }}", "who": "{{ user }}",'
           ' "key": "{{ key_name }}", "left": {{ balance }}, "limit": {{ threshold }},'
           ' "at": "{{ time }}"}')
    send(ctx_for(fake), "webhook", {"url": f"{fake.url}/hook/ok/tpl", "body_template": tpl,
                                    "secret": "hook-secret", "headers": {"X-Team": "ops"}})
    r = last(fake, "webhook")
    assert r["ok"]
    assert r["json"] == {"kind": "user_quota_warning",
                         "msg": 'Account balance is low: Balance "50" < 100\nline two',
                         "who": "ann", "key": "prod-key", "left": 50, "limit": 100,
                         "at": "2026-01-01 00:00:00 UTC"}
    want = "sha256=" + hmac.new(b"hook-secret", r["raw"], hashlib.sha256).hexdigest()
    assert r["headers"]["X-Signature"] == want
    assert r["headers"]["X-Team"] == "ops" and r["headers"]["X-Notify-Id"] == "ev1|7"


def test_webhook_plain_text_template_and_no_secret(fake):
    send(ctx_for(fake), "webhook", {"url": f"{fake.url}/hook/ok/plain",
                                    "headers": {"Content-Type": "text/plain"},
                                    "body_template": "{{ user }} has {{ balance }} left"})
    r = last(fake, "webhook")
    assert r["raw"] == b"ann has 50 left" and "X-Signature" not in r["headers"]


def test_webhook_rejects_bad_template_and_headers():
    ch = channels.get("webhook")
    with pytest.raises(ValueError, match="template"):
        ch.clean({"url": "http://127.0.0.1/x", "body_template": "{{ nope }}"})
    with pytest.raises(ValueError, match="template"):
        ch.clean({"url": "http://127.0.0.1/x", "body_template": "{{ title "})
    with pytest.raises(ValueError, match="headers"):
        ch.clean({"url": "http://127.0.0.1/x", "headers": {"Host": "evil"}})
    with pytest.raises(ValueError, match="http"):
        ch.clean({"url": "file:///etc/passwd"})


def test_webhook_500_is_a_delivery_error(fake):
    with pytest.raises(DeliveryError, match="HTTP 500"):
        send(ctx_for(fake), "webhook", {"url": f"{fake.url}/hook/500/x"})


def test_telegram(fake):
    fake.telegram_tokens.add("123:ABC")
    send(ctx_for(fake), "telegram", {"bot_token": "123:ABC", "chat_id": "-100200"})
    r = last(fake, "telegram")
    assert r["ok"] and r["path"] == "/bot123:ABC/sendMessage"
    assert r["json"]["chat_id"] == "-100200" and r["json"]["text"] == message().text()
    with pytest.raises(DeliveryError) as e:
        send(ctx_for(fake), "telegram", {"bot_token": "999:SECRET", "chat_id": "1"})
    assert "Unauthorized" in e.value.message and "999:SECRET" not in e.value.message


def test_serverchan_and_wxpusher(fake):
    fake.serverchan_keys.add("SCT123abc")
    send(ctx_for(fake), "personal_push", {"vendor": "serverchan", "send_key": "SCT123abc"})
    r = last(fake, "serverchan")
    assert r["ok"] and r["json"] == {"title": "Account balance is low",
                                     "desp": message().content}
    # The UID is the account's binding (notify/push_binding.py), never the config's.
    bound = message(user={"id": 1, "username": "x", "email": "", "wxpusher_uid": "UID_abc"})
    send(ctx_for(fake), "personal_push", {"vendor": "wxpusher"}, bound)
    r = last(fake, "wxpusher")
    assert r["ok"] and r["json"]["uids"] == ["UID_abc"]
    with pytest.raises(ValueError, match="QR code"):
        channels.get("personal_push").clean({"vendor": "wxpusher", "uid": "UID_typed"})
    assert r["json"]["appToken"] == fake.wxpusher_app_token and r["json"]["contentType"] == 1
    with pytest.raises(DeliveryError, match="UID"):
        send(ctx_for(fake), "personal_push", {"vendor": "wxpusher"})
    with pytest.raises(ValueError, match="SendKey"):
        channels.get("personal_push").clean({"vendor": "serverchan"})


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
@pytest.mark.parametrize("mode,auth", [("none", None), ("starttls", ("mailer", "pw-1")),
                                       ("tls", ("mailer", "pw-1"))])
def test_email_over_smtp(fake, mode, auth):
    sink = SmtpSink(tls="" if mode == "none" else mode, auth=auth).start()
    try:
        ctx = ctx_for(fake, smtp_host="127.0.0.1", smtp_port=sink.port,
                      smtp_from="relay@example.test", smtp_tls=mode, smtp_verify_cert=False,
                      smtp_user=auth[0] if auth else "", smtp_password=auth[1] if auth else "")
        send(ctx, "email", {})
        assert len(sink.messages) == 1
        m = sink.messages[0]
        assert m["to"] == ["ann@example.test"] and m["from"] == "relay@example.test"
        assert m["tls"] is (mode != "none")
        assert m["message"]["Subject"] == "Account balance is low"
        assert "ev1|7" in m["message"]["Message-ID"]  # the outbox id, for de-duplication
        if auth:
            assert m["login"] == b"mailer"
        body = m["message"].get_content().replace("\r\n", "\n").strip()
        assert body == message().content
        with pytest.raises(DeliveryError, match="no e-mail"):
            send(ctx, "email", {}, message(user={"id": 1, "username": "x", "email": ""}))
        if auth:
            bad = ctx_for(fake, smtp_host="127.0.0.1", smtp_port=sink.port, smtp_tls=mode,
                          smtp_verify_cert=False, smtp_user="mailer", smtp_password="wrong")
            with pytest.raises(DeliveryError, match="SMTP"):
                send(bad, "email", {})
            assert len(sink.messages) == 1
    finally:
        sink.stop()


def test_ssrf_guard_refuses_private_addresses(fake):
    http = HttpClient(False, timeout=5.0)

    async def go(url):
        return await http.send("POST", url, body=b"{}")
    for url in (f"{fake.url}/hook/ok/x", "http://localhost:1/x", "http://10.0.0.1/x",
                "http://[::1]:1/x", "http://169.254.169.254/latest", "ftp://example.test/x"):
        with pytest.raises(Refused):
            asyncio.run(go(url))
    try:
        loopback = socket.gethostbyname(socket.gethostname()).startswith("127.")
    except OSError:
        loopback = False
    if loopback:  # a host *name* that resolves to loopback is caught by the resolver
        with pytest.raises(Refused):
            asyncio.run(go(f"http://{socket.gethostname()}:{fake.port}/hook/ok/x"))
    assert not [r for r in fake.requests if r["path"] == "/hook/ok/x"]
    # With the admin setting on, the same URL works.
    asyncio.run(HttpClient(True, timeout=5.0).send("POST", f"{fake.url}/hook/ok/x", body=b"{}"))
    assert [r for r in fake.requests if r["path"] == "/hook/ok/x"]
