"""Events and their fan-out into the outbox.

An event is one record in `notify_events`, written before anything else.
For announcements its id is the announcement's.  For the two warnings there
is one record per subject (the user for the wallet warning, the key for a
key warning), id `type:subject`, and raising a warning is one atomic update
of it: "if the last warning of this subject is at least 60 minutes old and
fanned out, this is the new one".  That record *is* the rolling-hour
throttle, exact across all processes sharing the database: of any number of
racing processes one update (or, the first time, one insert) wins, and the
rest see a recent warning.  Each occurrence has its own id
(`type:subject@<ms>`), which the outbox records are named after.

Fan-out turns the event into one outbox record per subscription that wants
it (id: occurrence id + subscription id, so fanning out twice is harmless),
then marks the event fanned out.  A process that dies between the two steps
leaves the event unmarked, and `recover()` (at start and every minute, in
any process) finishes the job; until then the subject's next warning waits.
"""
from __future__ import annotations

import logging
import time

from models.records import ROLE_ADMIN
from models.store import DuplicateKeyError, PyMongoError, ReturnDocument, sort_by_id
from notify import words

log = logging.getLogger("relay.notify")

WARNINGS = ("user_quota_warning", "key_quota_warning")
# About one key, throttled like a warning, for the subscriptions watching it
# (notify/cache_watch.py raises the one there is).
KEY_ALERTS = ("key_cache_collapse",)
# Events about one user's money, written in that user's language: the two
# warnings, and a budget by period 80% used (once a period: its event id is
# the period's counter, relay/money/budgets.py).
PERSONAL = WARNINGS + ("budget_warning",)
WINDOW = 3600  # at most one warning per subject in any 60 minutes
# The database near its ceiling (relay/money/retention.py): administrators
# only, at most once a day per level ("near", then "pruning").
STORAGE = "storage_warning"
STORAGE_WINDOW = 86400


class Events:
    def __init__(self, store, subs, clock=time.time, on_enqueued=None):
        self.store = store
        self.subs = subs
        self.clock = clock
        self.on_enqueued = on_enqueued or (lambda: None)

    @property
    def db(self):
        return self.store.db

    async def ensure_indexes(self) -> None:
        db = self.db
        await db.notify_events.create_index([("fanned_out", 1), ("created_at", 1)])
        await db.notify_subscriptions.create_index([("user_id", 1)])
        # No index on event_types: the embedded server (nx-27017) answers an
        # equality match on an indexed array field with nothing.
        await db.notify_outbox.create_index([("status", 1), ("next_at", 1)])
        await db.notify_outbox.create_index([("sub_id", 1), ("created_at", -1)])
        await db.notify_outbox.create_index([("user_id", 1), ("created_at", -1)])
        await db.announcements.create_index([("created_at", -1)])

    # ---- raising -------------------------------------------------------------
    async def raise_event(self, event_id: str, etype: str, payload: dict) -> bool:
        """Record the event (once per id) and fan it out; False if it existed."""
        return await self._record_and_fan_out(
            {"_id": event_id, "type": etype, "payload": payload, "created_at": self.clock(),
             "fanned_out": False})

    async def _record_and_fan_out(self, doc: dict) -> bool:
        """Insert a new event and fan it out; False if its id is taken."""
        try:
            await self.db.notify_events.insert_one(doc)
        except DuplicateKeyError:
            return False
        await self.fan_out(doc)
        return True

    async def raise_warning(self, etype: str, user_id: int, token_id: int | None,
                            balance: int) -> bool:
        """A balance crossed a threshold: raise the warning unless its subject
        had one in the last 60 minutes (in any process); False if throttled."""
        subject = user_id if etype == "user_quota_warning" else token_id
        return await self._throttled(f"{etype}:{subject}", etype, WINDOW, {
            "user_id": user_id, "token_id": token_id, "balance": int(balance)})

    async def raise_key_alert(self, etype: str, user_id: int, token_id: int,
                              payload: dict) -> bool:
        """An alert about a key (KEY_ALERTS), at most one per key in any 60
        minutes across all processes; False if throttled."""
        return await self._throttled(f"{etype}:{token_id}", etype, WINDOW,
                                     dict(payload, user_id=user_id, token_id=token_id))

    async def raise_storage_warning(self, size: int, ceiling: int, pruning: bool) -> bool:
        """The database is at 80% of its ceiling, or at it and pruning: tell
        the administrators who subscribed, once a day per level (in any
        process); False if throttled."""
        level = "pruning" if pruning else "near"
        return await self._throttled(f"{STORAGE}:{level}", STORAGE, STORAGE_WINDOW, {
            "bytes": int(size), "max_bytes": int(ceiling), "pruning": bool(pruning)})

    async def _throttled(self, key: str, etype: str, window: float, payload: dict) -> bool:
        now = self.clock()
        fields = {"type": etype, "occurrence": f"{key}@{int(now * 1000)}", "created_at": now,
                  "fanned_out": False, "payload": payload}
        doc = await self.db.notify_events.find_one_and_update(
            {"_id": key, "created_at": {"$lte": now - window}, "fanned_out": True},
            {"$set": fields}, return_document=ReturnDocument.AFTER)
        if doc is None:
            # None matched: the subject's first warning, or a recent one exists.
            return await self._record_and_fan_out({"_id": key, **fields})
        await self.fan_out(doc)
        return True

    # ---- fan-out -------------------------------------------------------------
    async def fan_out(self, event: dict) -> int:
        etype, p = event["type"], event["payload"]
        if p.get("announcement"):  # idempotent: also restores it after a crash
            ann = dict(p["announcement"])
            await self.db.announcements.update_one(
                {"_id": ann.pop("_id")}, {"$setOnInsert": ann}, upsert=True)
        subs = await self._targets(etype, p)
        users = {}
        if subs:
            ids = list({s["user_id"] for s in subs})
            async for u in self.db.users.find({"_id": {"$in": ids}},
                                              {"username": 1, "language": 1}):
                users[u["_id"]] = u
        key_name = ""
        if etype == "key_quota_warning" or etype in KEY_ALERTS or (
                etype == "budget_warning" and p.get("token_id")):
            tok = await self.db.tokens.find_one({"_id": p["token_id"]}, {"name": 1})
            key_name = (tok or {}).get("name", "")
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(event["created_at"]))
        now = self.clock()
        docs = []
        occurrence = event.get("occurrence") or event["_id"]
        for s in subs:
            user = users.get(s["user_id"], {})
            # The rest stays as written.
            lang = words.language(user) if etype in PERSONAL + KEY_ALERTS else ""
            title, content, threshold = self._text(etype, p, s, key_name, lang)
            docs.append({
                "_id": f"{occurrence}|{s['_id']}", "event_id": occurrence, "sub_id": s["_id"],
                "user_id": s["user_id"], "channel_type": s["channel_type"], "event_type": etype,
                "title": title, "content": content,
                "vars": {"event_type": etype, "title": title, "content": content,
                         "user": user.get("username", ""), "key_name": key_name,
                         "balance": p.get("balance", ""), "threshold": threshold, "time": when},
                "status": "pending", "attempts": 0, "next_at": now, "created_at": now,
                "updated_at": now, "last_error": "", "sent_at": None, "receipt": ""})
        await self._insert(docs)
        # Only this occurrence: a warning record is reused by the next one.
        flt = {"_id": event["_id"]}
        if event.get("occurrence"):
            flt["occurrence"] = event["occurrence"]
        await self.db.notify_events.update_one(flt, {"$set": {"fanned_out": True,
                                                              "targets": len(docs)}})
        if docs:
            self.on_enqueued()
        return len(docs)

    async def _insert(self, docs: list[dict]) -> None:
        for i in range(0, len(docs), 500):
            batch = docs[i:i + 500]
            try:
                await self.db.notify_outbox.insert_many(batch, ordered=False)
            except PyMongoError:
                # Some existed already (a repeated fan-out): insert the rest one by one.
                for d in batch:
                    try:
                        await self.db.notify_outbox.insert_one(d)
                    except DuplicateKeyError:
                        pass

    async def _targets(self, etype: str, p: dict) -> list[dict]:
        flt = {"event_types": {"$in": [etype]}, "enabled": True}
        if etype in PERSONAL + KEY_ALERTS:
            flt["user_id"] = p["user_id"]
        subs = sort_by_id(await self.db.notify_subscriptions.find(flt).to_list(None))
        if etype == "marketing" and subs:
            ids = list({s["user_id"] for s in subs})
            opted = {u["_id"] async for u in self.db.users.find(
                {"_id": {"$in": ids}, "marketing_opt_in": True}, {"_id": 1})}
            subs = [s for s in subs if s["user_id"] in opted]
        elif etype == "user_quota_warning":
            subs = [s for s in subs if p["balance"] < s.get("user_threshold", 0)]
        elif etype == "key_quota_warning":
            subs = [s for s in subs if p["balance"] < s.get("key_threshold", 0)
                    and (not s.get("key_ids") or p["token_id"] in s["key_ids"])]
        elif etype in KEY_ALERTS or (etype == "budget_warning" and p.get("token_id")):
            subs = [s for s in subs if not s.get("key_ids") or p["token_id"] in s["key_ids"]]
        elif etype == STORAGE and subs:
            ids = list({s["user_id"] for s in subs})
            admins = {u["_id"] async for u in self.db.users.find(
                {"_id": {"$in": ids}, "role": {"$gte": ROLE_ADMIN}}, {"_id": 1})}
            subs = [s for s in subs if s["user_id"] in admins]
        return subs

    @staticmethod
    def _text(etype: str, p: dict, sub: dict, key_name: str,
              lang: str) -> tuple[str, str, object]:
        """A warning in the subscriber's language; an announcement as its author wrote it."""
        if etype in WARNINGS:
            return words.warning(etype, p, sub, key_name, lang)
        if etype in KEY_ALERTS:
            return words.cache_collapse(p, key_name, lang) + ("",)
        if etype == "budget_warning":
            return words.budget(p, key_name, lang)
        if etype == STORAGE:
            return words.storage(p, lang)
        return p.get("title", ""), p.get("content", ""), ""

    # ---- recovery ------------------------------------------------------------
    async def recover(self, older_than: float = 0.0) -> int:
        """Fan out events a dead process recorded but did not finish."""
        n = 0
        cutoff = self.clock() - older_than
        docs = await self.db.notify_events.find(
            {"fanned_out": False, "created_at": {"$lte": cutoff}}).to_list(1000)
        for d in docs:
            try:
                n += await self.fan_out(d)
            except PyMongoError:
                log.exception("fan-out of %s failed; will try again", d["_id"])
        return n
