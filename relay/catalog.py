"""In-memory view of keys, users, groups, prices and channels.

A relay request reads only from here: on a warm cache it makes no database
read.  Small tables (groups, prices, channels) are held whole and reloaded
when one of their rows changes; keys and users are cached per entry.

Invalidation: every management write calls `changed(kind, ident)`.  That drops
the local entry at once, so the very next request in this process sees the
change, and appends it to the invalidation log, which the other relay
processes sharing the database poll every `invalidation_poll` seconds.

The log is one document, `invalidations/_id "log"`: a counter `n` and the
last RING entries, both changed by one atomic update ($inc and $push with
$slice).  So the database numbers every invalidation, in the order it took
them; a peer reads the entries after the number it last saw, and no
writer's clock is involved (relays whose clocks disagree by any amount
see the same order).  A peer further behind than RING entries (cut off
for a while, or a burst of changes) drops its whole cache instead.  A
write that fails is tried again (a few times over about a second); if it
still fails, `changed` raises CatalogUnavailable (the admin's request
fails with 503) and the entry is written by the poller as soon as the
database takes it: an invalidation is never lost, only late.

A cache fill (a key or a user read from the database on a miss) that was
under way while any change was applied here is used for its request but
not kept: what it read may be older than the change.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid

from cachetools import TTLCache

from models.records import Channel, Group, Price, Token, User
from models.store import PyMongoError, sort_by_id
from relay.errors import RelayError
from relay.money import price_catalogue
from relay.serving.background import cancel_and_wait

log = logging.getLogger("relay.catalog")

_MISSING = object()
# The longest API key looked up.  Ours are 51 characters; anything much
# longer is not a key of this relay, and a client may send up to Tornado's
# header limit (64 KB) in every request.
MAX_KEY_LENGTH = 256
LOG_ID = "log"
# Entries kept in the log: far more than a relay sees in one poll.
RING = 256
# Attempts at writing an entry before the admin's request is failed (about
# a second in all), after which the poller keeps trying.
WRITE_ATTEMPTS = 5
# The kind a listener is given when everything may have changed.
EVERYTHING = "*"


class CatalogUnavailable(RelayError):
    def __init__(self):
        super().__init__(503, "The change is saved here, but the other relays could not be told "
                              "of it (the database did not answer); they will be as soon as it "
                              "does. Repeating the request is harmless.",
                         "service_unavailable", "invalidation_not_recorded")
        self.retry_after = 1


class Catalog:
    def __init__(self, store, vault, ttl: float = 300.0, poll: float = 0.25):
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
        self._seen = 0          # the log's counter as last read
        self._unsent: list[str] = []   # entries the database has not taken yet
        self.version = 0  # bumped on every change; lets other caches key on it
        # fn(kind, ident) after every change applied here, local or from a peer:
        # lets caches outside the catalog (notify's subscriptions) ride the
        # same cross-process invalidation.
        self.listeners: list = []

    # ---- loading -----------------------------------------------------------
    async def load(self) -> None:
        head = await self.store.db.invalidations.find_one({"_id": LOG_ID}, {"n": 1})
        self._seen = int((head or {}).get("n") or 0)
        await self.reload_groups()
        await self.reload_prices()
        await self.reload_channels()

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
        version = self.version
        doc = await self.store.db.tokens.find_one({"key_hash": h})
        if version != self.version:   # a change raced the read: used once, not kept
            return Token.from_doc(doc) if doc else None
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
        version = self.version
        doc = await self.store.db.users.find_one({"_id": user_id})
        u = User.from_doc(doc) if doc else None
        if version == self.version:   # else a change raced the read: not kept
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
        """Call after any write to a cached kind: token, user, group, price,
        channel.  Raises CatalogUnavailable when the other relays could not
        be told yet (the entry is kept and written when the database answers)."""
        await self._apply(kind, ident)
        entry = json.dumps([kind, ident, self.process_id], separators=(",", ":"))
        if self._unsent or not await self._record(entry, WRITE_ATTEMPTS):
            self._unsent.append(entry)   # in order, behind any still waiting
            raise CatalogUnavailable()

    async def _record(self, entry: str, attempts: int) -> bool:
        """Append one entry to the log; False if the database never took it.
        An attempt whose answer was lost may have been taken: then the
        entry is in the log twice, and applying it twice is harmless."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                await self.store.db.invalidations.update_one(
                    {"_id": LOG_ID},
                    {"$inc": {"n": 1}, "$push": {"log": {"$each": [entry], "$slice": -RING}}},
                    upsert=True)
                return True
            except PyMongoError as exc:
                log.warning("recording an invalidation (attempt %d of %d): %s", attempt + 1,
                            attempts, exc)
                if attempt + 1 < attempts:
                    await asyncio.sleep(delay)
                    delay *= 2
        return False

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
        elif kind == EVERYTHING:
            self._tokens.clear()
            self._no_token.clear()
            self._users.clear()
            await self.reload_groups()
            await self.reload_prices()
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
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("invalidation poll failed")

    async def poll_once(self) -> None:
        """Write what `changed` could not, then apply the entries peers
        added since the last poll (one small read when there are none)."""
        while self._unsent:
            if not await self._record(self._unsent[0], 1):
                break
            self._unsent.pop(0)
        db = self.store.db
        head = await db.invalidations.find_one({"_id": LOG_ID}, {"n": 1})
        n = int((head or {}).get("n") or 0)
        if n == self._seen:
            return
        doc = await db.invalidations.find_one({"_id": LOG_ID}) or {}
        n = int(doc.get("n") or 0)
        entries = list(doc.get("log") or [])
        new = n - self._seen
        if new < 0 or new > len(entries):
            log.warning("invalidation log moved %d entries since the last poll (%d kept): "
                        "dropping every cached entry", new, len(entries))
            await self._apply(EVERYTHING, None)
        else:
            for raw in entries[len(entries) - new:]:
                try:
                    kind, ident, origin = json.loads(raw)
                except (TypeError, ValueError):
                    log.error("unreadable invalidation entry %r: dropping every cached entry", raw)
                    await self._apply(EVERYTHING, None)
                    break
                if origin != self.process_id:
                    await self._apply(kind, ident)
        # Only now: a poll that failed half-way applies them all again.
        self._seen = n
