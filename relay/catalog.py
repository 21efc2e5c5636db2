"""In-memory view of keys, users, groups, prices and channels.

A relay request reads only from here: on a warm cache it makes no database
read.  Small tables (groups, prices, channels) are held whole and reloaded
when one of their rows changes; keys and users are cached per entry.

Invalidation: every management write calls `changed(kind, ident)`.  That drops
the local entry at once, so the very next request in this process sees the
change, and appends to the `invalidations` collection, which the other relay
processes sharing the database poll every `invalidation_poll` seconds.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

from cachetools import TTLCache

from models.records import Channel, Group, Price, Token, User
from models.store import sort_by_id
from relay.money import price_catalogue
from relay.serving.background import cancel_and_wait

log = logging.getLogger("relay.catalog")

_MISSING = object()
# The longest API key looked up.  Ours are 51 characters; anything much
# longer is not a key of this relay, and a client may send up to Tornado's
# header limit (64 KB) in every request.
MAX_KEY_LENGTH = 256


class Catalog:
    def __init__(self, store, vault, ttl: float = 300.0, poll: float = 0.5):
        self.store = store
        self.vault = vault
        self.poll = poll
        self.process_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.groups: dict[str, Group] = {}
        self.prices: dict[tuple[str, str], Price] = {}
        self.channels: list[Channel] = []
        # Keyed by the key's keyed hash, never by the key: a cache of what
        # clients sent must not hold their secrets, nor grow with their size.
        self._tokens: TTLCache = TTLCache(maxsize=100_000, ttl=ttl)
        # Hashes that are no key, apart: wrong keys sent by anyone cannot
        # push the keys in use out of the cache above.
        self._no_token: TTLCache = TTLCache(maxsize=10_000, ttl=ttl)
        self._token_hash_by_id: dict[int, str] = {}
        self._users: TTLCache = TTLCache(maxsize=100_000, ttl=ttl)
        self._poller: asyncio.Task | None = None
        self._last_seen = 0.0
        # Invalidations already applied; the poll re-reads a 2 s overlap to
        # tolerate clock skew between processes, so it must skip repeats.
        self._recent: set = set()
        self.version = 0  # bumped on every change; lets other caches key on it
        # fn(kind, ident) after every change applied here, local or from a peer:
        # lets caches outside the catalog (notify's subscriptions) ride the
        # same cross-process invalidation.
        self.listeners: list = []

    # ---- loading -----------------------------------------------------------
    async def load(self) -> None:
        await self.reload_groups()
        await self.reload_prices()
        await self.reload_channels()
        self._last_seen = time.time()

    async def reload_groups(self) -> None:
        self.groups = {d["_id"]: Group.from_doc(d) async for d in self.store.db.groups.find({})}
        self.version += 1

    async def reload_prices(self) -> None:
        prices = {}
        async for d in self.store.db.prices.find({}):
            p = Price.from_doc(d)
            prices[(p.model, p.group)] = p
        self.prices = prices
        self.version += 1

    async def reload_channels(self) -> None:
        chans = []
        for d in sort_by_id(await self.store.db.channels.find({}).to_list(None)):
            chans.append(Channel(
                id=d["_id"], name=d.get("name", ""), type=d.get("type", "openai"),
                base_url=d.get("base_url", ""), key=self.vault.decrypt(d.get("key_enc", "")),
                models=tuple(d.get("models") or ()), groups=tuple(d.get("groups") or ()),
                priority=int(d.get("priority", 0)), weight=max(0, int(d.get("weight", 1))),
                model_mapping=dict(d.get("model_mapping") or {}),
                enabled=bool(d.get("enabled", True)) and not d.get("auto_disabled"),
                options=dict(d.get("options") or {})))
        self.channels = chans
        self.version += 1

    # ---- lookups (hot path) ------------------------------------------------
    async def token_by_key(self, key: str) -> Token | None:
        """The key's token, or None: no such key, or one longer than
        MAX_KEY_LENGTH (refused before it is hashed or looked up)."""
        if len(key) > MAX_KEY_LENGTH:
            return None
        h = self.vault.lookup_hash(key)
        hit = self._tokens.get(h, _MISSING)
        if hit is not _MISSING:
            return hit
        if h in self._no_token:
            return None
        doc = await self.store.db.tokens.find_one({"key_hash": h})
        if doc is None:
            self._no_token[h] = True
            return None
        tok = Token.from_doc(doc)
        self._token_hash_by_id[tok.id] = h
        self._tokens[h] = tok
        return tok

    async def user(self, user_id: int) -> User | None:
        hit = self._users.get(user_id, _MISSING)
        if hit is not _MISSING:
            return hit
        doc = await self.store.db.users.find_one({"_id": user_id})
        u = User.from_doc(doc) if doc else None
        self._users[user_id] = u
        return u

    def price(self, model: str, group: str, channel: Channel | None = None,
              tier: str = "") -> Price | None:
        """An administrator's price for the model in the group, else for the
        model, else (given the channel that serves it) the vendor's price
        from the catalogue (relay/money/price_catalogue.py); None if none.
        A service tier ("flex", "priority") is priced by the catalogue only:
        an administrator's price has none, so a group (or model) priced by
        one refuses the tier."""
        p = self.prices.get((model, group)) or self.prices.get((model, ""))
        if p is not None and tier:
            return None
        if p is None and channel is not None:
            p = price_catalogue.lookup(channel.type, channel.upstream_model(model), tier)
        return p

    def models_for_group(self, group: str) -> list[str]:
        seen = set()
        for ch in self.channels:
            if ch.enabled and group in ch.groups:
                seen.update(ch.models)
        return sorted(seen)

    # ---- invalidation ------------------------------------------------------
    async def changed(self, kind: str, ident=None) -> None:
        """Call after any write to a cached kind: token, user, group, price, channel."""
        await self._apply(kind, ident)
        try:
            await self.store.db.invalidations.insert_one(
                {"kind": kind, "ident": ident, "ts": time.time(), "origin": self.process_id})
        except Exception:  # the local cache is right already; peers catch up by TTL
            log.exception("could not record invalidation")

    async def _apply(self, kind: str, ident) -> None:
        if kind == "token":
            h = self._token_hash_by_id.pop(ident, None) if isinstance(ident, int) else ident
            if h:
                self._tokens.pop(h, None)
                self._no_token.pop(h, None)
            elif ident is None:
                self._tokens.clear()
                self._no_token.clear()
        elif kind == "user":
            if ident is None:
                self._users.clear()
            else:
                self._users.pop(ident, None)
        elif kind == "group":
            await self.reload_groups()
        elif kind == "price":
            await self.reload_prices()
        elif kind == "channel":
            await self.reload_channels()
        self.version += 1
        for fn in self.listeners:
            try:
                fn(kind, ident)
            except Exception:
                log.exception("catalog listener failed on %s", kind)

    def start_polling(self) -> None:
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_loop())

    async def stop_polling(self) -> None:
        await cancel_and_wait(self._poller)
        self._poller = None

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            try:
                cutoff = self._last_seen
                docs = await self.store.db.invalidations.find(
                    {"ts": {"$gt": cutoff - 2.0}}).sort("ts", 1).to_list(1000)
                for d in docs:
                    if d.get("origin") == self.process_id or d["ts"] <= cutoff - 2.0:
                        continue
                    key = (d["kind"], repr(d.get("ident")), d["ts"])
                    if key in self._recent:
                        continue
                    self._recent.add(key)
                    await self._apply(d["kind"], d.get("ident"))
                self._last_seen = time.time()
                if len(self._recent) > 10_000:
                    self._recent.clear()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("invalidation poll failed")
