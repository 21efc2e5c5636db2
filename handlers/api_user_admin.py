"""/api/user, for administrators: listing, creating and changing users,
their roles, passwords and balances (the caller's own account:
handlers/api_user.py)."""
from __future__ import annotations

import re
import time

from handlers.api_fields import (_int, budget_fields, by_id, group_list, limit_fields, paged,
                                 timezone_field)
from handlers.api_user import (email_of, insert_user, language_of, save_budgets, set_email,
                               user_view, validate_new_user)
from handlers.base import ApiError, ApiHandler, ident
from models.passwords import password_refusal
from models.records import MAX_QUOTA, ROLE_ADMIN, ROLE_ROOT, ROLE_USER, USER_DISABLED, USER_ENABLED
from models.seed import end_sessions, reset_fields, temporary_password
from relay.serving import jsonin
from relay.money.billing import USER


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
        fields = await validate_new_user(body, self.ctx["catalog"].groups)
        if body.get("language") is not None:  # else set at the user's first sign-in
            fields["language"] = language_of(body["language"])
        role = _int(body.get("role") or ROLE_USER, "role")
        if role not in (ROLE_USER, ROLE_ADMIN) or (role >= ROLE_ADMIN and admin["role"] < ROLE_ROOT):
            raise ApiError(403, "Only root can create administrators.", code="root_only")
        doc = await insert_user(self, fields, role)
        self.ok(user_view(self, doc), "User created.")

    async def put(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        target = await self._target(admin, body.get("id"))
        update: dict = {}
        if "group" in body:
            if not isinstance(body["group"], str) or body["group"] not in self.ctx["catalog"].groups:
                raise ApiError(400, f"There is no group named {body['group']!r}.", code="no_group",
                               group=str(body["group"])[:64])
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
        email = email_of(body["email"]) if "email" in body else None
        if "language" in body:
            update["language"] = language_of(body["language"])
        if "status" in body:
            if body["status"] not in (USER_ENABLED, USER_DISABLED):
                raise ApiError(400, "status must be 1 (enabled) or 2 (disabled).",
                               code="status_choice")
            if body["status"] == USER_DISABLED:
                _not_yourself(admin, target, "disable")
            update["status"] = body["status"]
        if "credit_limit" in body:
            # How far below zero the account may go (quota units; 0: not at all).
            update["credit_limit"] = _int(body["credit_limit"], "credit_limit", 0, MAX_QUOTA)
        reset: dict = {}
        if body.get("password"):
            password = jsonin.text(body["password"], "password", 2000)
            problem = await password_refusal(password, target.get("username", ""),
                                             email if email is not None
                                             else target.get("email", ""))
            if problem:
                raise ApiError.of(problem, code="invalid")
            if target["_id"] == admin["_id"]:
                raise ApiError(400, "Change your own password on your account page "
                                    "(PUT /api/user/self with original_password).",
                               code="own_password")
            # The user must replace a password somebody else chose, and is
            # signed out everywhere.
            reset = await reset_fields(password)
        update.update(limit_fields(body))
        update.update(budget_fields(body))
        update.update(await timezone_field(body))
        if not update and not unset and not reset and "quota" not in body and email is None:
            raise ApiError(400, "Nothing to change.", code="nothing_to_change")
        if email is not None:
            # An administrator's word confirms an address (a user's own
            # change waits for the mail: handlers/api_user.py).
            await set_email(self, target["_id"], email)
        if update or unset or reset:
            change = {**reset, "$set": {**reset.get("$set", {}), **update}}
            if unset:
                change["$unset"] = {**change.get("$unset", {}), **unset}
            if not change["$set"]:
                del change["$set"]
            await self.store.db.users.update_one({"_id": target["_id"]}, change)
        if reset:
            await end_sessions(self.store, target["_id"])
        await save_budgets(self, target, update)
        if "quota" in body:
            await self.ctx["billing"].set_remaining(USER, target["_id"],
                                                    _int(body["quota"], "quota", 0, MAX_QUOTA))
        await self.ctx["catalog"].changed("user", target["_id"])
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Saved.")

    async def _target(self, admin: dict, raw) -> dict:
        if raw is None:
            raise ApiError(400, "Give the user's id.", code="field_required", field="id")
        doc = await by_id(self.store.db.users, ident(raw), "user")
        if doc.get("role", 0) >= admin.get("role", 0) and doc["_id"] != admin["_id"]:
            raise ApiError(403, "You cannot change a user of your own rank or higher.",
                           code="rank")
        return doc


class UserHandler(UsersHandler):
    async def get(self, uid: str) -> None:
        self.require_admin()
        self.ok(user_view(self, await by_id(self.store.db.users, uid, "user")))

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
            raise ApiError(400, "action must be enable, disable, promote or demote.",
                           code="field_choice", field="action",
                           choices="enable, disable, promote, demote")
        if action in ("promote", "demote") and admin["role"] < ROLE_ROOT:
            raise ApiError(403, "Only root can change roles.", code="root_only")
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
            raise ApiError(400, "Change your own password on your account page.",
                           code="own_password")
        password = await temporary_password()
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
            raise ApiError(400, "amount must be a non-zero whole number of quota units.",
                           code="amount_zero")
        if not reason:
            raise ApiError(400, "Give a reason for the adjustment.", code="field_required",
                           field="reason")
        # Not a user of the administrator's own rank or higher (root, say).
        target = await self._target(admin, uid)
        ok = await self.ctx["billing"].credit(
            USER, target["_id"], amount, f"admin {admin['username']}: {reason}",
            ledger_id=f"adjust:{target['_id']}:{time.time_ns()}")
        if not ok:
            raise ApiError(409, "The balance is smaller than the amount to remove.",
                           code="balance_too_small")
        doc = await self.store.db.users.find_one({"_id": target["_id"]})
        self.ok(user_view(self, doc), "Balance adjusted.")


def _not_yourself(admin: dict, target: dict, action: str) -> None:
    # The last administrator could otherwise lock everyone out.
    if target["_id"] == admin["_id"]:
        raise ApiError(400, f"You cannot {action} your own account.",
                       code="not_yourself_demote" if action == "demote" else "not_yourself")


default_handlers = [
    (r"/api/user/manage/?", ManageUserHandler),
    (r"/api/user/?", UsersHandler),
    (r"/api/user/(\d+)/quota/?", AdjustQuotaHandler),
    (r"/api/user/(\d+)/password/?", ResetPasswordHandler),
    (r"/api/user/(\d+)/?", UserHandler),
]
