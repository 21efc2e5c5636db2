"""First start: the seed groups and the administrator `root`."""
from __future__ import annotations

import logging
import secrets

from models.passwords import hash_password_async, password_problem, verify_password_async
from models.records import ROLE_ROOT, USER_ENABLED
from models.store import DuplicateKeyError, now

log = logging.getLogger("relay.seed")

# The five groups the service sells (issue 34), as data an administrator
# changes on /api/group/: rate rules are relay/money/rates.py's.  Only a new
# database gets them; an existing one keeps its groups.
SEED_GROUPS = [
    ("default", "1", "Several vendors' models mixed, at the official price.", {}),
    ("origin", "1", "Official upstreams only, at the official price: the highest stability.",
     {}),
    ("svip", "0.8", "The lowest price: 0.8 of the official price on every call.", {}),
    ("vvip", "1", "Long texts cheaper: 0.6 of the official price for a prompt of 32,000 "
                  "input tokens or more.",
     {"input_tiers": [{"from": "32000", "factor": "0.6"}]}),
    ("vip", "1", "Cheaper with use: 0.9 of the official price once the month's spend reaches "
                 "$50, 0.8 from $200.",
     {"spend_tiers": [{"from": "50", "factor": "0.9"}, {"from": "200", "factor": "0.8"}]}),
]


async def seed(store, admin_password: str = "") -> str | None:
    """Create what a fresh database needs.  Returns the generated root
    password when one had to be made (to be printed once), else None."""
    # Groups are seeded once: a group the admin deletes stays deleted.
    if not await store.db.meta.find_one({"_id": "seeded_groups"}):
        for name, rate, desc, rule in SEED_GROUPS:
            try:
                await store.db.groups.insert_one({"_id": name, "rate": rate, "description": desc,
                                                  "enabled": True, **rule,
                                                  "created_time": now()})
            except DuplicateKeyError:
                pass
        await store.db.meta.update_one({"_id": "seeded_groups"}, {"$set": {"at": now()}},
                                       upsert=True)
    root = await store.db.users.find_one({"username": "root"}, {"password_hash": 1})
    if root:
        if admin_password and not await verify_password_async(admin_password,
                                                               root.get("password_hash", "")):
            # Only the first start uses it: changing it later would let the
            # environment silently override a password root chose.
            log.warning("admin_password (RELAY_ADMIN_PASSWORD) differs from root's password and "
                        "is ignored: it only sets the password when root is first created. "
                        "To recover root, run server.py with --reset-admin-password.")
        return None
    generated = None
    password = admin_password
    if not password:
        password = generated = await temporary_password()
    uid = await store.next_id("users")
    try:
        await store.db.users.insert_one({
            "_id": uid, "username": "root", "name_key": "root", "email": "", "display_name": "Root",
            "password_hash": await hash_password_async(password), "role": ROLE_ROOT, "status": USER_ENABLED,
            "group": "default", "quota": 0, "used_quota": 0, "leases": {},
            # A password printed on a terminal is to be replaced at once.
            "must_change_password": generated is not None, "created_time": now()})
    except DuplicateKeyError:  # another process seeded first
        return None
    return generated


async def temporary_password() -> str:
    """A random password for one sign-in, after which it must be changed."""
    while True:
        password = secrets.token_urlsafe(15)
        if await password_problem(password) is None:
            return password


async def reset_fields(password: str) -> dict:
    """The update that gives an account a temporary password: it must be
    changed at the next sign-in, and its sessions (the epoch moves on: see
    handlers/sessions.py; then end_sessions) and access token end.  Hashed
    off the event loop."""
    return {"$set": {"password_hash": await hash_password_async(password),
                     "must_change_password": True},
            "$inc": {"session_epoch": 1}, "$unset": {"access_token_hash": ""}}


async def end_sessions(store, uid: int) -> None:
    """Delete a user's stored sign-in sessions (handlers/sessions.py), in
    every process.  After a password change or reset the epoch already
    refuses them; deleting keeps the collection small and the sessions list
    true."""
    await store.db.sessions.delete_many({"uid": uid})


async def reset_root_password(store) -> str:
    """Give root a new temporary password (re-enabling the account) and
    return it; creates root when the database has none."""
    generated = await seed(store)
    if generated:
        return generated
    password = await temporary_password()
    update = await reset_fields(password)
    update["$set"]["status"] = USER_ENABLED
    root = await store.db.users.find_one_and_update({"username": "root"}, update)
    if root:
        await end_sessions(store, root["_id"])
    return password
