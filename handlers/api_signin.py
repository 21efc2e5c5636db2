"""/api/user sign-in: signing in (throttled), signing out (here or
everywhere) and the caller's sessions, which live in the database
(handlers/sessions.py)."""
from __future__ import annotations

import json
import secrets
import time

from handlers.api_user import browser_language, user_view
from handlers.base import ApiError, ApiHandler
from handlers.login_throttle import LoginThrottle
from models.passwords import hash_password_async, needs_update, verify_password_async
from models.records import USER_ENABLED
from relay.serving import jsonin

# A browser that signed in to an account before: its sign-in attempts are
# throttled per device (handlers/login_throttle.py).
DEVICE_COOKIE = "device"
DEVICE_NAMES = 5  # accounts one browser remembers


class LoginHandler(ApiHandler):
    JSON_ONLY = True

    async def post(self) -> None:
        body = self.body_json()
        name = jsonin.text(body.get("username"), "username", 320).strip()
        password = jsonin.text(body.get("password"), "password", 2000)
        if not name or not password:
            raise ApiError(400, "Enter a user name (or e-mail address) and a password.",
                           code="signin_empty")
        doc = await find_account(self.store.db, name)
        throttle = LoginThrottle(self.store)
        device = self._device()
        account = str(doc["_id"]) if doc else "name:" + name.lower()
        keys = throttle.keys(account, self.client_ip(),
                             f"{device['d']}:{account}" if doc and doc["_id"] in device["u"]
                             else None)
        # Counted as a failure before the check, given back if it was none.
        wait, claim = await throttle.claim(keys)
        if wait:
            raise ApiError(429, f"Too many failed sign-ins: try again in {_duration(wait)}.",
                           retry_after=wait, code="signin_throttled", wait=wait,
                           minutes=(wait + 59) // 60)
        try:
            # A missing user costs a hash too, so that timing does not tell
            # which names exist.
            right = await verify_password_async(password,
                                                doc.get("password_hash", "") if doc else "")
        except BaseException:  # never checked (the pool is full, the client left)
            await throttle.release(claim)
            raise
        if not right:
            await throttle.failed(claim)  # it stays counted
            raise ApiError(401, "Wrong user name or password.", code="wrong_credentials")
        if doc.get("status", USER_ENABLED) != USER_ENABLED:
            await throttle.release(claim)
            raise ApiError(403, "This account is disabled.", code="account_disabled")
        await throttle.succeeded(keys, claim)
        if needs_update(doc["password_hash"]):
            await self.store.db.users.update_one(
                {"_id": doc["_id"]},
                {"$set": {"password_hash": await hash_password_async(password)}})
        lang = "" if doc.get("language") else browser_language(self)
        if lang:
            # An account made before languages, by an administrator who chose
            # none, or by a script: it speaks what its first browser asks for.
            doc["language"] = lang
            await self.store.db.users.update_one({"_id": doc["_id"]},
                                                 {"$set": {"language": lang}})
        self._remember_device(device, doc["_id"])
        csrf = await self.start_session(doc)
        self.ok({**user_view(self, doc), "csrf_token": csrf}, "Signed in.")

    def _device(self) -> dict:
        raw = self.get_signed_cookie(DEVICE_COOKIE, max_age_days=400)
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("u"), list):
            return {"d": secrets.token_urlsafe(12), "u": []}
        # Accounts by id (cookies from before named them: those no longer count).
        ids = [u for u in doc["u"] if isinstance(u, int) and not isinstance(u, bool)]
        return {"d": str(doc.get("d") or secrets.token_urlsafe(12)), "u": ids}

    def _remember_device(self, device: dict, account: int) -> None:
        ids = [account] + [n for n in device["u"] if n != account][:DEVICE_NAMES - 1]
        self.set_signed_cookie(DEVICE_COOKIE, json.dumps({"d": device["d"], "u": ids}),
                               expires_days=365, httponly=True, samesite="Lax",
                               secure=self.secure_cookies, path="/api/user/login")


async def find_account(db, name: str) -> dict | None:
    """The account a sign-in names: by its exact name, else whatever the
    case (name_key), else by its confirmed e-mail address."""
    doc = await db.users.find_one({"username": name})
    if doc is None:
        doc = await db.users.find_one({"name_key": name.lower()})
    if doc is None and "@" in name:
        doc = await db.users.find_one({"email_key": name.lower()})
    return doc


def _duration(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = (seconds + 59) // 60
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


class LogoutHandler(ApiHandler):
    """POST only (a GET could be triggered by any page); with
    {"everywhere": true} it ends every session of the user."""

    open_before_password_change = True  # one's own sessions, also before a new password

    async def post(self) -> None:
        body = self.body_json()
        everywhere = jsonin.flag(body.get("everywhere", False), "everywhere")
        if everywhere:
            await self.end_all_sessions(self.require_user())
        await self.end_session()
        self.ok(None, "Signed out everywhere." if everywhere else "Signed out.")


class SessionsHandler(ApiHandler):
    """The caller's signed-in sessions (browsers)."""

    open_before_password_change = True  # one's own sessions, also before a new password

    async def get(self) -> None:
        user = self.require_user()
        docs = await self.store.db.sessions.find(
            {"uid": user["_id"], "exp": {"$gt": time.time()},
             "epoch": user.get("session_epoch", 0)}).to_list(200)
        docs.sort(key=lambda d: d.get("created", 0), reverse=True)
        self.ok([{"id": d["_id"][:16], "created": int(d.get("created", 0)),
                  "expires": int(d.get("exp", 0)), "ip": d.get("ip", ""),
                  "agent": d.get("agent", ""), "current": d["_id"] == self._session.get("_id")}
                 for d in docs])


class SessionHandler(ApiHandler):
    """Ending one of the caller's sessions (by the id the list shows)."""

    open_before_password_change = True  # one's own sessions, also before a new password

    async def delete(self, sid: str) -> None:
        user = self.require_user()
        docs = await self.store.db.sessions.find({"uid": user["_id"]}).to_list(1000)
        match = [d for d in docs if d["_id"][:16] == sid]
        if not match:
            raise ApiError(404, "No such session.", code="no_such_session")
        await self.store.db.sessions.delete_one({"_id": match[0]["_id"]})
        self.ok(None, "Session ended.")


default_handlers = [
    (r"/api/user/login/?", LoginHandler),
    (r"/api/user/logout/?", LogoutHandler),
    (r"/api/user/sessions/?", SessionsHandler),
    (r"/api/user/sessions/([A-Za-z0-9]+)/?", SessionHandler),
]
