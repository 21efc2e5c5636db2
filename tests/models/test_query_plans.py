"""Every query the relay makes of the usage log and its rollups is one the
embedded server answers with an index, in SQL: none reads the collection
into memory, none walks it whole (models/queries.py says which shapes, and
why).  The plans are SQLite's own: a real relay on its embedded database,
every console page, filter, cursor, chart, total and export, the billing
flusher and the retention pass, with the servers writing down each SQL
statement they run (models/nx_server.TRACE_ENV); then SQLite explains each
one.  A plan does not depend on the table's size (no statistics are kept),
so a few records show what a billion would get."""
from __future__ import annotations

import csv
import io
import re
import sqlite3
import time

import pytest
import requests
from pymongo import MongoClient

from models import bulkload
from models.nx_server import TRACE_ENV
from relay.money import rollups
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually
from tests.relay.money.money_env import database_of

MODEL = "gpt-4o-mini"
TABLE = r"usage(?:_day[a-z_]*)?"
_OLD: dict = {}
TOUCH = re.compile(rf'\b(?:FROM|UPDATE|INTO)\s+"?({TABLE})"?(?:\s|$|\))', re.I)


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI(record=False).start()
    yield f
    f.stop()


def _statements(path) -> list[str]:
    out = []
    for line in open(path, errors="replace"):
        sql = line.strip()
        if TOUCH.search(sql) and "sqlite_master" not in sql and "temp_" not in sql:
            out.append(sql)
    return out


def _problems(db: sqlite3.Connection, sql: str) -> list[str]:
    """What is wrong with one statement's plan (nothing: [])."""
    head = sql.lstrip().split(None, 1)[0].upper()
    if head not in ("SELECT", "WITH", "UPDATE", "DELETE"):
        return []
    tables = set(TOUCH.findall(sql))
    if re.search(r"\bCOUNT\s*\(", sql, re.I) and "usage" in tables and re.search(
            r"FROM\s+usage\b(?!_)", sql):
        return ["counts the usage log"]
    try:
        plan = [row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
    except sqlite3.Error as exc:  # a statement of a temporary table, gone
        return [] if "no such" in str(exc) else [f"cannot explain: {exc}"]
    bad = []
    limited = re.search(r"\bLIMIT\s+\d+", sql, re.I) is not None
    for step in plan:
        m = re.match(rf"SCAN ({TABLE})\b(.*)", step)
        if not m:
            continue
        table, how = m.group(1), m.group(2)
        if table == rollups.DAYS:
            # One document per day and model whatever the traffic: all-time
            # totals may read it whole.
            continue
        if "INDEX" not in how:
            bad.append(f"reads every row of {table}")
        elif limited and re.search(r"\bWHERE\b", sql, re.I) and head == "SELECT":
            # A filter checked row by row along the time index: a rare value
            # walks the whole log to fill a page.
            bad.append(f"filters {table} row by row along an index ({step})")
        elif not limited:
            # Walking an index in order is fine for a page (it stops at the
            # limit), not without one.  (The embedded server's count before
            # each aggregation walked a rollup's smallest index: two years
            # of rollups at a busy relay are millions of documents; it is
            # not taken, models/nx_server.py.)
            bad.append(f"walks the whole of {table} ({step})")
    if head in ("UPDATE", "DELETE") and not any(s.startswith("SEARCH") for s in plan):
        bad.append("finds its rows without an index")
    return bad


def _old_data(db, now: float) -> None:
    """A record and rollups beyond their retention, for the pruning pass."""
    db.usage.insert_one({"_id": "ancient", "user_id": 1, "token_id": 1, "model": MODEL,
                         "status": 200, "quota": 1, "created_at": now - 200 * 86400,
                         "proc": "gone", "seq": 1})
    day = rollups.day_of(now - 800 * 86400)
    for coll in rollups.COLLECTIONS:
        _OLD[coll] = [{"_id": f"{day}|old|{coll}", "day": day, "model": MODEL, "n": 1}]
        db[coll].insert_many(_OLD[coll])


def test_every_usage_query_is_answered_with_an_index(tmp_path, fake):
    trace = tmp_path / "sql.log"
    data = str(tmp_path / "data")
    relay = RelayProcess("", data, env={TRACE_ENV: str(trace)}).start()
    try:
        admin = Api.login(relay.url)
        ch = admin.create_channel(fake.url, [MODEL])
        admin.set_price(MODEL, input_price=1, output_price=2)
        user = admin.create_user("plans", quota=10 ** 9)
        api = Api.login(relay.url, "plans", USER_PASSWORD)
        tok = api.create_token(name="k", remain_quota=10 ** 8)
        for n in (2, 4):  # two flushes: rollups made, then added to
            _calls(relay, tok, 2)
            eventually(lambda: _has(api, n), timeout=15)
        _old_data(MongoClient(database_of(data))[relay.db_name], time.time())
        relay.stop()  # and again: the retention pass runs at the first tick
        relay = RelayProcess("", data, db_name=relay.db_name, env={TRACE_ENV: str(trace)}).start()
        admin = Api.login(relay.url)
        api = Api.login(relay.url, "plans", USER_PASSWORD)
        _calls(relay, tok, 2)  # a new process adds to rollups the last one made
        eventually(lambda: _has(api, 6), timeout=15)
        now = time.time()
        pages = [f"?size=2&start={now - 3600.5:.1f}&end={now + 1:.1f}", f"?token_id={tok['id']}",
                 f"?model={MODEL}", "?status=200", f"?token_id={tok['id']}&model={MODEL}&status=200",
                 "?p=2&size=2", f"?start={now - 86400 * 3:.0f}"]
        for q in pages:
            page = api.get("/api/log/self" + q)["data"]
            if page["older"]:
                nxt = api.get(f"/api/log/self?older={page['older']}&size=2")["data"]
                if nxt["newer"]:
                    api.get(f"/api/log/self?newer={nxt['newer']}&size=2")
        for q in ("", f"?user_id={user['id']}", f"?channel_id={ch['id']}", "?status=429",
                  f"?channel_id={ch['id']}&status=200", f"?model={MODEL}"):
            admin.get("/api/log/" + q)
            admin.get("/api/log/daily" + (q or "?") + "&days=90&tz_offset=330")
        api.get("/api/log/self/daily?days=30&tz_offset=-300")
        # Cache health (console/cache_health.py): per key, per channel, filtered or not.
        for q in ("", f"?token_id={tok['id']}", f"?model={MODEL}&start={now - 7200:.0f}"):
            api.get("/api/log/self/cache" + q)
            admin.get("/api/log/cache" + q)
            admin.get("/api/log/cache?by=channel" + q.replace("?", "&"))
        rows = list(csv.reader(io.StringIO(
            api.s.get(relay.url + "/api/log/self/export?size=2").text)))
        assert rows[-1][0] == "TOTAL" and len(rows) == 8
        admin.s.get(relay.url + f"/api/log/export?channel_id={ch['id']}").raise_for_status()
        db = MongoClient(database_of(data))[relay.db_name]
        eventually(lambda: _pruned(db), timeout=20)
    finally:
        relay.stop()
    statements = _statements(trace)
    kinds = {s.lstrip().split(None, 1)[0].upper() for s in statements}
    assert {"SELECT", "UPDATE", "DELETE"} <= kinds | {"WITH"}, kinds
    file = sqlite3.connect(f"file:{bulkload.db_file(data, relay.db_name)}?mode=ro", uri=True)
    problems = {}
    for sql in dict.fromkeys(statements):
        bad = _problems(file, sql)
        if bad:
            problems[sql[:300]] = bad
    assert problems == {}, "\n".join(f"{k} => {v}" for k, v in problems.items())


def _calls(relay, tok, n):
    for i in range(n):
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {tok['key']}"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                "stream": i % 2 == 1})
        assert r.status_code == 200


def _has(api, n):
    assert len(api.get("/api/log/self?size=50")["data"]["items"]) >= n


def _pruned(db):
    assert db.usage.find_one({"_id": "ancient"}) is None
    for coll in rollups.COLLECTIONS:
        assert db[coll].find_one({"_id": {"$in": [d["_id"] for d in _OLD[coll]]}}) is None


def _counted_with_indexes(window: list[str], colls: str, file) -> tuple[list, dict]:
    """The COUNT statements of a window of the trace, and every statement
    on `colls` that reads the collection whole or walks it without an index."""
    counts, problems = [], {}
    for sql in dict.fromkeys(window):
        if not re.search(rf'\bFROM\s+"?{colls}"?(\s|$)', sql):
            continue
        if re.search(rf'\bFROM\s+"?{colls}"?\s*$', sql.strip()):
            problems[sql] = "reads the whole collection"
            continue
        if re.search(r"\bCOUNT\s*\(", sql, re.I):
            counts.append(sql)
        if sql.lstrip().upper().startswith(("SELECT", "WITH")):
            plan = [row[-1] for row in file.execute("EXPLAIN QUERY PLAN " + sql)]
            if any(re.match(rf"SCAN {colls}\b", step) and "INDEX" not in step for step in plan):
                problems[sql] = plan
    return counts, problems


def test_a_cap_per_user_counts_with_an_index(tmp_path):
    """models/store.insert_capped (a user's keys, issue 31; subscriptions)
    and the subscription's check that its keys are the user's count with
    the index on user_id: the embedded server answers `count_documents`
    by reading the whole collection into memory, every account's keys.
    So do a user's pages of keys and of deliveries, with their totals
    (handlers/api_fields.paged, notify/service.py)."""
    trace = tmp_path / "sql.log"
    relay = RelayProcess("", str(tmp_path / "data"), env={TRACE_ENV: str(trace)}).start()
    try:
        admin = Api.login(relay.url)
        admin.create_user("capped", quota=10 ** 6)
        api = Api.login(relay.url, "capped", USER_PASSWORD)
        keys = [api.create_token(name=f"k{i}")["id"] for i in range(2)]
        with open(trace, "a") as f:
            f.write("-- window\n")
        api.create_token(name="k2")
        api.post("/api/subscription/", {
            "name": "mine", "event_types": ["key_quota_warning"], "channel_type": "email",
            "channel_config": {}, "enabled": True, "key_threshold": 1000, "key_ids": keys})
        with open(trace, "a") as f:
            f.write("-- window\n")
        page = api.get("/api/token/?p=1&size=2")["data"]
        deliveries = api.get("/api/notify/deliveries?p=1&size=5")["data"]
        with open(trace, "a") as f:
            f.write("-- window\n")
    finally:
        relay.stop()
    assert page["total"] == 3 and len(page["items"]) == 2, page
    assert deliveries["total"] == 0 and deliveries["items"] == [], deliveries
    windows = open(trace, errors="replace").read().split("-- window\n")
    file = sqlite3.connect(f"file:{bulkload.db_file(str(tmp_path / 'data'), relay.db_name)}"
                           "?mode=ro", uri=True)
    counts, problems = _counted_with_indexes(windows[1].splitlines(),
                                             r"(tokens|notify_subscriptions)", file)
    assert problems == {}, problems
    # the key's cap twice (before and after its insert), the subscription's
    # cap twice and its keys once
    assert len(counts) >= 3, windows[1]
    counts, problems = _counted_with_indexes(windows[2].splitlines(),
                                             r"(tokens|notify_outbox)", file)
    assert problems == {}, problems
    assert len(counts) == 2, windows[2]   # the keys' total and the deliveries'


def test_the_outbox_is_polled_with_an_index(tmp_path):
    """notify/outbox.py claims a due delivery once a second on every relay.
    The outbox keeps every delivery for the console, so a claim that walks
    it (`status $in`, which the embedded server reads as "any element of",
    and no index serves) grows with the history; by status equality and
    `next_at`, the (status, next_at) index answers it.  (A poll that fell
    into another test's window made this known.)"""
    trace = tmp_path / "sql.log"
    relay = RelayProcess("", str(tmp_path / "data"), env={TRACE_ENV: str(trace)}).start()
    try:
        def polled():
            text = open(trace, errors="replace").read()
            assert len(re.findall(r"FROM\s+\"?notify_outbox\"?.*next_at", text)) >= 2
        eventually(polled, timeout=15)
    finally:
        relay.stop()
    file = sqlite3.connect(f"file:{bulkload.db_file(str(tmp_path / 'data'), relay.db_name)}"
                           "?mode=ro", uri=True)
    lines = open(trace, errors="replace").read().splitlines()
    _, problems = _counted_with_indexes(lines, r"(notify_outbox)", file)
    assert problems == {}, problems
