"""Subscriptions: who wants which events, over which channel.

A subscription is one channel with its config, the event types it takes,
and the thresholds for the two warnings.  Secret fields of the channel config
are stored encrypted (models.secrets.Vault) and shown masked; a masked value
sent back unchanged keeps the stored secret.

Reads on the hot path (threshold checks after every settle) come from an
in-memory copy per user, dropped on every write; other processes hear of the
write through the catalog's cross-process invalidation, and `ttl` bounds the
copy's age should that be missed.
"""
from __future__ import annotations

import json
import re
import time

from models.records import ROLE_ADMIN
from models.refusal import Refusal
from models.secrets import mask
from models.store import count_matching, insert_capped, now, sort_by_id
from notify import channels, templates

EVENT_TYPES = ("announcement", "marketing", "user_quota_warning", "key_quota_warning",
               "key_cache_collapse", "budget_warning",
               "storage_warning")
# Events only administrators may subscribe to.
ADMIN_EVENT_TYPES = ("storage_warning",)
MAX_PER_USER = 50
# Keys one subscription may watch (an account has at most max_keys_per_user).
MAX_KEY_IDS = 1000
# Header names whose values are credentials, masked when shown.
SENSITIVE = re.compile(r"auth|token|key|secret|pass|cookie|sign", re.I)
MASK_MARK = "********"


class Invalid(Refusal):
    """A subscription field is wrong; the message says which and why, and
    `code` names it for the console (subscription_invalid, with the message
    as `detail`, for what a channel's or a template's check says)."""

    def __init__(self, message: str, code: str = "", **values):
        if not code:
            code, values = "subscription_invalid", {"detail": message.rstrip(".")}
        super().__init__(message, code, **values)


class Subscriptions:
    def __init__(self, store, vault, ttl: float = 10.0, url_check=None, on_change=None):
        self.url_check = url_check  # raises for a URL the SSRF guard would refuse
        # async fn(user_id) after a write: tells other processes to drop their copy
        self.on_change = on_change
        self.store = store
        self.vault = vault
        self.ttl = ttl
        self._by_user: dict[int, tuple[float, list[dict]]] = {}

    @property
    def coll(self):
        return self.store.db.notify_subscriptions

    # ---- reads ---------------------------------------------------------------
    def cached(self, user_id: int) -> list[dict] | None:
        """The user's subscriptions if cached and fresh, else None (no I/O)."""
        hit = self._by_user.get(user_id)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    async def for_user(self, user_id: int) -> list[dict]:
        hit = self.cached(user_id)
        if hit is not None:
            return hit
        docs = sort_by_id(await self.coll.find({"user_id": user_id}).to_list(1000))
        if len(self._by_user) > 50_000:
            self._by_user.clear()
        self._by_user[user_id] = (time.monotonic() + self.ttl, docs)
        return docs

    async def list(self, user_id: int) -> list[dict]:
        """The user's subscriptions from the database (not the cache), oldest first."""
        return sort_by_id(await self.coll.find({"user_id": user_id}).to_list(1000))

    async def get(self, sub_id: int) -> dict | None:
        return await self.coll.find_one({"_id": sub_id})

    def invalidate(self, user_id: int) -> None:
        self._by_user.pop(user_id, None)

    def invalidate_all(self) -> None:
        self._by_user.clear()

    async def _changed(self, user_id: int) -> None:
        self.invalidate(user_id)
        if self.on_change is not None:
            await self.on_change(user_id)

    # ---- config and secrets --------------------------------------------------
    def config(self, doc: dict) -> dict:
        """The channel config with secrets decrypted, for sending."""
        cfg = dict(doc.get("channel_config") or {})
        for name, blob in (doc.get("secrets") or {}).items():
            cfg[name] = self.vault.decrypt(blob)
        for name, blob in (doc.get("secret_objects") or {}).items():
            cfg[name] = json.loads(self.vault.decrypt(blob) or "{}")
        return cfg

    def view(self, doc: dict) -> dict:
        cfg = dict(doc.get("channel_config") or {})
        for name, blob in (doc.get("secrets") or {}).items():
            cfg[name] = mask(self.vault.decrypt(blob)) if blob else ""
            if cfg[name] and MASK_MARK not in cfg[name]:
                cfg[name] = MASK_MARK  # short secrets: show nothing of them
        for name, blob in (doc.get("secret_objects") or {}).items():
            obj = json.loads(self.vault.decrypt(blob) or "{}")
            cfg[name] = {k: (_masked(v) if SENSITIVE.search(k) else v) for k, v in obj.items()}
        return {"id": doc["_id"], "user_id": doc["user_id"], "name": doc.get("name", ""),
                "event_types": doc.get("event_types", []),
                "user_threshold": doc.get("user_threshold", 0),
                "key_threshold": doc.get("key_threshold", 0), "key_ids": doc.get("key_ids", []),
                "channel_type": doc["channel_type"], "channel_config": cfg,
                "enabled": bool(doc.get("enabled", True)),
                "created_at": doc.get("created_at", 0), "updated_at": doc.get("updated_at", 0),
                "last_error": doc.get("last_error", ""),
                "last_error_at": doc.get("last_error_at", 0)}

    # ---- writes --------------------------------------------------------------
    async def clean(self, user: dict, body: dict, existing: dict | None = None) -> dict:
        """Validate a create/update body into stored fields; raise Invalid."""
        old = existing or {}
        out: dict = {}
        name = str(body.get("name", old.get("name", "")) or "").strip()
        if len(name) > 64:
            raise Invalid("The name is longer than 64 characters.", "field_too_long", field="name",
                          max=64)
        out["name"] = name or "default"
        types = body.get("event_types", old.get("event_types"))
        if not isinstance(types, list) or not types or len(types) > 2 * len(EVENT_TYPES):
            raise Invalid(f"event_types must be a non-empty list of: {', '.join(EVENT_TYPES)}.",
                          "event_types")
        unknown = [t for t in types if t not in EVENT_TYPES]
        if unknown:
            raise Invalid(f"Unknown event types: {unknown}; known: {', '.join(EVENT_TYPES)}.",
                          "event_types_unknown", types=", ".join(map(str, unknown))[:200])
        admin_only = [t for t in types if t in ADMIN_EVENT_TYPES]
        if admin_only and int(user.get("role") or 0) < ROLE_ADMIN:
            raise Invalid(f"Only administrators receive {', '.join(admin_only)}.",
                          "event_types_admin", types=", ".join(admin_only))
        out["event_types"] = list(dict.fromkeys(types))
        out.update(await self.clean_targets(user, body, old))
        ctype = body.get("channel_type", old.get("channel_type"))
        channel = channels.get(ctype) if isinstance(ctype, str) else None
        if channel is None:
            raise Invalid(f"channel_type must be one of: {', '.join(channels.CHANNELS)}.",
                          "field_choice", field="channel_type",
                          choices=", ".join(channels.CHANNELS))
        out["channel_type"] = ctype
        raw = body.get("channel_config", None)
        if raw is None:
            raw = self.config(old) if old.get("channel_type") == ctype else {}
        if not isinstance(raw, dict):
            raise Invalid("channel_config must be an object.", "field_not_object",
                          field="channel_config")
        raw = dict(raw)
        if old.get("channel_type") == ctype:
            stored = self.config(old)
            if raw.get("uid") and raw.get("uid") == stored.get("uid"):
                # A WxPusher UID typed in before UIDs came only from the QR
                # binding: sent back unchanged, it is dropped (and unused).
                raw.pop("uid")
            for f in channel.secret_fields():
                # The masked value came back, or the field was left out: keep the
                # stored secret.  An explicit "" clears it.
                if f not in raw or MASK_MARK in str(raw.get(f) or ""):
                    raw[f] = stored.get(f, "")
            for f in channel.secret_objects():
                if f not in raw:
                    raw[f] = stored.get(f, {})
                elif isinstance(raw[f], dict):
                    old_obj = stored.get(f) or {}
                    raw[f] = {k: (old_obj.get(k, "") if MASK_MARK in str(v) else v)
                              for k, v in raw[f].items()}
        try:
            # A webhook's clean() compiles and test-renders the body template:
            # off the event loop (notify/templates.py).
            cfg = await templates.run(channel.clean, raw)
            for f in ("url", "webhook_url"):
                if cfg.get(f) and self.url_check is not None:
                    self.url_check(cfg[f])
        except Refusal as exc:  # a channel's check names its refusal
            raise Invalid(str(exc), exc.code, **exc.values) from None
        except Exception as exc:  # ValueError, or the guard's Refused
            raise Invalid(str(exc)) from None
        out["secrets"] = {f: self.vault.encrypt(cfg.pop(f)) for f in channel.secret_fields()}
        out["secret_objects"] = {f: self.vault.encrypt(json.dumps(cfg.pop(f)))
                                 for f in channel.secret_objects()}
        out["channel_config"] = cfg
        out["enabled"] = bool(body.get("enabled", old.get("enabled", True)))
        return out

    async def clean_targets(self, user: dict, body: dict, old: dict | None = None) -> dict:
        """The thresholds and watched keys of a body (the stored ones where
        it leaves them out); raise Invalid."""
        old = old or {}
        out: dict = {}
        for f in ("user_threshold", "key_threshold"):
            value = body.get(f, old.get(f, 0))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                    or int(value) != value:
                raise Invalid(f"{f} must be a whole number of quota units, 0 or more.",
                              "field_units", field=f)
            out[f] = int(value)
        key_ids = body.get("key_ids", old.get("key_ids", []))
        if isinstance(key_ids, list) and len(key_ids) > MAX_KEY_IDS:
            raise Invalid(f"key_ids names at most {MAX_KEY_IDS} keys.", "list_too_long",
                          field="key_ids", max=MAX_KEY_IDS)
        if not isinstance(key_ids, list) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in key_ids):
            raise Invalid("key_ids must be a list of key ids (empty: all keys).", "field_not_list",
                          field="key_ids")
        if key_ids:
            mine = await count_matching(self.store.db.tokens,
                                        {"_id": {"$in": key_ids}, "user_id": user["_id"]})
            if mine != len(set(key_ids)):
                raise Invalid("key_ids names a key that is not yours.", "key_ids_not_yours")
        out["key_ids"] = sorted(set(key_ids))
        return out

    async def create(self, user: dict, body: dict) -> dict:
        fields = await self.clean(user, body)
        doc = {"_id": await self.store.next_id("notify_subscriptions"), "user_id": user["_id"],
               "created_at": now(), "updated_at": now(), "last_error": "", **fields}
        # Exact under racing creates, in any number of processes.
        if not await insert_capped(self.coll, doc, {"user_id": user["_id"]}, MAX_PER_USER):
            raise Invalid(f"An account can have at most {MAX_PER_USER} subscriptions.",
                          "subscription_cap", max=MAX_PER_USER)
        await self._changed(user["_id"])
        return doc

    async def update(self, user: dict, existing: dict, body: dict) -> dict:
        fields = await self.clean(user, body, existing)
        fields["updated_at"] = now()
        await self.coll.update_one({"_id": existing["_id"]}, {"$set": fields})
        await self._changed(existing["user_id"])
        return {**existing, **fields}

    async def delete(self, doc: dict) -> None:
        await self.coll.delete_one({"_id": doc["_id"]})
        await self._changed(doc["user_id"])

    async def record_failure(self, sub_id: int, error: str) -> None:
        await self.coll.update_one({"_id": sub_id}, {"$set": {"last_error": error[:500],
                                                              "last_error_at": now()}})


def _masked(value: str) -> str:
    shown = mask(str(value))
    return shown if MASK_MARK in shown else MASK_MARK
