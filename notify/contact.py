"""Confirmed contact points: an account's e-mail address changes only once
the new address has shown it reads its mail.

A change (PUT /api/user/self {email}, or an address given at registration)
is kept aside as `pending_email`, and a code is mailed to it.  The code,
given back by the signed-in owner within a day (POST /api/user/self/email,
the console's account page), makes it the account's address; five wrong
codes drop the change.  Until then notifications go to the old address, and
the new one may not be used to sign in.  The mail carries no link: a link
would be built from the request's Host header, which the client chooses.

What this stops: naming someone else's address and having the relay mail
them (a spam relay through our own SMTP server), or taking an address that
another account could then not claim.  A confirmation mail is itself a mail
to an address nobody vouched for: at most MAILS_PER_HOUR per account, with
our own fixed text.
"""
from __future__ import annotations

import hmac
import secrets
import time

from models import allowance
from notify import words
from notify.channels.base import DeliveryError, Message
from notify.channels.email import EmailChannel

VALID_SECONDS = 86400
MAX_TRIES = 5
MAILS_PER_HOUR = 3


# Codes are typed: no 0/O, 1/I; 32 ** 10 of them, MAX_TRIES guesses each.
_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def new_code() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(10))


class ContactError(Exception):
    """A refusal with its HTTP status (and, for 429, the seconds to wait);
    `code` names it for the console (`err.<code>` in its strings)."""

    def __init__(self, status: int, message: str, retry_after: int = 0, code: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.code = code


class EmailConfirmation:
    def __init__(self, store, vault, ctx, clock=time.time):
        self.store = store
        self.vault = vault
        self.ctx = ctx  # the notifier's channel context (settings, clock)
        self.clock = clock

    async def start(self, user: dict, email: str) -> dict:
        """Keep `email` aside for `user` and mail it a code; returns
        {"pending_email", "sent"} (sent False when this server has no SMTP:
        the change waits, and may be asked again once it has)."""
        wait = await allowance.take(self.store, f"confirm-mail:{user['_id']}", MAILS_PER_HOUR,
                                    3600, self.clock)
        if wait:
            raise ContactError(429, f"At most {MAILS_PER_HOUR} confirmation mails an hour: try "
                                    f"again in {(wait + 59) // 60} minutes.", wait,
                               code="confirm_mails")
        code = new_code()
        now = self.clock()
        await self.store.db.users.update_one({"_id": user["_id"]}, {"$set": {
            "pending_email": email, "email_code": self.vault.lookup_hash(code),
            "email_code_exp": now + VALID_SECONDS, "email_code_tries": 0}})
        title, content = words.confirm_mail(code, words.language(user))
        msg = Message(id=f"confirm:{user['_id']}:{int(now * 1000)}", event_type="confirm_email",
                      title=title, content=content, user={"id": user["_id"], "email": email})
        if not self.ctx.settings.smtp_host:
            return {"pending_email": email, "sent": False}
        try:
            await EmailChannel().send(msg, {}, self.ctx)
        except DeliveryError as exc:
            raise ContactError(502, f"The confirmation mail could not be sent: "
                                    f"{exc.message}", code="confirm_mail_failed") from None
        return {"pending_email": email, "sent": True}

    async def check(self, user_id: int, code: str) -> str:
        """The pending address if `code` is its code (and it is cleared);
        ContactError otherwise (a wrong code counts against MAX_TRIES)."""
        db = self.store.db
        doc = await db.users.find_one_and_update(
            {"_id": user_id, "pending_email": {"$exists": True},
             "email_code_tries": {"$lt": MAX_TRIES}},
            {"$inc": {"email_code_tries": 1}}, return_document=True)
        if doc is None:
            raise ContactError(404, "There is no e-mail change waiting to be confirmed.",
                               code="no_pending_email")
        typed = "".join(str(code or "").split()).upper()
        right = hmac.compare_digest(str(doc.get("email_code", "")), self.vault.lookup_hash(typed))
        if right and doc.get("email_code_exp", 0) >= self.clock():
            await self.forget(user_id)
            return doc["pending_email"]
        if doc.get("email_code_tries", 0) >= MAX_TRIES or doc.get("email_code_exp", 0) < self.clock():
            await self.forget(user_id)
            raise ContactError(400, "That code is wrong or too old, and the change is dropped: "
                                    "ask for a new one.", code="email_code_dropped")
        raise ContactError(400, "That code is wrong.", code="email_code_wrong")

    async def forget(self, user_id: int) -> None:
        await self.store.db.users.update_one({"_id": user_id}, {"$unset": {
            "pending_email": "", "email_code": "", "email_code_exp": "", "email_code_tries": ""}})
