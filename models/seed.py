"""First start: the seed groups and the administrator `root`."""
from __future__ import annotations

import logging
import secrets

from models.passwords import hash_password
from models.records import ROLE_ROOT, USER_ENABLED
from models.store import DuplicateKeyError, now

log = logging.getLogger("relay.seed")

SEED_GROUPS = [
    ("default", "1", "Standard: shared channels at the official price."),
    ("origin", "1", "Official upstreams only, at the official price."),
    ("vip", "1.2", "Dedicated channels with higher rate limits."),
    ("svip", "1.5", "Premium channels with priority routing and the highest limits."),
    ("vvip", "2", "Reserved capacity for enterprise workloads."),
]


async def seed(store, admin_password: str = "") -> str | None:
    """Create what a fresh database needs.  Returns the generated root
    password when one had to be made (to be printed once), else None."""
    # Groups are seeded once: a group the admin deletes stays deleted.
    if not await store.db.meta.find_one({"_id": "seeded_groups"}):
        for name, rate, desc in SEED_GROUPS:
            try:
                await store.db.groups.insert_one({"_id": name, "rate": rate, "description": desc,
                                                  "enabled": True, "created_time": now()})
            except DuplicateKeyError:
                pass
        await store.db.meta.update_one({"_id": "seeded_groups"}, {"$set": {"at": now()}},
                                       upsert=True)
    if await store.db.users.find_one({"username": "root"}, {"_id": 1}):
        return None
    generated = None
    password = admin_password
    if not password:
        password = generated = secrets.token_urlsafe(15)
    uid = await store.next_id("users")
    try:
        await store.db.users.insert_one({
            "_id": uid, "username": "root", "email": "", "display_name": "Root",
            "password_hash": hash_password(password), "role": ROLE_ROOT, "status": USER_ENABLED,
            "group": "default", "quota": 0, "used_quota": 0, "leases": {},
            "created_time": now()})
    except DuplicateKeyError:  # another process seeded first
        return None
    return generated
