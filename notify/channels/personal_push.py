"""Personal push to one person's WeChat: ServerChan (send key) or WxPusher (UID).

WxPusher: the server operator owns one WxPusher app (its appToken is the
setting notify_wxpusher_app_token); a user binds their UID by scanning a
parametric QR code (notify/push_binding.py), and messages go to
POST {base}/api/send/message {appToken, content, summary, contentType, uids}.
The UID comes only from that binding: one typed into a subscription would
let anyone push through the operator's app to someone else's WeChat.
ServerChan (Turbo): POST {base}/{send_key}.send with title and desp.
"""
from __future__ import annotations

from urllib.parse import quote

from models.refusal import Refusal
from notify.channels.base import Channel, Context, DeliveryError, Field, Message, check_reply

VENDORS = ("serverchan", "wxpusher")


class PersonalPushChannel(Channel):
    type = "personal_push"
    label = "Personal push (ServerChan / WxPusher)"
    fields = (
        Field("vendor", "Vendor", required=True, kind="choice", choices=VENDORS),
        Field("send_key", "ServerChan SendKey", secret=True),
    )

    def clean(self, config: dict) -> dict:
        if str(config.get("uid") or "").strip():
            raise ValueError("The WxPusher UID is set by scanning the binding QR code "
                             "(GET /api/notify/push/qrcode), not typed in.")
        out = super().clean(config)
        if out["vendor"] == "serverchan" and not out["send_key"]:
            raise Refusal("ServerChan needs a SendKey.", "field_required", field="send_key")
        return out

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        s = ctx.settings
        if config["vendor"] == "serverchan":
            url = f"{s.notify_serverchan_base.rstrip('/')}/{quote(config['send_key'], safe='')}.send"
            reply = await ctx.http.send("POST", url, json_body={"title": msg.title[:32],
                                                               "desp": msg.content})
            check_reply(reply, "ServerChan", lambda d: d.get("code") == 0)
            return "serverchan ok"
        uid = (msg.user or {}).get("wxpusher_uid") or ""  # the binding's, never the config's
        if not uid:
            raise DeliveryError("No WxPusher UID: scan the binding QR code first.", permanent=True)
        if not s.notify_wxpusher_app_token:
            raise DeliveryError("WxPusher is not set up on this server.", permanent=True)
        reply = await ctx.http.send(
            "POST", f"{s.notify_wxpusher_base.rstrip('/')}/api/send/message",
            json_body={"appToken": s.notify_wxpusher_app_token, "content": msg.text(),
                       "summary": msg.title[:100], "contentType": 1, "uids": [uid]})
        check_reply(reply, "WxPusher", lambda d: d.get("code") == 1000)
        return "wxpusher ok"
