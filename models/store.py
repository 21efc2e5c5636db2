"""The store: the only module that imports the MongoDB driver.

Everything else reaches collections through `store.db.<name>` and uses the
driver's method names (find_one, update_one, ...), so the same code runs
against the embedded server and a real MongoDB replica set.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument
from pymongo.errors import DuplicateKeyError, PyMongoError

from models.embedded import EmbeddedMongo

__all__ = ["Store", "DuplicateKeyError", "PyMongoError", "ReturnDocument", "ASCENDING", "DESCENDING"]

log = logging.getLogger("relay.store")

# name -> list of (keys, options); created at start, idempotent.
INDEXES: dict[str, list[tuple[list, dict]]] = {
    "users": [([("username", ASCENDING)], {"unique": True}),
              ([("email", ASCENDING)], {}),
              ([("access_token_hash", ASCENDING)], {})],
    "tokens": [([("key_hash", ASCENDING)], {"unique": True}),
               ([("user_id", ASCENDING)], {})],
    "channels": [],
    # Codes are found by keyed hash (models/migrations.py hashed old ones).
    "redemptions": [([("key_hash", ASCENDING)], {"unique": True, "sparse": True})],
    "usage": [([("user_id", ASCENDING), ("created_at", DESCENDING)], {}),
              ([("created_at", DESCENDING)], {}),
              ([("token_id", ASCENDING)], {})],
    "invalidations": [([("ts", ASCENDING)], {})],
}


class Store:
    """Owns the database connection (and the embedded server, if any)."""

    def __init__(self, mongo_url: str = "", data_dir: str = "./data", db_name: str = "relay"):
        self.mongo_url = mongo_url
        self.data_dir = data_dir
        self.db_name = db_name
        self.embedded: EmbeddedMongo | None = None
        self.client: AsyncMongoClient | None = None
        self.db: Any = None

    async def start(self) -> None:
        url = self.mongo_url
        if not url:
            self.embedded = EmbeddedMongo(self.data_dir)
            url = self.embedded.start()
            log.info("embedded database on %s", url)
        self.client = AsyncMongoClient(url, tz_aware=False, serverSelectionTimeoutMS=15000,
                                       maxPoolSize=64)
        self.db = self.client[self.db_name]
        await self.db.command("ping")
        await self.ensure_indexes()

    async def ensure_indexes(self) -> None:
        for coll, specs in INDEXES.items():
            for keys, opts in specs:
                await self.db[coll].create_index(keys, **opts)

    async def next_id(self, name: str) -> int:
        doc = await self.db.counters.find_one_and_update(
            {"_id": name}, {"$inc": {"seq": 1}}, upsert=True,
            return_document=ReturnDocument.AFTER)
        return int(doc["seq"])

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def now() -> int:
    return int(time.time())
