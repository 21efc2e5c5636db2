"""Binding a personal-push UID to an account by scanning a QR code (WxPusher).

1. The user asks for a QR code: we make a one-time bind code and ask the push
   service for a parametric QR code carrying it
   (POST /api/fun/create/qrcode {appToken, extra, validTime}).
2. The user scans it in WeChat; the push service calls our callback with
   {"action": "app_subscribe", "data": {"uid", "extra", ...}}.
3. The callback is not signed by the vendor, so we check it: the bind code
   must be ours, unused and fresh, the optional callback token must match, and
   the push service itself must confirm that this UID scanned that QR code
   (GET /api/fun/scan-qrcode-uid?code=).  Only then is the UID bound.
"""
from __future__ import annotations

import hmac
from urllib.parse import quote

from models.secrets import random_string
from models.store import ReturnDocument

VALID_SECONDS = 1800
VENDORS = ("wxpusher",)


class BindError(Exception):
    """A refusal with its HTTP status; `code` names the ones a user meets in
    the console (err.<code>), the callback's are for the push service."""

    def __init__(self, status: int, message: str, code: str = "", **values):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.values = values


class PushBinding:
    def __init__(self, store, settings, http, clock):
        self.store = store
        self.settings = settings
        self.http = http
        self.clock = clock

    @property
    def base(self) -> str:
        return self.settings.notify_wxpusher_base.rstrip("/")

    async def qrcode(self, user_id: int, vendor: str) -> dict:
        """Ask the push service for a QR code carrying a new one-time bind code."""
        if vendor not in VENDORS:
            raise BindError(400, f"QR binding is available for: {', '.join(VENDORS)} "
                                 f"(ServerChan uses a SendKey instead).", "push_vendor",
                            choices=", ".join(VENDORS))
        if not self.settings.notify_wxpusher_app_token:
            raise BindError(503, "WxPusher is not set up on this server.", "push_not_set_up")
        code = "bind_" + random_string(24)
        try:
            reply = await self.http.send("POST", f"{self.base}/api/fun/create/qrcode", json_body={
                "appToken": self.settings.notify_wxpusher_app_token, "extra": code,
                "validTime": VALID_SECONDS})
        except Exception as exc:
            raise BindError(502, f"The push service did not answer: {exc}",
                            "push_service_failed", detail=str(exc)[:200]) from None
        data = reply.json() or {}
        qr = data.get("data") or {}
        if reply.status != 200 or data.get("code") != 1000 or not qr.get("url"):
            raise BindError(502, f"The push service refused the QR code: {reply.snippet(200)}",
                            "push_service_failed", detail=reply.snippet(200))
        now = self.clock()
        await self.store.db.notify_push_binds.insert_one({
            "_id": code, "user_id": user_id, "vendor": vendor, "qr_code": qr.get("code", ""),
            "created_at": now, "expires_at": now + VALID_SECONDS, "used": False})
        return {"qr_url": qr["url"], "short_url": qr.get("shortUrl", ""), "bind_code": code,
                "expires_at": int(now + VALID_SECONDS)}

    async def callback(self, body: dict, token: str) -> dict:
        """Handle the push service's scan callback; returns {user_id, uid}."""
        want = self.settings.notify_push_callback_token
        if want and not hmac.compare_digest(token.encode(), want.encode()):
            raise BindError(403, "Wrong callback token.")
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        if body.get("action") != "app_subscribe":
            raise BindError(400, "Not a subscribe callback.")
        uid, code = str(data.get("uid") or ""), str(data.get("extra") or "")
        if not uid or not code:
            raise BindError(400, "The callback has no uid or no extra (bind code).")
        bind = await self.store.db.notify_push_binds.find_one({"_id": code})
        if bind is None or bind["used"] or bind["expires_at"] < self.clock():
            raise BindError(404, "Unknown, used or expired bind code.")
        try:
            reply = await self.http.send(
                "GET", f"{self.base}/api/fun/scan-qrcode-uid?code={quote(bind['qr_code'])}")
        except Exception as exc:
            raise BindError(502, f"Could not confirm the scan with the push service: {exc}") from None
        confirmed = (reply.json() or {}).get("data")
        if reply.status != 200 or confirmed != uid:
            raise BindError(403, "The push service does not confirm this scan.")
        won = await self.store.db.notify_push_binds.find_one_and_update(
            {"_id": code, "used": False}, {"$set": {"used": True, "uid": uid}},
            return_document=ReturnDocument.AFTER)
        if won is None:
            raise BindError(404, "Unknown, used or expired bind code.")
        await self.store.db.notify_push_bindings.update_one(
            {"_id": bind["user_id"]}, {"$set": {bind["vendor"]: uid, "updated_at": self.clock()}},
            upsert=True)
        return {"user_id": bind["user_id"], "uid": uid}

    async def binding(self, user_id: int, vendor: str = "wxpusher") -> str | None:
        doc = await self.store.db.notify_push_bindings.find_one({"_id": user_id})
        return (doc or {}).get(vendor) or None

    async def unbind(self, user_id: int, vendor: str = "wxpusher") -> None:
        await self.store.db.notify_push_bindings.update_one({"_id": user_id},
                                                            {"$unset": {vendor: ""}})

