"""/api/token: a user's API keys (admins see everyone's), new-api routes and fields.

Keys are stored encrypted (the owner can see theirs again) and found by a
keyed hash; the plain key is never stored.  Every write calls
catalog.changed(), so the next relay request already sees it.
"""
from __future__ import annotations

import re
import time

from handlers.api_user import _int, limit_fields, paged
from handlers.base import ApiError, ApiHandler
from models.records import (BILLING_MODES, LIMIT_FIELDS, TOKEN_DISABLED, TOKEN_ENABLED,
                            TOKEN_EXHAUSTED, TOKEN_EXPIRED, parse_networks)
from models.secrets import mask, new_api_key
from models.store import now
from relay.billing import TOKEN


def token_view(handler: ApiHandler, doc: dict, reveal: bool = False) -> dict:
    remaining, used = handler.ctx["billing"].view_from_doc(TOKEN, doc)
    key = handler.ctx["vault"].decrypt(doc.get("key_enc", ""))
    status = int(doc.get("status", TOKEN_ENABLED))
    if status == TOKEN_ENABLED:
        if doc.get("expired_time", -1) not in (-1, 0) and doc["expired_time"] <= time.time():
            status = TOKEN_EXPIRED
        elif not doc.get("unlimited_quota") and remaining <= 0:
            status = TOKEN_EXHAUSTED
    return {
        "id": doc["_id"], "user_id": doc["user_id"], "name": doc.get("name", ""),
        "key": key if reveal else mask(key, 6), "status": status,
        "remain_quota": remaining, "used_quota": used,
        "unlimited_quota": bool(doc.get("unlimited_quota")),
        "expired_time": doc.get("expired_time", -1), "group": doc.get("group", "default"),
        "allow_ips": doc.get("allow_ips", ""),
        "model_limits_enabled": bool(doc.get("model_limits_enabled")),
        "model_limits": ",".join(doc.get("model_limits") or []),
        "billing_mode": doc.get("billing_mode", "per_token"),
        "created_time": doc.get("created_time", 0), "accessed_time": doc.get("accessed_time", 0),
        **{f: int(doc.get(f) or 0) for f in LIMIT_FIELDS},  # relay/limits.py
    }


def clean_fields(handler: ApiHandler, body: dict, creating: bool) -> dict:
    """Validate the writable fields present in body."""
    out: dict = {}
    if "name" in body or creating:
        name = str(body.get("name") or "").strip() or "default"
        if len(name) > 64:
            raise ApiError(400, "The key name is longer than 64 characters.")
        out["name"] = name
    if "unlimited_quota" in body:
        out["unlimited_quota"] = bool(body["unlimited_quota"])
    if "expired_time" in body:
        exp = _int(body["expired_time"], "expired_time")
        if exp not in (-1, 0) and exp <= time.time():
            raise ApiError(400, "expired_time is in the past; use -1 for never.")
        out["expired_time"] = -1 if exp == 0 else exp
    if "group" in body:
        group = str(body["group"] or "").strip()
        g = handler.ctx["catalog"].groups.get(group)
        if g is None:
            raise ApiError(400, f"There is no group named {group!r}.")
        if not g.enabled:
            raise ApiError(400, f"The group {group!r} is disabled.")
        out["group"] = group
    if "allow_ips" in body:
        raw = body["allow_ips"] or ""
        if isinstance(raw, list):
            raw = "\n".join(str(x) for x in raw)
        try:
            parse_networks(raw)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        out["allow_ips"] = "\n".join(x for x in re.split(r"[\s,;]+", str(raw)) if x)
    if "model_limits_enabled" in body:
        out["model_limits_enabled"] = bool(body["model_limits_enabled"])
    if "model_limits" in body:
        raw = body["model_limits"] or []
        items = raw if isinstance(raw, list) else str(raw).split(",")
        out["model_limits"] = sorted({str(m).strip() for m in items if str(m).strip()})
    if "billing_mode" in body:
        if body["billing_mode"] not in BILLING_MODES:
            raise ApiError(400, "billing_mode must be per_token or per_call.")
        out["billing_mode"] = body["billing_mode"]
    out.update(limit_fields(body))
    if "status" in body:
        if body["status"] not in (TOKEN_ENABLED, TOKEN_DISABLED):
            raise ApiError(400, "status must be 1 (enabled) or 2 (disabled).")
        out["status"] = body["status"]
    return out


class TokensHandler(ApiHandler):
    def scope(self) -> dict:
        user = self.require_user()
        if self.is_admin() and self.get_argument("all", "") in ("1", "true"):
            return {}
        return {"user_id": user["_id"]}

    async def get(self) -> None:
        flt = self.scope()
        uid = self.current_user["_id"]
        self.ok(await paged(self, self.store.db.tokens, flt,
                            lambda d: token_view(self, d, reveal=False) | {
                                "owned": d["user_id"] == uid}))

    async def post(self) -> None:
        user = self.require_user()
        body = self.body_json()
        fields = clean_fields(self, body, creating=True)
        fields.setdefault("group", user.get("group") or "default")
        if fields["group"] not in self.ctx["catalog"].groups:
            raise ApiError(400, f"There is no group named {fields['group']!r}.")
        remain = _int(body.get("remain_quota", 0), "remain_quota")
        if remain < 0:
            raise ApiError(400, "remain_quota cannot be negative.")
        key = new_api_key()
        vault = self.ctx["vault"]
        doc = {"_id": await self.store.next_id("tokens"), "user_id": user["_id"],
               "key_hash": vault.lookup_hash(key), "key_enc": vault.encrypt(key),
               "status": TOKEN_ENABLED, "quota": remain, "used_quota": 0, "leases": {},
               "unlimited_quota": False, "expired_time": -1, "allow_ips": "",
               "model_limits_enabled": False, "model_limits": [], "billing_mode": "per_token",
               "created_time": now(), "accessed_time": 0, **fields}
        await self.store.db.tokens.insert_one(doc)
        self.ok(token_view(self, doc, reveal=True), "Key created.")

    async def put(self) -> None:
        self.require_user()
        body = self.body_json()
        doc = await self.owned(body.get("id"))
        if self.get_argument("status_only", "") in ("1", "true"):
            body = {"status": body.get("status")}
        fields = clean_fields(self, body, creating=False)
        if fields:
            await self.store.db.tokens.update_one({"_id": doc["_id"]}, {"$set": fields})
        if "remain_quota" in body and self.get_argument("status_only", "") not in ("1", "true"):
            target = _int(body["remain_quota"], "remain_quota")
            if target < 0:
                raise ApiError(400, "remain_quota cannot be negative.")
            await self.ctx["billing"].set_remaining(TOKEN, doc["_id"], target)
        await self.ctx["catalog"].changed("token", doc["key_hash"])
        doc = await self.store.db.tokens.find_one({"_id": doc["_id"]})
        self.ok(token_view(self, doc, reveal=doc["user_id"] == self.current_user["_id"]), "Saved.")

    async def owned(self, ident) -> dict:
        try:
            ident = int(ident)
        except (TypeError, ValueError):
            raise ApiError(400, "Give the key's id.") from None
        doc = await self.store.db.tokens.find_one({"_id": ident})
        if doc is None or (doc["user_id"] != self.current_user["_id"] and not self.is_admin()):
            raise ApiError(404, f"No key with id {ident}.")
        return doc


class TokenHandler(TokensHandler):
    async def get(self, ident: str) -> None:
        self.require_user()
        doc = await self.owned(ident)
        self.ok(token_view(self, doc, reveal=doc["user_id"] == self.current_user["_id"]))

    async def delete(self, ident: str) -> None:
        self.require_user()
        doc = await self.owned(ident)
        await self.store.db.tokens.delete_one({"_id": doc["_id"]})
        await self.ctx["catalog"].changed("token", doc["key_hash"])
        await self.ctx["responses"].records.delete_for_token(doc["_id"])
        self.ok(None, "Key deleted.")


class TokenSearchHandler(TokensHandler):
    async def get(self) -> None:
        flt = self.scope()
        kw = self.get_argument("keyword", "").strip()
        if kw.startswith("sk-"):
            flt["key_hash"] = self.ctx["vault"].lookup_hash(kw)
        elif kw:
            flt["name"] = {"$regex": re.escape(kw), "$options": "i"}
        uid = self.current_user["_id"]
        self.ok(await paged(self, self.store.db.tokens, flt,
                            lambda d: token_view(self, d) | {"owned": d["user_id"] == uid}))


default_handlers = [
    (r"/api/token/search/?", TokenSearchHandler),
    (r"/api/token/?", TokensHandler),
    (r"/api/token/(\d+)/?", TokenHandler),
]
