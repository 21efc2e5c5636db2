"""/api/user: registration, the caller's own account and top-up (signing in
and out, and sessions: handlers/api_signin.py; users administered:
handlers/api_user_admin.py)."""
from __future__ import annotations

import re
import secrets

from console import strings
from handlers.api_fields import budget_fields, budget_use, budgets_changed, timezone_field
from handlers.base import ApiError, ApiHandler
from models.passwords import hash_password_async, password_refusal, verify_password_async
from models.records import LIMIT_FIELDS, ROLE_USER, USER_ENABLED
from models.seed import end_sessions
from models.store import DuplicateKeyError, now
from notify.contact import ContactError
from relay.serving import jsonin
from relay.money.billing import USER

_USERNAME = re.compile(r"^[A-Za-z0-9_.\-@]{2,64}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def user_view(handler: ApiHandler, doc: dict) -> dict:
    remaining, used = handler.ctx["billing"].view_from_doc(USER, doc)
    return {"id": doc["_id"], "username": doc.get("username", ""), "email": doc.get("email", ""),
            "display_name": doc.get("display_name", ""), "role": doc.get("role", ROLE_USER),
            "status": doc.get("status", USER_ENABLED), "group": doc.get("group", "default"),
            "quota": remaining, "used_quota": used, "created_time": doc.get("created_time", 0),
            "marketing_opt_in": bool(doc.get("marketing_opt_in")),
            # The console's and the notifications' language; "" until chosen
            # (sign-up, first sign-in or the console's switch): then English.
            "language": doc.get("language") or "",
            "must_change_password": bool(doc.get("must_change_password")),
            "usable_groups": doc.get("usable_groups"),
            # An address waiting for its code (notify/contact.py), else "".
            "pending_email": doc.get("pending_email", ""),
            "credit_limit": int(doc.get("credit_limit") or 0),
            **{f: int(doc.get(f) or 0) for f in LIMIT_FIELDS},
            # Budgets by period and their calendar (relay/money/budgets.py).
            "budgets": dict(doc.get("budgets") or {}), "timezone": doc.get("timezone") or "UTC"}


async def with_budget_use(handler: ApiHandler, view: dict) -> dict:
    """The account's budgets' use this period (`budget_use`: the dashboard's bars)."""
    use = await budget_use(handler, [("user", view["id"], view["budgets"])],
                           lambda _s, _i: view["timezone"])
    view["budget_use"] = use[("user", view["id"])]
    return view


async def save_budgets(handler: ApiHandler, target: dict, update: dict) -> None:
    """After an account's budgets or time zone changed: the current periods'
    counters follow a changed limit (a changed time zone starts counting
    in the new calendar's periods)."""
    if "budgets" in update:
        await budgets_changed(handler, "user", target["_id"], target.get("budgets") or {},
                              update["budgets"], update.get("timezone", target.get("timezone")))


def email_of(value) -> str:
    """An e-mail address from a form ("" clears it), or a 400."""
    email = str(value).strip().lower()
    if email and not _EMAIL.match(email):
        raise ApiError(400, f"Not an e-mail address: {email!r}.", code="email_invalid",
                       email=email[:320])
    return email


def language_of(value) -> str:
    """A language the console has (a tag such as zh-CN, any case), or a 400."""
    tag = jsonin.text(value, "language", strings.MAX_TAG)
    lang = strings.normalize(tag)
    if lang is None:
        choices = ", ".join(strings.available())
        raise ApiError(400, f"language must be one of: {choices}.", code="field_choice",
                       field="language", choices=choices)
    return lang


def browser_language(handler: ApiHandler) -> str:
    """The language a browser asks for: its `lang` cookie (the console's
    switch), else its Accept-Language; "" when it says neither (a script)."""
    accept, cookie = handler.request.headers.get("Accept-Language", ""), handler.get_cookie("lang")
    if not accept.strip() and not cookie:
        return ""
    return strings.pick(accept, cookie)


async def registration_open(handler: ApiHandler) -> bool:
    opt = await handler.store.db.options.find_one({"_id": "registration_enabled"})
    return bool(opt["value"]) if opt else handler.config.registration_enabled


async def validate_new_user(body: dict, groups: dict) -> dict:
    """The fields of a new user; the password is checked but not yet hashed
    (`password`: hash it with hash_password_async before storing)."""
    username = jsonin.text(body.get("username"), "username", 200).strip()
    password = jsonin.text(body.get("password"), "password", 2000)
    email = jsonin.text(body.get("email"), "email", 320).strip().lower()
    group = jsonin.text(body.get("group"), "group", 64) or "default"
    if not _USERNAME.match(username) or "@" in username:
        raise ApiError(400, "The user name must be 2-64 letters, digits or _.- characters.",
                       code="username_invalid", min=2, max=64)
    problem = await password_refusal(password, username, email)
    if problem:
        raise ApiError.of(problem, code="invalid")
    if email and not _EMAIL.match(email):
        raise ApiError(400, f"Not an e-mail address: {email!r}.", code="email_invalid",
                       email=email)
    if group not in groups:
        raise ApiError(400, f"There is no group named {group!r}.", code="no_group", group=group)
    return {"username": username, "password": password, "email": email, "group": group}


async def insert_user(handler: ApiHandler, fields: dict, role: int = ROLE_USER) -> dict:
    """A new account.  Its name is unique whatever its case (`name_key`), and
    so is its e-mail address (`email_key`): a second "ALICE" beside "alice"
    would be a second throttle for the same sign-in name."""
    db = handler.store.db
    fields = dict(fields)
    fields["name_key"] = fields["username"].lower()
    if fields["email"]:
        fields["email_key"] = fields["email"]
    if await db.users.find_one({"name_key": fields["name_key"]}, {"_id": 1}):
        raise ApiError(409, f"The user name {fields['username']!r} is taken.",
                       code="username_taken", username=fields["username"])
    if fields["email"] and await email_taken(handler, fields["email"]):
        raise ApiError(409, "That e-mail address is already registered.", code="email_taken")
    if "password" in fields:
        fields["password_hash"] = await hash_password_async(fields.pop("password"))
    doc = {"_id": await handler.store.next_id("users"), "display_name": fields["username"],
           "role": role, "status": USER_ENABLED, "quota": 0, "used_quota": 0, "leases": {},
           "created_time": now(), **fields}
    try:
        await db.users.insert_one(doc)
    except DuplicateKeyError:  # a racing registration took the name or the address
        raise ApiError(409, f"The user name {fields['username']!r} or the e-mail address "
                            "is taken.", code="username_or_email_taken",
                       username=fields["username"]) from None
    return doc


async def email_taken(handler: ApiHandler, email: str, but: int | None = None) -> bool:
    """Whether another account (not `but`) has this address."""
    doc = await handler.store.db.users.find_one({"email_key": email.lower()}, {"_id": 1})
    return doc is not None and doc["_id"] != but


async def set_email(handler: ApiHandler, user_id: int, email: str) -> dict:
    """Give an account a confirmed address ("" removes it); 409 if another
    account has it.  Returns the account."""
    if email and await email_taken(handler, email, but=user_id):
        raise ApiError(409, "That e-mail address is already registered to another account.",
                       code="email_taken")
    change: dict = {"$set": {"email": email}}
    if email:
        change["$set"]["email_key"] = email
    else:
        change["$unset"] = {"email_key": ""}
    try:
        return await handler.store.db.users.find_one_and_update(
            {"_id": user_id}, change, return_document=True)
    except DuplicateKeyError:
        raise ApiError(409, "That e-mail address is already registered to another "
                            "account.", code="email_taken") from None


class RegisterHandler(ApiHandler):
    JSON_ONLY = True

    async def post(self) -> None:
        if not await registration_open(self):
            raise ApiError(403, "Registration is closed on this server.",
                           code="registration_closed")
        body = self.body_json()
        fields = await validate_new_user({**body, "group": "default"},
                                   self.ctx["catalog"].groups)
        lang = (language_of(body["language"]) if body.get("language") is not None
                else browser_language(self))
        if lang:
            fields["language"] = lang
        # The address is the account's once its code comes back (notify/contact.py).
        email, fields["email"] = fields["email"], ""
        if email and await email_taken(self, email):
            raise ApiError(409, "That e-mail address is already registered.",
                           code="email_taken")
        doc = await insert_user(self, fields)
        message = "Account created; you can sign in now."
        if email:
            note = await confirm_email(self, doc, email)
            doc = await self.store.db.users.find_one({"_id": doc["_id"]}) or doc
            message += " " + note
        self.ok(user_view(self, doc), message)


async def confirm_email(handler: ApiHandler, user: dict, email: str) -> str:
    """Mail a confirmation code to `email` for `user`; what to tell them."""
    try:
        sent = await handler.ctx["notifier"].contact.start(user, email)
    except ContactError as exc:
        raise ApiError(exc.status, exc.message, retry_after=exc.retry_after,
                           code=exc.code) from None
    if not sent["sent"]:
        return (f"{email} is kept until it is confirmed, but this server cannot send mail "
                "yet (ask an administrator to set up SMTP).")
    return (f"We mailed a code to {email}: enter it on your account page to make the "
            "address yours.")


class SelfHandler(ApiHandler):
    open_before_password_change = True

    async def get(self) -> None:
        self.ok(await with_budget_use(self, user_view(self, self.require_user())))

    async def put(self) -> None:
        user = self.require_user()
        body = self.body_json()
        update: dict = {}
        if "display_name" in body:
            update["display_name"] = str(body["display_name"])[:64]
        if "marketing_opt_in" in body:
            update["marketing_opt_in"] = bool(body["marketing_opt_in"])
        email = email_of(body["email"]) if "email" in body else None
        if "language" in body:
            update["language"] = language_of(body["language"])
        if email == user.get("email", ""):
            email = None  # unchanged
        # An account may limit its own spend by period (so may an administrator).
        update.update(budget_fields(body))
        update.update(await timezone_field(body))
        if body.get("password"):
            update.update(await self.new_password(user, body, None))
        if not update and email is None and "email" not in body:
            raise ApiError(400, "Nothing to change.", code="nothing_to_change")
        note = ""
        if email == "":
            # Removing an address needs no confirmation.
            await set_email(self, user["_id"], "")
            await self.ctx["notifier"].contact.forget(user["_id"])
        elif email is not None:
            if await email_taken(self, email, but=user["_id"]):
                raise ApiError(409, "That e-mail address is already registered to another "
                                    "account.", code="email_taken")
            note = await confirm_email(self, user, email)
        inc = {"session_epoch": 1} if "password_hash" in update else {}
        change = {**({"$set": update} if update else {}), **({"$inc": inc} if inc else {})}
        doc = (await self.store.db.users.find_one_and_update({"_id": user["_id"]}, change,
                                                             return_document=True)
               if change else await self.store.db.users.find_one({"_id": user["_id"]}))
        await save_budgets(self, user, update)
        await self.ctx["catalog"].changed("user", user["_id"])
        if inc:
            # Every other session ends with the old password; this one goes on.
            await end_sessions(self.store, user["_id"])
            self.set_header("X-CSRF-Token", await self.start_session(doc))
        self.ok(await with_budget_use(self, user_view(self, doc)),
                note or ("Password changed." if inc else "Saved."))

    @staticmethod
    async def new_password(user: dict, body: dict, email: str | None) -> dict:
        """The fields that set the caller's own new password, after checking
        the current one; also clears a reset's must-change flag."""
        password = jsonin.text(body["password"], "password", 2000)
        original = jsonin.text(body.get("original_password"), "original_password", 2000)
        current = user.get("password_hash", "")
        if not await verify_password_async(original, current):
            raise ApiError(403, "The current password is wrong.", code="wrong_password")
        problem = await password_refusal(password, user.get("username", ""),
                                         email if email is not None else user.get("email", ""))
        if problem:
            raise ApiError.of(problem, code="invalid")
        if password == original:
            raise ApiError(400, "The new password must differ from the current one.",
                           code="password_same")
        return {"password_hash": await hash_password_async(password),
                "must_change_password": False}


class EmailConfirmHandler(ApiHandler):
    """POST {code}: the code mailed to the pending address makes it the
    account's e-mail address (notify/contact.py)."""

    async def post(self) -> None:
        user = self.require_user()
        code = jsonin.text(self.body_json().get("code"), "code", 100)
        try:
            email = await self.ctx["notifier"].contact.check(user["_id"], code)
        except ContactError as exc:
            raise ApiError(exc.status, exc.message, code=exc.code) from None
        doc = await set_email(self, user["_id"], email)
        await self.ctx["catalog"].changed("user", user["_id"])
        self.ok(user_view(self, doc), f"{email} is your e-mail address now.")


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
            raise ApiError(400, "Enter a redemption code.", code="code_empty")
        db = self.store.db
        code_hash = self.ctx["vault"].lookup_hash(code)
        doc = await db.redemptions.find_one_and_update(
            {"key_hash": code_hash, "status": 1},
            {"$set": {"status": 3, "used_user_id": user["_id"], "redeemed_time": now()}},
            return_document=True)
        if doc is None:
            used = await db.redemptions.find_one({"key_hash": code_hash}, {"status": 1})
            if used is None:
                raise ApiError(404, "No such redemption code.", code="no_such_code")
            raise ApiError(409, "This redemption code has already been used.",
                           code="code_used")
        ok = await self.ctx["billing"].credit(USER, user["_id"], int(doc["quota"]),
                                              f"redemption {doc['_id']}",
                                              ledger_id=f"redeem:{doc['_id']}")
        if not ok:
            await db.redemptions.update_one({"_id": doc["_id"]},
                                            {"$set": {"status": 1, "used_user_id": None}})
            raise ApiError(500, "The code could not be applied; it is still valid.",
                           code="code_not_applied")
        self.ok(int(doc["quota"]), f"Added {doc['quota']} to your balance.")


default_handlers = [
    (r"/api/user/register/?", RegisterHandler),
    (r"/api/user/self/?", SelfHandler),
    (r"/api/user/self/email/?", EmailConfirmHandler),
    (r"/api/user/token/?", AccessTokenHandler),
    (r"/api/user/topup/?", TopupHandler),
]
