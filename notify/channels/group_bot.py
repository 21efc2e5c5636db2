"""Group-chat bots: DingTalk, Feishu (Lark) and WeCom group robots.

Each vendor signs differently, exactly as its docs say:
- DingTalk: timestamp in milliseconds; sign = base64(HMAC-SHA256(key=secret,
  msg=f"{timestamp}\\n{secret}")), URL-encoded and appended to the webhook
  URL as &timestamp=..&sign=..
- Feishu: timestamp in seconds; sign = base64(HMAC-SHA256(key=f"{timestamp}\\n
  {secret}", msg=b"")), sent in the JSON body as "timestamp" and "sign".
- WeCom group robots have no signing scheme: the key in the webhook URL is
  the secret, so a signing secret is ignored there.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import math
from urllib.parse import quote_plus

from models.refusal import Refusal
from notify.channels.base import Channel, Context, DeliveryError, Field, Message, check_reply

VENDORS = ("dingtalk", "feishu", "wecom")


def dingtalk_sign(secret: str, timestamp_ms: str) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def feishu_sign(secret: str, timestamp_s: str) -> str:
    mac = hmac.new(f"{timestamp_s}\n{secret}".encode(), b"", hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


class GroupBotChannel(Channel):
    type = "group_bot"
    label = "Group-chat bot (DingTalk / Feishu / WeCom)"
    fields = (
        Field("vendor", "Vendor", required=True, kind="choice", choices=VENDORS),
        # The URL carries the bot's access token (DingTalk) or key (WeCom): a secret.
        Field("webhook_url", "Webhook URL", secret=True, required=True),
        Field("secret", "Signing secret", secret=True),
    )

    def clean(self, config: dict) -> dict:
        out = super().clean(config)
        if not out["webhook_url"].startswith(("http://", "https://")):
            raise Refusal("The webhook URL must start with http:// or https://.", "field_url",
                          field="webhook_url")
        return out

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        vendor, url, secret = config["vendor"], config["webhook_url"], config.get("secret", "")
        text = msg.text()
        if vendor == "dingtalk":
            body = {"msgtype": "text", "text": {"content": text}}
            if secret:
                ts = str(math.floor(ctx.clock() * 1000))
                sep = "&" if "?" in url else "?"
                url = f"{url}{sep}timestamp={ts}&sign={quote_plus(dingtalk_sign(secret, ts))}"
            reply = await ctx.http.send("POST", url, json_body=body)
            check_reply(reply, "DingTalk", lambda d: d.get("errcode") == 0)
        elif vendor == "feishu":
            body: dict = {"msg_type": "text", "content": {"text": text}}
            if secret:
                ts = str(math.floor(ctx.clock()))
                body = {"timestamp": ts, "sign": feishu_sign(secret, ts), **body}
            reply = await ctx.http.send("POST", url, json_body=body)
            check_reply(reply, "Feishu",
                        lambda d: d.get("code", d.get("StatusCode")) == 0)
        elif vendor == "wecom":
            reply = await ctx.http.send("POST", url, json_body={"msgtype": "text",
                                                                "text": {"content": text}})
            check_reply(reply, "WeCom bot", lambda d: d.get("errcode") == 0)
        else:
            raise DeliveryError(f"Unknown group bot vendor {vendor!r}.", permanent=True)
        return f"{vendor} ok"
