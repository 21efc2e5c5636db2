"""Sign-in sessions: stored in the database (`sessions`, keyed by a keyed
hash of the random token in the signed `session` cookie), so that signing
out ends one for good, in every process.

session_user() is shared by the /api handlers, the console pages and the
console websocket; SessionMixin gives ApiHandler the ways to start and end
sessions.
"""
from __future__ import annotations

import secrets
import time

import tornado.web

from models.records import USER_ENABLED

SESSION_COOKIE = "session"


async def session_user(handler: tornado.web.RequestHandler) -> tuple[dict | None, dict]:
    """The enabled user behind the signed `session` cookie, and the session.

    Shared by the /api handlers, the console pages and the console
    websocket.  Sessions live in the database (`sessions`, keyed by a hash
    of the cookie's random token), so signing out ends one for good.
    Returns (None, {}) when there is no valid session: no or a forged
    cookie, signed out, expired, user disabled, or signed out everywhere
    (the user's session_epoch moved on, also on a password change).
    """
    raw = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=30)
    if not raw:
        return None, {}
    settings = handler.application.settings
    db = settings["store"].db
    sess = await db.sessions.find_one({"_id": settings["vault"].lookup_hash(raw.decode("latin-1"))})
    if not sess or sess.get("exp", 0) < time.time():
        return None, {}
    doc = await db.users.find_one({"_id": sess.get("uid")})
    if not doc or doc.get("status", USER_ENABLED) != USER_ENABLED:
        return None, {}
    if doc.get("session_epoch", 0) != sess.get("epoch", 0):
        return None, {}
    return doc, sess


def https(request) -> bool:
    """Whether the client's own connection is https (behind a trusted proxy,
    as its X-Forwarded-Proto says: see handlers/proxies.py)."""
    return request.protocol == "https"


class SessionMixin:
    """For ApiHandler: needs self.store, self.ctx, self.config, client_ip()
    and self._session (the session this request came with, or {})."""

    @property
    def secure_cookies(self) -> bool:
        return bool(self.config.secure_cookies) or https(self.request)

    async def start_session(self, user: dict, days: int = 7) -> str:
        """A new server-side session and its cookies; returns the CSRF token.
        A coroutine: the session is stored before the cookie is sent."""
        token = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(24)
        now = time.time()
        await self.store.db.sessions.insert_one({
            "_id": self.ctx["vault"].lookup_hash(token), "uid": user["_id"], "csrf": csrf,
            "epoch": user.get("session_epoch", 0), "created": now, "exp": now + days * 86400,
            "ip": self.client_ip(), "agent": self.request.headers.get("User-Agent", "")[:200]})
        # Expired sessions of this user go as a new one comes.
        await self.store.db.sessions.delete_many({"uid": user["_id"], "exp": {"$lt": now}})
        self.set_signed_cookie(SESSION_COOKIE, token, expires_days=days, httponly=True,
                               samesite="Lax", secure=self.secure_cookies, path="/")
        self.set_cookie("csrf_token", csrf, expires_days=days, samesite="Lax",
                        secure=self.secure_cookies, path="/")
        return csrf

    async def end_session(self) -> None:
        """Revoke this request's session on the server and clear its cookies."""
        if self._session.get("_id"):
            await self.store.db.sessions.delete_one({"_id": self._session["_id"]})
        self.clear_cookie(SESSION_COOKIE, path="/")
        self.clear_cookie("csrf_token", path="/")

    async def end_all_sessions(self, user: dict) -> None:
        """Sign the user out everywhere: every session, in every process.
        The epoch alone would do; the delete keeps the collection small."""
        await self.store.db.users.update_one({"_id": user["_id"]}, {"$inc": {"session_epoch": 1}})
        await self.store.db.sessions.delete_many({"uid": user["_id"]})
