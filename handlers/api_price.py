"""/api/group and /api/price: what a call costs, each group with its rate
(and the groups its keys may use) and each model's price."""
from __future__ import annotations

import time
from dataclasses import replace
from decimal import Decimal

from handlers.api_fields import group_list
from handlers.base import ApiError, ApiHandler
from models.records import (PRICE_COMPONENTS, Group, Price, User, parse_rate_tiers, parse_tiers,
                            rate_tiers_doc, tiers_doc, to_decimal)
from models.store import DuplicateKeyError, now
from relay.serving import jsonin
from relay.money import budgets, price_catalogue, rates

RATE_TIERS = ("input_tiers", "spend_tiers")


def _dec(value, name: str) -> str:
    if isinstance(value, str) and len(value) > 40:
        raise ApiError(400, f"{name} must be a number.", code="field_not_number", field=name)
    try:
        d = to_decimal(value, name)
    except ValueError as exc:
        raise ApiError.of(exc, code="invalid") from None
    if d > 10 ** 9 or d.as_tuple().exponent < -12:
        raise ApiError(400, f"{name} must be at most 1,000,000,000 with at most 12 decimals.",
                       code="field_decimal", field=name, max=10 ** 9, decimals=12)
    return str(d)


def _num(s) -> float | int:
    d = Decimal(str(s or "0"))
    return int(d) if d == d.to_integral_value() else float(d)


# ---- groups ----------------------------------------------------------------
def group_view(d: dict, spend: int | None = None) -> dict:
    """A group and its rate rule; with the viewer's spend this month, also
    `rate_now`: the rate their next call with a short prompt would get."""
    out = {"name": d["_id"], "rate": _num(d.get("rate", "1")),
           "description": d.get("description", ""), "enabled": bool(d.get("enabled", True)),
           "usable_groups": list(d.get("usable_groups") or [])}
    g = Group.from_doc(d)
    for f in RATE_TIERS:
        out[f] = [{"from": _num(t["from"]), "factor": _num(t["factor"])}
                  for t in rate_tiers_doc(getattr(g, f), f)]
    if spend is not None:
        out["rate_now"] = _num(rates.rate_for(g, 0, spend)[0])
        out["month_spend"] = spend
    return out


def rate_tiers(body: dict) -> dict:
    """The rate rules given in body, validated and in their stored form."""
    out = {}
    for f in RATE_TIERS:
        if f in body:
            try:
                out[f] = rate_tiers_doc(parse_rate_tiers(body[f], f), f)
            except ValueError as exc:
                raise ApiError.of(exc, code="invalid", message=f"{exc}.") from None
    return out


async def month_spend(handler, user: dict) -> int:
    """What the account was charged this calendar month (its time zone), as
    its month counter holds it (relay/money/budgets.py); 0 without one."""
    c = budgets.counter("user", user["_id"], "month", 0, time.time(),
                        user.get("timezone"))
    doc = await handler.store.db.budgets.find_one({"_id": c.id}, {"used_quota": 1})
    return int((doc or {}).get("used_quota") or 0)


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
        spend = await month_spend(self, user)
        self.ok([group_view(d, spend) for d in docs])

    async def post(self) -> None:
        self.require_admin()
        body = self.body_json()
        name = str(body.get("name") or "").strip()
        if not name or len(name) > 32 or not name.replace("-", "").replace("_", "").isalnum():
            raise ApiError(400, "A group name is 1-32 letters, digits, - or _.", code="group_name",
                           max=32)
        doc = {"_id": name, "rate": _dec(body.get("rate", 1), "rate"),
               "description": str(body.get("description") or ""),
               "enabled": bool(body.get("enabled", True)),
               "usable_groups": group_list(self, body.get("usable_groups")),
               **rate_tiers(body), "created_time": now()}
        try:
            await self.store.db.groups.insert_one(doc)
        except DuplicateKeyError:
            raise ApiError(409, f"The group {name!r} exists already.", code="group_exists",
                           group=name) from None
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
        update.update(rate_tiers(body))
        if not update:
            raise ApiError(400, "Nothing to change.", code="nothing_to_change")
        doc = await self.store.db.groups.find_one_and_update({"_id": name}, {"$set": update},
                                                             return_document=True)
        if doc is None:
            raise ApiError(404, f"No group named {name!r}.", code="no_group", group=name)
        await self.ctx["catalog"].changed("group", name)
        self.ok(group_view(doc), "Saved.")


class GroupHandler(GroupsHandler):
    async def delete(self, name: str) -> None:
        self.require_admin()
        if await self.store.db.tokens.find_one({"group": name}, {"_id": 1}):
            raise ApiError(409, f"Keys still use the group {name!r}; move them first or "
                                "disable the group instead.", code="group_in_use", group=name)
        r = await self.store.db.groups.delete_one({"_id": name})
        if not r.deleted_count:
            raise ApiError(404, f"No group named {name!r}.", code="no_group", group=name)
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
            raise ApiError(400, "Give the model name, without leading or trailing spaces.",
                           code="model_name")
        group = jsonin.text(body.get("group"), "group", 64)
        if group and group not in self.ctx["catalog"].groups:
            raise ApiError(400, f"There is no group named {group!r}.", code="no_group", group=group)
        try:
            tiers = parse_tiers(body.get("tiers"))
        except ValueError as exc:
            raise ApiError.of(exc, code="invalid") from None
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
            raise ApiError(404, f"No price for {model!r}" + (f" in {group!r}." if group else "."),
                           code="no_such_price", model=model, group=group)
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


default_handlers = [
    (r"/api/group/?", GroupsHandler),
    (r"/api/group/([^/]+)/?", GroupHandler),
    (r"/api/price/?", PricesHandler),
    (r"/api/price/catalogue/?", PriceCatalogueHandler),
    (r"/api/price/([^/]+)/?", PriceHandler),
]
