"""Midjourney tasks: where they are kept, and the poller that follows them.

A task is stored when its submit is accepted (and charged), with its owner
(user and key), the channel that holds it, the upstream's task id and the
amount charged.  Clients read tasks from here only; the upstreams are asked
for progress by one background poller per process, every
`mj_poll_interval` seconds, in one list-by-condition call per channel.

When a task fails (or is cancelled, or does not finish within
`mj_task_timeout`), its charge is given back with billing.reverse(), keyed
by the task id, so that two pollers (two relay processes) refund it once;
a negative usage record balances the log.

Public task ids are ours (random, 16 digits like midjourney-proxy's): two
channels may hand out the same id, and ids must not be guessable.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time

from relay import registry
from relay.serving.background import cancel_and_wait
from relay.money.pricing import Usage

log = logging.getLogger("relay.mj")

ENDED = ("SUCCESS", "FAILURE", "CANCEL")
FAILED = ("FAILURE", "CANCEL")
# What a task shows to clients, as midjourney-proxy names it.
VIEW_FIELDS = ("action", "status", "prompt", "promptEn", "description", "state", "submitTime",
               "startTime", "finishTime", "progress", "imageUrl", "failReason", "properties",
               "buttons")
# What the upstream's task may change in ours.
UPSTREAM_FIELDS = ("status", "prompt", "promptEn", "description", "startTime", "finishTime",
                   "progress", "imageUrl", "failReason", "properties", "buttons", "action")


def new_task_id() -> str:
    return str(10 ** 15 + secrets.randbelow(9 * 10 ** 15))


def view(doc: dict) -> dict:
    """A stored task as the client sees it (midjourney-proxy's Task)."""
    out = {"id": doc["_id"]}
    for f in VIEW_FIELDS:
        out[f] = doc.get(f)
    if not isinstance(out["properties"], dict):
        out["properties"] = {}
    if not isinstance(out["buttons"], list):
        out["buttons"] = []
    return out


class TaskStore:
    """The `mj_tasks` collection."""

    def __init__(self, store):
        self.db = store.db

    async def ensure_indexes(self) -> None:
        await self.db.mj_tasks.create_index([("done", 1), ("next_poll", 1)])
        await self.db.mj_tasks.create_index([("user_id", 1), ("submitTime", -1)])
        await self.db.mj_tasks.create_index([("channel_id", 1), ("upstream_id", 1)])

    async def create(self, doc: dict) -> dict:
        doc.setdefault("_id", new_task_id())
        await self.db.mj_tasks.insert_one(doc)
        return doc

    async def owned(self, task_id: str, user_id: int) -> dict | None:
        """The task if it exists and belongs to `user_id`; None otherwise
        (someone else's task is "not found", never "forbidden")."""
        if not isinstance(task_id, str) or not task_id:
            return None
        return await self.db.mj_tasks.find_one({"_id": task_id, "user_id": user_id})

    async def owned_many(self, ids: list, user_id: int) -> list[dict]:
        ids = [i for i in ids if isinstance(i, str)][:100]
        docs = await self.db.mj_tasks.find({"_id": {"$in": ids}, "user_id": user_id}).to_list(100)
        order = {i: n for n, i in enumerate(ids)}
        return sorted(docs, key=lambda d: order.get(d["_id"], 0))

    async def by_upstream(self, channel_id: int, upstream_id: str, user_id: int) -> dict | None:
        return await self.db.mj_tasks.find_one({"channel_id": channel_id,
                                                "upstream_id": upstream_id, "user_id": user_id})

    async def get(self, task_id: str) -> dict | None:
        return await self.db.mj_tasks.find_one({"_id": task_id})

    async def due(self, now: float, limit: int = 500) -> list[dict]:
        """Unfinished tasks whose next poll is due."""
        return await self.db.mj_tasks.find(
            {"done": False, "next_poll": {"$lte": now}}).limit(limit).to_list(limit)

    async def update(self, task_id: str, fields: dict) -> None:
        await self.db.mj_tasks.update_one({"_id": task_id}, {"$set": fields})

    async def add_charge(self, task_id: str, amount: int, status: str) -> None:
        """A modal submit continues a task: its charge joins the task's."""
        await self.db.mj_tasks.update_one(
            {"_id": task_id},
            {"$inc": {"charged": amount}, "$set": {"status": status, "done": False,
                                                  "next_poll": time.time()}})


class Poller:
    """Follows unfinished tasks on their upstreams; refunds the failed ones."""

    def __init__(self, app):
        s = app.settings
        self.config = s["config"]
        self.tasks: TaskStore = s["mj_tasks"]
        self.catalog = s["catalog"]
        self.upstream = s["upstream"]
        self.billing = s["billing"]
        self.usage_log = s["usage_log"]
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    @property
    def interval(self) -> float:
        return max(float(self.config.mj_poll_interval), 0.05)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        """Poll soon (a task was just submitted)."""
        self._wake.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("polling Midjourney tasks failed; will retry")

    async def poll_once(self) -> None:
        now = time.time()
        by_channel: dict[int, list[dict]] = {}
        for doc in await self.tasks.due(now):
            by_channel.setdefault(doc["channel_id"], []).append(doc)
        for cid, docs in by_channel.items():
            channel = next((c for c in self.catalog.channels if c.id == cid), None)
            found = await self._poll_channel(channel, docs) if channel is not None else {}
            for doc in docs:
                up = found.get(doc["upstream_id"])
                if up is not None:
                    doc = await self._apply(doc, up, now)
                if doc.get("done"):
                    continue
                if now - doc.get("created_at", now) > self.config.mj_task_timeout:
                    await self._end_failed(doc, "The task did not finish in time.")
                elif up is None:
                    await self.tasks.update(doc["_id"], {"next_poll": now + self.interval})

    async def _poll_channel(self, channel, docs: list[dict]) -> dict[str, dict]:
        adaptor = registry.adaptor_for(channel.type)
        ids = [d["upstream_id"] for d in docs]
        req = adaptor.poll_request(channel, ids)
        resp = await self.upstream.send(req.method, req.url, req.headers, req.body,
                                        first_byte_timeout=30)
        if resp.error is None and resp.status in (404, 405):
            # An upstream without list-by-condition: one fetch per task.
            found = {}
            for uid in ids:
                req = adaptor.fetch_request(channel, uid)
                r = await self.upstream.send(req.method, req.url, req.headers, None,
                                             first_byte_timeout=30)
                if r.error is None and r.status < 400:
                    found.update({t["id"]: t for t in _safe_read(adaptor, r.body)})
            return found
        if resp.error is not None or resp.status >= 400:
            log.warning("polling channel %s for %d task(s) failed: %s", channel.id, len(ids),
                        resp.error.message if resp.error else resp.status)
            return {}
        return {t["id"]: t for t in _safe_read(adaptor, resp.body)}

    async def _apply(self, doc: dict, up: dict, now: float) -> dict:
        fields = {f: up[f] for f in UPSTREAM_FIELDS if f in up and up[f] is not None}
        status = str(fields.get("status") or doc.get("status") or "SUBMITTED").upper()
        fields["status"] = status
        fields["done"] = status in ENDED
        fields["next_poll"] = now + self.interval
        doc = {**doc, **fields}
        await self.tasks.update(doc["_id"], fields)
        if status in FAILED:
            await self._refund(doc, str(doc.get("failReason") or status.lower()))
        return doc

    async def _end_failed(self, doc: dict, reason: str) -> None:
        await self.tasks.update(doc["_id"], {"status": "FAILURE", "failReason": reason,
                                             "done": True, "finishTime": int(time.time() * 1000)})
        await self._refund(doc, reason)

    async def _refund(self, doc: dict, reason: str) -> None:
        amount = int(doc.get("charged") or 0)
        if amount > 0 and not doc.get("refunded"):
            await self.billing.reverse(f"mj_refund:{doc['_id']}", refund_record(doc, amount, reason),
                                       f"Midjourney task {doc['_id']} failed: {reason}"[:300])
        await self.tasks.update(doc["_id"], {"refunded": True})


def refund_record(doc: dict, amount: int, reason: str) -> dict:
    """The usage record of a refund: the log keeps adding up to used_quota."""
    return {
        "_id": f"{doc['request_id']}:refund", "user_id": doc["user_id"],
        "username": doc.get("username", ""), "token_id": doc.get("token_id"),
        "token_name": doc.get("token_name", ""), "group": doc.get("group", ""),
        "model": doc.get("model", ""), "upstream_model": doc.get("model", ""),
        "channel_id": doc.get("channel_id"), "endpoint": "mj_refund", "face": "mj",
        **Usage().record(), "quota": -amount, "estimated": False, "duration_ms": 0, "ttfb_ms": 0, "status": 200,
        "stream": False, "client_ip": doc.get("client_ip", ""),
        "billing_mode": doc.get("billing_mode", ""), "error": f"refund: {reason}"[:500],
    }


def _safe_read(adaptor, body: bytes) -> list[dict]:
    try:
        return adaptor.read_tasks(body)
    except ValueError:
        return []
