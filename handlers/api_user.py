"""/api/user: registration, the caller's own account, top-up, and user admin
(signing in and out, and sessions: handlers/api_signin.py)."""
from __future__ import annotations

import re
import secrets
import time

from handlers.base import ApiError, ApiHandler, ident
from models.passwords import hash_password_async, password_problem, verify_password_async
from models.records import (LIMIT_FIELDS, MAX_QUOTA, ROLE_ADMIN, ROLE_ROOT, ROLE_USER,
                            USER_DISABLED, USER_ENABLED)
from models.seed import end_sessions, reset_fields, temporary_password
from models.store import DuplicateKeyError, now
from relay import jsonin
from relay.billing import USER

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
            "usable_groups": doc.get("usable_groups"),
            "credit_limit": int(doc.get("credit_limit") or 0),
            **{f: int(doc.get(f) or 0) for f in LIMIT_FIELDS}}


async def registration_open(handler: ApiHandler) -> bool:
    opt = await handler.store.db.options.find_one({"_id": "registration_enabled"})
    return bool(opt["value"]) if opt else handler.config.registration_enabled


def validate_new_user(body: dict, groups: dict) -> dict:
    """The fields of a new user; the password is checked but not yet hashed
    (`password`: hash it with hash_password_async before storing)."""
    username = jsonin.text(body.get("username"), "username", 200).strip()
    password = jsonin.text(body.get("password"), "password", 2000)
    email = jsonin.text(body.get("email"), "email", 320).strip().lower()
    group = jsonin.text(body.get("group"), "group", 64) or "default"
    if not _USERNAME.match(username) or "@" in username:
        raise ApiError(400, "The user name must be 2-64 letters, digits or _.- characters.")
    problem = password_problem(password, username, email)
    if problem:
        raise ApiError(400, problem)
    if email and not _EMAIL.match(email):
        raise ApiError(400, f"Not an e-mail address: {email!r}.")
    if group not in groups:
        raise ApiError(400, f"There is no group named {group!r}.")
    return {"username": username, "password": password, "email": email, "group": group}


async def insert_user(handler: ApiHandler, fields: dict, role: int = ROLE_USER) -> dict:
    db = handler.store.db
    fields = dict(fields)
    if "password" in fields:
        fields["password_hash"] = await hash_password_async(fields.pop("password"))
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
            update.update(await self.new_password(user, body, update.get("email")))
        if not update:
            raise ApiError(400, "Nothing to change.")
        inc = {"session_epoch": 1} if "password_hash" in update else {}
        doc = await self.store.db.users.find_one_and_update(
            {"_id": user["_id"]}, {"$set": update, **({"$inc": inc} if inc else {})},
            return_document=True)
        await self.ctx["catalog"].changed("user", user["_id"])
        if inc:
            # Every other session ends with the old password; this one goes on.
            await end_sessions(self.store, user["_id"])
            self.set_header("X-CSRF-Token", await self.start_session(doc))
        self.ok(user_view(self, doc), "Password changed." if inc else "Saved.")

    @staticmethod
    async def new_password(user: dict, body: dict, email: str | None) -> dict:
        """The fields that set the caller's own new password, after checking
        the current one; also clears a reset's must-change flag."""
        password = jsonin.text(body["password"], "password", 2000)
        original = jsonin.text(body.get("original_password"), "original_password", 2000)
        current = user.get("password_hash", "")
        if not await verify_password_async(original, current):
            raise ApiError(403, "The current password is wrong.")
        problem = password_problem(password, user.get("username", ""),
                                   email if email is not None else user.get("email", ""))
        if problem:
            raise ApiError(400, problem)
        if password == original:
            raise ApiError(400, "The new password must differ from the current one.")
        return {"password_hash": await hash_password_async(password),
                "must_change_password": False}


class AccessTokenHandler(ApiHandler):
    """A new access token for `Authorization: Bearer` on /api (replaces the
    old).  POST only, and from a session only with the CSRF header: a page
    elsewhere must not be able to rotate it."""

    async def post(self) -> None:
        user = self.require_user()
        token = "at-" + secrets.token_urlsafe(32)
        await self.store.db.users.update_one(
            {"_id": user["_id"]},
            {"$set": {"access_token_hash": self.ctx["vault"].lookup_hash(token)}})
        self.ok(token)


class TopupHandler(ApiHandler):
    async def post(self) -> None:
        user = self.require_user()
        code = jsonin.text(self.body_json().get("key"), "key", 200).strip()
        if not code:
            raise ApiError(400, "Enter a redemption code.")
        db = self.store.db
        code_hash = self.ctx["vault"].lookup_hash(code)
        doc = await db.redemptions.find_one_and_update(
            {"key_hash": code_hash, "status": 1},
            {"$set": {"status": 3, "used_user_id": user["_id"], "redeemed_time": now()}},
            return_document=True)
        if doc is None:
            used = await db.redemptions.find_one({"key_hash": code_hash}, {"status": 1})
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
    """p (from 1) and size (1-200); out-of-range small values are clamped as
    new-api clients expect, values no page could have are refused."""
    p = handler.int_arg("p", 1, -10 ** 9, 10 ** 9)
    size = handler.int_arg("size", None, -10 ** 9, 10 ** 9)
    if size is None:
        size = handler.int_arg("page_size", 20, -10 ** 9, 10 ** 9)
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
        kw = self.str_arg("keyword", max_len=200).strip()
        if kw:
            rx = {"$regex": re.escape(kw), "$options": "i"}
            flt = {"$or": [{"username": rx}, {"email": rx}]}
        self.ok(await paged(self, self.store.db.users, flt, lambda d: user_view(self, d)))

    async def post(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        fields = validate_new_user(body, self.ctx["catalog"].groups)
        role = _int(body.get("role") or ROLE_USER, "role")
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
            if not isinstance(body["group"], str) or body["group"] not in self.ctx["catalog"].groups:
                raise ApiError(400, f"There is no group named {body['group']!r}.")
            update["group"] = body["group"]
        unset = {}
        if "usable_groups" in body:
            # null: the user group's list applies again.
            if body["usable_groups"] is None:
                unset["usable_groups"] = ""
            else:
                update["usable_groups"] = group_list(self, body["usable_groups"])
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
            if body["status"] == USER_DISABLED:
                _not_yourself(admin, target, "disable")
            update["status"] = body["status"]
        if "credit_limit" in body:
            # How far below zero the account may go (quota units; 0: not at all).
            update["credit_limit"] = _int(body["credit_limit"], "credit_limit", 0, MAX_QUOTA)
        reset: dict = {}
        if body.get("password"):
            password = jsonin.text(body["password"], "password", 2000)
            problem = password_problem(password, target.get("username", ""),
                                       update.get("email", target.get("email", "")))
            if problem:
                raise ApiError(400, problem)
            if target["_id"] == admin["_id"]:
                raise ApiError(400, "Change your own password on your account page "
                                    "(PUT /api/user/self with original_password).")
            # The user must replace a password somebody else chose, and is
            # signed out everywhere.
            reset = await reset_fields(password)
        update.update(limit_fields(body))
        if not update and not unset and not reset and "quota" not in body:
            raise ApiError(400, "Nothing to change.")
        if update or unset or reset:
            change = {**reset, "$set": {**reset.get("$set", {}), **update}}
            if unset:
                change["$unset"] = {**change.get("$unset", {}), **unset}
            if not change["$set"]:
                del change["$set"]
            await self.store.db.users.update_one({"_id": target["_id"]}, change)
        if reset:
            await end_sessions(self.store, target["_id"])
        if "quota" in body:
            await self.ctx["billing"].set_remaining(USER, target["_id"],
                                                    _int(body["quota"], "quota", 0, MAX_QUOTA))
        await self.ctx["catalog"].changed("user", target["_id"])
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Saved.")

    async def _target(self, admin: dict, raw) -> dict:
        if raw is None:
            raise ApiError(400, "Give the user's id.")
        uid = ident(raw)
        doc = await self.store.db.users.find_one({"_id": uid})
        if doc is None:
            raise ApiError(404, f"No user with id {uid}.")
        if doc.get("role", 0) >= admin.get("role", 0) and doc["_id"] != admin["_id"]:
            raise ApiError(403, "You cannot change a user of your own rank or higher.")
        return doc


class UserHandler(UsersHandler):
    async def get(self, uid: str) -> None:
        self.require_admin()
        doc = await self.store.db.users.find_one({"_id": ident(uid)})
        if doc is None:
            raise ApiError(404, f"No user with id {uid}.")
        self.ok(user_view(self, doc))

    async def delete(self, uid: str) -> None:
        """Disabling, not deleting: usage records keep pointing at the user."""
        admin = self.require_admin()
        target = await self._target(admin, uid)
        _not_yourself(admin, target, "disable")
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
        if action in ("disable", "demote"):
            _not_yourself(admin, target, action)
        await self.store.db.users.update_one({"_id": target["_id"]}, {"$set": update})
        await self.ctx["catalog"].changed("user", target["_id"])
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Saved.")


class ResetPasswordHandler(UsersHandler):
    """A new temporary password for a user, shown to the administrator once;
    the user must replace it at the next sign-in (sessions end now)."""

    async def post(self, uid: str) -> None:
        admin = self.require_admin()
        target = await self._target(admin, uid)
        if target["_id"] == admin["_id"]:
            raise ApiError(400, "Change your own password on your account page.")
        password = temporary_password()
        await self.store.db.users.update_one({"_id": target["_id"]},
                                             await reset_fields(password))
        await end_sessions(self.store, target["_id"])
        await self.ctx["catalog"].changed("user", target["_id"])
        self.ok({"id": target["_id"], "username": target.get("username", ""),
                 "password": password},
                "Password reset: give it to the user, who must choose a new one at sign-in.")


class AdjustQuotaHandler(UsersHandler):
    """Add or remove balance with a reason; kept in the ledger."""

    async def post(self, uid: str) -> None:
        admin = self.require_admin()
        body = self.body_json()
        amount = _int(body.get("amount"), "amount", -MAX_QUOTA, MAX_QUOTA)
        reason = str(body.get("reason") or "").strip()
        if not amount:
            raise ApiError(400, "amount must be a non-zero whole number of quota units.")
        if not reason:
            raise ApiError(400, "Give a reason for the adjustment.")
        target = await self.store.db.users.find_one({"_id": ident(uid)})
        if target is None:
            raise ApiError(404, f"No user with id {uid}.")
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


def _not_yourself(admin: dict, target: dict, action: str) -> None:
    # The last administrator could otherwise lock everyone out.
    if target["_id"] == admin["_id"]:
        raise ApiError(400, f"You cannot {action} your own account.")


def group_list(handler: ApiHandler, value, field: str = "usable_groups") -> list[str]:
    """A list of existing group names (a JSON list, or names separated by commas)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.replace("\n", ",").split(",")
    if not isinstance(value, list):
        raise ApiError(400, f"{field} must be a list of group names.")
    names = {jsonin.text(v, field, 64).strip() for v in value} - {""}
    unknown = sorted(g for g in names if g not in handler.ctx["catalog"].groups)
    if unknown:
        raise ApiError(400, f"{field}: there is no group named {unknown[0]!r}.")
    return sorted(names)


def _int(value, name: str, lo: int = jsonin.INT64_MIN, hi: int = jsonin.INT64_MAX) -> int:
    """A whole-number field (relay/jsonin.whole; BadInput is a 400 naming it)."""
    return jsonin.whole(value, name, lo, hi)


default_handlers = [
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
