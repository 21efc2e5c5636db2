"""/api/channel: the upstream channels, and a test call through one."""
from __future__ import annotations

import json
import time

from handlers.api_fields import _int, by_id, paged
from handlers.base import ApiError, ApiHandler, ident
from models.secrets import mask
from models.store import now
from relay import registry
from relay.adaptors.base import Call


def channel_view(handler: ApiHandler, d: dict) -> dict:
    health = handler.ctx["scheduler"].snapshot().get(d["_id"], {})
    compat = handler.ctx.get("compat")
    return {"id": d["_id"], "name": d.get("name", ""), "type": d.get("type", "openai"),
            "base_url": d.get("base_url", ""),
            "key": mask(handler.ctx["vault"].decrypt(d.get("key_enc", ""))),
            "models": d.get("models", []), "groups": d.get("groups", []),
            "priority": d.get("priority", 0), "weight": d.get("weight", 1),
            "model_mapping": d.get("model_mapping", {}), "enabled": bool(d.get("enabled", True)),
            "options": d.get("options", {}), "health": health,
            "learned": compat.listing(d["_id"]) if compat is not None else [],
            "created_time": d.get("created_time", 0)}


def _list(value, name: str) -> list[str]:
    if isinstance(value, str):
        value = [v for v in value.replace("\n", ",").split(",")]
    if not isinstance(value, list):
        raise ApiError(400, f"{name} must be a list.", code="field_not_list", field=name)
    return [str(v).strip() for v in value if str(v).strip()]


def channel_fields(handler: ApiHandler, body: dict, creating: bool) -> dict:
    out: dict = {}
    required = ("name", "type", "base_url", "key", "models") if creating else ()
    for f in required:
        if not body.get(f):
            raise ApiError(400, f"A channel needs {f}.", code="field_required", field=f)
    if "name" in body:
        out["name"] = str(body["name"]).strip()
    if "type" in body:
        if body["type"] not in registry.channel_types():
            types = ", ".join(registry.channel_types())
            raise ApiError(400, f"type must be one of: {types}.", code="field_choice",
                           field="type", choices=types)
        out["type"] = body["type"]
    if "base_url" in body:
        url = str(body["base_url"]).strip()
        if not url.startswith(("http://", "https://")):
            raise ApiError(400, "base_url must start with http:// or https://.",
                           code="field_url", field="base_url")
        out["base_url"] = url.rstrip("/")
    if body.get("key") and "*" not in str(body["key"]):
        out["key_enc"] = handler.ctx["vault"].encrypt(str(body["key"]).strip())
    if "models" in body:
        out["models"] = _list(body["models"], "models")
    if "groups" in body or creating:
        groups = _list(body.get("groups") or ["default"], "groups")
        unknown = [g for g in groups if g not in handler.ctx["catalog"].groups]
        if unknown:
            raise ApiError(400, f"Unknown group(s): {', '.join(unknown)}.", code="no_group",
                           group=", ".join(unknown)[:200])
        out["groups"] = groups
    for f in ("priority", "weight"):
        if f in body:
            out[f] = _int(body[f], f, -10 ** 9, 10 ** 9)
    if out.get("weight", 1) < 0:
        raise ApiError(400, "weight cannot be negative.", code="field_negative", field="weight")
    if "model_mapping" in body:
        mm = body["model_mapping"] or {}
        if isinstance(mm, str):
            try:
                mm = json.loads(mm) if mm.strip() else {}
            except ValueError:
                raise ApiError(400, "model_mapping must be a JSON object.",
                               code="field_not_object", field="model_mapping") from None
        if not isinstance(mm, dict) or not all(isinstance(v, str) for v in mm.values()):
            raise ApiError(400, "model_mapping must map model names to model names.",
                           code="model_mapping")
        out["model_mapping"] = mm
    if "enabled" in body:
        out["enabled"] = bool(body["enabled"])
    if "options" in body:
        if not isinstance(body["options"], dict):
            raise ApiError(400, "options must be an object.", code="field_not_object",
                           field="options")
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
            raise ApiError(404, f"No channel with id {body.get('id')}.", code="no_such_channel",
                           id=body.get("id"))
        await self.ctx["catalog"].changed("channel", doc["_id"])
        self.ok(channel_view(self, doc), "Saved.")


class ChannelHandler(ChannelsHandler):
    async def get(self, cid: str) -> None:
        self.require_admin()
        self.ok(channel_view(self, await by_id(self.store.db.channels, cid, "channel")))

    async def delete(self, cid: str) -> None:
        self.require_admin()
        r = await self.store.db.channels.delete_one({"_id": ident(cid)})
        if not r.deleted_count:
            raise ApiError(404, f"No channel with id {cid}.", code="no_such_channel", id=cid)
        await self.ctx["catalog"].changed("channel", ident(cid))
        await self.ctx["compat"].forget(ident(cid))
        self.ok(None, "Channel deleted.")


class LearnedHandler(ApiHandler):
    """What the channel was seen to refuse (relay/compat): the API it speaks,
    and the betas and fields taken out of its calls.  DELETE forgets them
    all, or with ?id= one of them: the next call tries it again."""

    async def get(self, cid: str) -> None:
        self.require_admin()
        await by_id(self.store.db.channels, cid, "channel")
        self.ok(self.ctx["compat"].listing(ident(cid)))

    async def delete(self, cid: str) -> None:
        self.require_admin()
        await by_id(self.store.db.channels, cid, "channel")
        fact = self.get_query_argument("id", None)
        if fact is not None and (len(fact) > 1000 or not fact.startswith(f"{ident(cid)}|")):
            raise ApiError(404, "The channel has learnt no such thing.", code="no_such_learned")
        n = await self.ctx["compat"].forget(ident(cid), fact)
        if fact is not None and not n:
            raise ApiError(404, "The channel has learnt no such thing.", code="no_such_learned")
        self.ok(self.ctx["compat"].listing(ident(cid)), "Forgotten.")


class ChannelTestHandler(ApiHandler):
    """Send a one-token chat call through the channel and report the result."""

    async def post(self, raw_id: str) -> None:
        self.require_admin()
        catalog = self.ctx["catalog"]
        cid = ident(raw_id)
        chan = next((c for c in catalog.channels if c.id == cid), None)
        if chan is None:
            await by_id(self.store.db.channels, cid, "channel")
            await catalog.reload_channels()
            chan = next((c for c in catalog.channels if c.id == cid), None)
        body = self.body_json()
        model = body.get("model") or (chan.models[0] if chan and chan.models else "")
        if chan is None or not model:
            raise ApiError(400, "The channel has no models to test with.",
                           code="channel_no_models")
        adaptor = registry.adaptor_for(chan.type)
        if adaptor is None or "chat" not in adaptor.endpoints:
            raise ApiError(400, f"Channels of type {chan.type} cannot be tested with a chat call.",
                           code="channel_untestable", type=chan.type)
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


default_handlers = [
    (r"/api/channel/?", ChannelsHandler),
    (r"/api/channel/(\d+)/test/?", ChannelTestHandler),
    (r"/api/channel/(\d+)/learned/?", LearnedHandler),
    (r"/api/channel/(\d+)/?", ChannelHandler),
]
