"""Sticky sessions: the calls of one conversation go to the channel that
served its first turn, while that channel is healthy.

Prompt caches belong to an upstream account.  A coding agent resends a
prompt of 50-150k tokens every turn; on the channel that saw the last turn
most of it is a cache read (a tenth of the input price), on any other it
is a cache write (1.25 times it).  Thinking signatures made by one upstream
are refused by another, too.  So a conversation stays where it started.

The conversation is what the client says it is: the headers of
CLIENT_HEADERS (Codex: session_id; Claude Code: X-Claude-Code-Session-Id),
else the body's prompt_cache_key, else Claude Code's metadata.user_id;
else a hash of the system prompt and the first user message, which a
conversation keeps for its whole life.  It is keyed with the API key and
the model: a key's conversations never meet another key's, and an agent's
background calls on a small model are placed on their own.

Placement is weighted rendezvous hashing: each awake channel of the best
priority scores weight / -ln(u), u a hash of (conversation, channel) in
(0, 1), and the best score wins.  Over many conversations each channel gets
its weight's share; for one conversation the choice is the same on every
relay, with nothing shared.  Where a conversation is placed is kept in
memory and in the database (models/sessions.py: written when it is placed
or moves, and every half TTL while it lasts; read by a relay that has not
seen it for RECHECK seconds).  When its channel fails or rests
(relay/scheduler.py), the call goes to the next channel in rendezvous
order, the same one on every relay, and the conversation stays there even
after the old channel recovers: one move, one cache rebuilt.

Behind a round-robin balancer over several relays, each turn of a
conversation reaches another relay: per-relay memory alone would not do
(each relay would place it by its own random draw), which is why placement
is deterministic and the move is written down.  A conversation idle for
`sticky_session_ttl` seconds is forgotten and placed afresh.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
from collections import OrderedDict

from models.sessions import SessionStore
from relay.serving.buglog import reason

log = logging.getLogger("relay.sessions")

CLIENT_HEADERS = ("session_id", "x-claude-code-session-id", "x-codex-turn-state",
                  "x-codex-window-id")
# A client's own session id is recorded as sent up to this length, hashed beyond it.
LABEL_LIMIT = 128
# Seconds after which a relay asks the database again where a conversation is.
RECHECK = 60.0
# A database read on the way to a call waits at most this long; after a
# failure none is tried for QUIET seconds (placement goes on from memory).
READ_WAIT, QUIET = 0.25, 5.0
MAX_LOCAL = 200_000
FLUSH_BATCH = 500
# Conversations are chat-like calls (the Messages and Responses faces speak "chat" and
# "responses" too); embeddings, images or Midjourney tasks are spread by weight.
ENDPOINTS = ("chat", "responses", "responses_compact")
_CLAUDE_SESSION = re.compile(r"session_([0-9A-Za-z-]{8,})")


def client_session(headers, call) -> str:
    """The conversation id the client sent (headers, then body), or ""."""
    if headers is not None:
        for name in CLIENT_HEADERS:
            value = headers.get(name)
            if value and value.strip():
                return value.strip()
    doc = call.native_body if call.native_body is not None else call.body
    if not isinstance(doc, dict):
        return ""
    key = doc.get("prompt_cache_key")
    if isinstance(key, str) and key.strip():
        return key.strip()
    meta = doc.get("metadata")
    uid = meta.get("user_id") if isinstance(meta, dict) else None
    return _claude_code_session(uid) if isinstance(uid, str) and uid.strip() else ""


def _claude_code_session(uid: str) -> str:
    """Claude Code's metadata.user_id carries its session: a JSON object with
    session_id (2.x), or "user_<hash>_account_<uuid>_session_<uuid>"."""
    if uid.startswith("{"):
        try:
            doc = json.loads(uid)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("session_id"), str) and doc["session_id"]:
            return doc["session_id"]
    m = _CLAUDE_SESSION.search(uid)
    return m.group(1) if m else uid


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def conversation_of(body: dict) -> str:
    """A hash of what a conversation keeps on every turn: its system prompt
    and its first user message (canonical chat shape)."""
    system, first = [], None
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        if m.get("role") in ("system", "developer"):
            system.append(m.get("content"))
        elif m.get("role") == "user":
            first = m.get("content")
            break
    if first is None:
        return ""
    return "h:" + _digest(json.dumps([system, first], sort_keys=True, ensure_ascii=False,
                                     default=str))[:24]


def score(key: str, channel) -> float:
    """Weighted rendezvous score of a channel for a conversation."""
    u = (int(_digest(key, str(channel.id))[:16], 16) + 0.5) / 2.0 ** 64
    # Weight 0 gets traffic only when nothing else can take it (as in the scheduler).
    return (channel.weight if channel.weight > 0 else 1e-9) / -math.log(u)


class Sessions:
    def __init__(self, store, scheduler, ttl: float = 3600.0, clock=time.time):
        self.records = SessionStore(store) if store is not None else None
        self.scheduler = scheduler
        self.ttl = float(ttl)
        self.clock = clock
        # key -> [channel id, last served, last asked the database, last written]
        self.local: OrderedDict[str, list] = OrderedDict()
        self.pending: dict[str, tuple[int, float]] = {}
        # key -> (channel id, tokens written, where the cached prefix then
        # ended, when, the cache's lifetime): the conversation's last cache
        # write, until its next call reads it or not.
        self.writes: OrderedDict[str, tuple] = OrderedDict()
        self._quiet_until = 0.0
        self._task: asyncio.Task | None = None
        self._pruned_at = 0.0

    @property
    def on(self) -> bool:
        return self.ttl > 0

    # ---- the hot path -----------------------------------------------------------
    def label(self, call, auth) -> str:
        """The conversation as the usage record shows it (and notes its key)."""
        raw = call.extra.get("client_session") or ""
        if raw:
            label = raw if len(raw) <= LABEL_LIMIT else "h:" + _digest(raw)[:24]
        else:
            label = conversation_of(call.body) if isinstance(call.body, dict) else ""
        call.extra["session"] = label
        call.extra["session_key"] = _digest(str(auth.token.id), call.model, label) if label else ""
        return label

    async def order(self, call, auth, channels: list) -> list:
        """The channels to try, the conversation's own first, then the rest
        in its rendezvous order (awake ones before resting ones)."""
        if not self.on or call.endpoint not in ENDPOINTS:
            return channels
        if len(channels) < 2:
            if call.extra.get("client_session"):
                self.label(call, auth)
            return channels
        if not self.label(call, auth):
            return channels
        key = call.extra["session_key"]
        stuck = await self._where(key)
        awake = [c for c in channels if self.scheduler.awake(c)]
        resting = [c for c in channels if c not in awake]
        first = next((c for c in awake if c.id == stuck), None) if stuck is not None else None
        rest = sorted((c for c in awake if c is not first),
                      key=lambda c: (-c.priority, -score(key, c)))
        return ([first] if first is not None else []) + rest + resting

    async def _where(self, key: str) -> int | None:
        now = self.clock()
        entry = self.local.get(key)
        if entry is not None and now - entry[1] > self.ttl:
            entry = None  # idle past the TTL: placed afresh
            self.local.pop(key, None)
        if entry is None or now - entry[2] > RECHECK:
            got = await self._read(key)
            if got is not None and now - got[1] <= self.ttl:
                if entry is None:
                    entry = self.local[key] = [got[0], got[1], now, got[1]]
                else:
                    entry[0], entry[2] = got[0], now
            elif entry is not None:
                entry[2] = now
        return entry[0] if entry is not None else None

    async def _read(self, key: str):
        if self.records is None or self.clock() < self._quiet_until:
            return None
        try:
            return await asyncio.wait_for(self.records.get(key), READ_WAIT)
        except Exception as exc:  # placement goes on from memory and the hash
            self._quiet_until = self.clock() + QUIET
            log.warning("where conversations are placed could not be read: %s",
                        reason(exc))
            return None

    def served(self, call, channel) -> None:
        """A call of the conversation succeeded on `channel`: it is placed there."""
        key = call.extra.get("session_key") if self.on else None
        if not key:
            return
        now = self.clock()
        entry = self.local.get(key)
        if entry is None or entry[0] != channel.id:
            if entry is not None:
                log.info("conversation %s moves from channel %s to %s",
                         call.extra.get("session", "")[:40], entry[0], channel.id)
            self.local[key] = [channel.id, now, now, now]
            self.pending[key] = (channel.id, now)
        else:
            entry[1] = now
            if now - entry[3] > self.ttl / 2:
                entry[3] = now
                self.pending[key] = (channel.id, now)
        self.local.move_to_end(key)
        while len(self.local) > MAX_LOCAL:
            self.local.popitem(last=False)

    def cache_use(self, call, channel, usage) -> int:
        """Tokens of this conversation's previous cache write that no call
        read.  A write extends the cached prefix (from what that call read
        to read + written); the next call reads it if it reads at least that
        far, on the same channel, while the cache lives.  Seen from this
        relay's own calls of the conversation (behind a balancer, the next of
        them); a conversation's last write is counted only if it comes back."""
        key = call.extra.get("session_key")
        if not key or usage is None:
            return 0
        now = self.clock()
        unread = 0
        prev = self.writes.pop(key, None)
        if prev is not None:
            cid, written, end, at, life = prev
            read = usage.cached_tokens if cid == channel.id and now - at <= life else 0
            unread = min(max(end - read, 0), written)
        written = usage.cache_write_5m_tokens + usage.cache_write_1h_tokens
        if written:
            self.writes[key] = (channel.id, written, usage.cached_tokens + written, now,
                                3600.0 if usage.cache_write_1h_tokens else 300.0)
            while len(self.writes) > MAX_LOCAL:
                self.writes.popitem(last=False)
        return unread

    # ---- background --------------------------------------------------------------
    def start(self) -> None:
        if self.on and self.records is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        try:
            await asyncio.wait_for(self.flush(), 2.0)
        except (asyncio.TimeoutError, Exception):
            pass

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.flush()
                if self.clock() - self._pruned_at > 600:
                    self._pruned_at = self.clock()
                    await self.records.prune(self.clock() - self.ttl)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("placing conversations in the database: %s", exc)

    async def flush(self) -> int:
        """Write one bounded batch of placements; what fails is kept for the next."""
        if not self.pending or self.records is None:
            return 0
        batch = []
        for key in list(self.pending)[:FLUSH_BATCH]:
            cid, at = self.pending.pop(key)
            batch.append((key, cid, at))
        try:
            await self.records.save(batch)
        except Exception:
            for key, cid, at in batch:
                self.pending.setdefault(key, (cid, at))
            if len(self.pending) > MAX_LOCAL:  # the database is gone for long: memory holds
                self.pending.clear()
            raise
        return len(batch)
