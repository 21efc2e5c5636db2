"""The notification API end to end: a real relay process, the vendor fakes and
an SMTP sink on 127.0.0.1.  Subscriptions (validation, secrets masked and
encrypted at rest), test sends, previews, announcements reaching every
subscribed user over each channel, marketing opt-in, retries after a 500,
QR-code binding for personal push, and warnings raised by real billing."""
from __future__ import annotations

import re
import socket
import time
import uuid

import openai
import pymongo
import pytest

from tests.fakes.notify_receivers import NotifyReceivers
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.smtp_sink import SmtpSink
from tests.helpers import Api, RelayProcess
from tests.notify.notify_helpers import subscribe, wait_for

CALLBACK_TOKEN = "cb-token-123"


def notify_env(fake, sink) -> dict:
    return {"RELAY_SMTP_HOST": "127.0.0.1", "RELAY_SMTP_PORT": str(sink.port),
            "RELAY_SMTP_TLS": "none", "RELAY_SMTP_FROM": "relay@example.test",
            "RELAY_NOTIFY_WECOM_BASE": fake.url, "RELAY_NOTIFY_TELEGRAM_BASE": fake.url,
            "RELAY_NOTIFY_SERVERCHAN_BASE": fake.url, "RELAY_NOTIFY_WXPUSHER_BASE": fake.url,
            "RELAY_NOTIFY_WXPUSHER_APP_TOKEN": fake.wxpusher_app_token,
            "RELAY_NOTIFY_PUSH_CALLBACK_TOKEN": CALLBACK_TOKEN,
            "RELAY_NOTIFY_RETRY_BASE": "0.3", "RELAY_NOTIFY_POLL_INTERVAL": "0.2",
            "RELAY_NOTIFY_SEND_TIMEOUT": "5"}


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
def nrelay(mongo_url, tmp_path_factory, fake, sink):
    proc = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("nrelay")),
                        env=notify_env(fake, sink)).start()
    fake.wxpusher_callback_url = f"{proc.url}/api/notify/push/callback?token={CALLBACK_TOKEN}"
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def root(nrelay) -> Api:
    return Api.login(nrelay.url)


def new_user(root, nrelay, quota=0, **kw) -> tuple[dict, Api]:
    name = "u" + uuid.uuid4().hex[:8]
    user = root.create_user(name, quota=quota, **kw)
    return user, Api.login(nrelay.url, name, "Blue-Kettle-Harbor-42")


def test_channel_types(root):
    types = {c["type"]: c for c in root.get("/api/notify/channels")["data"]}
    assert set(types) == {"email", "wecom_app", "group_bot", "personal_push", "webhook", "telegram"}
    fields = {t: {f["name"]: f for f in c["fields"]} for t, c in types.items()}
    assert fields["email"] == {}
    assert fields["wecom_app"]["app_secret"]["secret"] and fields["wecom_app"]["corp_id"]["required"]
    assert fields["group_bot"]["vendor"]["choices"] == ["dingtalk", "feishu", "wecom"]
    assert fields["personal_push"]["vendor"]["choices"] == ["serverchan", "wxpusher"]
    assert set(fields["webhook"]) == {"url", "headers", "body_template", "secret"}
    assert fields["webhook"]["secret"]["secret"] and not fields["webhook"]["url"]["secret"]
    assert fields["telegram"]["bot_token"]["secret"] and not fields["telegram"]["chat_id"]["secret"]
    for c in types.values():
        assert c["label"] and all({"name", "label", "secret", "required"} <= set(f)
                                  for f in c["fields"])


def test_subscription_crud_secrets_masked_and_encrypted(root, nrelay, fake, mongo_url):
    fake.telegram_tokens.add("777:SECRET-TOKEN-VALUE")
    user, api = new_user(root, nrelay)
    sub = subscribe(api, "telegram", {"bot_token": "777:SECRET-TOKEN-VALUE", "chat_id": "42"})
    shown = sub["channel_config"]["bot_token"]
    assert "SECRET-TOKEN" not in shown and "********" in shown
    assert sub["channel_config"]["chat_id"] == "42" and sub["user_id"] == user["id"]
    listed = api.get("/api/subscription/")["data"]
    assert [s["id"] for s in listed] == [sub["id"]]
    assert "SECRET-TOKEN" not in str(listed)
    raw = pymongo.MongoClient(mongo_url)[nrelay.db_name].notify_subscriptions.find_one(
        {"_id": sub["id"]})
    assert "SECRET-TOKEN" not in str(raw), "secrets are encrypted at rest"
    # A masked value sent back unchanged keeps the stored secret.
    upd = api.put("/api/subscription/", {"id": sub["id"], "name": "renamed",
                                         "channel_config": sub["channel_config"]})["data"]
    assert upd["name"] == "renamed" and upd["channel_config"]["bot_token"] == shown
    result = api.post(f"/api/subscription/{sub['id']}/test")["data"]
    assert result["ok"], result
    assert fake.delivered("telegram")[-1]["path"] == "/bot777:SECRET-TOKEN-VALUE/sendMessage"
    # Leaving the secret out keeps it too; only an explicit value replaces it.
    api.put("/api/subscription/", {"id": sub["id"], "channel_config": {"chat_id": "43"}})
    assert api.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    assert fake.delivered("telegram")[-1]["json"]["chat_id"] == "43"
    # A new secret replaces it; the test send now fails with the vendor's reason.
    api.put("/api/subscription/", {"id": sub["id"], "channel_config": {
        "bot_token": "000:WRONG", "chat_id": "42"}})
    result = api.post(f"/api/subscription/{sub['id']}/test")["data"]
    assert not result["ok"] and "Unauthorized" in result["error"]
    # Someone else cannot see, change or delete it.
    _, other = new_user(root, nrelay)
    other.delete(f"/api/subscription/{sub['id']}", expect=404)
    other.put("/api/subscription/", {"id": sub["id"], "name": "x"}, expect=404)
    other.get(f"/api/subscription/{sub['id']}/deliveries", expect=404)
    assert other.get("/api/subscription/")["data"] == []
    api.delete(f"/api/subscription/{sub['id']}")
    api.delete(f"/api/subscription/{sub['id']}", expect=404)


@pytest.mark.parametrize("body,needle", [
    ({"event_types": ["nope"]}, "Unknown event types"),
    ({"event_types": []}, "event_types"),
    ({"channel_type": "pigeon"}, "channel_type"),
    ({"channel_config": {"chat_id": "1"}}, "Bot token is required"),
    ({"user_threshold": -5}, "user_threshold"),
    ({"key_threshold": "lots"}, "key_threshold"),
    ({"key_ids": [999999]}, "not yours"),
    ({"channel_config": "x"}, "object"),
])
def test_subscription_validation(root, nrelay, body, needle):
    _, api = new_user(root, nrelay)
    base = {"name": "v", "event_types": ["announcement"], "channel_type": "telegram",
            "channel_config": {"bot_token": "1:A", "chat_id": "1"}}
    base.update(body)
    r = api.post("/api/subscription/", base, expect=400)
    assert needle in r["message"]


def test_unauthenticated_and_non_admin(nrelay, root):
    anon = Api(nrelay.url)
    anon.get("/api/subscription/", expect=401)
    anon.get("/api/notify/channels", expect=401)
    _, api = new_user(root, nrelay)
    api.post("/api/announcement/", {"title": "x", "content": "y"}, expect=403)
    root.post("/api/announcement/", {"title": "", "content": "y"}, expect=400)
    root.post("/api/announcement/", {"title": "x", "kind": "spam"}, expect=400)


def test_preview_renders_webhook_template(root, nrelay):
    user, api = new_user(root, nrelay)
    d = api.post("/api/subscription/preview", {
        "channel_type": "webhook", "event_type": "key_quota_warning",
        "channel_config": {"body_template": '{"t": "{{ title }}", "u": "{{ user }}", '
                                            '"k": "{{ key_name }}", "e": "{{ event_type }}"}'}})
    assert d["data"]["body"] == ('{"t": "API key #0 is running low", "u": "%s", '
                                 '"k": "example-key", "e": "key_quota_warning"}' % user["username"])
    r = api.post("/api/subscription/preview", {"channel_type": "webhook",
                                               "channel_config": {"body_template": "{{ bad"}},
                 expect=400)
    assert "template" in r["message"]
    api.post("/api/subscription/preview", {"channel_type": "webhook", "event_type": "x"},
             expect=400)


def test_preview_carries_the_live_balance_and_the_forms_threshold(root, nrelay, mongo_url):
    """The account's balance with this process's leases counted (what billing
    would publish), and the threshold the form holds, not the saved one."""
    up = FakeOpenAI().start()
    try:
        tag = uuid.uuid4().hex[:6]
        model = f"preview-model-{tag}"
        root.create_channel(up.url, [model], name=f"pv-{tag}")
        root.set_price(model, call_price=0.0068)              # 3,400 units a call
        user, api = new_user(root, nrelay, quota=5_000_000)
        key = api.post("/api/token/", {"name": f"K{tag}", "remain_quota": 900_000})["data"]
        client = openai.OpenAI(api_key=key["key"], base_url=nrelay.url + "/v1", max_retries=0)
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        live = wait_for(lambda: (lambda q: q == 4_996_600 and q)(
            api.get("/api/user/self")["data"]["quota"]), what="the live balance")
        stored = pymongo.MongoClient(mongo_url)[nrelay.db_name].users.find_one({"_id": user["id"]})
        assert stored["quota"] != live  # a lease is out: the stored field alone is wrong
        template = '{"b": "{{ balance }}", "t": "{{ threshold }}", "c": "{{ content }}"}'
        d = api.post("/api/subscription/preview", {
            "channel_type": "webhook", "event_type": "user_quota_warning",
            "user_threshold": 5_250_000, "channel_config": {"body_template": template}})["data"]
        assert d["variables"]["balance"] == 4_996_600 and d["variables"]["threshold"] == 5_250_000
        assert '"b": "4996600", "t": "5250000"' in d["body"]
        assert "4996600 units ($9.99)" in d["body"] and "5250000 units ($10.50)" in d["body"]
        d = api.post("/api/subscription/preview", {
            "channel_type": "webhook", "event_type": "key_quota_warning", "key_threshold": 1_000_000,
            "key_ids": [key["id"]], "channel_config": {"body_template": template}})["data"]
        assert d["variables"]["key_name"] == f"K{tag}"
        assert d["variables"]["balance"] == 896_600 and d["variables"]["threshold"] == 1_000_000
        api.post("/api/subscription/preview", {"channel_type": "webhook",
                                               "user_threshold": -1}, expect=400)
        api.post("/api/subscription/preview", {"channel_type": "webhook",
                                               "key_ids": [999_999]}, expect=400)
    finally:
        up.stop()


def test_announcement_reaches_every_subscribed_user_over_each_channel(root, nrelay, fake, sink):
    tag = uuid.uuid4().hex[:6]
    users = []
    for i in range(2):
        user, api = new_user(root, nrelay)
        n = f"{tag}{i}"
        fake.wecom_corps[f"corp-{n}"] = f"secret-{n}"
        fake.dingtalk_secrets[f"dt-{n}"] = f"dsec-{n}"
        fake.feishu_secrets[f"fs-{n}"] = f"fsec-{n}"
        fake.serverchan_keys.add(f"SCT{n}")
        fake.telegram_tokens.add(f"1:{n}")
        subs = [
            subscribe(api, "email", {}),
            subscribe(api, "wecom_app", {"corp_id": f"corp-{n}", "app_secret": f"secret-{n}",
                                         "agent_id": "1000002"}),
            subscribe(api, "group_bot", {"vendor": "dingtalk", "secret": f"dsec-{n}",
                                         "webhook_url": f"{fake.url}/robot/send?access_token=dt-{n}"}),
            subscribe(api, "group_bot", {"vendor": "feishu", "secret": f"fsec-{n}",
                                         "webhook_url": f"{fake.url}/open-apis/bot/v2/hook/fs-{n}"}),
            subscribe(api, "personal_push", {"vendor": "serverchan", "send_key": f"SCT{n}"}),
            subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/{n}", "secret": "s"}),
            subscribe(api, "telegram", {"bot_token": f"1:{n}", "chat_id": n}),
        ]
        users.append((user, api, n, subs))
    # Someone subscribed to other events only gets nothing.
    bystander, bapi = new_user(root, nrelay)
    subscribe(bapi, "webhook", {"url": f"{fake.url}/hook/ok/by{tag}"}, events=["marketing"])
    title = f"Maintenance {tag}"
    ann = root.post("/api/announcement/", {"title": title, "content": "Tonight 22:00 UTC.",
                                           "kind": "announcement"})["data"]
    assert ann["kind"] == "announcement" and ann["title"] == title

    def text_seen(r):
        return title in str(r["json"]) or title in r["uri"]

    def all_sent():
        return all(all(d["status"] == "sent" for s in subs for d in
                       api.get(f"/api/subscription/{s['id']}/deliveries")["data"]["items"])
                   and all(api.get(f"/api/subscription/{s['id']}/deliveries")["data"]["total"] == 1
                           for s in subs)
                   for _, api, _, subs in users)
    wait_for(all_sent, what="every delivery sent")
    for user, api, n, subs in users:
        mails = [m for m in sink.messages if m["to"] == [user["email"]]]
        assert len(mails) == 1 and mails[0]["message"]["Subject"] == title
        wecom = [r for r in fake.delivered("wecom_app") if text_seen(r)
                 and fake.wecom_tokens[r["query"]["access_token"]][0] == f"corp-{n}"]
        assert len(wecom) == 1
        assert len([r for r in fake.delivered("dingtalk") if r["query"]["access_token"] == f"dt-{n}"]) == 1
        assert len(fake.delivered("feishu", f"/open-apis/bot/v2/hook/fs-{n}")) == 1
        assert len(fake.delivered("serverchan", f"/SCT{n}.send")) == 1
        hooks = fake.delivered("webhook", f"/hook/ok/{n}")
        assert len(hooks) == 1 and hooks[0]["json"]["title"] == title
        assert hooks[0]["json"]["user"] == user["username"]
        assert len([r for r in fake.delivered("telegram") if r["json"]["chat_id"] == n]) == 1
        item = api.get(f"/api/subscription/{subs[0]['id']}/deliveries")["data"]["items"][0]
        assert item["attempts"] == 1 and item["event_type"] == "announcement" and item["sent_at"]
    assert not fake.delivered("webhook", f"/hook/ok/by{tag}")
    listed = users[0][1].get("/api/announcement/")["data"]["items"]
    assert listed[0]["title"] == title


def test_marketing_only_to_opted_in_users(root, nrelay, fake):
    tag = uuid.uuid4().hex[:6]
    _, yes = new_user(root, nrelay)
    _, no = new_user(root, nrelay)
    yes.put("/api/user/self", {"marketing_opt_in": True})
    for api, n in ((yes, "yes"), (no, "no")):
        subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/{n}{tag}"},
                  events=["marketing", "announcement"])
    root.post("/api/announcement/", {"title": f"Promo {tag}", "content": "20% off",
                                     "kind": "marketing"})
    wait_for(lambda: fake.delivered("webhook", f"/hook/ok/yes{tag}"), what="opted-in delivery")
    time.sleep(1.0)
    assert not fake.delivered("webhook", f"/hook/ok/no{tag}")
    assert fake.delivered("webhook", f"/hook/ok/yes{tag}")[0]["json"]["event_type"] == "marketing"


def test_retries_after_500_then_recovers(root, nrelay, fake):
    tag = uuid.uuid4().hex[:6]
    _, api = new_user(root, nrelay)
    sub = subscribe(api, "webhook", {"url": f"{fake.url}/hook/flaky2/{tag}"})
    root.post("/api/announcement/", {"title": f"Retry {tag}", "content": "c"})

    def sent():
        items = api.get(f"/api/subscription/{sub['id']}/deliveries")["data"]["items"]
        return items and items[0]["status"] == "sent" and items[0]
    item = wait_for(sent, what="delivery after retries")
    assert item["attempts"] == 3 and fake.hook_counts[f"flaky2/{tag}"] == 3
    assert len(fake.delivered("webhook", f"/hook/flaky2/{tag}")) == 1


def test_final_failure_is_shown_to_the_user(root, nrelay, fake):
    _, api = new_user(root, nrelay)
    sub = subscribe(api, "personal_push", {"vendor": "wxpusher"})  # no UID bound: permanent
    root.post("/api/announcement/", {"title": "Unbound", "content": "c"})

    def failed():
        items = api.get(f"/api/subscription/{sub['id']}/deliveries")["data"]["items"]
        return items and items[0]["status"] == "failed" and items[0]
    item = wait_for(failed, what="final failure")
    assert "UID" in item["last_error"]
    shown = api.get(f"/api/subscription/{sub['id']}")["data"]
    assert "UID" in shown["last_error"] and shown["last_error_at"]


def test_wxpusher_qr_binding(root, nrelay, fake):
    user, api = new_user(root, nrelay)
    assert api.get("/api/notify/push/binding")["data"]["uid"] is None
    api.get("/api/notify/push/qrcode?vendor=serverchan", expect=400)
    qr = api.get("/api/notify/push/qrcode?vendor=wxpusher")["data"]
    assert qr["bind_code"] and qr["qr_url"].startswith(fake.url)
    code = re.search(r"/qrcode/([^/]+)\.jpg$", qr["qr_url"]).group(1)
    assert fake.qrcodes[code]["extra"] == qr["bind_code"]
    anon = Api(nrelay.url)
    # A forged callback (the push service saw no such scan) is refused.
    forged = {"action": "app_subscribe", "data": {"uid": "UID_attacker", "extra": qr["bind_code"]}}
    anon.post(f"/api/notify/push/callback?token={CALLBACK_TOKEN}", forged, expect=403)
    anon.post("/api/notify/push/callback?token=wrong", forged, expect=403)
    # The user scans: the fake push service calls our callback, which checks back.
    r = Api(fake.url).post("/fake/wxpusher/scan", {"code": code, "uid": "UID_real_user"})
    assert r["status"] == 200, r
    assert api.get("/api/notify/push/binding")["data"]["uid"] == "UID_real_user"
    again = Api(fake.url).post("/fake/wxpusher/scan", {"code": code, "uid": "UID_real_user"})
    assert again["status"] == 404, "a bind code works once"
    sub = subscribe(api, "personal_push", {"vendor": "wxpusher"})
    assert api.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    assert fake.delivered("wxpusher")[-1]["json"]["uids"] == ["UID_real_user"]


def test_warnings_from_real_billing_per_key(root, nrelay, fake):
    up = FakeOpenAI().start()
    try:
        tag = uuid.uuid4().hex[:6]
        model = f"notify-model-{tag}"
        root.create_channel(up.url, [model], name=f"ch-{tag}")
        root.set_price(model, call_price=0.002)              # 1,000 units a call
        user, api = new_user(root, nrelay, quota=1_000_000)
        key_a = api.post("/api/token/", {"name": f"A{tag}", "remain_quota": 5000})["data"]
        key_b = api.post("/api/token/", {"name": f"B{tag}", "remain_quota": 5000})["data"]
        subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/w{tag}"},
                  events=["key_quota_warning", "user_quota_warning"],
                  key_threshold=2500, user_threshold=997_500)
        client_a = openai.OpenAI(api_key=key_a["key"], base_url=nrelay.url + "/v1", max_retries=0)
        client_b = openai.OpenAI(api_key=key_b["key"], base_url=nrelay.url + "/v1", max_retries=0)
        client_b.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        for _ in range(3):   # A: 5000 -> 2000, crossing 2500 on the third call
            client_a.chat.completions.create(model=model,
                                             messages=[{"role": "user", "content": "hi"}])
        hooks = wait_for(lambda: len(fake.delivered("webhook", f"/hook/ok/w{tag}")) >= 2 and
                         fake.delivered("webhook", f"/hook/ok/w{tag}"), what="warnings")
        time.sleep(1.0)
        hooks = fake.delivered("webhook", f"/hook/ok/w{tag}")
        kinds = sorted(h["json"]["event_type"] for h in hooks)
        assert kinds == ["key_quota_warning", "user_quota_warning"], kinds
        key_hook = [h for h in hooks if h["json"]["event_type"] == "key_quota_warning"][0]
        assert key_hook["json"]["key_name"] == f"A{tag}"
        assert key_hook["json"]["balance"] == "2000" and key_hook["json"]["threshold"] == "2500"
        user_hook = [h for h in hooks if h["json"]["event_type"] == "user_quota_warning"][0]
        # The account crossed 997,500 on the third call of all (B once, A twice);
        # the warning is decided at the flush that applies it, and carries the
        # real balance then: the fourth call may be in the same flush.
        assert user_hook["json"]["balance"] in ("997000", "996000")
        # More calls below the threshold within the hour send nothing more.
        client_a.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        time.sleep(1.0)
        assert len(fake.delivered("webhook", f"/hook/ok/w{tag}")) == 2
    finally:
        up.stop()


def test_history_across_channels(root, nrelay, fake):
    tag = uuid.uuid4().hex[:6]
    _, api = new_user(root, nrelay)
    ok = subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/h{tag}"})
    bad = subscribe(api, "personal_push", {"vendor": "wxpusher"})
    root.post("/api/announcement/", {"title": f"History {tag}", "content": "c"})
    page = wait_for(lambda: (lambda d: d["total"] == 2 and all(
        i["status"] != "pending" for i in d["items"]) and d)(
        api.get("/api/notify/deliveries")["data"]), what="two settled deliveries")
    by_sub = {i["subscription_id"]: i for i in page["items"]}
    assert by_sub[ok["id"]]["status"] == "sent" and by_sub[bad["id"]]["status"] == "failed"
    only = api.get("/api/notify/deliveries?channel_type=webhook")["data"]
    assert [i["subscription_id"] for i in only["items"]] == [ok["id"]]
    failed = api.get("/api/notify/deliveries?status=failed&size=1")["data"]
    assert failed["total"] == 1 and failed["page_size"] == 1
    api.get("/api/notify/deliveries?status=weird", expect=400)


def test_ssrf_guard_on_in_a_relay(fresh_relay, fake):
    relay = fresh_relay(env={"RELAY_ALLOW_PRIVATE_WEBHOOKS": "false"})
    root = Api.login(relay.url)
    root.create_user("guarded")
    api = Api.login(relay.url, "guarded", "Blue-Kettle-Harbor-42")
    for url in (f"{fake.url}/hook/ok/ssrf", "http://localhost:8080/x", "http://10.1.2.3/x"):
        r = api.post("/api/subscription/", {
            "name": "x", "event_types": ["announcement"], "channel_type": "webhook",
            "channel_config": {"url": url}}, expect=400)
        assert "private" in r["message"] or "localhost" in r["message"]
    r = api.post("/api/subscription/", {
        "name": "x", "event_types": ["announcement"], "channel_type": "group_bot",
        "channel_config": {"vendor": "wecom", "webhook_url": "http://127.0.0.1:1/x"}}, expect=400)
    assert "private" in r["message"]
    # A host *name* that resolves to loopback passes the write-time check but is
    # refused when sending, by the resolver.
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except socket.gaierror:  # a machine whose own name does not resolve (a bare chroot)
        address = ""
    if address.startswith("127."):
        sub = subscribe(api, "webhook", {"url": f"http://{host}:{fake.port}/hook/ok/ssrf"})
        result = api.post(f"/api/subscription/{sub['id']}/test")["data"]
        assert not result["ok"] and "private" in result["error"]
    assert not fake.delivered("webhook", "/hook/ok/ssrf")


def test_webhook_credential_headers_masked_and_kept(root, nrelay, fake, mongo_url):
    tag = uuid.uuid4().hex[:6]
    _, api = new_user(root, nrelay)
    sub = subscribe(api, "webhook", {"url": f"{fake.url}/hook/ok/hdr{tag}", "headers": {
        "Authorization": "Bearer very-secret-value", "X-Team": "ops"}})
    shown = sub["channel_config"]["headers"]
    assert shown["X-Team"] == "ops" and "very-secret" not in shown["Authorization"]
    raw = pymongo.MongoClient(mongo_url)[nrelay.db_name].notify_subscriptions.find_one(
        {"_id": sub["id"]})
    assert "very-secret" not in str(raw) and "X-Team" not in str(raw)
    # The console sends the masked value back with another header changed.
    api.put("/api/subscription/", {"id": sub["id"], "channel_config": {
        **sub["channel_config"], "headers": {**shown, "X-Team": "dev"}}})
    assert api.post(f"/api/subscription/{sub['id']}/test")["data"]["ok"]
    got = fake.delivered("webhook", f"/hook/ok/hdr{tag}")[-1]["headers"]
    assert got["Authorization"] == "Bearer very-secret-value" and got["X-Team"] == "dev"
