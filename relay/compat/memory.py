"""What each channel has been seen to refuse, and the request it gets for it.

`Compat` holds, per channel, the facts learnt from its refusals
(relay/compat/rules.py, relay/compat/wire.py):
- the API it speaks ("wire"): applied as the channel's `wire_api`
  (`compact_api` for compactions) until `reprobe_after` seconds have
  passed, then the client's own API is tried again;
- the betas and body fields it refuses, per upstream model: taken out of
  every request to that model for `strip_ttl` seconds.

relay/service.py asks `diagnose()` after a refused attempt, `learn()`s
what it names (in memory at once, so calls running beside it benefit),
retries on the same channel, and `keep()`s what the retry did not refute:
that is written to the database (models/learned.py) and announced to the
other relays through the catalog's invalidations (kind "learned").  A
relay that hears of it reads the channel's facts again.

The operator sees the facts on the channel's row and forgets them there
(handlers/api_channel.py).  Nothing an operator set is overridden: a
channel with `wire_api` "chat" or "responses" learns no wire.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from models.learned import LearnedStore, fact_id
from relay.compat import rules, wire
from relay.compat.rules import Fix

log = logging.getLogger("relay.compat")

STRIPS = ("beta", "field")


class Compat:
    def __init__(self, store, catalog, strip_ttl: float = 7 * 86400,
                 reprobe_after: float = 86400.0, clock=time.time):
        self.records = LearnedStore(store)
        self.catalog = catalog
        self.strip_ttl = strip_ttl
        self.reprobe_after = reprobe_after
        self.clock = clock
        # channel id -> {fact _id: fact document}
        self.facts: dict[int, dict[str, dict]] = {}
        self._views: dict[int, tuple] = {}
        self._tasks: set[asyncio.Task] = set()
        catalog.listeners.append(self._changed)

    # ---- loading -------------------------------------------------------------
    async def load(self) -> None:
        try:
            await self.records.prune(self.clock() - max(self.strip_ttl, self.reprobe_after))
            docs = await self.records.all()
        except Exception:  # the relay serves without what it learnt; it learns again
            log.exception("could not read what channels were seen to refuse")
            return
        facts: dict[int, dict[str, dict]] = {}
        for d in docs:
            facts.setdefault(int(d["channel_id"]), {})[d["_id"]] = d
        self.facts = facts
        self._views.clear()

    def _changed(self, kind: str, ident) -> None:
        if kind == "learned" and isinstance(ident, int):
            self._spawn(self._reload(ident))
        elif kind == "channel":
            self._views.clear()

    async def _reload(self, channel_id: int) -> None:
        docs = await self.records.of_channel(channel_id)
        self.facts[channel_id] = {d["_id"]: d for d in docs}
        self._views.pop(channel_id, None)

    # ---- reading (hot path: no I/O) ------------------------------------------
    def _live(self, d: dict, now: float) -> bool:
        ttl = self.reprobe_after if d["kind"] == "wire" else self.strip_ttl
        return now - float(d.get("at") or 0) < ttl

    def view(self, channel):
        """The channel as this call should see it: with the API it was
        learnt to speak (the catalog's own object when nothing was learnt)."""
        facts = self.facts.get(channel.id)
        if not facts:
            return channel
        now = self.clock()
        wires = {d["name"] for d in facts.values() if d["kind"] == "wire" and self._live(d, now)}
        key = (id(channel), frozenset(wires))
        cached = self._views.get(channel.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        opts = dict(channel.options or {})
        if str(opts.get("wire_api") or "both") == "both":
            if wire.CHAT in wires:
                opts["wire_api"] = "chat"
            elif wire.RESPONSES in wires:
                opts["wire_api"] = "responses"
        if wire.COMPACT in wires and not opts.get("compact_api"):
            opts["compact_api"] = "chat"
        seen = replace(channel, options=opts) if opts != (channel.options or {}) else channel
        self._views[channel.id] = (key, seen)
        return seen

    def fixes_for(self, channel_id: int, model: str) -> list[Fix]:
        """The betas and fields to take out of a request to this model."""
        facts = self.facts.get(channel_id)
        if not facts:
            return []
        now = self.clock()
        return [Fix(d["kind"], d["name"]) for d in facts.values()
                if d["kind"] in STRIPS and d.get("model") == model and self._live(d, now)]

    def diagnose(self, call, channel, out) -> list[Fix]:
        """What a refused attempt (out.refusal: status, body, request sent)
        says the channel does not take; [] when it names nothing."""
        if out.refusal is None:
            return []
        status, body, req = out.refusal
        fix = wire.refusal(call.endpoint, call.extra.get("wire", ""),
                           self._own_options(channel), status, body)
        if fix is not None:
            return [fix]
        return rules.refusals(status, body, req.headers, req.body)

    def _own_options(self, channel) -> dict:
        """The operator's options (a learnt wire is not the operator's choice)."""
        own = next((c for c in self.catalog.channels if c.id == channel.id), None)
        return (own or channel).options or {}

    # ---- learning ------------------------------------------------------------
    def learn(self, channel, model: str, fixes: list[Fix]) -> None:
        """In memory at once: the retry and every call beside it use it.
        (A fix for this call only, rules.ONCE, is not learnt.)"""
        fixes = [f for f in fixes if f.kind not in rules.ONCE]
        now = self.clock()
        facts = self.facts.setdefault(channel.id, {})
        for f in fixes:
            doc = self._doc(channel.id, model, f, now)
            facts[doc["_id"]] = doc
        self._views.pop(channel.id, None)
        for f in fixes:
            log.warning("channel %s (%s) refuses %s %r%s: it is %s from now on", channel.id,
                        getattr(channel, "name", ""), f.kind, f.label,
                        f" for {model}" if f.kind != "wire" else "",
                        "bridged" if f.kind == "wire" else "taken out")

    def refuted(self, fixes: list[Fix], out) -> list[Fix]:
        """The fixes the retry's own answer shows to be wrong: a bridged
        call that meets an unknown path again (the base URL serves neither
        API), or a refusal naming the same thing again."""
        if out.refusal is None:
            return []
        status, body, _ = out.refusal
        bad = [f for f in fixes if f.kind == "wire" and wire.unknown_endpoint(status, body)]
        named = {(f.kind, f.name) for f in rules.refusals(status, body, out.refusal[2].headers,
                                                          out.refusal[2].body)}
        return bad + [f for f in fixes if f.kind in STRIPS and (f.kind, f.name) in named]

    def unlearn(self, channel_id: int, model: str, fixes: list[Fix]) -> None:
        facts = self.facts.get(channel_id) or {}
        for f in fixes:
            facts.pop(self._doc(channel_id, model, f, 0)["_id"], None)
        self._views.pop(channel_id, None)

    def keep(self, channel_id: int, model: str, fixes: list[Fix]) -> None:
        """Write confirmed facts, in the background, and tell the other relays."""
        fixes = [f for f in fixes if f.kind not in rules.ONCE]
        if fixes:
            self._spawn(self._save(channel_id, model, list(fixes)))

    async def _save(self, channel_id: int, model: str, fixes: list[Fix]) -> None:
        now = self.clock()
        for f in fixes:
            d = self._doc(channel_id, model, f, now)
            await self.records.save(channel_id, d["kind"], d["model"], d["name"], d["reason"], now)
        await self.catalog.changed("learned", channel_id)

    def _doc(self, channel_id: int, model: str, f: Fix, at: float) -> dict:
        model = "" if f.kind == "wire" else model
        return {"_id": fact_id(channel_id, f.kind, model, f.name), "channel_id": channel_id,
                "kind": f.kind, "model": model, "name": f.name, "reason": f.reason[:300],
                "at": at}

    # ---- the operator's view ---------------------------------------------------
    def listing(self, channel_id: int) -> list[dict]:
        now = self.clock()
        out = []
        for d in sorted((self.facts.get(channel_id) or {}).values(),
                        key=lambda d: (d["kind"], d.get("model", ""), d["name"])):
            if not self._live(d, now):
                continue
            ttl = self.reprobe_after if d["kind"] == "wire" else self.strip_ttl
            out.append({"id": d["_id"], "kind": d["kind"], "model": d.get("model", ""),
                        "name": d["name"], "label": Fix(d["kind"], d["name"]).label,
                        "reason": d.get("reason", ""), "learned_at": int(d.get("at") or 0),
                        "until": int(float(d.get("at") or 0) + ttl)})
        return out

    async def forget(self, channel_id: int, ident: str | None = None) -> int:
        n = await self.records.forget(channel_id, ident)
        facts = self.facts.get(channel_id) or {}
        if ident is None:
            facts.clear()
        else:
            facts.pop(ident, None)
        self._views.pop(channel_id, None)
        await self.catalog.changed("learned", channel_id)
        return n

    # ---- background --------------------------------------------------------------
    def _spawn(self, coro) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a unit test): nothing to announce
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record what a channel refuses: %s", task.exception())

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=3)
