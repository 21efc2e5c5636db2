"""Generic webhook: POST a templated body to the user's URL.

With a secret, X-Signature carries "sha256=" + hex HMAC-SHA256(secret, raw
body bytes) so the receiver can check the body came from us.  X-Notify-Id is
the outbox record id: a receiver can use it to drop a repeat delivery.
"""
from __future__ import annotations

import hashlib
import hmac

from models.refusal import Refusal
from notify import templates
from notify.channels.base import Channel, Context, DeliveryError, Field, Message

RESERVED = {"host", "content-length", "x-signature", "x-notify-id", "transfer-encoding"}


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def content_type(config: dict) -> str:
    for k, v in (config.get("headers") or {}).items():
        if k.lower() == "content-type":
            return v
    return "application/json; charset=utf-8"


def render_body(config: dict, variables: dict) -> str:
    return templates.render(config.get("body_template") or "", variables,
                            json_mode="json" in content_type(config).lower())


class WebhookChannel(Channel):
    type = "webhook"
    label = "Webhook"
    fields = (
        Field("url", "Endpoint URL", required=True),
        Field("headers", "Custom headers", kind="object", secret_values=True),
        Field("body_template", "Body template", kind="text"),
        Field("secret", "Signing secret (X-Signature)", secret=True),
    )

    def clean(self, config: dict) -> dict:
        out = super().clean(config)
        if not out["url"].startswith(("http://", "https://")):
            raise Refusal("The webhook URL must start with http:// or https://.", "field_url",
                          field="url")
        bad = [k for k in out["headers"] if k.lower() in RESERVED or not k.strip()
               or any(c in k + out["headers"][k] for c in "\r\n")]
        if bad:
            raise ValueError(f"These headers cannot be set: {', '.join(bad)}.")
        templates.check(out["body_template"])
        return out

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        try:
            body = (await templates.run(render_body, config, msg.vars)).encode()
        except ValueError as exc:
            raise DeliveryError(str(exc), permanent=True) from None
        headers = {"Content-Type": content_type(config), **(config.get("headers") or {}),
                   "X-Notify-Id": msg.id, "X-Notify-Event": msg.event_type,
                   "User-Agent": "relay-notify/1"}
        if config.get("secret"):
            headers["X-Signature"] = signature(config["secret"], body)
        reply = await ctx.http.send("POST", config["url"], headers=headers, body=body)
        if not 200 <= reply.status < 300:
            raise DeliveryError(f"The webhook answered HTTP {reply.status}: {reply.snippet()}")
        return f"HTTP {reply.status}"
