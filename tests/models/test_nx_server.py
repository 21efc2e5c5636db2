"""models/nx_server.py: the embedded server stores each insert command as one
SQLite transaction, and nothing else about an insert changes (the store
fidelity suite runs the same shapes through the wire)."""
import datetime
import sqlite3

import pytest
from bson import ObjectId
from pymongo import MongoClient
from pymongo.errors import BulkWriteError

from models import nx_server
from models.embedded import EmbeddedMongo
from models.store import DUPLICATE_KEY

nx_server.install()
from nx_27017.handler import NeoSQLiteHandler  # noqa: E402


@pytest.fixture
def handler(tmp_path):
    h = NeoSQLiteHandler(data_dir=str(tmp_path))
    yield h
    for conn in list(h._conns.values()):
        conn.close()


def insert(h, docs, ordered=False, db="t"):
    msg = {"request_id": 1, "sections": [
        ("body", {"insert": "usage", "ordered": ordered, "$db": db}),
        ("payload", {"documents": docs})]}
    return h.handle_insert(msg)[1]


def traced(h, db="t"):
    conn = h.get_database(db).db
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return conn, seen


def words(seen, first):
    return [s for s in seen if s.lstrip().upper().startswith(first)]


def test_a_batch_is_one_transaction(handler):
    insert(handler, [{"_id": "warm"}])  # makes the table
    conn, seen = traced(handler)
    out = insert(handler, [{"_id": f"r{i}", "n": i} for i in range(5)])
    assert out["ok"] == 1 and out["n"] == 5
    assert len(words(seen, "INSERT INTO")) == 5
    assert (len(words(seen, "BEGIN")), len(words(seen, "COMMIT"))) == (1, 1)
    assert seen.index(words(seen, "BEGIN")[0]) < seen.index(words(seen, "INSERT INTO")[0])
    assert seen.index(words(seen, "COMMIT")[0]) > seen.index(words(seen, "INSERT INTO")[-1])
    assert not conn.in_transaction
    # committed: another connection to the file sees every document
    other = sqlite3.connect(handler._db_file("t"))
    assert other.execute('SELECT count(*) FROM "usage"').fetchone()[0] == 6
    other.close()


def test_a_duplicate_fails_alone_and_the_rest_is_stored(handler):
    insert(handler, [{"_id": "b"}])
    out = insert(handler, [{"_id": "a"}, {"_id": "b"}, {"_id": "c"}])
    assert out["n"] == 2
    assert [(e["index"], e["code"]) for e in out["writeErrors"]] == [(1, DUPLICATE_KEY)]
    out = insert(handler, [{"_id": "d"}, {"_id": "a"}, {"_id": "e"}], ordered=True)
    assert out["n"] == 1 and [e["index"] for e in out["writeErrors"]] == [1]
    conn = handler.get_database("t").db
    assert not conn.in_transaction
    ids = sorted(r[0] for r in conn.execute('SELECT _id FROM "usage"'))
    assert ids == ["a", "b", "c", "d"]


class FailingCommit:
    """The database's connection, but its COMMIT fails (a full disk, say)."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql, *args):
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_a_commit_that_fails_stores_nothing(handler):
    insert(handler, [{"_id": "warm"}])
    database = handler.get_database("t")
    conn = database.db
    database.db = FailingCommit(conn)
    try:
        with pytest.raises(sqlite3.OperationalError):
            insert(handler, [{"_id": "x"}, {"_id": "y"}])
    finally:
        database.db = conn
    assert not conn.in_transaction
    assert [r[0] for r in conn.execute('SELECT _id FROM "usage"')] == ["warm"]
    # and the client's retry of the same batch stores it
    assert insert(handler, [{"_id": "x"}, {"_id": "y"}])["n"] == 2


def test_inside_a_clients_transaction_it_adds_none(handler):
    insert(handler, [{"_id": "warm"}])
    conn, seen = traced(handler)
    conn.execute("BEGIN")
    insert(handler, [{"_id": "p"}, {"_id": "q"}])
    assert conn.in_transaction  # still the client's, to commit or abort
    assert words(seen, "BEGIN") == ["BEGIN"] and not words(seen, "COMMIT")
    conn.execute("ROLLBACK")
    assert [r[0] for r in conn.execute('SELECT _id FROM "usage"')] == ["warm"]


def test_the_embedded_child_runs_it(tmp_path):
    db = EmbeddedMongo(str(tmp_path))
    url = db.start()
    try:
        cmdline = open(f"/proc/{db.proc.pid}/cmdline", "rb").read()
        assert b"nx_server.py" in cmdline
        coll = MongoClient(url)["t"]["usage"]
        coll.insert_many([{"_id": i} for i in range(3)])
        with pytest.raises(BulkWriteError) as exc:
            coll.insert_many([{"_id": 2}, {"_id": 3}], ordered=False)
        assert exc.value.details["nInserted"] == 1
        assert sorted(d["_id"] for d in coll.find({})) == [0, 1, 2, 3]
        assert "has changed" not in open(db.log_file).read()
    finally:
        db.stop()


def update(h, updates, db="t"):
    msg = {"request_id": 1, "sections": [
        ("body", {"update": "bal", "ordered": False, "$db": db}),
        ("payload", {"updates": updates})]}
    return h.handle_command(msg)[1]


def test_a_bulk_update_is_one_transaction(handler):
    handler.get_database("t")["bal"].insert_many([{"_id": i, "q": 0, "a": 1} for i in range(4)])
    conn, seen = traced(handler)
    out = update(handler, [{"q": {"_id": i}, "u": {"$inc": {"q": 5}}} for i in range(4)]
                 + [{"q": {"_id": "new", "a": {"$exists": False}}, "u": {"$inc": {"q": 1}},
                     "upsert": True},
                    {"q": {"_id": 0, "a": {"$exists": False}}, "u": {"$inc": {"q": 1}},
                     "upsert": True}])
    # the last upsert meets _id 0 (its filter fails, its insert is a duplicate): alone
    assert out["n"] == 5 and [(e["index"], e["code"]) for e in out["writeErrors"]] == [
        (5, DUPLICATE_KEY)]
    assert (len(words(seen, "BEGIN")), len(words(seen, "COMMIT"))) == (1, 1)
    assert not conn.in_transaction
    docs = {d["_id"]: d["q"] for d in handler.get_database("t")["bal"].find({})}
    assert docs == {0: 5, 1: 5, 2: 5, 3: 5, "new": 1}
    # one update alone, and anything else, runs as it did
    conn, seen = traced(handler)
    update(handler, [{"q": {"_id": 1}, "u": {"$inc": {"q": 1}}}])
    assert not words(seen, "BEGIN")


def test_the_reports_server_reads_the_same_files_and_writes_nothing(tmp_path):
    writer, reader = EmbeddedMongo(str(tmp_path)), EmbeddedMongo(str(tmp_path), read_only=True)
    try:
        w = MongoClient(writer.start())["t"]
        w.usage.insert_many([{"_id": i, "n": i} for i in range(3)])
        r = MongoClient(reader.start())["t"]
        assert b"--read-only" in open(f"/proc/{reader.proc.pid}/cmdline", "rb").read()
        assert reader.pid_file != writer.pid_file and reader.log_file != writer.log_file
        assert sorted(d["_id"] for d in r.usage.find({})) == [0, 1, 2]
        w.usage.insert_one({"_id": 3, "n": 3})  # the writer's next commit is seen at once
        assert r.usage.find_one({"_id": 3}) == {"_id": 3, "n": 3}
        with pytest.raises(Exception) as exc:
            r.usage.insert_one({"_id": 9})
        assert "readonly" in str(exc.value)
        with pytest.raises(Exception):
            r.usage.update_one({"_id": 1}, {"$set": {"n": 7}})
        assert w.usage.find_one({"_id": 1}) == {"_id": 1, "n": 1}
    finally:
        reader.stop()
        writer.stop()


def test_compact_gives_the_space_of_deleted_documents_back(tmp_path):
    """Store.give_back_space sends this to the embedded server only (a real
    MongoDB's storage engine reuses freed space itself)."""
    db = EmbeddedMongo(str(tmp_path))
    try:
        c = MongoClient(db.start())["t"]
        c.usage.insert_many([{"_id": f"r{i}", "n": i, "pad": "x" * 2000} for i in range(3000)])
        c.command({"wal_checkpoint": 1})
        path = tmp_path / "db" / "t.db"
        before = path.stat().st_size
        c.usage.delete_many({"n": {"$lt": 2900}})
        assert c.command({"compact": "usage", "freeSpaceTargetMB": 1})["ok"] == 1
        c.command({"wal_checkpoint": 1})
        assert path.stat().st_size < before / 2
        assert c.usage.count_documents({}) == 100
    finally:
        db.stop()


def insert_into(h, coll, docs, ordered=False, db="t"):
    msg = {"request_id": 1, "sections": [
        ("body", {"insert": coll, "ordered": ordered, "$db": db}),
        ("payload", {"documents": docs})]}
    return h.handle_insert(msg)[1]


PLAIN = [{"_id": "r1", "user_id": 7, "quota": 12, "cost": 0.5, "model": "gpt-4o-mini",
          "stream": True, "error": None, "tags": ["a", 1, 2.5, None, {"x": "é ✓"}],
          "usage": {"in": {"cached": 3}, "out": 0}},
         {"_id": 42, "note": "an integer _id", "big": 2 ** 62, "neg": -1.25e-7},
         {"_id": "r3", "quote": "\"'\\\n\t", "empty": {}, "none": []}]


def test_plain_documents_are_stored_as_nx_27017_stores_them(handler):
    """The fast path writes rows identical, column for column, to those
    nx-27017's own insert writes for the same documents (its path: the
    first insert, which makes the table), and they read back the same."""
    assert insert_into(handler, "own", PLAIN)["n"] == 3  # nx-27017's own path
    insert_into(handler, "fast", [{"_id": "warm"}])
    conn, seen = traced(handler)
    assert insert_into(handler, "fast", PLAIN) == {"ok": 1, "n": 3, "insertedIds": ["r1", 42, "r3"]}
    assert any('INSERT INTO "fast" (data, _id)' in s for s in seen)  # the fast path's own
    rows = {c: conn.execute(f'SELECT _id, data, typeof(_id) FROM "{c}" WHERE _id != ? ORDER BY id',
                            ("warm",)).fetchall() for c in ("own", "fast")}
    assert rows["fast"] == rows["own"]
    database = handler.get_database("t")
    for doc in PLAIN:
        assert database["fast"].find_one({"_id": doc["_id"]}) == doc
        assert database["own"].find_one({"_id": doc["_id"]}) == doc


def test_documents_not_plain_take_nx_27017s_own_path(handler):
    for doc in ({"_id": ObjectId()}, {"_id": "d", "at": datetime.datetime(2026, 1, 1)},
                {"_id": "b", "raw": b"\x00"}, {"_id": "n", "v": float("nan")},
                {"_id": True}, {"no_id": 1}, {"_id": 1.5}, {"_id": {"a": 1}}):
        msg = {"request_id": 1, "sections": [("body", {"insert": "u", "$db": "t"}),
                                             ("payload", {"documents": [doc, {"_id": "ok"}]})]}
        assert nx_server.plain_insert(msg) is None, doc
    # a client's transaction and GridFS are left to nx-27017 too
    for body in ({"insert": "u", "txnNumber": 1}, {"insert": "fs.files"}, {"insert": "fs.chunks"}):
        msg = {"request_id": 1, "sections": [("body", {**body, "$db": "t"}),
                                             ("payload", {"documents": [{"_id": "x"}]})]}
        assert nx_server.plain_insert(msg) is None, body
    insert_into(handler, "u", [{"_id": "warm"}])
    conn, seen = traced(handler)
    when = datetime.datetime(2026, 1, 1)
    assert insert_into(handler, "u", [{"_id": "d", "at": when}])["n"] == 1
    assert not any('INSERT INTO "u" (data, _id)' in s for s in seen)
    assert handler.get_database("t")["u"].find_one({"_id": "d"})["_id"] == "d"
