"""/api/redemption and /api/option: redemption codes and the site's options
(groups and prices: handlers/api_price.py; channels: handlers/api_channel.py;
users: handlers/api_user_admin.py)."""
from __future__ import annotations

import secrets

from handlers.api_fields import _int, paged
from handlers.base import ApiError, ApiHandler, ident
from models.records import MAX_QUOTA
from models.secrets import mask
from models.store import now


# ---- redemption codes ------------------------------------------------------
def redemption_view(d: dict) -> dict:
    """A code as listed: only its masked hint; the code itself was shown once,
    when it was made, and only a keyed hash of it is stored."""
    return {"id": d["_id"], "name": d.get("name", ""), "key": d.get("key_hint", ""),
            "quota": d["quota"],
            "status": d.get("status", 1), "created_time": d.get("created_time", 0),
            "redeemed_time": d.get("redeemed_time", 0), "used_user_id": d.get("used_user_id")}


class RedemptionsHandler(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        self.ok(await paged(self, self.store.db.redemptions, {}, redemption_view))

    async def post(self) -> None:
        self.require_admin()
        body = self.body_json()
        quota = _int(body.get("quota"), "quota", -MAX_QUOTA, MAX_QUOTA)
        count = _int(body.get("count", 1), "count")
        if quota <= 0:
            raise ApiError(400, "quota must be a positive whole number of units.",
                           code="field_positive", field="quota")
        if not 1 <= count <= 1000:
            raise ApiError(400, "count must be between 1 and 1000.", code="field_range",
                           field="count", min=1, max=1000)
        name = str(body.get("name") or "").strip()[:64] or "code"
        vault = self.ctx["vault"]
        codes = []
        for _ in range(count):
            key = secrets.token_hex(16)
            await self.store.db.redemptions.insert_one({
                "_id": await self.store.next_id("redemptions"), "name": name,
                "key_hash": vault.lookup_hash(key), "key_hint": mask(key, 4),
                "quota": quota, "status": 1, "created_time": now()})
            codes.append(key)
        self.ok(codes, f"{count} code(s) created; copy them now, they are not shown again.")


class RedemptionHandler(RedemptionsHandler):
    async def delete(self, rid: str) -> None:
        self.require_admin()
        r = await self.store.db.redemptions.delete_one({"_id": ident(rid), "status": 1})
        if not r.deleted_count:
            raise ApiError(404, f"No unused code with id {rid}.", code="no_unused_code", id=rid)
        self.ok(None, "Code deleted.")


# ---- options ---------------------------------------------------------------
PUBLIC_OPTIONS = ("registration_enabled", "base_addresses", "purchase_rate", "site_name")


class OptionsHandler(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        docs = await self.store.db.options.find({}).to_list(1000)
        self.ok({d["_id"]: d.get("value") for d in docs})

    async def put(self) -> None:
        self.require_admin()
        body = self.body_json()
        key, value = body.get("key"), body.get("value")
        if key not in PUBLIC_OPTIONS:
            raise ApiError(400, f"key must be one of: {', '.join(PUBLIC_OPTIONS)}.",
                           code="field_choice", field="key", choices=", ".join(PUBLIC_OPTIONS))
        await self.store.db.options.update_one({"_id": key}, {"$set": {"value": value}},
                                               upsert=True)
        self.ok({key: value}, "Saved.")


default_handlers = [
    (r"/api/redemption/?", RedemptionsHandler),
    (r"/api/redemption/(\d+)/?", RedemptionHandler),
    (r"/api/option/?", OptionsHandler),
]
