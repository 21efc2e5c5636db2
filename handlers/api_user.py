"""/api/user: sign-in, the caller's own account, top-up, and user admin."""
from __future__ import annotations

import re
import secrets
import time

from cachetools import TTLCache

from handlers.base import ApiError, ApiHandler
from models.passwords import hash_password, needs_update, password_problem, verify_password
from models.records import (LIMIT_FIELDS, ROLE_ADMIN, ROLE_ROOT, ROLE_USER, USER_DISABLED,
                            USER_ENABLED)
from models.seed import reset_fields, temporary_password
from models.store import DuplicateKeyError, now
from relay.billing import USER

# Failed sign-ins allowed per 10 minutes: per (address, name), and per
# address over all names (guessing many accounts from one place).
MAX_FAILURES = 5
MAX_FAILURES_PER_IP = 30
_failures: TTLCache = TTLCache(maxsize=100_000, ttl=600)

_USERNAME = re.compile(r"^[A-Za-z0-9_.\-@]{2,64}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def user_view(handler: ApiHandler, doc: dict) -> dict:
    remaining, used = handler.ctx["billing"].view_from_doc(USER, doc)
    return {"id": doc["_id"], "username": doc.get("username", ""), "email": doc.get("email", ""),
            "display_name": doc.get("display_name", ""), "role": doc.get("role", ROLE_USER),
            "status": doc.get("status", USER_ENABLED), "group": doc.get("group", "default"),
            "quota": remaining, "used_quota": used, "created_time": doc.get("created_time", 0),
            "marketing_opt_in": bool(doc.get("marketing_opt_in")),
            "must_change_password": bool(doc.get("must_change_password")),
            "credit_limit": int(doc.get("credit_limit") or 0),
            **{f: int(doc.get(f) or 0) for f in LIMIT_FIELDS}}


async def registration_open(handler: ApiHandler) -> bool:
    opt = await handler.store.db.options.find_one({"_id": "registration_enabled"})
    return bool(opt["value"]) if opt else handler.config.registration_enabled


def validate_new_user(body: dict, groups: dict) -> dict:
    username = str(body.get("username") or "").strip()
    password = str(body.get("password") or "")
    email = str(body.get("email") or "").strip().lower()
    group = str(body.get("group") or "default")
    if not _USERNAME.match(username) or "@" in username:
        raise ApiError(400, "The user name must be 2-64 letters, digits or _.- characters.")
    problem = password_problem(password, username, email)
    if problem:
        raise ApiError(400, problem)
    if email and not _EMAIL.match(email):
        raise ApiError(400, f"Not an e-mail address: {email!r}.")
    if group not in groups:
        raise ApiError(400, f"There is no group named {group!r}.")
    return {"username": username, "password_hash": hash_password(password), "email": email,
            "group": group}


async def insert_user(handler: ApiHandler, fields: dict, role: int = ROLE_USER) -> dict:
    db = handler.store.db
    if fields["email"] and await db.users.find_one({"email": fields["email"]}, {"_id": 1}):
        raise ApiError(409, "That e-mail address is already registered.")
    doc = {"_id": await handler.store.next_id("users"), "display_name": fields["username"],
           "role": role, "status": USER_ENABLED, "quota": 0, "used_quota": 0, "leases": {},
           "created_time": now(), **fields}
    try:
        await db.users.insert_one(doc)
    except DuplicateKeyError:
        raise ApiError(409, f"The user name {fields['username']!r} is taken.") from None
    return doc


class LoginHandler(ApiHandler):
    async def post(self) -> None:
        body = self.body_json()
        name = str(body.get("username") or "").strip()
        password = str(body.get("password") or "")
        if not name or not password:
            raise ApiError(400, "Enter a user name (or e-mail address) and a password.")
        keys = (("pair", self.client_ip(), name.lower()), ("ip", self.client_ip()))
        if (_failures.get(keys[0], 0) >= MAX_FAILURES
                or _failures.get(keys[1], 0) >= MAX_FAILURES_PER_IP):
            raise ApiError(429, "Too many failed sign-in attempts; wait 10 minutes and try again.")
        db = self.store.db
        doc = await db.users.find_one({"username": name})
        if doc is None and "@" in name:
            doc = await db.users.find_one({"email": name.lower()})
        if doc is None or not verify_password(password, doc.get("password_hash", "")):
            for k in keys:
                _failures[k] = _failures.get(k, 0) + 1
            raise ApiError(401, "Wrong user name or password.")
        if doc.get("status", USER_ENABLED) != USER_ENABLED:
            raise ApiError(403, "This account is disabled.")
        _failures.pop(keys[0], None)
        if needs_update(doc["password_hash"]):
            await db.users.update_one({"_id": doc["_id"]},
                                      {"$set": {"password_hash": hash_password(password)}})
        csrf = self.start_session(doc)
        self.ok({**user_view(self, doc), "csrf_token": csrf}, "Signed in.")


class LogoutHandler(ApiHandler):
    async def post(self) -> None:
        self.end_session()
        self.ok(None, "Signed out.")

    get = post


class RegisterHandler(ApiHandler):
    async def post(self) -> None:
        if not await registration_open(self):
            raise ApiError(403, "Registration is closed on this server.")
        fields = validate_new_user({**self.body_json(), "group": "default"},
                                   self.ctx["catalog"].groups)
        doc = await insert_user(self, fields)
        self.ok(user_view(self, doc), "Account created; you can sign in now.")


class SelfHandler(ApiHandler):
    open_before_password_change = True

    async def get(self) -> None:
        self.ok(user_view(self, self.require_user()))

    async def put(self) -> None:
        user = self.require_user()
        body = self.body_json()
        update: dict = {}
        if "display_name" in body:
            update["display_name"] = str(body["display_name"])[:64]
        if "marketing_opt_in" in body:
            update["marketing_opt_in"] = bool(body["marketing_opt_in"])
        if "email" in body:
            email = str(body["email"]).strip().lower()
            if email and not _EMAIL.match(email):
                raise ApiError(400, f"Not an e-mail address: {email!r}.")
            update["email"] = email
        if body.get("password"):
            update.update(self.new_password(user, body, update.get("email")))
        if not update:
            raise ApiError(400, "Nothing to change.")
        inc = {"session_epoch": 1} if "password_hash" in update else {}
        doc = await self.store.db.users.find_one_and_update(
            {"_id": user["_id"]}, {"$set": update, **({"$inc": inc} if inc else {})},
            return_document=True)
        await self.ctx["catalog"].changed("user", user["_id"])
        if inc:
            self.start_session(doc)
        self.ok(user_view(self, doc), "Password changed." if inc else "Saved.")

    @staticmethod
    def new_password(user: dict, body: dict, email: str | None) -> dict:
        """The fields that set the caller's own new password, after checking
        the current one; also clears a reset's must-change flag."""
        password = str(body["password"])
        current = user.get("password_hash", "")
        if not verify_password(str(body.get("original_password") or ""), current):
            raise ApiError(403, "The current password is wrong.")
        if verify_password(password, current):
            raise ApiError(400, "The new password must differ from the current one.")
        problem = password_problem(password, user.get("username", ""),
                                   email if email is not None else user.get("email", ""))
        if problem:
            raise ApiError(400, problem)
        return {"password_hash": hash_password(password), "must_change_password": False}


class AccessTokenHandler(ApiHandler):
    """A new access token for `Authorization: Bearer` on /api (replaces the old)."""

    async def get(self) -> None:
        user = self.require_user()
        token = "at-" + secrets.token_urlsafe(32)
        await self.store.db.users.update_one(
            {"_id": user["_id"]},
            {"$set": {"access_token_hash": self.ctx["vault"].lookup_hash(token)}})
        self.ok(token)

    post = get


class TopupHandler(ApiHandler):
    async def post(self) -> None:
        user = self.require_user()
        code = str(self.body_json().get("key") or "").strip()
        if not code:
            raise ApiError(400, "Enter a redemption code.")
        db = self.store.db
        doc = await db.redemptions.find_one_and_update(
            {"key": code, "status": 1},
            {"$set": {"status": 3, "used_user_id": user["_id"], "redeemed_time": now()}},
            return_document=True)
        if doc is None:
            used = await db.redemptions.find_one({"key": code}, {"status": 1})
            if used is None:
                raise ApiError(404, "No such redemption code.")
            raise ApiError(409, "This redemption code has already been used.")
        ok = await self.ctx["billing"].credit(USER, user["_id"], int(doc["quota"]),
                                              f"redemption {doc['_id']}",
                                              ledger_id=f"redeem:{doc['_id']}")
        if not ok:
            await db.redemptions.update_one({"_id": doc["_id"]},
                                            {"$set": {"status": 1, "used_user_id": None}})
            raise ApiError(500, "The code could not be applied; it is still valid.")
        self.ok(int(doc["quota"]), f"Added {doc['quota']} to your balance.")


# ---- admin ----------------------------------------------------------------
def page_args(handler: ApiHandler) -> tuple[int, int]:
    try:
        p = int(handler.get_argument("p", "1"))
        size = int(handler.get_argument("size", handler.get_argument("page_size", "20")))
    except ValueError:
        raise ApiError(400, "p and size must be whole numbers.") from None
    return max(p, 1), min(max(size, 1), 200)


async def paged(handler: ApiHandler, coll, flt: dict, view, sort: str = "_id") -> dict:
    """One page of documents, newest first by `sort` (descending)."""
    p, size = page_args(handler)
    total = await coll.count_documents(flt)
    docs = await handler.store.page(coll, flt, sort, -1, (p - 1) * size, size)
    return {"items": [view(d) for d in docs], "total": total, "page": p, "page_size": size}


class UsersHandler(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        flt: dict = {}
        kw = self.get_argument("keyword", "").strip()
        if kw:
            rx = {"$regex": re.escape(kw), "$options": "i"}
            flt = {"$or": [{"username": rx}, {"email": rx}]}
        self.ok(await paged(self, self.store.db.users, flt, lambda d: user_view(self, d)))

    async def post(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        fields = validate_new_user(body, self.ctx["catalog"].groups)
        role = int(body.get("role") or ROLE_USER)
        if role not in (ROLE_USER, ROLE_ADMIN) or (role >= ROLE_ADMIN and admin["role"] < ROLE_ROOT):
            raise ApiError(403, "Only root can create administrators.")
        doc = await insert_user(self, fields, role)
        self.ok(user_view(self, doc), "User created.")

    async def put(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        target = await self._target(admin, body.get("id"))
        update: dict = {}
        if "group" in body:
            if body["group"] not in self.ctx["catalog"].groups:
                raise ApiError(400, f"There is no group named {body['group']!r}.")
            update["group"] = body["group"]
        for f in ("display_name",):
            if f in body:
                update[f] = str(body[f])
        if "email" in body:
            email = str(body["email"]).strip().lower()
            if email and not _EMAIL.match(email):
                raise ApiError(400, f"Not an e-mail address: {email!r}.")
            update["email"] = email
        if "status" in body:
            if body["status"] not in (USER_ENABLED, USER_DISABLED):
                raise ApiError(400, "status must be 1 (enabled) or 2 (disabled).")
            update["status"] = body["status"]
        if "credit_limit" in body:
            # How far below zero the account may go (quota units; 0: not at all).
            limit = _int(body["credit_limit"], "credit_limit")
            if limit < 0:
                raise ApiError(400, "credit_limit is a number of quota units, 0 or more.")
            update["credit_limit"] = limit
        reset: dict = {}
        if body.get("password"):
            password = str(body["password"])
            problem = password_problem(password, target.get("username", ""),
                                       update.get("email", target.get("email", "")))
            if problem:
                raise ApiError(400, problem)
            if target["_id"] == admin["_id"]:
                raise ApiError(400, "Change your own password on your account page "
                                    "(PUT /api/user/self with original_password).")
            # The user must replace a password somebody else chose.
            reset = reset_fields(password)
        update.update(limit_fields(body))
        if not update and not reset and "quota" not in body:
            raise ApiError(400, "Nothing to change.")
        if update or reset:
            change = {**reset, "$set": {**reset.get("$set", {}), **update}}
            await self.store.db.users.update_one({"_id": target["_id"]}, change)
        if "quota" in body:
            await self.ctx["billing"].set_remaining(USER, target["_id"], _int(body["quota"], "quota"))
        await self.ctx["catalog"].changed("user", target["_id"])
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Saved.")

    async def _target(self, admin: dict, ident) -> dict:
        try:
            ident = int(ident)
        except (TypeError, ValueError):
            raise ApiError(400, "Give the user's id.") from None
        doc = await self.store.db.users.find_one({"_id": ident})
        if doc is None:
            raise ApiError(404, f"No user with id {ident}.")
        if doc.get("role", 0) >= admin.get("role", 0) and doc["_id"] != admin["_id"]:
            raise ApiError(403, "You cannot change a user of your own rank or higher.")
        return doc


class UserHandler(UsersHandler):
    async def get(self, ident: str) -> None:
        self.require_admin()
        doc = await self.store.db.users.find_one({"_id": int(ident)})
        if doc is None:
            raise ApiError(404, f"No user with id {ident}.")
        self.ok(user_view(self, doc))

    async def delete(self, ident: str) -> None:
        """Disabling, not deleting: usage records keep pointing at the user."""
        admin = self.require_admin()
        target = await self._target(admin, ident)
        await self.store.db.users.update_one({"_id": target["_id"]},
                                             {"$set": {"status": USER_DISABLED}})
        await self.ctx["catalog"].changed("user", target["_id"])
        # Their conversations go with them (stored responses hold prompts).
        await self.ctx["responses"].records.delete_for_user(target["_id"])
        self.ok(None, "User disabled.")


class ManageUserHandler(UsersHandler):
    """new-api style: {id, action: enable|disable|promote|demote}."""

    async def post(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        target = await self._target(admin, body.get("id"))
        action = body.get("action")
        update = {"enable": {"status": USER_ENABLED}, "disable": {"status": USER_DISABLED},
                  "promote": {"role": ROLE_ADMIN}, "demote": {"role": ROLE_USER}}.get(action)
        if update is None:
            raise ApiError(400, "action must be enable, disable, promote or demote.")
        if action in ("promote", "demote") and admin["role"] < ROLE_ROOT:
            raise ApiError(403, "Only root can change roles.")
        await self.store.db.users.update_one({"_id": target["_id"]}, {"$set": update})
        await self.ctx["catalog"].changed("user", target["_id"])
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Saved.")


class ResetPasswordHandler(UsersHandler):
    """A new temporary password for a user, shown to the administrator once;
    the user must replace it at the next sign-in (sessions end now)."""

    async def post(self, ident: str) -> None:
        admin = self.require_admin()
        target = await self._target(admin, ident)
        if target["_id"] == admin["_id"]:
            raise ApiError(400, "Change your own password on your account page.")
        password = temporary_password()
        await self.store.db.users.update_one({"_id": target["_id"]}, reset_fields(password))
        await self.ctx["catalog"].changed("user", target["_id"])
        self.ok({"id": target["_id"], "username": target.get("username", ""),
                 "password": password},
                "Password reset: give it to the user, who must choose a new one at sign-in.")


class AdjustQuotaHandler(UsersHandler):
    """Add or remove balance with a reason; kept in the ledger."""

    async def post(self, ident: str) -> None:
        admin = self.require_admin()
        body = self.body_json()
        amount = _int(body.get("amount"), "amount")
        reason = str(body.get("reason") or "").strip()
        if not amount:
            raise ApiError(400, "amount must be a non-zero whole number of quota units.")
        if not reason:
            raise ApiError(400, "Give a reason for the adjustment.")
        target = await self.store.db.users.find_one({"_id": int(ident)})
        if target is None:
            raise ApiError(404, f"No user with id {ident}.")
        ok = await self.ctx["billing"].credit(
            USER, target["_id"], amount, f"admin {admin['username']}: {reason}",
            ledger_id=f"adjust:{target['_id']}:{time.time_ns()}")
        if not ok:
            raise ApiError(409, "The balance is smaller than the amount to remove.")
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Balance adjusted.")


def limit_fields(body: dict) -> dict:
    """The rate limits present in body (relay/limits.py): 0 = none."""
    out = {}
    for f in LIMIT_FIELDS:
        if f in body:
            v = _int(body[f] if body[f] not in (None, "") else 0, f)
            if not 0 <= v <= 10 ** 12:
                raise ApiError(400, f"{f} must be 0 (no limit) or a positive whole number.")
            out[f] = v
    return out


def _int(value, name: str) -> int:
    if isinstance(value, bool):
        raise ApiError(400, f"{name} must be a whole number.")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ApiError(400, f"{name} must be a whole number.") from None
    if f != int(f):
        raise ApiError(400, f"{name} must be a whole number.")
    return int(f)


default_handlers = [
    (r"/api/user/login/?", LoginHandler),
    (r"/api/user/logout/?", LogoutHandler),
    (r"/api/user/register/?", RegisterHandler),
    (r"/api/user/self/?", SelfHandler),
    (r"/api/user/token/?", AccessTokenHandler),
    (r"/api/user/topup/?", TopupHandler),
    (r"/api/user/manage/?", ManageUserHandler),
    (r"/api/user/?", UsersHandler),
    (r"/api/user/(\d+)/quota/?", AdjustQuotaHandler),
    (r"/api/user/(\d+)/password/?", ResetPasswordHandler),
    (r"/api/user/(\d+)/?", UserHandler),
]
