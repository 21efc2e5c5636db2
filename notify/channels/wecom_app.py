"""Enterprise messaging app (WeCom self-built app): corp id + app secret + agent id.

Flow: GET /cgi-bin/gettoken?corpid=&corpsecret= gives an access_token valid
for expires_in seconds (7200); it is cached per (corp, secret) and reused
until shortly before it expires, because the vendor rate-limits gettoken.
Then POST /cgi-bin/message/send?access_token=.  An answer saying the token
is invalid or expired (40014, 42001, 40001) drops the cache and retries once.
"""
from __future__ import annotations

import asyncio
import hashlib
from urllib.parse import urlencode

from models.refusal import Refusal
from notify.channels.base import Channel, Context, DeliveryError, Field, Message

TOKEN_ERRORS = {40001, 40014, 42001}


def _cut(text: str, limit: int) -> str:
    """The vendor refuses text over `limit` bytes (UTF-8)."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", "ignore")


class WecomAppChannel(Channel):
    type = "wecom_app"
    label = "Enterprise messaging app (WeCom)"
    fields = (
        Field("corp_id", "Corp ID", required=True),
        Field("app_secret", "App secret", secret=True, required=True),
        Field("agent_id", "Agent ID", required=True),
        Field("to_user", "Recipients (user ids joined by |, default @all)"),
    )

    def clean(self, config: dict) -> dict:
        out = super().clean(config)
        if out["agent_id"] and not out["agent_id"].isdigit():
            raise Refusal("agent_id must be a number.", "field_not_whole", field="agent_id")
        return out

    async def _token(self, config: dict, ctx: Context, refused: str = "") -> str:
        """A valid access token; `refused` names one the vendor just refused."""
        base = ctx.settings.notify_wecom_base.rstrip("/")
        key = ("wecom_token", base, config["corp_id"],
               hashlib.sha256(config["app_secret"].encode()).hexdigest())
        cached = ctx.cache.get(key)
        if cached and not refused and cached[1] > ctx.clock():
            return cached[0]
        # One gettoken at a time per app: the vendor rate-limits it, and a burst
        # of sends (an announcement) would otherwise all fetch at once.
        lock = ctx.cache.setdefault(("lock",) + key, asyncio.Lock())
        async with lock:
            cached = ctx.cache.get(key)
            if cached and cached[1] > ctx.clock() and cached[0] != refused:
                return cached[0]
            url = f"{base}/cgi-bin/gettoken?" + urlencode(
                {"corpid": config["corp_id"], "corpsecret": config["app_secret"]})
            reply = await ctx.http.send("GET", url)
            data = reply.json() or {}
            if reply.status != 200 or data.get("errcode", 0) != 0 or not data.get("access_token"):
                raise DeliveryError(f"WeCom gettoken failed: HTTP {reply.status} {reply.snippet()}")
            # Renew five minutes early so that a token never expires in flight.
            ctx.cache[key] = (data["access_token"],
                              ctx.clock() + max(int(data.get("expires_in", 7200)) - 300, 60))
            return data["access_token"]

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        base = ctx.settings.notify_wecom_base.rstrip("/")
        body = {"touser": config.get("to_user") or "@all", "msgtype": "text",
                "agentid": int(config["agent_id"]), "text": {"content": _cut(msg.text(), 2048)},
                "safe": 0}
        refused = ""
        for _ in (0, 1):
            token = await self._token(config, ctx, refused)
            reply = await ctx.http.send(
                "POST", f"{base}/cgi-bin/message/send?access_token={token}", json_body=body)
            data = reply.json() or {}
            if reply.status == 200 and data.get("errcode") == 0:
                return f"msgid {data.get('msgid', '')}"
            if data.get("errcode") not in TOKEN_ERRORS:
                break
            refused = token
        raise DeliveryError(f"WeCom message/send failed: HTTP {reply.status} {reply.snippet()}")
