"""The store: the only module that imports the MongoDB driver.

Everything else reaches collections through `store.db.<name>` and uses the
driver's method names (find_one, update_one, ...), so the same code runs
against the embedded server and a real MongoDB replica set.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from models.compat import Quirks, find_page, probe, sort_by_id
from models.embedded import EmbeddedMongo

__all__ = ["Store", "DuplicateKeyError", "PyMongoError", "ReturnDocument", "ASCENDING", "DESCENDING",
           "insert_records", "insert_capped", "count_matching", "as_eq", "all_of", "DUPLICATE_KEY", "sort_by_id", "Op",
           "bulk_apply", "read_marks"]

# Matched by code, never by text: nx-27017 says "UNIQUE constraint failed"
# where MongoDB says "E11000 duplicate key error".
DUPLICATE_KEY = 11000

log = logging.getLogger("relay.store")

# name -> list of (keys, options); created at start, idempotent.
INDEXES: dict[str, list[tuple[list, dict]]] = {
    # A name and an e-mail address belong to one account whatever their case:
    # name_key is the lower-cased name, email_key the confirmed address
    # (sparse: set by models/migrations.py on accounts from before them).
    "users": [([("username", ASCENDING)], {"unique": True}),
              ([("name_key", ASCENDING)], {"unique": True, "sparse": True}),
              ([("email_key", ASCENDING)], {"unique": True, "sparse": True}),
              ([("email", ASCENDING)], {}),
              ([("access_token_hash", ASCENDING)], {})],
    "tokens": [([("key_hash", ASCENDING)], {"unique": True}),
               ([("user_id", ASCENDING)], {})],
    "channels": [],
    # Codes are found by keyed hash (models/migrations.py hashed old ones).
    "redemptions": [([("key_hash", ASCENDING)], {"unique": True, "sparse": True})],
    # Every filter of the usage log, with the time it is paged by: the
    # embedded server walks one of these in order and stops at the page's
    # end (models/queries.py builds the filters so that it can).
    "usage": [([("user_id", ASCENDING), ("created_at", DESCENDING)], {}),
              ([("created_at", DESCENDING)], {}),
              ([("token_id", ASCENDING), ("created_at", DESCENDING)], {}),
              ([("model", ASCENDING), ("created_at", DESCENDING)], {}),
              ([("channel_id", ASCENDING), ("created_at", DESCENDING)], {}),
              ([("status", ASCENDING), ("created_at", DESCENDING)], {})],
    # Rollups (relay/money/rollups.py): each family by day, and by each
    # filter it answers and day.
    "usage_days": [([("day", ASCENDING)], {})],
    "usage_day_channels": [([("day", ASCENDING)], {}),
                           ([("channel_id", ASCENDING), ("day", ASCENDING)], {})],
    "usage_day_statuses": [([("day", ASCENDING)], {}),
                           ([("status", ASCENDING), ("day", ASCENDING)], {})],
    "usage_day_keys": [([("day", ASCENDING)], {}),
                       ([("user_id", ASCENDING), ("day", ASCENDING)], {}),
                       ([("token_id", ASCENDING), ("day", ASCENDING)], {}),
                       ([("channel_id", ASCENDING), ("day", ASCENDING)], {})],
    "processes": [([("dead", ASCENDING), ("heartbeat", ASCENDING)], {})],
    "invalidations": [([("ts", ASCENDING)], {})],
    # Pruned by these (models/housekeeping.py).
    "login_failures": [([("last", ASCENDING)], {})],
    "allowances": [([("until", ASCENDING)], {})],
}


# Reports read through a pool of their own, this many at once: a burst of
# exports and charts waits for each other, not for the money path.
REPORT_POOL = 4
# Both embedded servers, stopping side by side (server.py STOP_BOUND counts it).
EMBEDDED_STOP = 10.0


class Store:
    """Owns the database connections (and the embedded servers, if any).

    `db` is the relay's own: money, keys, settings, everything written.
    `reports` is what the console's reports read (the usage log, its
    rollups, exports) through a client of its own, with its own pool and
    its own timeout, so that no report can hold up a charge, a lease or a
    heartbeat.  On the embedded database it is a second server process on
    the same files, read-only (models/nx_server.py): the embedded server
    answers one command at a time per database, and a report there would
    stop billing while it ran.  With --mongo-url both clients reach the
    same server, each with its own connections.
    """

    def __init__(self, mongo_url: str = "", data_dir: str = "./data", db_name: str = "relay",
                 reports: bool = True, report_timeout: float = 30.0):
        self.mongo_url = mongo_url
        self.data_dir = data_dir
        self.db_name = db_name
        self.with_reports = reports
        self.report_timeout = report_timeout
        self.embedded: EmbeddedMongo | None = None
        self.embedded_reports: EmbeddedMongo | None = None
        self.client: AsyncMongoClient | None = None
        self.reports_client: AsyncMongoClient | None = None
        self.db: Any = None
        self.reports: Any = None
        self.quirks = Quirks()

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
        self.quirks = await probe(self.db)
        await self.ensure_indexes()
        if not self.with_reports:
            self.reports = self.db
            return
        reports_url = url
        if self.embedded is not None:
            # After the collections exist: the reader cannot make them.
            self.embedded_reports = EmbeddedMongo(self.data_dir, read_only=True)
            reports_url = self.embedded_reports.start()
        self.reports_client = AsyncMongoClient(
            reports_url, tz_aware=False, serverSelectionTimeoutMS=15000, maxPoolSize=REPORT_POOL,
            timeoutMS=int(self.report_timeout * 1000))
        self.reports = self.reports_client[self.db_name]

    async def ensure_indexes(self) -> None:
        for coll, specs in INDEXES.items():
            for keys, opts in specs:
                await self.db[coll].create_index(keys, **opts)

    async def page(self, coll, flt: dict, sort: str = "_id", direction: int = -1, skip: int = 0,
                   limit: int = 20) -> list[dict]:
        """One page of a listing in `sort` order, right on every server
        (models/compat.py: integer _ids sort as text on nx-27017)."""
        return await find_page(coll, flt, sort, direction, skip, limit, self.quirks)

    async def give_back_space(self) -> None:
        """Return the space of deleted documents to the file system.

        nx-27017 deviation: SQLite keeps freed pages in its file; `compact`
        with freeSpaceTargetMB runs its incremental vacuum (the file is made
        with auto_vacuum=INCREMENTAL) until no page is free, so its cost is
        that of what was freed since the last call.  A real MongoDB's
        storage engine reuses freed space itself: nothing is sent.
        """
        if self.embedded is None:
            return
        try:
            await self.db.command({"compact": "usage", "freeSpaceTargetMB": 1})
            # The vacuum's moves are in the write-ahead log until a
            # checkpoint copies them into the file and truncates it.
            await self.db.command({"wal_checkpoint": 1})
        except PyMongoError as exc:
            log.warning("giving back free space: %s", exc)

    async def disk_bytes(self) -> int:
        """The database's size on disk: its file on the embedded server (its
        write-ahead log, a few MB that checkpoints reuse, comes on top),
        dbStats' storage and index sizes on a real MongoDB."""
        if self.embedded is not None:
            try:
                return os.path.getsize(os.path.join(self.embedded.dir, f"{self.db_name}.db"))
            except OSError:
                return 0
        stats = await self.db.command("dbStats")
        return int(stats.get("storageSize") or 0) + int(stats.get("indexSize") or 0)

    async def sum_usage(self, by: tuple, sums: list, since: float, until: float):
        """Usage records made in [since, until) summed by the fields `by`
        (models/bulkload.sum_records), read by SQLite from the embedded
        server's file beside it; None on a real MongoDB (the caller reads
        the records instead)."""
        if self.embedded is None:
            return None
        from models import bulkload
        path = os.path.join(self.embedded.dir, f"{self.db_name}.db")
        return await asyncio.to_thread(bulkload.sum_records, path, by, sums, since, until)

    async def next_id(self, name: str) -> int:
        doc = await self.db.counters.find_one_and_update(
            {"_id": name}, {"$inc": {"seq": 1}}, upsert=True,
            return_document=ReturnDocument.AFTER)
        return int(doc["seq"])

    async def close(self, timeout: float = 3.0) -> None:
        clients = [c for c in (self.reports_client, self.client) if c is not None]
        self.reports_client = self.client = None
        if clients:
            # Closing ends server sessions, which waits for a server that may
            # be gone: both at once, within one bound, and not waited for
            # past it (a cancelled close may take as long to unwind).
            closing = {asyncio.ensure_future(c.close()) for c in clients}
            await asyncio.wait(closing, timeout=timeout)
            for task in closing:
                if not task.done():
                    task.cancel()
                elif not task.cancelled() and task.exception() is not None:
                    log.warning("closing the database client: %s", task.exception())
        servers = [s for s in (self.embedded_reports, self.embedded) if s is not None]
        self.embedded_reports = self.embedded = None
        for server in servers:
            server.terminate()
        until = time.monotonic() + EMBEDDED_STOP
        for server in servers:
            server.stop(max(until - time.monotonic(), 0.1))


def all_of(*conditions: dict) -> dict:
    """A filter that holds when every condition holds.

    nx-27017 deviation: a filter that puts `$or` beside other fields
    ({_id: 4, $or: [...]}) can match a document outside `_id` (it loses the
    grouping of the `$or`), so an update_one changes the wrong document.
    Inside an explicit `$and` both servers get it right; a filter with one
    condition stays as it is.
    """
    conds = [c for c in conditions if c]
    return conds[0] if len(conds) == 1 else {"$and": conds}


async def insert_records(coll, docs: list[dict]) -> int:
    """insert_many that treats documents already there (same _id) as written.

    Returns how many were new.  Any other error is raised: the caller keeps
    the batch and tries again.
    """
    if not docs:
        return 0
    try:
        r = await coll.insert_many([dict(d) for d in docs], ordered=False)
        return len(r.inserted_ids)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors") or []
        if exc.details.get("writeConcernErrors") or any(
                e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        return int(exc.details.get("nInserted") or 0)


async def count_matching(coll, flt: dict) -> int:
    """How many documents match `flt`, by the `count` command, each plain
    value sent as `{$eq: v}`: give `flt` an indexed field (a user's keys by
    user_id) and the count reads that index's entries, on every server.

    nx-27017 deviation: `count_documents` is an aggregation there, run by
    reading the whole collection into memory (every account's keys to
    count one's); its `count` command is one SQL COUNT, and plain equality
    there is "f = v or f is an array holding v", which no index serves
    (models/queries.py).  tests/models/test_query_plans.py pins the plan,
    tests/models/test_store_fidelity.py the answer."""
    r = await coll.database.command("count", coll.name, query=as_eq(flt))
    return int(r["n"])


def as_eq(flt: dict) -> dict:
    """`flt` with each plain value as {$eq: v}, inside $or/$and too: the
    shape in which nx-27017 looks a field up by its index (count_matching)."""
    out = {}
    for k, v in flt.items():
        if k in ("$or", "$and", "$nor"):
            out[k] = [as_eq(f) for f in v]
        elif k.startswith("$") or isinstance(v, dict):
            out[k] = v
        else:
            out[k] = {"$eq": v}
    return out


async def insert_capped(coll, doc: dict, scope: dict, cap: int) -> bool:
    """Insert `doc` unless more than `cap` documents would then match
    `scope` (a user's keys, say: a field with an index); False, and nothing
    inserted, if so.

    Exact across processes without a counter to keep in step: the document
    is inserted, then counted with the rest (count_matching: the index's
    entries, not the collection), and taken out again if the count is over.
    Racing inserts at the cap may all be refused (each sees the others),
    never all let in.
    """
    if await count_matching(coll, scope) >= cap:
        return False
    await coll.insert_one(doc)
    if await count_matching(coll, scope) <= cap:
        return True
    await coll.delete_one({"_id": doc["_id"]})
    return False


class Op(UpdateOne):
    """An update_one for bulk_apply that remembers which document it is for."""

    def __init__(self, ident, flt: dict, update: dict, upsert: bool = False):
        super().__init__(flt, update, upsert=upsert)
        self.ident = ident


async def bulk_apply(coll, ops: list) -> int:
    """Many conditional updates as one command (bulk_write, unordered);
    returns how many matched a document or made one.

    An update whose filter did not match changes nothing and is no error;
    an upsert that meets a document already there (code 11000) is no error
    either: the caller reads the documents back to see what each update did
    (models/store.read_marks).  Any other error is raised."""
    if not ops:
        return 0
    try:
        r = await coll.bulk_write(ops, ordered=False)
        return r.matched_count + r.upserted_count
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors") or []
        if exc.details.get("writeConcernErrors") or any(
                e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        return int(exc.details.get("nMatched") or 0) + int(exc.details.get("nUpserted") or 0)


async def read_marks(coll, ids, projection: dict) -> dict:
    """{_id: document} of the documents with these ids (one read)."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        return {}
    return {d["_id"]: d async for d in coll.find({"_id": {"$in": ids}}, projection)}


def now() -> int:
    return int(time.time())
