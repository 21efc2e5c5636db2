"""Many usage records at once, written straight into the embedded server's
file: what the benchmark (bench/datascale.py) and the tests at a million
records start from.

Why not through the driver: nx-27017 stores about 4,000 records a second,
so a million takes minutes; SQLite itself writes them in seconds.  Why it
is faithful:
- the server must have made the file (a relay started once on the data
  directory): tables, indexes and their bookkeeping are the server's own;
- a row is what the server writes for an insert: `_id` in its column and
  the document as JSON text in `data` (tests/models/test_bulkload.py reads
  built records back through the driver and compares them, field by field
  and type by type, with a record the relay made from a real call);
- the document is the relay's own: its fields are those of a record made
  by relay/service.py and settled by billing, stored as relay/money/usage.py
  stores them (`stored()`), and only the values vary;
- rollups are made from the stored records by the relay's own code
  (relay/money/rollups.py), as the flusher makes them.

Only nx-27017's file layout is known here (models/ is the one place that
knows the embedded server).  Never run this on a file a server has open.
"""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field

# A successful call's record as the relay stores it, in the order
# relay/service.py builds it (json_object keeps the order given).
FIELDS = ("_id", "user_id", "username", "token_id", "token_name", "group", "model",
          "upstream_model", "channel_id", "endpoint", "face", "prompt_tokens",
          "completion_tokens", "duration_ms", "ttfb_ms", "status", "stream", "client_ip",
          "billing_mode", "rate", "error", "created_at", "cost", "quota", "token_limited", "proc",
          "seq")


@dataclass
class Population:
    """Who makes the calls, and how they spread.

    keys: (user_id, username, token_id, token_name) of every key;
    heavy: indices into keys of the keys of the user who makes
    `heavy_share` of the calls.  Each key uses `models_per_key` models of
    `models`, and each model is served by `channels_per_model` of
    `channels`: the spread of real traffic, where a key calls few models
    and a model goes to few channels.  `error_share` of the calls fail
    with 429 and cost nothing.  Records are spread evenly over `days`
    days before `now`, oldest first, as a relay writes them."""
    keys: list
    heavy: list
    models: list
    channels: list
    now: float
    days: float = 30.0
    heavy_share: float = 0.1
    models_per_key: int = 3
    channels_per_model: int = 2
    error_share: float = 0.03
    proc: str = "bulkload"
    first_seq: int = 1
    extra: dict = field(default_factory=dict)


def db_file(data_dir: str, db_name: str = "relay") -> str:
    """The SQLite file the embedded server keeps database `db_name` in
    (nx-27017's files mode: <its --data-dir>/<name>.db, and the relay's
    embedded server has <data_dir>/db, models/embedded.py)."""
    return os.path.join(os.path.abspath(data_dir), "db", f"{db_name}.db")


def _connect(path: str) -> sqlite3.Connection:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: start a relay on this data directory once first")
    db = sqlite3.connect(path, isolation_level=None)
    # A build is all or nothing (one transaction) and the file is the
    # builder's alone, so nothing needs syncing until the end.
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-1000000")
    db.execute("PRAGMA temp_store=MEMORY")
    return db


def _has_table(db, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                      (name,)).fetchone() is not None


class _IndexesAfter:
    """The table's indexes dropped while rows go in, then made again by the
    server's own statements (as sqlite_master keeps them): an index built
    from sorted rows costs half what one kept up row by row does."""

    def __init__(self, db, table: str):
        self.db, self.table = db, table

    def __enter__(self):
        # The unique index on _id stays: a duplicate must fail as it would.
        self.saved = self.db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='index' AND tbl_name=? "
            "AND sql IS NOT NULL AND name != ?", (self.table, f"idx_{self.table}_id")).fetchall()
        for name, _ in self.saved:
            self.db.execute(f'DROP INDEX "{name}"')
        return self

    def __exit__(self, *exc):
        for _, sql in self.saved:
            self.db.execute(sql)


def build_usage(path: str, n: int, pop: Population, batch: int = 200_000,
                sums: str | None = None) -> None:
    """Append `n` usage records to the `usage` table of the SQLite file at
    `path` (made by the embedded server), in one transaction per batch.

    With `sums` (the path of a scratch SQLite file, made if absent), the
    records' sums by GRAIN_COLUMNS go there as they are made, in table
    `grain`: what write_rollups makes rollups from without reading the
    records back (json_extract of ten fields of every record costs more
    than making it)."""
    db = _connect(path)
    try:
        if not _has_table(db, "usage"):
            raise RuntimeError(f"{path} has no usage collection: start a relay on it once first")
        others = [i for i in range(len(pop.keys)) if i not in set(pop.heavy)] or list(pop.heavy)
        heavy = list(pop.heavy) or others
        db.execute("CREATE TEMP TABLE _hk (i INTEGER PRIMARY KEY, k INTEGER)")
        db.execute("CREATE TEMP TABLE _ok (i INTEGER PRIMARY KEY, k INTEGER)")
        db.execute("CREATE TEMP TABLE _keys (k INTEGER PRIMARY KEY, user_id, username, "
                   "token_id, token_name)")
        db.execute("CREATE TEMP TABLE _models (i INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TEMP TABLE _channels (i INTEGER PRIMARY KEY, id INTEGER)")
        db.executemany("INSERT INTO _keys VALUES (?, ?, ?, ?, ?)",
                       [(k, *pop.keys[k]) for k in range(len(pop.keys))])
        db.executemany("INSERT INTO _hk VALUES (?, ?)", list(enumerate(heavy)))
        db.executemany("INSERT INTO _ok VALUES (?, ?)", list(enumerate(others)))
        db.executemany("INSERT INTO _models VALUES (?, ?)", list(enumerate(pop.models)))
        db.executemany("INSERT INTO _channels VALUES (?, ?)", list(enumerate(pop.channels)))
        if sums is not None:
            db.execute("ATTACH DATABASE ? AS s", (sums,))
            db.execute(f"CREATE TABLE IF NOT EXISTS s.grain ({', '.join(GRAIN_COLUMNS)})")
        span = pop.days * 86400.0
        start = pop.now - span
        params = {"n": n, "start": start, "span": span, "hs": int(pop.heavy_share * 1000),
                  "es": int(pop.error_share * 1000), "nh": len(heavy), "no": len(others),
                  "nm": len(pop.models), "mpk": max(1, pop.models_per_key),
                  "nc": len(pop.channels), "cpm": max(1, pop.channels_per_model),
                  "proc": pop.proc, "seq0": pop.first_seq}
        with _IndexesAfter(db, "usage"):
            for lo in range(0, n, batch):
                hi = min(n, lo + batch)
                db.execute("BEGIN")
                db.execute(_MAKE, {**params, "lo": lo, "hi": hi})
                db.execute(_INSERT, params)
                if sums is not None:
                    db.execute(_SUM, params)
                db.execute("DROP TABLE _g")
                db.execute("COMMIT")
    finally:
        db.close()


# The columns of a scratch file's `grain`: what a rollup keys on, the hour,
# the process, then the sums (the records' count, their fields' sums, the
# last sequence number).  Built records carry no cache figures and no
# unpaid part: those sums are 0.
GRAIN_COLUMNS = ("day", "hour", "user_id", "token_id", "channel_id", "status", "model", "proc",
                 "n", "quota", "prompt_tokens", "completion_tokens", "last_seq")

# Three independent hashes of the record's number pick its key, model,
# channel, status and sizes; the numbers are Knuth's multiplicative ones.
_MAKE = """
CREATE TEMP TABLE _g AS
WITH RECURSIVE s(i) AS (SELECT :lo UNION ALL SELECT i + 1 FROM s WHERE i + 1 < :hi),
h AS (SELECT i, (i * 2654435761 + 40503) % 4294967296 AS h1,
             (i * 2246822519 + 9973) % 4294967296 AS h2,
             (i * 3266489917 + 131) % 4294967296 AS h3 FROM s),
p AS (SELECT h.*, CASE WHEN h1 % 1000 < :hs THEN (SELECT k FROM _hk WHERE _hk.i = h2 % :nh)
                       ELSE (SELECT k FROM _ok WHERE _ok.i = h2 % :no) END AS k,
             (h1 / 1000) % 1000 < :es AS failed FROM h),
q AS (SELECT p.*, (k * 7 + (h3 % :mpk) * 13) % :nm AS m FROM p)
SELECT q.i, q.h1, q.h2, q.h3, q.failed, _keys.user_id, _keys.username, _keys.token_id,
       _keys.token_name,
       (SELECT name FROM _models WHERE _models.i = m) AS model,
       (SELECT id FROM _channels WHERE _channels.i = (m * :cpm + (h3 / 7) % :cpm) % :nc)
         AS channel_id,
       printf('%08x%016x', i, h1 * 4294967296 + h2) AS rid,
       CASE WHEN failed THEN 0 ELSE 20 + h2 % 3000 END AS pt,
       CASE WHEN failed THEN 0 ELSE 1 + h3 % 800 END AS ct,
       :start + :span * i / :n AS created_at
FROM q JOIN _keys ON _keys.k = q.k
"""

_INSERT = """
INSERT INTO usage (_id, data)
SELECT rid, CASE WHEN failed THEN json_object(
    '_id', rid, 'user_id', user_id, 'username', username, 'token_id', token_id,
    'token_name', token_name, 'group', 'default', 'model', model, 'upstream_model', model,
    'channel_id', channel_id, 'endpoint', 'chat', 'face', 'openai', 'prompt_tokens', 0,
    'completion_tokens', 0, 'duration_ms', 40 + h1 % 200, 'ttfb_ms', 0, 'status', 429,
    'stream', json('false'), 'client_ip', '203.0.113.' || (h2 % 250 + 1),
    'billing_mode', 'per_token', 'rate', '1.0', 'error', 'Rate limit reached for requests',
    'created_at', created_at, 'cost', 0, 'quota', 0,
    'token_limited', json('true'), 'proc', :proc, 'seq', :seq0 + i)
  ELSE json_object(
    '_id', rid, 'user_id', user_id, 'username', username, 'token_id', token_id,
    'token_name', token_name, 'group', 'default', 'model', model, 'upstream_model', model,
    'channel_id', channel_id, 'endpoint', 'chat', 'face', 'openai', 'prompt_tokens', pt,
    'completion_tokens', ct, 'duration_ms', 300 + h1 % 4000, 'ttfb_ms', 100 + h2 % 900,
    'status', 200, 'stream', json(CASE WHEN h3 % 2 THEN 'true' ELSE 'false' END),
    'client_ip', '203.0.113.' || (h2 % 250 + 1), 'billing_mode', 'per_token', 'rate', '1.0',
    'created_at', created_at, 'cost', pt + 2 * ct, 'quota', pt + 2 * ct,
    'token_limited', json('true'), 'proc', :proc, 'seq', :seq0 + i)
  END
FROM _g ORDER BY i
"""

# The day and hour as relay/money/rollups.py takes them from created_at
# (and sum_records below): SQLite's % works on integers.
_SUM = """
INSERT INTO s.grain
SELECT CAST(created_at / 86400 AS INTEGER) * 86400 AS day,
       CAST(created_at % 86400 / 3600 AS INTEGER) AS hour,
       user_id, token_id, channel_id, CASE WHEN failed THEN 429 ELSE 200 END AS status, model,
       :proc, COUNT(*), SUM(pt + 2 * ct), SUM(pt), SUM(ct), MAX(:seq0 + i)
FROM _g GROUP BY 1, 2, 3, 4, 5, 6, 7
"""


def sum_records(path: str, by: tuple, sums, since: float | None = None,
                until: float | None = None) -> list[dict]:
    """The stored usage records (made in [since, until) when given) grouped
    by the fields `by` ("day" and "hour" are the UTC day and hour of
    created_at), each group with `n` (its records), the sum of each field in
    `sums` and `last_seq`: what relay/money/rollups.build_file and
    relay/money/backfill.py make rollups from.  Only reads: safe beside a
    running server (SQLite's WAL lets a reader and the writer be)."""
    exprs = {"day": "CAST(json_extract(data, '$.created_at') / 86400 AS INTEGER) * 86400",
             "hour": "CAST(json_extract(data, '$.created_at') % 86400 / 3600 AS INTEGER)"}
    cols = [exprs.get(f, f"json_extract(data, '$.{f}')") for f in by]
    sums = list(sums)
    sql = (f"SELECT {', '.join(cols)}, COUNT(*), "
           f"{', '.join(f'TOTAL(json_extract(data, {chr(39)}$.{f}{chr(39)}))' for f in sums)}, "
           f"MAX(json_extract(data, '$.seq')) FROM usage {{where}} GROUP BY {', '.join(cols)}")
    conds, args = [], []
    for op, v in ((">=", since), ("<", until)):
        if v is not None:
            conds.append(f"json_extract(data, '$.created_at') {op} ?")
            args.append(float(v))
    sql = sql.replace("{where}", ("WHERE " + " AND ".join(conds)) if conds else "")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = []
        for row in db.execute(sql, args):
            d = dict(zip(by, row))
            d["n"] = row[len(by)]
            for i, f in enumerate(sums):
                d[f] = int(row[len(by) + 1 + i])
            d["last_seq"] = row[-1]
            out.append(d)
        return out
    finally:
        db.close()


def write_documents(path: str, collection: str, docs) -> int:
    """Insert whole documents into `collection` (its table must exist: the
    relay creates its collections and indexes at start), as the server
    stores an insert: `_id` in its column, the document as JSON text."""
    db = _connect(path)
    n = 0
    try:
        if not _has_table(db, collection):
            raise RuntimeError(f"{path} has no {collection} collection")
        with _IndexesAfter(db, collection):
            db.execute("BEGIN")
            for d in docs:
                db.execute(f'INSERT INTO "{collection}" (_id, data) VALUES (?, ?)',
                           (d["_id"], json.dumps(d)))
                n += 1
            db.execute("COMMIT")
    finally:
        db.close()
    return n


def write_rollups(path: str, sums: str, families: dict, copies: dict, metrics: dict,
                  mark: str) -> int:
    """Rollup documents made by SQLite from the scratch file `sums` that
    build_usage filled, inserted into the file at `path`; returns how many.

    The documents are those relay/money/rollups.py makes (it passes its
    schema: `families` {collection: the fields besides day and model, in
    the _id's order}, `copies` {field: its unindexed copy}, `metrics`
    {name: the record field it sums}, `mark` the name of the process
    marks): `_id` `day|field...|model`, the fixed fields, `dm`, the marks,
    the day's sums and the same per hour (`hHHm`), a sum left out when 0
    as a record leaves it out (records' figures are never negative here).
    tests/models/test_bulkload.py checks them against rollups.build_file.
    The rollup collections must hold nothing of these records' days."""
    db = _connect(path)
    total = 0
    try:
        db.execute("ATTACH DATABASE ? AS s", (f"file:{sums}?mode=ro",))
    except sqlite3.OperationalError:
        db.close()
        raise
    try:
        procs = [r[0] for r in db.execute("SELECT DISTINCT proc FROM s.grain")]
        if len(procs) > 1:
            raise ValueError(f"one process per build, not {procs}")
        have = [(m, src) for m, src in metrics.items() if src in GRAIN_COLUMNS]
        for coll, fields in families.items():
            if not _has_table(db, coll):
                raise RuntimeError(f"{path} has no {coll} collection")
            keys = ["day", *fields, "model"]
            kc = ", ".join(keys)
            with _IndexesAfter(db, coll):
                total += _write_family(db, coll, fields, keys, kc, have, copies, mark)
    finally:
        db.close()
    return total


def _write_family(db, coll, fields, keys, kc, have, copies, mark) -> int:
    """One family's documents (write_rollups), in one transaction."""
    db.execute("BEGIN")
    db.execute(f"CREATE TEMP TABLE _h AS SELECT {kc}, hour, SUM(n) AS n, "
               + "".join(f'SUM({src}) AS "{m}", ' for m, src in have)
               + f"MAX(last_seq) AS ls, MIN(proc) AS proc FROM s.grain "
               f"GROUP BY {kc}, hour")
    db.execute(f"CREATE TEMP TABLE _d AS SELECT {kc}, SUM(n) AS n, "
               + "".join(f'SUM("{m}") AS "{m}", ' for m, _ in have)
               + f"MAX(ls) AS ls, MIN(proc) AS proc FROM _h GROUP BY {kc}")
    db.execute(f"CREATE UNIQUE INDEX _dk ON _d ({kc})")
    ident = " || '|' || ".join(
        ["CAST(_d.day AS TEXT)",
         *(f"COALESCE(CAST(_d.{f} AS TEXT), '-')" for f in fields), "_d.model"])
    fixed = ", ".join(
        ["'_id', _id", "'day', day", *(f"'{f}', {f}" for f in fields), "'model', model",
         "'dm', CAST(day AS TEXT) || '|' || model",
         *(f"'{copies[f]}', {f}" for f in fields if f in copies),
         f"'{mark}', json_object(proc, ls)", "'n', n"])
    day_sums = ", ".join(f"'{m}', NULLIF(\"{m}\", 0)" for m, _ in have)
    unpivot = " UNION ALL ".join(
        [f"SELECT {kc}, printf('h%02dn', hour) AS k, n AS v FROM _h"]
        + [f"SELECT {kc}, printf('h%02d{m}', hour), \"{m}\" FROM _h WHERE \"{m}\" != 0"
           for m, _ in have])
    on = " AND ".join(f"_d.{k} IS u.{k}" for k in keys)
    db.execute("CREATE TEMP TABLE _j AS SELECT " + kc + ", json_group_object(k, v) AS j "
               f"FROM ({unpivot}) GROUP BY {kc}")
    cur = db.execute(
        f'INSERT INTO "{coll}" (_id, data) SELECT _id, json_patch(json_patch('
        f"json_object({fixed}), json_object({day_sums})), j) FROM "
        f"(SELECT {ident} AS _id, _d.*, u.j FROM _j AS u JOIN _d ON {on})")
    for t in ("_h", "_d", "_j"):
        db.execute(f"DROP TABLE {t}")
    db.execute("COMMIT")
    return cur.rowcount
