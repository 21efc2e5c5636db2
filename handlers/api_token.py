"""/api/token: a user's API keys (admins see everyone's), new-api routes and fields.

Keys are stored encrypted (the owner can see theirs again) and found by a
keyed hash; the plain key is never stored.  Every write calls
catalog.changed(), so the next relay request already sees it.
"""
from __future__ import annotations

import asyncio
import re
import time

from handlers.api_fields import (_int, budget_fields, budget_use, budgets_changed, limit_fields,
                                 paged)
from handlers.base import ApiError, ApiHandler, ident
from models import netlist
from models.records import (BILLING_MODES, LIMIT_FIELDS, MAX_QUOTA, TOKEN_DISABLED, TOKEN_ENABLED,
                            TOKEN_EXHAUSTED, TOKEN_EXPIRED, User)
from models.secrets import mask, new_api_key
from models.store import insert_capped, now
from relay.serving import jsonin
from relay.money.billing import TOKEN

# The models a key may be locked to: more is no lock anyone types.
MAX_MODEL_LIMITS = 1000


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
        **{f: int(doc.get(f) or 0) for f in LIMIT_FIELDS},  # relay/money/limits.py
        "budgets": dict(doc.get("budgets") or {}),   # relay/money/budgets.py
    }


async def allow_list(fields: dict) -> dict:
    """`fields` with the allow-list's entries collapsed into networks
    (models/netlist.py); a long list is parsed on a worker thread."""
    if "allow_nets" in fields:
        items = fields["allow_nets"]
        try:
            fields["allow_nets"] = (netlist.compile(items) if len(items) <= 16 else
                                    await asyncio.to_thread(netlist.compile, items))
        except ValueError as exc:
            raise ApiError.of(exc, code="invalid", message=f"allow_ips: {exc}.") from None
    return fields


async def with_budget_use(handler: ApiHandler, views: list[dict]) -> list[dict]:
    """Each key's budgets' use this period (`budget_use`: the keys page's
    bars), in its owner's time zone; one read of the counters."""
    if not any(v["budgets"] for v in views):
        for v in views:
            v["budget_use"] = []
        return views
    owners = {v["user_id"] for v in views if v["budgets"]}
    tz = {u["_id"]: u.get("timezone") async for u in handler.store.db.users.find(
        {"_id": {"$in": list(owners)}}, {"timezone": 1})}
    by_key = {v["id"]: v["user_id"] for v in views}
    use = await budget_use(handler, [("token", v["id"], v["budgets"]) for v in views],
                           lambda _s, tid: tz.get(by_key[tid]))
    for v in views:
        v["budget_use"] = use[("token", v["id"])]
    return views


def clean_fields(handler: ApiHandler, body: dict, creating: bool) -> dict:
    """Validate the writable fields present in body."""
    out: dict = {}
    if "name" in body or creating:
        name = jsonin.text(body.get("name"), "name", 1000).strip() or "default"
        if len(name) > 64:
            raise ApiError(400, "The key name is longer than 64 characters.", code="field_too_long",
                           field="name", max=64)
        out["name"] = name
    if "unlimited_quota" in body:
        out["unlimited_quota"] = bool(body["unlimited_quota"])
    if "expired_time" in body:
        exp = _int(body["expired_time"], "expired_time", -1, 2 ** 40)
        if exp not in (-1, 0) and exp <= time.time():
            raise ApiError(400, "expired_time is in the past; use -1 for never.",
                           code="expired_in_past")
        out["expired_time"] = -1 if exp == 0 else exp
    if "group" in body:
        group = jsonin.text(body["group"], "group", 64).strip()
        g = handler.ctx["catalog"].groups.get(group)
        if g is None:
            raise ApiError(400, f"There is no group named {group!r}.", code="no_group", group=group)
        if not g.enabled:
            raise ApiError(400, f"The group {group!r} is disabled.", code="group_disabled",
                           group=group)
        out["group"] = group
    if "allow_ips" in body:
        try:
            items = netlist.entries(body["allow_ips"])
        except ValueError as exc:
            raise ApiError.of(exc, code="invalid", message=f"allow_ips: {exc}.") from None
        out["allow_ips"] = "\n".join(items)
        out["allow_nets"] = items  # collapsed by allow_list(), off the event loop
    if "model_limits_enabled" in body:
        out["model_limits_enabled"] = bool(body["model_limits_enabled"])
    if "model_limits" in body:
        raw = body["model_limits"] or []
        items = raw if isinstance(raw, list) else jsonin.text(raw, "model_limits", 100_000).split(",")
        if len(items) > MAX_MODEL_LIMITS:
            raise ApiError(400, f"model_limits: at most {MAX_MODEL_LIMITS} models.",
                           code="list_too_long", field="model_limits", max=MAX_MODEL_LIMITS)
        names = {jsonin.text(m, "model_limits", 200).strip() for m in items}
        out["model_limits"] = sorted(n for n in names if n)
    if "billing_mode" in body:
        if body["billing_mode"] not in BILLING_MODES:
            raise ApiError(400, "billing_mode must be per_token or per_call.", code="field_choice",
                           field="billing_mode", choices=", ".join(BILLING_MODES))
        out["billing_mode"] = body["billing_mode"]
    out.update(limit_fields(body))
    out.update(budget_fields(body))
    if "status" in body:
        if body["status"] not in (TOKEN_ENABLED, TOKEN_DISABLED):
            raise ApiError(400, "status must be 1 (enabled) or 2 (disabled).", code="status_choice")
        out["status"] = body["status"]
    return out


class TokensHandler(ApiHandler):
    def scope(self) -> dict:
        user = self.require_user()
        if self.is_admin() and self.flag_arg("all"):
            return {}
        return {"user_id": user["_id"]}

    async def get(self) -> None:
        flt = self.scope()
        uid = self.current_user["_id"]
        page = await paged(self, self.store.db.tokens, flt,
                           lambda d: token_view(self, d, reveal=False) | {
                               "owned": d["user_id"] == uid})
        await with_budget_use(self, page["items"])
        self.ok(page)

    async def post(self) -> None:
        user = self.require_user()
        body = self.body_json()
        fields = await allow_list(clean_fields(self, body, creating=True))
        fields.setdefault("group", user.get("group") or "default")
        if fields["group"] not in self.ctx["catalog"].groups:
            raise ApiError(400, f"There is no group named {fields['group']!r}.", code="no_group",
                           group=fields["group"])
        self.check_usable(user, fields["group"])
        remain = _int(body.get("remain_quota", 0), "remain_quota", 0, MAX_QUOTA)
        key = new_api_key()
        vault = self.ctx["vault"]
        doc = {"_id": await self.store.next_id("tokens"), "user_id": user["_id"],
               "key_hash": vault.lookup_hash(key), "key_enc": vault.encrypt(key),
               "status": TOKEN_ENABLED, "quota": remain, "used_quota": 0, "leases": {},
               "unlimited_quota": False, "expired_time": -1,
               "allow_ips": "", "allow_nets": {"n": 0},
               "model_limits_enabled": False, "model_limits": [], "billing_mode": "per_token",
               "created_time": now(), "accessed_time": 0, **fields}
        cap = self.config.max_keys_per_user
        if not await insert_capped(self.store.db.tokens, doc, {"user_id": user["_id"]}, cap):
            raise ApiError(409, f"An account can have at most {cap} keys; delete one first.",
                           code="key_cap", max=cap)
        view = (await with_budget_use(self, [token_view(self, doc, reveal=True)]))[0]
        self.ok(view, "Key created.")

    async def put(self) -> None:
        self.require_user()
        body = self.body_json()
        doc = await self.owned(body.get("id"))
        status_only = self.flag_arg("status_only")
        if status_only:
            body = {"status": body.get("status")}
        fields = await allow_list(clean_fields(self, body, creating=False))
        if "group" in fields:
            owner = (self.current_user if doc["user_id"] == self.current_user["_id"]
                     else await self.store.db.users.find_one({"_id": doc["user_id"]}) or {})
            self.check_usable(owner, fields["group"])
        if fields:
            await self.store.db.tokens.update_one({"_id": doc["_id"]}, {"$set": fields})
        if "budgets" in fields:
            owner = await self.store.db.users.find_one({"_id": doc["user_id"]}, {"timezone": 1})
            await budgets_changed(self, "token", doc["_id"], doc.get("budgets") or {},
                                  fields["budgets"], (owner or {}).get("timezone"))
        if "remain_quota" in body and not status_only:
            target = _int(body["remain_quota"], "remain_quota", 0, MAX_QUOTA)
            await self.ctx["billing"].set_remaining(TOKEN, doc["_id"], target)
        await self.ctx["catalog"].changed("token", doc["key_hash"])
        doc = await self.store.db.tokens.find_one({"_id": doc["_id"]})
        view = token_view(self, doc, reveal=doc["user_id"] == self.current_user["_id"])
        self.ok((await with_budget_use(self, [view]))[0], "Saved.")

    def check_usable(self, owner: dict, group: str) -> None:
        """403 unless the key's owner may put keys in `group` (usable groups)."""
        if owner and not User.from_doc(owner).may_use(group, self.ctx["catalog"].groups):
            raise ApiError(403, f"The group {group!r} is not one this key's owner may use; "
                                "an administrator decides which groups each user may use.",
                           code="group_not_usable", group=group)

    async def owned(self, raw) -> dict:
        if raw is None:
            raise ApiError(400, "Give the key's id.", code="field_required", field="id")
        tid = ident(raw)
        doc = await self.store.db.tokens.find_one({"_id": tid})
        if doc is None or (doc["user_id"] != self.current_user["_id"] and not self.is_admin()):
            raise ApiError(404, f"No key with id {tid}.", code="no_such_key", id=tid)
        return doc


class TokenHandler(TokensHandler):
    async def get(self, tid: str) -> None:
        self.require_user()
        doc = await self.owned(tid)
        view = token_view(self, doc, reveal=doc["user_id"] == self.current_user["_id"])
        self.ok((await with_budget_use(self, [view]))[0])

    async def delete(self, tid: str) -> None:
        self.require_user()
        doc = await self.owned(tid)
        await self.store.db.tokens.delete_one({"_id": doc["_id"]})
        await self.ctx["catalog"].changed("token", doc["key_hash"])
        await self.ctx["responses"].records.delete_for_token(doc["_id"])
        self.ok(None, "Key deleted.")


class TokenSearchHandler(TokensHandler):
    async def get(self) -> None:
        flt = self.scope()
        kw = self.str_arg("keyword", max_len=200).strip()
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
