"""Changes to stored data that run once at start (each is idempotent).

install(app) is listed in server.INSTALLERS: it runs these before the server
takes requests.
"""
from __future__ import annotations

import logging

from models.secrets import mask
from models.store import PyMongoError

log = logging.getLogger("relay.migrations")


async def hash_redemption_codes(store, vault) -> int:
    """Redemption codes were stored in plain text; now only a keyed hash
    (like API keys) and a masked hint are kept.  Returns how many changed."""
    try:
        # The old unique index on the plain code: with codes no longer
        # stored, MongoDB would see every new one as a duplicate null.
        await store.db.redemptions.drop_index("key_1")
    except PyMongoError:
        pass
    n = 0
    async for doc in store.db.redemptions.find({"key": {"$exists": True}}):
        code = doc["key"]
        await store.db.redemptions.update_one(
            {"_id": doc["_id"]},
            {"$set": {"key_hash": vault.lookup_hash(code), "key_hint": mask(code, 4)},
             "$unset": {"key": ""}})
        n += 1
    if n:
        log.info("redemption codes: %d stored as keyed hashes", n)
    return n


def install(app) -> None:
    async def on_start(_app) -> None:
        s = app.settings
        await hash_redemption_codes(s["store"], s["vault"])
    app.settings["on_start"].insert(0, on_start)
