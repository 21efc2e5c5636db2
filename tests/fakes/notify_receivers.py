"""Faithful fakes of every notification vendor, on one real socket.

Routes follow each vendor's real API, so the relay's base-URL settings (or a
webhook URL) are simply pointed here:

    WeCom app     GET  /cgi-bin/gettoken?corpid=&corpsecret=   -> access_token, expires_in
                  POST /cgi-bin/message/send?access_token=      -> errcode 0 | 40014 | 42001
    WeCom bot     POST /cgi-bin/webhook/send?key=               -> errcode 0 | 93000
    DingTalk bot  POST /robot/send?access_token=&timestamp=&sign= (signature checked)
    Feishu bot    POST /open-apis/bot/v2/hook/<id>   (timestamp + sign in the body, checked)
    ServerChan    POST /<sendkey>.send
    WxPusher      POST /api/send/message, POST /api/fun/create/qrcode,
                  GET  /api/fun/scan-qrcode-uid?code=
                  POST /fake/wxpusher/scan {code, uid}: a user scans; the fake then calls
                       the app's callback URL like WxPusher does
    Telegram      POST /bot<token>/sendMessage
    Webhook       POST /hook/<mode>/<name>, modes:
                       ok, 500 (always), flaky<N> (500 for the first N requests to that
                       path, then 200), hang (never answers), slow (0.1 s),
                       gate (503 while <name> is in `closed`), gatehang (holds the request
                       while <name> is in `closed`, then 200)

Signatures are checked the way each vendor documents them, and a wrong one
gets the vendor's own error.  Every request is recorded in `requests`.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import defaultdict

import tornado.web
from tornado.httpclient import AsyncHTTPClient

from tests.fakes.server import ThreadedServer


class _H(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    def prepare(self):
        try:
            self.json = json.loads(self.request.body or b"null")
        except ValueError:
            self.json = None
        self.rec = self.fake.record(self.request, self.json, type(self).vendor)

    def reply(self, obj, status=200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, ensure_ascii=False))


class WecomToken(_H):
    vendor = "wecom_app"

    def get(self):
        corp, secret = self.get_argument("corpid", ""), self.get_argument("corpsecret", "")
        if self.fake.wecom_corps.get(corp) != secret:
            return self.reply({"errcode": 40001, "errmsg": "invalid credential"})
        token = "tok-" + secrets.token_hex(8)
        self.fake.wecom_tokens[token] = (corp, time.time() + self.fake.wecom_expires_in)
        self.fake.gettoken_calls += 1
        self.reply({"errcode": 0, "errmsg": "ok", "access_token": token,
                    "expires_in": self.fake.wecom_expires_in})


class WecomSend(_H):
    vendor = "wecom_app"

    def post(self):
        token = self.get_argument("access_token", "")
        hit = self.fake.wecom_tokens.get(token)
        if hit is None:
            return self.reply({"errcode": 40014, "errmsg": "invalid access_token"})
        if hit[1] < time.time():
            return self.reply({"errcode": 42001, "errmsg": "access_token expired"})
        b = self.json or {}
        if not isinstance(b.get("agentid"), int) or b.get("msgtype") != "text" \
                or not (b.get("text") or {}).get("content"):
            return self.reply({"errcode": 40008, "errmsg": "invalid message type"})
        self.rec["ok"] = True
        self.reply({"errcode": 0, "errmsg": "ok", "invaliduser": "",
                    "msgid": secrets.token_hex(6)})


class WecomBot(_H):
    vendor = "wecom_bot"

    def post(self):
        if self.get_argument("key", "") not in self.fake.wecom_bot_keys:
            return self.reply({"errcode": 93000, "errmsg": "invalid webhook url"})
        self.rec["ok"] = True
        self.reply({"errcode": 0, "errmsg": "ok"})


class DingTalk(_H):
    vendor = "dingtalk"

    def post(self):
        token = self.get_argument("access_token", "")
        if token not in self.fake.dingtalk_secrets:
            return self.reply({"errcode": 300001, "errmsg": "token is not exist"})
        secret = self.fake.dingtalk_secrets[token]
        if secret:
            ts = self.get_argument("timestamp", "")
            sign = self.get_argument("sign", "")  # tornado has URL-decoded it once
            want = base64.b64encode(hmac.new(secret.encode(), f"{ts}\n{secret}".encode(),
                                             hashlib.sha256).digest()).decode()
            if not ts.isdigit() or abs(int(ts) / 1000 - time.time()) > 3600 \
                    or not hmac.compare_digest(sign, want):
                return self.reply({"errcode": 310000,
                                   "errmsg": "sign not match, more: [https://ding-doc...]"})
        self.rec["ok"] = True
        self.reply({"errcode": 0, "errmsg": "ok"})


class Feishu(_H):
    vendor = "feishu"

    def post(self, hook):
        if hook not in self.fake.feishu_secrets:
            return self.reply({"code": 19001, "msg": "param invalid: incoming webhook access "
                                                     "token invalid", "data": {}})
        secret = self.fake.feishu_secrets[hook]
        b = self.json or {}
        if secret:
            ts = str(b.get("timestamp", ""))
            want = base64.b64encode(hmac.new(f"{ts}\n{secret}".encode(), b"",
                                             hashlib.sha256).digest()).decode()
            if not ts.isdigit() or abs(int(ts) - time.time()) > 3600 \
                    or not hmac.compare_digest(str(b.get("sign", "")), want):
                return self.reply({"code": 19021, "msg": "sign match fail or timestamp is not "
                                                         "within one hour from current time",
                                   "data": {}})
        if b.get("msg_type") != "text":
            return self.reply({"code": 9499, "msg": "Bad Request", "data": {}})
        self.rec["ok"] = True
        self.reply({"code": 0, "msg": "success", "data": {}})


class ServerChan(_H):
    vendor = "serverchan"

    def post(self, key):
        if key not in self.fake.serverchan_keys:
            return self.reply({"code": 40001, "message": "bad pushkey", "data": None}, 400)
        if not (self.json or {}).get("title"):
            return self.reply({"code": 20001, "message": "bad title", "data": None}, 400)
        self.rec["ok"] = True
        self.reply({"code": 0, "message": "", "data": {"pushid": "1", "readkey": "r",
                                                       "error": "SUCCESS", "errno": 0}})


class WxSend(_H):
    vendor = "wxpusher"

    def post(self):
        b = self.json or {}
        if b.get("appToken") != self.fake.wxpusher_app_token:
            return self.reply({"code": 1001, "msg": "appToken不正确", "data": None,
                               "success": False})
        uids = b.get("uids") or []
        if not uids or not b.get("content"):
            return self.reply({"code": 1001, "msg": "uids或者topicIds不能为空", "data": None,
                               "success": False})
        self.rec["ok"] = True
        self.reply({"code": 1000, "msg": "处理成功", "success": True, "data": [
            {"uid": u, "topicId": None, "messageId": 1, "messageContentId": 1,
             "sendRecordId": 1, "code": 1000, "status": "创建发送任务成功"} for u in uids]})


class WxQrcode(_H):
    vendor = "wxpusher"

    def post(self):
        b = self.json or {}
        if b.get("appToken") != self.fake.wxpusher_app_token or not b.get("extra"):
            return self.reply({"code": 1001, "msg": "appToken不正确", "data": None,
                               "success": False})
        code = "qr-" + secrets.token_hex(8)
        self.fake.qrcodes[code] = {"extra": b["extra"], "uid": None}
        self.reply({"code": 1000, "msg": "处理成功", "success": True, "data": {
            "expires": int(time.time() * 1000) + int(b.get("validTime", 1800)) * 1000,
            "code": code, "shortUrl": f"{self.fake.url}/q/{code}", "extra": b["extra"],
            "url": f"{self.fake.url}/qrcode/{code}.jpg"}})


class WxScanUid(_H):
    vendor = "wxpusher"

    def get(self):
        qr = self.fake.qrcodes.get(self.get_argument("code", ""))
        if qr is None:
            return self.reply({"code": 1001, "msg": "二维码不存在", "data": None, "success": False})
        self.reply({"code": 1000, "msg": "处理成功", "success": True, "data": qr["uid"]})


class WxScan(_H):
    """Test control: a WeChat user scans the QR code."""
    vendor = "control"

    async def post(self):
        b = self.json or {}
        qr = self.fake.qrcodes[b["code"]]
        qr["uid"] = b["uid"]
        body = {"action": "app_subscribe", "data": {
            "appKey": "AK_fake", "appName": "relay", "source": "scan", "userName": "someone",
            "userHeadImg": "", "time": int(time.time() * 1000), "uid": b["uid"],
            "extra": qr["extra"]}}
        resp = await AsyncHTTPClient().fetch(self.fake.wxpusher_callback_url, method="POST",
                                             body=json.dumps(body), raise_error=False,
                                             headers={"Content-Type": "application/json"})
        self.reply({"status": resp.code, "body": (resp.body or b"").decode()})


class Telegram(_H):
    vendor = "telegram"

    def post(self, token):
        if token not in self.fake.telegram_tokens:
            return self.reply({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
        b = self.json or {}
        if not b.get("chat_id"):
            return self.reply({"ok": False, "error_code": 400,
                               "description": "Bad Request: chat not found"}, 400)
        if not b.get("text"):
            return self.reply({"ok": False, "error_code": 400,
                               "description": "Bad Request: message text is empty"}, 400)
        self.rec["ok"] = True
        self.fake.telegram_msg_id += 1
        self.reply({"ok": True, "result": {"message_id": self.fake.telegram_msg_id,
                                           "chat": {"id": b["chat_id"]}, "date": int(time.time()),
                                           "text": b["text"]}})


class Hook(_H):
    vendor = "webhook"
    gone = False

    def on_connection_close(self):
        self.gone = True

    async def post(self, mode, name):
        key = f"{mode}/{name}"
        self.fake.hook_counts[key] += 1
        if mode == "hang":
            await asyncio.Event().wait()
        if mode == "slow":
            await asyncio.sleep(0.1)
        if mode == "gate" and name in self.fake.closed:
            return self.reply({"error": "receiver down"}, 503)
        if mode == "gatehang":
            while name in self.fake.closed and not self.gone:
                await asyncio.sleep(0.05)
            if self.gone:  # the sender died while we held its request
                return
        if mode == "500" or (mode.startswith("flaky")
                             and self.fake.hook_counts[key] <= int(mode[5:] or 1)):
            return self.reply({"error": "receiver failure"}, 500)
        self.rec["ok"] = True
        self.reply({"received": True})


class NotifyReceivers(ThreadedServer):
    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.wecom_corps: dict[str, str] = {}
        self.wecom_tokens: dict[str, tuple] = {}
        self.wecom_expires_in = 7200
        self.gettoken_calls = 0
        self.wecom_bot_keys: set[str] = set()
        self.dingtalk_secrets: dict[str, str] = {}
        self.feishu_secrets: dict[str, str] = {}
        self.serverchan_keys: set[str] = set()
        self.wxpusher_app_token = "AT_fake_app_token"
        self.wxpusher_callback_url = ""
        self.qrcodes: dict[str, dict] = {}
        self.telegram_tokens: set[str] = set()
        self.telegram_msg_id = 0
        self.hook_counts: dict[str, int] = defaultdict(int)
        self.closed: set[str] = set()


    def record(self, request, body, vendor) -> dict:
        rec = {"vendor": vendor, "method": request.method, "path": request.path,
               "uri": request.uri, "query": {k: v[-1].decode() for k, v in
                                             request.query_arguments.items()},
               "headers": dict(request.headers), "raw": request.body, "json": body,
               "ok": False, "at": time.time()}
        with self.lock:
            self.requests.append(rec)
        return rec

    def delivered(self, vendor: str | None = None, path_prefix: str = "") -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["ok"] and (vendor is None or r["vendor"] == vendor)
                    and r["path"].startswith(path_prefix)]

    def expire_wecom_tokens(self) -> None:
        for t, (corp, _) in list(self.wecom_tokens.items()):
            self.wecom_tokens[t] = (corp, 0)

    def routes(self):
        kw = {"fake": self}
        return [(r"/cgi-bin/gettoken", WecomToken, kw),
                (r"/cgi-bin/message/send", WecomSend, kw),
                (r"/cgi-bin/webhook/send", WecomBot, kw),
                (r"/robot/send", DingTalk, kw),
                (r"/open-apis/bot/v2/hook/([^/]+)", Feishu, kw),
                (r"/api/send/message", WxSend, kw),
                (r"/api/fun/create/qrcode", WxQrcode, kw),
                (r"/api/fun/scan-qrcode-uid", WxScanUid, kw),
                (r"/fake/wxpusher/scan", WxScan, kw),
                (r"/bot([^/]+)/sendMessage", Telegram, kw),
                (r"/hook/([a-z0-9]+)/([^/]+)", Hook, kw),
                (r"/([A-Za-z0-9_\-]+)\.send", ServerChan, kw)]
