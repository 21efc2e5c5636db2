"""The notifier: wires subscriptions, rules, events, the outbox worker and
the channels together, and hooks them into the relay's start and stop.

    install(app)  ->  app.settings["notifier"]; start/stop in on_start/on_stop

Everything the API needs goes through the Notifier's methods, so handlers
stay thin.
"""
from __future__ import annotations

import asyncio
import logging
import time

from models import allowance
from models.refusal import Refusal
from models.store import as_eq, count_matching
from models.store import now as store_now
from notify import channels, templates, words
from notify.cache_watch import CacheWatch
from notify.channels.base import Context, DeliveryError, Message
from notify.channels.webhook import render_body
from notify.contact import ContactError, EmailConfirmation
from notify.events import KEY_ALERTS, STORAGE, WARNINGS, Events
from notify.http import HttpClient, Refused
from notify.outbox import Worker
from notify.push_binding import PushBinding
from notify.rules import Rules
from notify.subscriptions import Subscriptions
from relay.catalog import EVERYTHING

log = logging.getLogger("relay.notify")

RECOVER_EVERY = 60.0
# Test messages a user may send an hour (each reaches a third party).
TEST_SENDS_PER_HOUR = 5
SUBSCRIPTION_KIND = "notify_subscription"  # catalog invalidation kind
# The events a test send or a preview may show (their words: notify/words.py).
SAMPLE = ("announcement", "marketing", "user_quota_warning", "key_quota_warning",
          "key_cache_collapse", "budget_warning",
          "storage_warning")
# What a test send of a cache alert says (the figures of a real one are the key's).
CACHE_SAMPLE = {"before": 0.82, "now": 0.07, "minutes": 10, "tokens": 250_000}


class Notifier:
    def __init__(self, config, store, bus, vault, owner: str = "n", clock=time.time,
                 catalog=None, billing=None):
        self.config = config
        self.store = store
        self.bus = bus
        self.billing = billing  # for live balances in previews and test sends
        self.clock = clock
        self.http = HttpClient(config.allow_private_webhooks, timeout=config.notify_send_timeout)
        self.ctx = Context(settings=config, http=self.http, clock=clock)
        self.subs = Subscriptions(store, vault, ttl=config.notify_cache_ttl,
                                  url_check=self.http.check_url)
        if catalog is not None:
            self.subs.on_change = lambda uid: catalog.changed(SUBSCRIPTION_KIND, uid)
            catalog.listeners.append(self._catalog_changed)
        self.worker = Worker(store, self._deliver, self._final_failure, clock=clock, owner=owner,
                             poll=config.notify_poll_interval,
                             concurrency=config.notify_concurrency,
                             lease=config.notify_claim_lease, retry_base=config.notify_retry_base,
                             retry_window=config.notify_retry_window,
                             send_timeout=config.notify_send_timeout)
        self.events = Events(store, self.subs, clock=clock, on_enqueued=self.worker.wake)
        self.rules = Rules(self.subs, self.events)
        if billing is not None:   # read back after a flush only what warnings need
            billing.watched = self.rules.watching
        self.cache_watch = CacheWatch(self.events, clock=clock)
        self.binding = PushBinding(store, config, self.http, clock)
        self.contact = EmailConfirmation(store, vault, self.ctx, clock)
        self._unsub: list = []
        self._recoverer: asyncio.Task | None = None

    def _catalog_changed(self, kind: str, ident) -> None:
        if kind == SUBSCRIPTION_KIND and isinstance(ident, int):
            self.subs.invalidate(ident)
        elif kind == EVERYTHING:
            self.subs.invalidate_all()

    # ---- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        await self.events.ensure_indexes()
        self._unsub = self.rules.attach(self.bus) + self.cache_watch.attach(self.bus)
        await self.events.recover()
        self.worker.start()
        self._recoverer = asyncio.get_running_loop().create_task(self._recover_loop())

    async def stop(self) -> None:
        for u in self._unsub:
            u()
        if self._recoverer is not None:
            self._recoverer.cancel()
        await self.rules.drain()
        await self.cache_watch.drain()
        await self.worker.stop()
        self.http.close()

    async def _recover_loop(self) -> None:
        while True:
            await asyncio.sleep(RECOVER_EVERY)
            try:
                await self.events.recover(older_than=RECOVER_EVERY)
                await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event recovery failed")

    async def prune(self) -> None:
        """Drop history past notify_history_days; events past two days (an
        event record only matters for its 60-minute throttle and for recovery)."""
        now = self.clock()
        db = self.store.db
        await db.notify_outbox.delete_many({
            "status": {"$in": ["sent", "failed"]},
            "updated_at": {"$lt": now - self.config.notify_history_days * 86400}})
        await db.notify_events.delete_many({"fanned_out": True,
                                            "created_at": {"$lt": now - 2 * 86400}})
        await db.notify_push_binds.delete_many({"expires_at": {"$lt": now - 86400}})

    # ---- delivery ------------------------------------------------------------
    async def _user(self, user_id: int) -> dict:
        u = await self.store.db.users.find_one({"_id": user_id}, {"username": 1, "email": 1}) or {}
        out = {"id": user_id, "username": u.get("username", ""), "email": u.get("email", "")}
        uid = await self.binding.binding(user_id)
        if uid:
            out["wxpusher_uid"] = uid
        return out

    async def _deliver(self, record: dict) -> str:
        sub = await self.subs.get(record["sub_id"])
        if sub is None:
            raise DeliveryError("The subscription was deleted.", permanent=True)
        channel = channels.get(sub["channel_type"])
        if channel is None:
            raise DeliveryError(f"Unknown channel {sub['channel_type']!r}.", permanent=True)
        msg = Message(id=record["_id"], event_type=record["event_type"], title=record["title"],
                      content=record["content"], vars=record.get("vars") or {},
                      user=await self._user(sub["user_id"]))
        return await channel.send(msg, self.subs.config(sub), self.ctx)

    async def _final_failure(self, record: dict, error: str) -> None:
        await self.subs.record_failure(record["sub_id"], error)

    # ---- API operations ------------------------------------------------------
    def channel_types(self) -> list[dict]:
        return [c.describe() for c in channels.CHANNELS.values()]

    async def sample_vars(self, event_type: str, user: dict, sub: dict | None = None) -> dict:
        """The variables a delivery of `event_type` to `user` would carry now:
        a warning's text, balance and threshold are computed as a real one's
        (live balance, leases included; thresholds from `sub`), for the key
        the subscription watches (else the user's first key)."""
        lang = words.language(user)
        title, content = words.sample(event_type, lang)
        v = {"event_type": event_type, "title": title, "content": content,
             "user": user.get("username", ""), "key_name": "", "balance": "", "threshold": "",
             "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.clock()))}
        if event_type == STORAGE:
            v["title"], v["content"], v["threshold"] = words.storage(
                {"bytes": 8.1e9, "max_bytes": 10e9}, lang)
            return v
        if event_type == "budget_warning":
            # An example: the account's first budget (else $10 a day), 80% used.
            period, limit = next(iter((user.get("budgets") or {"day": 5_000_000}).items()))
            p = {"period": period, "limit": int(limit), "used": int(limit) * 4 // 5}
            v["title"], v["content"], v["threshold"] = words.budget(p, "", lang)
            v["balance"] = p["limit"] - p["used"]
            return v
        if event_type in KEY_ALERTS:
            key = await self._sample_key(user["_id"], (sub or {}).get("key_ids") or [])
            v["key_name"] = key.get("name", "") if key else "example-key"
            payload = dict(CACHE_SAMPLE, token_id=key["_id"] if key else 0)
            v["title"], v["content"], _ = Events._text(event_type, payload, sub or {},
                                                       v["key_name"], lang)
            return v
        if event_type not in WARNINGS:
            return v
        sub = sub or {}
        payload = {"user_id": user["_id"], "token_id": None,
                   "balance": await self._live("user", user)}
        if event_type == "key_quota_warning":
            key = await self._sample_key(user["_id"], sub.get("key_ids") or [])
            payload["token_id"] = key["_id"] if key else 0
            payload["balance"] = await self._live("token", key) if key else 0
            v["key_name"] = key.get("name", "") if key else "example-key"
        v["title"], v["content"], v["threshold"] = Events._text(event_type, payload, sub,
                                                                  v["key_name"], lang)
        v["balance"] = payload["balance"]
        return v

    async def _live(self, kind: str, doc: dict) -> int:
        if self.billing is not None:
            return int((await self.billing.balance(kind, doc["_id"]))[0])
        field = "quota" if kind == "user" else "remain_quota"
        return int(doc.get(field, 0)) + sum(int(x) for x in (doc.get("leases") or {}).values())

    async def _sample_key(self, user_id: int, key_ids: list) -> dict | None:
        flt: dict = {"user_id": user_id}
        ids = [int(k) for k in key_ids if isinstance(k, int) and not isinstance(k, bool)]
        if ids:
            flt["_id"] = {"$in": ids}
        docs = await self.store.page(self.store.db.tokens, flt, "_id", 1, 0, 1)
        return docs[0] if docs else None

    async def test_send(self, user: dict, sub: dict) -> dict:
        """Send a test message over the subscription's channel now.  Raises
        ContactError (429) past TEST_SENDS_PER_HOUR for the user, in every
        process; else never raises."""
        wait = await allowance.take(self.store, f"test-send:{user['_id']}", TEST_SENDS_PER_HOUR,
                                    3600, self.clock)
        if wait:
            raise ContactError(429, f"At most {TEST_SENDS_PER_HOUR} test messages an hour: try "
                                    f"again in {(wait + 59) // 60} minutes.", wait,
                               code="test_sends")
        etype = (sub.get("event_types") or ["announcement"])[0]
        v = await self.sample_vars(etype, user, sub)
        title = words.test_title(v["title"], words.language(user))
        msg = Message(id=f"test:{sub['_id']}:{int(self.clock() * 1000)}", event_type=etype,
                      title=title, content=v["content"], vars={**v, "title": title},
                      user=await self._user(sub["user_id"]))
        try:
            receipt = await asyncio.wait_for(
                channels.get(sub["channel_type"]).send(msg, self.subs.config(sub), self.ctx),
                self.config.notify_send_timeout * 2 + 5)
        except (DeliveryError, Refused) as exc:
            return {"ok": False, "error": getattr(exc, "message", str(exc))}
        except asyncio.TimeoutError:
            return {"ok": False, "error": "The send timed out."}
        except Exception as exc:  # connection refused, DNS, ...
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "receipt": receipt}

    async def preview(self, user: dict, channel_type: str, config: dict, event_type: str,
                      sub: dict | None = None) -> dict:
        """Render what a channel would send now; `sub` holds the form's
        thresholds and key_ids.  Raises ValueError on a bad template or input."""
        channel = channels.get(channel_type)
        if channel is None:
            names = ", ".join(channels.CHANNELS)
            raise Refusal(f"channel_type must be one of: {names}.", "field_choice",
                          field="channel_type", choices=names)
        if event_type not in SAMPLE:
            raise Refusal(f"event_type must be one of: {', '.join(SAMPLE)}.", "field_choice",
                          field="event_type", choices=", ".join(SAMPLE))
        v = await self.sample_vars(event_type, user, sub)
        if channel_type == "webhook":
            cfg = {"headers": config.get("headers") or {},
                   "body_template": str(config.get("body_template") or "")}
            if not isinstance(cfg["headers"], dict):
                raise Refusal("headers must be an object.", "field_not_object",
                              field="headers")
            # Rendering is CPU work: on the template thread (notify/templates.py).
            return {"body": await templates.run(render_body, cfg, v), "variables": v}
        return {"body": f"{v['title']}\n\n{v['content']}", "variables": v}

    async def deliveries(self, flt: dict, page: int, size: int) -> dict:
        """A page of delivery history, newest first; flt selects sub_id or user_id."""
        coll = self.store.db.notify_outbox
        total = await count_matching(coll, flt)
        docs = await coll.find(as_eq(flt)).sort("created_at", -1).skip((page - 1) * size) \
            .limit(size).to_list(size)
        return {"items": [delivery_view(d) for d in docs], "total": total, "page": page,
                "page_size": size}

    async def announcements(self, page: int, size: int, marketing: bool) -> dict:
        """Recent announcements, newest first; marketing ones only if marketing."""
        coll = self.store.db.announcements
        flt = {} if marketing else {"kind": "announcement"}
        total = await count_matching(coll, flt)
        docs = await self.store.page(coll, flt, "_id", -1, (page - 1) * size, size)
        return {"items": [announcement_view(d) for d in docs], "total": total, "page": page,
                "page_size": size}

    async def announce(self, author: dict, title: str, content: str, kind: str) -> dict:
        """Store an announcement, tell the console, and raise the event.

        The event record (which carries the whole announcement) is written
        first: if the process dies at any point after it, recovery both
        stores the announcement and delivers it.
        """
        ann = {"_id": await self.store.next_id("announcements"), "title": title,
               "content": content, "kind": kind, "created_at": store_now(),
               "author_id": author["_id"]}
        await self.events.raise_event(f"{kind}:{ann['_id']}", kind,
                                      {"announcement": ann, "title": title, "content": content})
        self.bus.publish("announcement", {"id": ann["_id"], "title": title, "content": content,
                                          "kind": kind})
        return ann


def announcement_view(d: dict) -> dict:
    return {"id": d["_id"], "title": d["title"], "content": d.get("content", ""),
            "kind": d.get("kind", "announcement"), "created_at": d.get("created_at", 0)}


def delivery_view(d: dict) -> dict:
    status = "pending" if d["status"] == "sending" else d["status"]
    return {"id": d["_id"], "subscription_id": d["sub_id"], "event_type": d["event_type"],
            "title": d["title"],
            "channel_type": d["channel_type"], "status": status,
            "in_flight": d["status"] == "sending", "attempts": d.get("attempts", 0),
            "last_error": d.get("last_error", ""), "receipt": d.get("receipt", ""),
            "created_at": d.get("created_at"), "updated_at": d.get("updated_at"),
            "next_attempt_at": d.get("next_at") if d["status"] == "pending" else None,
            "sent_at": d.get("sent_at"), "failed_at": d.get("failed_at")}


def install(app) -> None:
    s = app.settings
    # "notify_clock": a test may set the time the throttle and outbox see.
    notifier = Notifier(s["config"], s["store"], s["bus"], s["vault"],
                        owner=s["catalog"].process_id, clock=s.get("notify_clock") or time.time,
                        catalog=s["catalog"], billing=s["billing"])
    s["notifier"] = notifier

    async def start(app) -> None:
        await notifier.start()

    async def stop(app) -> None:
        await notifier.stop()
    s["on_start"].append(start)
    s["on_stop"].append(stop)
