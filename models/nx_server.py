"""The embedded database's entry point (models/embedded.py runs this file):
nx-27017, with each insert or update command stored as one SQLite
transaction, and a read-only role for the process that serves reports.

One transaction per command.  nx-27017 stores an `insert_many` as one
autocommitted `insert_one` per document, and a bulk update (the billing
flusher's one `bulk_write` per collection a tick, relay/money/flusher.py)
as one autocommitted update per document, so every usage record and every
balance is a transaction of its own, and in WAL mode each commit writes
again every page it touched (the table's, `_id`'s and every index's).  One
transaction per command writes each page once: bench/store.py measures the
server's CPU per record.

Why it is safe:
- nx-27017 runs a command while holding its database's lock, and this takes
  the same (re-entrant) lock first, so no other command's writes fall inside;
- a command inside a client's own transaction (the connection already in
  one) is left as it is;
- a failed document or update (a duplicate `_id`) fails alone, as before:
  SQLite undoes the statement, not the transaction, so an unordered batch
  stores the rest;
- an error of the command as a whole, or of the COMMIT, rolls the batch back
  and reaches the client as an error: the relay keeps its records and sends
  them again (models/store.insert_records treats those already there as
  written; the flusher's updates are idempotent by sequence number).

The read-only role (`--read-only`): a second server process on the same
files answers the console's reports (models/store.py, `Store.reports`), so
that a report never holds the lock the money path needs; every connection
it opens is `PRAGMA query_only`, so a report that would write fails instead
of taking SQLite's write lock from the relay's own server.  In WAL mode its
readers and the writer never wait for each other.

No count before an aggregation: neosqlite counts the whole collection
before each one, for a choice nx-27017 never makes (uncounted()).

If nx-27017 changes shape, it runs as it comes, with a warning in its log.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys


def _sibling(name: str):
    """A module of models/ by its path: this file runs by path in the
    server's process (models/embedded.py), with no package around it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_relay_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bulk = _sibling("nx_bulk")
simple_bulk_update, fast_bulk_update = _bulk.simple_bulk_update, _bulk.fast_bulk_update
_scalar = _bulk._scalar

READ_ONLY_FLAG = "--read-only"
# A file to append every SQL statement to (tests only: it costs a write each).
TRACE_ENV = "RELAY_NX_TRACE"


def _in_one_transaction(self, db_name, run):
    with self._lock_for(db_name):
        conn = self.get_database(db_name).db
        if conn.in_transaction:
            return run()
        conn.execute("BEGIN")
        try:
            out = run()
            if conn.in_transaction:  # else something inside committed it
                conn.execute("COMMIT")
            return out
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def one_transaction(handle_insert):
    """handle_insert, its documents stored in one transaction; documents made
    only of JSON's own types written by fast_insert."""
    from nx_27017.handler import _msg_db_name

    @functools.wraps(handle_insert)
    def wrapper(self, msg):
        db_name = _msg_db_name(msg)
        plan = plain_insert(msg)
        if plan is not None:
            coll, docs, ordered = plan
            database = self.get_database(db_name)
            with self._lock_for(db_name):
                if coll in database.list_collection_names():
                    return _in_one_transaction(self, db_name, lambda: (
                        msg["request_id"], fast_insert(database.db, coll, docs, ordered)))
        return _in_one_transaction(self, db_name, lambda: handle_insert(self, msg))
    wrapper.one_transaction = True
    return wrapper


# ---- inserts of plain documents, written as the server writes them ----------
# nx-27017 copies each document deeply, walks it twice for ObjectIds and
# bytes, and has SQLite check its JSON before the INSERT: two thirds of an
# insert's 120-180 us of CPU (a usage record, 2026-11-26).  A document of
# JSON's own types only (strings, finite numbers, booleans, null, lists,
# objects) with a string or integer _id needs none of that: its row is
# `_id` and json.dumps of it, what nx-27017 stores for it.
def _plain(v, depth: int = 0) -> bool:
    if v is None or isinstance(v, (str, bool, int)):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if depth > 20:
        return False
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    if isinstance(v, list):
        return all(_plain(x, depth + 1) for x in v)
    return False


def plain_insert(msg):
    """(collection, documents, ordered) when every document of this insert
    command is plain (above); None otherwise."""
    body, docs = None, []
    for kind, doc in msg.get("sections") or ():
        if kind == "body" and isinstance(doc, dict):
            body = doc
        elif kind == "payload_docs":
            docs.extend(doc)
        elif kind == "payload" and isinstance(doc, dict):
            for value in doc.values():
                docs.extend(value if isinstance(value, list) else [value])
    if not isinstance(body, dict) or not isinstance(body.get("insert"), str):
        return None
    coll = body["insert"]
    if coll.endswith((".files", ".chunks")) or body.get("txnNumber") is not None:
        return None  # GridFS, or a client's transaction: nx-27017's own path
    docs += list(body.get("documents") or ())
    if not docs or not all(isinstance(d, dict) and _scalar(d.get("_id")) and _plain(d)
                           for d in docs):
        return None
    return coll, docs, bool(body.get("ordered", True))


def fast_insert(conn, coll: str, docs: list, ordered: bool) -> dict:
    """Insert plain documents into `coll` (the caller holds the database's
    lock and a transaction); nx-27017's answer for them."""
    import json
    import sqlite3
    table = '"' + coll.replace('"', '""') + '"'
    ids, errors = [], []
    for i, doc in enumerate(docs):
        try:
            conn.execute(f"INSERT INTO {table} (data, _id) VALUES (?, ?)",
                         (json.dumps(doc), doc["_id"]))
            ids.append(doc["_id"])
        except sqlite3.IntegrityError as exc:
            errors.append({"index": i, "code": 11000, "errmsg": str(exc)})
            if ordered:
                break
    out: dict = {"ok": 1, "n": len(ids), "insertedIds": ids}
    if errors:
        out["writeErrors"] = errors
    return out


def _is_bulk_update(msg) -> bool:
    """An `update` command with more than one update (a bulk_write)."""
    body, n = None, 0
    for kind, doc in msg.get("sections") or ():
        if kind == "body" and isinstance(doc, dict):
            body = doc
        elif kind == "payload" and isinstance(doc, dict):
            n += len(doc.get("updates") or ())
    if not isinstance(body, dict) or "update" not in body:
        return False
    return n + len(body.get("updates") or ()) > 1


def updates_in_one_transaction(handle_command):
    """handle_command, a bulk update's updates stored in one transaction, and
    those made only of the billing flusher's shapes run by fast_bulk_update."""
    from nx_27017.handler import _msg_db_name

    @functools.wraps(handle_command)
    def wrapper(self, msg):
        if not _is_bulk_update(msg):
            return handle_command(self, msg)
        db_name = _msg_db_name(msg)
        plan = simple_bulk_update(msg)
        if plan is not None:
            coll, updates, ordered = plan
            database = self.get_database(db_name)
            with self._lock_for(db_name):
                if coll in database.list_collection_names():
                    return _in_one_transaction(self, db_name, lambda: (
                        msg["request_id"], fast_bulk_update(database.db, coll, updates, ordered)))
        return _in_one_transaction(self, db_name, lambda: handle_command(self, msg))
    wrapper.one_transaction = True
    return wrapper


def configured(open_db_conn, read_only: bool, trace: str):
    """_open_db_conn, every connection it opens read-only (the reports
    server), and with `trace` every SQL statement it runs appended to that
    file (TRACE_ENV: tests/models/test_query_plans.py asks SQLite for the
    plan of each one the relay's queries became)."""

    @functools.wraps(open_db_conn)
    def wrapper(self, db_name):
        conn = open_db_conn(self, db_name)
        if read_only:
            conn.db.execute("PRAGMA query_only = 1")
        if trace:
            out = open(trace, "a", buffering=1)
            conn.db.set_trace_callback(lambda sql: out.write(sql.replace("\n", " ") + "\n"))
        return conn
    wrapper.configured = True
    return wrapper


def _warn(text: str) -> None:
    """A line in the server's log file (its logging is not set up yet)."""
    args = sys.argv
    path = args[args.index("--log-file") + 1] if "--log-file" in args[:-1] else ""
    try:
        with open(path, "a") as fh:
            fh.write(f"WARNING relay: {text}\n")
    except OSError:
        print(text, file=sys.stderr)


def uncounted(estimate):
    """AggregationCursor._estimate_result_size, without counting the
    collection when the estimate cannot change anything.

    neosqlite sizes every aggregation's result before running it, from
    `SELECT COUNT(1)` of the whole collection, to choose a spill to a
    compressed queue (quez) over a result that would not fit in memory;
    that choice is made only when the cursor was asked for it and quez is
    installed, which nx-27017 never does.  The count walks a table's
    smallest index: a chart read 90 x models rollup documents and counted
    all of them (tests/models/test_query_plans.py)."""

    @functools.wraps(estimate)
    def wrapper(self):
        from neosqlite.collection import aggregation_cursor
        if not (getattr(self, "_use_quez", True) and aggregation_cursor.QUEZ_AVAILABLE):
            return 0
        return estimate(self)
    wrapper.uncounted = True
    return wrapper


def _skip_the_count() -> None:
    try:
        from neosqlite.collection.aggregation_cursor import AggregationCursor
        estimate = AggregationCursor._estimate_result_size
    except (ImportError, AttributeError) as exc:
        _warn(f"neosqlite has changed ({exc}): each aggregation counts its collection")
        return
    if not getattr(estimate, "uncounted", False):
        AggregationCursor._estimate_result_size = uncounted(estimate)


def install(read_only: bool = False) -> bool:
    _skip_the_count()
    try:
        from nx_27017 import handler
        cls = handler.NeoSQLiteHandler
        if not hasattr(handler, "_msg_db_name") or not all(
                hasattr(cls, name) for name in ("handle_insert", "handle_command", "_lock_for",
                                                "get_database", "_open_db_conn")):
            raise AttributeError("no _msg_db_name, or NeoSQLiteHandler lacks handle_insert, "
                                 "handle_command, _lock_for, get_database or _open_db_conn")
    except (ImportError, AttributeError) as exc:
        if read_only:
            # A reader that could write would take the writer's lock: refuse
            # to run rather than serve reports that way.
            raise SystemExit(f"nx-27017 has changed ({exc}): cannot serve read-only") from None
        _warn(f"nx-27017 has changed ({exc}): inserts are stored a document at a time")
        return False
    if not getattr(cls.handle_insert, "one_transaction", False):
        cls.handle_insert = one_transaction(cls.handle_insert)
    if not getattr(cls.handle_command, "one_transaction", False):
        cls.handle_command = updates_in_one_transaction(cls.handle_command)
    trace = os.environ.get(TRACE_ENV, "")
    if (read_only or trace) and not getattr(cls._open_db_conn, "configured", False):
        cls._open_db_conn = configured(cls._open_db_conn, read_only, trace)
    return True


def main() -> None:
    read_only = READ_ONLY_FLAG in sys.argv
    if read_only:
        sys.argv.remove(READ_ONLY_FLAG)
    install(read_only)
    from nx_27017.nx_27017 import main as nx_main
    nx_main()


if __name__ == "__main__":
    sys.exit(main())
