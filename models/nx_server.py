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

If nx-27017 changes shape, it runs as it comes, with a warning in its log.
"""
from __future__ import annotations

import functools
import os
import sys

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


# ---- the flusher's bulk updates, run on the rows themselves -----------------
# nx-27017 spends 120-300 us of Python on each update of a bulk write (the
# filter and the update translated to SQL again for every one), which at a
# few thousand keys and rollup documents a second is more than a core.  The
# billing flusher sends few shapes (relay/money/flusher.py): these run here
# on the row itself, with MongoDB's meaning; any other bulk update, or any
# value of another type, goes to nx-27017 as it comes.  The fidelity suite
# (tests/models/test_store_fidelity.py) runs these shapes through the wire.
#   filter: {_id: int or str, <path>: {$lt: number} | {$exists: bool} | number}
#   update: {$inc: {<path>: int}, $set / $setOnInsert: {<path>: int or str},
#            $max: {<path>: number}}, with or without upsert
_NUM = (int, float)


def _scalar(v, types=(int, str)) -> bool:
    return isinstance(v, types) and not isinstance(v, bool)


def _simple_filter(q) -> bool:
    if not isinstance(q, dict) or not _scalar(q.get("_id")):
        return False
    for k, v in q.items():
        if k == "_id":
            continue
        if k.startswith("$") or not k:
            return False
        if isinstance(v, dict):
            if len(v) != 1:
                return False
            (op, arg), = v.items()
            if not ((op == "$lt" and _scalar(arg, _NUM)) or
                    (op == "$exists" and isinstance(arg, bool))):
                return False
        elif not _scalar(v, _NUM):
            return False
    return True


def _simple_update(u) -> bool:
    if not isinstance(u, dict) or not u:
        return False
    kinds = {"$inc": (int,), "$set": (int, str), "$setOnInsert": (int, str), "$max": _NUM}
    paths = set()
    for op, fields in u.items():
        if op not in kinds or not isinstance(fields, dict) or not fields:
            return False
        for path, v in fields.items():
            if (not path or path.startswith("$") or "_id" == path.split(".")[0]
                    or not _scalar(v, kinds[op]) or path in paths):
                return False
            paths.add(path)
    return True


def simple_bulk_update(msg):
    """(collection, updates, ordered) when every update of this `update`
    command is one of the shapes above; None otherwise."""
    body, updates = None, []
    for kind, doc in msg.get("sections") or ():
        if kind == "body" and isinstance(doc, dict):
            body = doc
        elif kind == "payload" and isinstance(doc, dict):
            updates += list(doc.get("updates") or ())
    if not isinstance(body, dict) or not isinstance(body.get("update"), str):
        return None
    updates += list(body.get("updates") or ())
    if body.get("lsid") is not None and body.get("txnNumber") is not None:
        return None  # a client's transaction: nx-27017's own path
    for up in updates:
        if (not isinstance(up, dict) or set(up) - {"q", "u", "upsert", "multi"} or up.get("multi")
                or not _simple_filter(up.get("q")) or not _simple_update(up.get("u"))):
            return None
    return body["update"], updates, bool(body.get("ordered", True))


def _get(doc: dict, path: str):
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _put(doc: dict, path: str, value) -> None:
    parts = path.split(".")
    cur = doc
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            if nxt is not None:
                raise ValueError(f"cannot create field {part!r} in a non-object")
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def _matches(doc: dict, q: dict) -> bool:
    for path, cond in q.items():
        if path == "_id":
            continue
        there, value = _get(doc, path)
        if isinstance(cond, dict):
            (op, arg), = cond.items()
            if op == "$exists":
                if there != arg:
                    return False
            elif not (there and _scalar(value, _NUM) and value < arg):
                return False
        elif not (there and _scalar(value, _NUM) and value == cond):
            return False
    return True


def _apply(doc: dict, u: dict, inserting: bool) -> bool:
    """Apply update `u` to `doc`; whether anything changed."""
    changed = False

    def put(path, value):
        nonlocal changed
        there, old = _get(doc, path)
        if not there or old != value or type(old) is not type(value):
            _put(doc, path, value)
            changed = True
    for path, v in (u.get("$setOnInsert") or {}).items() if inserting else ():
        put(path, v)
    for path, v in (u.get("$set") or {}).items():
        put(path, v)
    for path, v in (u.get("$inc") or {}).items():
        there, old = _get(doc, path)
        if there and not _scalar(old, _NUM):
            raise ValueError(f"cannot $inc the non-number {path!r}")
        put(path, (old if there else 0) + v)
    for path, v in (u.get("$max") or {}).items():
        there, old = _get(doc, path)
        if not there or (_scalar(old, _NUM) and old < v):
            put(path, v)
    return changed


def fast_bulk_update(conn, coll: str, updates: list, ordered: bool) -> dict:
    """Run updates of the simple shapes on `coll`'s rows (the caller holds
    the database's lock and a transaction); nx-27017's answer for them."""
    import json
    import sqlite3
    table = '"' + coll.replace('"', '""') + '"'
    matched = modified = 0
    upserted, errors = [], []
    for i, up in enumerate(updates):
        q, u = up["q"], up["u"]
        try:
            row = conn.execute(f"SELECT id, data FROM {table} WHERE _id = ? LIMIT 1",
                               (q["_id"],)).fetchone()
            if row is not None:
                doc = json.loads(row[1])
                if not _matches(doc, q):
                    row = None
            if row is not None:
                matched += 1
                if _apply(doc, u, False):
                    conn.execute(f"UPDATE {table} SET data = ? WHERE id = ?",
                                 (json.dumps(doc), row[0]))
                    modified += 1
            elif up.get("upsert"):
                doc = {"_id": q["_id"]}
                for path, cond in q.items():
                    if path != "_id" and not isinstance(cond, dict):
                        _put(doc, path, cond)
                _apply(doc, u, True)
                conn.execute(f"INSERT INTO {table} (data, _id) VALUES (?, ?)",
                             (json.dumps(doc), q["_id"]))
                upserted.append({"index": i, "_id": q["_id"]})
        except sqlite3.IntegrityError as exc:
            errors.append({"index": i, "code": 11000, "errmsg": str(exc)})
        except ValueError as exc:
            errors.append({"index": i, "code": 14, "errmsg": str(exc)})
        if errors and ordered:
            break
    out: dict = {"ok": 1, "n": matched + len(upserted), "nModified": modified}
    if upserted:
        out["upserted"] = upserted
    if errors:
        out["writeErrors"] = errors
    return out


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


def install(read_only: bool = False) -> bool:
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
