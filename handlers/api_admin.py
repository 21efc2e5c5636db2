"""/api/group, /api/price, /api/channel, /api/redemption, /api/option."""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import replace
from decimal import Decimal

from handlers.api_fields import _int, group_list, paged
from handlers.base import ApiError, ApiHandler, ident
from models.records import (MAX_QUOTA, PRICE_COMPONENTS, Price, User, parse_tiers, tiers_doc,
                            to_decimal)
from models.secrets import mask
from models.store import DuplicateKeyError, now
from relay import jsonin, price_catalogue, registry
from relay.adaptors.base import Call


def _dec(value, name: str) -> str:
    if isinstance(value, str) and len(value) > 40:
        raise ApiError(400, f"{name} must be a number.")
    try:
        d = to_decimal(value, name)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if d > 10 ** 9 or d.as_tuple().exponent < -12:
        raise ApiError(400, f"{name} must be at most 1,000,000,000 with at most 12 decimals.")
    return str(d)


def _num(s) -> float | int:
    d = Decimal(str(s or "0"))
    return int(d) if d == d.to_integral_value() else float(d)


# ---- groups ----------------------------------------------------------------
def group_view(d: dict) -> dict:
    return {"name": d["_id"], "rate": _num(d.get("rate", "1")),
            "description": d.get("description", ""), "enabled": bool(d.get("enabled", True)),
            "usable_groups": list(d.get("usable_groups") or [])}


class GroupsHandler(ApiHandler):
    async def get(self) -> None:
        """Signed-in users see the enabled groups they may put keys in (for
        the key form); admins all, with each group's usable_groups."""
        user = self.require_user()
        flt = {} if self.is_admin() else {"enabled": True}
        docs = await self.store.db.groups.find(flt).sort("_id", 1).to_list(1000)
        if not self.is_admin():
            usable = User.from_doc(user).usable_set(self.ctx["catalog"].groups)
            docs = [d for d in docs if d["_id"] in usable]
        self.ok([group_view(d) for d in docs])

    async def post(self) -> None:
        self.require_admin()
        body = self.body_json()
        name = str(body.get("name") or "").strip()
        if not name or len(name) > 32 or not name.replace("-", "").replace("_", "").isalnum():
            raise ApiError(400, "A group name is 1-32 letters, digits, - or _.")
        doc = {"_id": name, "rate": _dec(body.get("rate", 1), "rate"),
               "description": str(body.get("description") or ""),
               "enabled": bool(body.get("enabled", True)),
               "usable_groups": group_list(self, body.get("usable_groups")),
               "created_time": now()}
        try:
            await self.store.db.groups.insert_one(doc)
        except DuplicateKeyError:
            raise ApiError(409, f"The group {name!r} exists already.") from None
        await self.ctx["catalog"].changed("group", name)
        self.ok(group_view(doc), "Group created.")

    async def put(self) -> None:
        self.require_admin()
        body = self.body_json()
        name = str(body.get("name") or "")
        update = {}
        if "rate" in body:
            update["rate"] = _dec(body["rate"], "rate")
        if "description" in body:
            update["description"] = str(body["description"])
        if "enabled" in body:
            update["enabled"] = bool(body["enabled"])
        if "usable_groups" in body:
            update["usable_groups"] = group_list(self, body["usable_groups"])
        if not update:
            raise ApiError(400, "Nothing to change.")
        doc = await self.store.db.groups.find_one_and_update({"_id": name}, {"$set": update},
                                                             return_document=True)
        if doc is None:
            raise ApiError(404, f"No group named {name!r}.")
        await self.ctx["catalog"].changed("group", name)
        self.ok(group_view(doc), "Saved.")


class GroupHandler(GroupsHandler):
    async def delete(self, name: str) -> None:
        self.require_admin()
        if await self.store.db.tokens.find_one({"group": name}, {"_id": 1}):
            raise ApiError(409, f"Keys still use the group {name!r}; move them first or "
                                "disable the group instead.")
        r = await self.store.db.groups.delete_one({"_id": name})
        if not r.deleted_count:
            raise ApiError(404, f"No group named {name!r}.")
        await self.ctx["catalog"].changed("group", name)
        self.ok(None, "Group deleted.")


# ---- prices ----------------------------------------------------------------
def price_view(p: Price, **extra) -> dict:
    """One price row: every component, its tiers, and where it comes from."""
    return {"model": p.model, "group": p.group, "source": p.source, "ref": p.ref,
            **{f: _num(v) for f, v in p.components().items()},
            "tiers": [{"above": a, **{k: _num(v) for k, v in t.items()}} for a, t in p.tiers],
            **extra}


def catalogue_rows(catalog) -> list[dict]:
    """What the catalogue charges for each model a channel serves and no
    administrator has priced for all groups; source "none" when it has no
    price either (such a model answers 503)."""
    rows: dict = {}
    for ch in catalog.channels:
        for model in ch.models:
            if (model, "") in catalog.prices:
                continue
            p = price_catalogue.lookup(ch.type, ch.upstream_model(model))
            key = (model, p.ref if p else "")
            if key not in rows:
                rows[key] = (price_view(replace(p, model=model), upstream_model=p.model)
                             if p else {"model": model, "group": "", "source": "none", "ref": "",
                                        "tiers": []})
                rows[key]["channels"] = []
            rows[key]["channels"].append(ch.id)
    return list(rows.values())


class PricesHandler(ApiHandler):
    async def get(self) -> None:
        """Every price in force: administrators' overrides and, for each
        served model without one, the catalogue's."""
        self.require_user()
        catalog = self.ctx["catalog"]
        rows = [price_view(p) for p in catalog.prices.values()] + catalogue_rows(catalog)
        if not self.is_admin():  # which channel serves what is the operator's business
            for r in rows:
                r.pop("channels", None)
                r.pop("upstream_model", None)
        rows.sort(key=lambda r: (r["model"], r["group"], r["source"]))
        self.ok(rows)

    async def post(self) -> None:
        """Create or replace the price of a model (optionally for one group):
        an override of the catalogue's, complete in itself."""
        self.require_admin()
        body = self.body_json()
        model = jsonin.text(body.get("model"), "model", 200)
        if not model.strip() or model != model.strip():
            raise ApiError(400, "Give the model name, without leading or trailing spaces.")
        group = jsonin.text(body.get("group"), "group", 64)
        if group and group not in self.ctx["catalog"].groups:
            raise ApiError(400, f"There is no group named {group!r}.")
        try:
            tiers = parse_tiers(body.get("tiers"))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        # A tier's prices within the same bounds as the components'.
        tiers = tiers_doc(tuple((above, {k: _dec(v, f"tiers[{i}].{k}") for k, v in prices.items()})
                                for i, (above, prices) in enumerate(tiers)))
        doc = {"_id": f"{model}@{group}", "model": model, "group": group,
               **{f: _dec(body.get(f, 0), f) for f in PRICE_COMPONENTS}, "tiers": tiers,
               "updated_time": now()}
        await self.store.db.prices.replace_one({"_id": doc["_id"]}, doc, upsert=True)
        await self.ctx["catalog"].changed("price", doc["_id"])
        self.ok(price_view(Price.from_doc(doc)), "Price saved.")

    put = post

    async def delete(self) -> None:
        self.require_admin()
        model = self.get_argument("model", "")
        group = self.get_argument("group", "")
        r = await self.store.db.prices.delete_one({"_id": f"{model}@{group}"})
        if not r.deleted_count:
            raise ApiError(404, f"No price for {model!r}" + (f" in {group!r}." if group else "."))
        await self.ctx["catalog"].changed("price", f"{model}@{group}")
        self.ok(None, "Price deleted.")


class PriceCatalogueHandler(ApiHandler):
    async def get(self) -> None:
        """Which catalogue prices models without an override, and its version."""
        self.require_user()
        self.ok({"package": price_catalogue.PACKAGE, "version": price_catalogue.VERSION,
                 "providers": price_catalogue.PROVIDERS})


class PriceHandler(PricesHandler):
    async def delete(self, model: str) -> None:
        self.request.arguments.setdefault("model", [model.encode()])
        await PricesHandler.delete(self)


# ---- channels --------------------------------------------------------------
def channel_view(handler: ApiHandler, d: dict) -> dict:
    health = handler.ctx["scheduler"].snapshot().get(d["_id"], {})
    return {"id": d["_id"], "name": d.get("name", ""), "type": d.get("type", "openai"),
            "base_url": d.get("base_url", ""),
            "key": mask(handler.ctx["vault"].decrypt(d.get("key_enc", ""))),
            "models": d.get("models", []), "groups": d.get("groups", []),
            "priority": d.get("priority", 0), "weight": d.get("weight", 1),
            "model_mapping": d.get("model_mapping", {}), "enabled": bool(d.get("enabled", True)),
            "options": d.get("options", {}), "health": health,
            "created_time": d.get("created_time", 0)}


def _list(value, name: str) -> list[str]:
    if isinstance(value, str):
        value = [v for v in value.replace("\n", ",").split(",")]
    if not isinstance(value, list):
        raise ApiError(400, f"{name} must be a list.")
    return [str(v).strip() for v in value if str(v).strip()]


def channel_fields(handler: ApiHandler, body: dict, creating: bool) -> dict:
    out: dict = {}
    required = ("name", "type", "base_url", "key", "models") if creating else ()
    for f in required:
        if not body.get(f):
            raise ApiError(400, f"A channel needs {f}.")
    if "name" in body:
        out["name"] = str(body["name"]).strip()
    if "type" in body:
        if body["type"] not in registry.channel_types():
            raise ApiError(400, f"type must be one of: {', '.join(registry.channel_types())}.")
        out["type"] = body["type"]
    if "base_url" in body:
        url = str(body["base_url"]).strip()
        if not url.startswith(("http://", "https://")):
            raise ApiError(400, "base_url must start with http:// or https://.")
        out["base_url"] = url.rstrip("/")
    if body.get("key") and "*" not in str(body["key"]):
        out["key_enc"] = handler.ctx["vault"].encrypt(str(body["key"]).strip())
    if "models" in body:
        out["models"] = _list(body["models"], "models")
    if "groups" in body or creating:
        groups = _list(body.get("groups") or ["default"], "groups")
        unknown = [g for g in groups if g not in handler.ctx["catalog"].groups]
        if unknown:
            raise ApiError(400, f"Unknown group(s): {', '.join(unknown)}.")
        out["groups"] = groups
    for f in ("priority", "weight"):
        if f in body:
            out[f] = _int(body[f], f, -10 ** 9, 10 ** 9)
    if out.get("weight", 1) < 0:
        raise ApiError(400, "weight cannot be negative.")
    if "model_mapping" in body:
        mm = body["model_mapping"] or {}
        if isinstance(mm, str):
            try:
                mm = json.loads(mm) if mm.strip() else {}
            except ValueError:
                raise ApiError(400, "model_mapping must be a JSON object.") from None
        if not isinstance(mm, dict) or not all(isinstance(v, str) for v in mm.values()):
            raise ApiError(400, "model_mapping must map model names to model names.")
        out["model_mapping"] = mm
    if "enabled" in body:
        out["enabled"] = bool(body["enabled"])
    if "options" in body:
        if not isinstance(body["options"], dict):
            raise ApiError(400, "options must be an object.")
        out["options"] = body["options"]
    return out


class ChannelsHandler(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        self.ok(await paged(self, self.store.db.channels, {}, lambda d: channel_view(self, d)))

    async def post(self) -> None:
        self.require_admin()
        fields = channel_fields(self, self.body_json(), creating=True)
        doc = {"_id": await self.store.next_id("channels"), "priority": 0, "weight": 1,
               "model_mapping": {}, "enabled": True, "options": {}, "created_time": now(),
               **fields}
        await self.store.db.channels.insert_one(doc)
        await self.ctx["catalog"].changed("channel", doc["_id"])
        self.ok(channel_view(self, doc), "Channel created.")

    async def put(self) -> None:
        self.require_admin()
        body = self.body_json()
        fields = channel_fields(self, body, creating=False)
        doc = await self.store.db.channels.find_one_and_update(
            {"_id": ident(body.get("id"))}, {"$set": fields}, return_document=True)
        if doc is None:
            raise ApiError(404, f"No channel with id {body.get('id')}.")
        await self.ctx["catalog"].changed("channel", doc["_id"])
        self.ok(channel_view(self, doc), "Saved.")


class ChannelHandler(ChannelsHandler):
    async def get(self, cid: str) -> None:
        self.require_admin()
        doc = await self.store.db.channels.find_one({"_id": ident(cid)})
        if doc is None:
            raise ApiError(404, f"No channel with id {cid}.")
        self.ok(channel_view(self, doc))

    async def delete(self, cid: str) -> None:
        self.require_admin()
        r = await self.store.db.channels.delete_one({"_id": ident(cid)})
        if not r.deleted_count:
            raise ApiError(404, f"No channel with id {cid}.")
        await self.ctx["catalog"].changed("channel", ident(cid))
        self.ok(None, "Channel deleted.")


class ChannelTestHandler(ApiHandler):
    """Send a one-token chat call through the channel and report the result."""

    async def post(self, raw_id: str) -> None:
        self.require_admin()
        catalog = self.ctx["catalog"]
        cid = ident(raw_id)
        chan = next((c for c in catalog.channels if c.id == cid), None)
        if chan is None:
            doc = await self.store.db.channels.find_one({"_id": cid})
            if doc is None:
                raise ApiError(404, f"No channel with id {cid}.")
            await catalog.reload_channels()
            chan = next((c for c in catalog.channels if c.id == cid), None)
        body = self.body_json()
        model = body.get("model") or (chan.models[0] if chan and chan.models else "")
        if chan is None or not model:
            raise ApiError(400, "The channel has no models to test with.")
        adaptor = registry.adaptor_for(chan.type)
        if adaptor is None or "chat" not in adaptor.endpoints:
            raise ApiError(400, f"Channels of type {chan.type} cannot be tested with a chat call.")
        call = Call(request_id=self.request_id, endpoint="chat", face="openai", model=model,
                    body={"model": model, "max_tokens": 1,
                          "messages": [{"role": "user", "content": "ping"}]},
                    upstream_model=chan.upstream_model(model))
        req = adaptor.prepare(call, chan)
        t0 = time.monotonic()
        resp = await self.ctx["upstream"].send(req.method, req.url, req.headers, req.body,
                                               first_byte_timeout=30)
        ms = int((time.monotonic() - t0) * 1000)
        if resp.error is None and resp.status < 400:
            self.ctx["scheduler"].success(chan)
            return self.ok({"ok": True, "status": resp.status, "latency_ms": ms},
                           f"The channel answered in {ms} ms.")
        err = resp.error or adaptor.error(resp.status, resp.body)
        self.ok({"ok": False, "status": resp.status, "latency_ms": ms, "error": err.message},
                f"The channel failed: {err.message}")


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
            raise ApiError(400, "quota must be a positive whole number of units.")
        if not 1 <= count <= 1000:
            raise ApiError(400, "count must be between 1 and 1000.")
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
            raise ApiError(404, f"No unused code with id {rid}.")
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
            raise ApiError(400, f"key must be one of: {', '.join(PUBLIC_OPTIONS)}.")
        await self.store.db.options.update_one({"_id": key}, {"$set": {"value": value}},
                                               upsert=True)
        self.ok({key: value}, "Saved.")


default_handlers = [
    (r"/api/group/?", GroupsHandler),
    (r"/api/group/([^/]+)/?", GroupHandler),
    (r"/api/price/?", PricesHandler),
    (r"/api/price/catalogue/?", PriceCatalogueHandler),
    (r"/api/price/([^/]+)/?", PriceHandler),
    (r"/api/channel/?", ChannelsHandler),
    (r"/api/channel/(\d+)/test/?", ChannelTestHandler),
    (r"/api/channel/(\d+)/?", ChannelHandler),
    (r"/api/redemption/?", RedemptionsHandler),
    (r"/api/redemption/(\d+)/?", RedemptionHandler),
    (r"/api/option/?", OptionsHandler),
]
