"""models/bulkload.py writes records and rollups straight into the embedded
server's file; what it writes must be what the relay writes.  A real relay
makes real calls (one answered, one refused upstream with 429); then, with
the relay stopped, records are built into the same file and rollups made
again from the stored records: field for field and type for type the built
records are the relay's, and the rollups equal the billing flusher's own,
whether made from the records or from the sums kept as they were built."""
from __future__ import annotations

import sqlite3
import time

import pytest
import requests
from pymongo import MongoClient

from models import bulkload
from relay.money import rollups
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually
from tests.relay.money.money_env import database_of

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI(record=False).start()
    yield f
    f.stop()


def _shape(doc: dict) -> dict:
    return {k: type(v).__name__ for k, v in doc.items()}


def _rows(path, table) -> dict:
    db = sqlite3.connect(path)
    try:
        import json
        return {r[0]: json.loads(r[1]) for r in db.execute(f'SELECT _id, data FROM "{table}"')}
    finally:
        db.close()


def _rebuilt(path: str) -> dict:
    """The rollups made again from the records alone (rollups.build_file)."""
    conn = sqlite3.connect(path)
    for c in rollups.COLLECTIONS:
        conn.execute(f'DELETE FROM "{c}"')
    conn.commit()
    conn.close()
    rollups.build_file(path)
    return {c: _rows(path, c) for c in rollups.COLLECTIONS}


def test_built_records_and_rollups_are_the_relays_own(tmp_path, fake):
    data = str(tmp_path / "data")
    relay = RelayProcess("", data).start()
    try:
        admin = Api.login(relay.url)
        admin.create_channel(fake.url, [MODEL], name="ok")
        admin.create_channel(fake.mode_url("429"), ["limited"], name="429")
        admin.set_price(MODEL, input_price=1, output_price=2)
        admin.set_price("limited", input_price=1, output_price=2)
        admin.create_user("built", quota=10 ** 9)
        api = Api.login(relay.url, "built", USER_PASSWORD)
        key = api.create_token(name="k", remain_quota=10 ** 8)["key"]
        for model, status in ((MODEL, 200), ("limited", 429)):
            r = requests.post(relay.url + "/v1/chat/completions", headers={
                "Authorization": f"Bearer {key}"}, json={
                "model": model, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == status
        db = MongoClient(database_of(data))[relay.db_name]
        eventually(lambda: _applied(db), timeout=15)
        real = {d["status"]: d for d in db.usage.find({})}
    finally:
        relay.stop()
    path = bulkload.db_file(data, relay.db_name)
    flushed = {c: _rows(path, c) for c in rollups.COLLECTIONS}
    assert all(flushed.values())
    # The flusher's rollups, made again from the records alone.
    assert _rebuilt(path) == flushed
    # Records built into the same file have the real ones' fields and types.
    pop = bulkload.Population(keys=[(7, "u7", 70, "k70"), (8, "u8", 80, "k80")], heavy=[0],
                              models=["m1", "m2"], channels=[1, 2], now=time.time(),
                              error_share=0.3, proc="built")
    sums = str(tmp_path / "sums.db")
    bulkload.build_usage(path, 200, pop, sums=sums)
    built = [d for i, d in _rows(path, "usage").items() if d.get("proc") == "built"]
    assert len(built) == 200
    # Their rollups made by SQLite from the build's sums are those the
    # relay's code makes from the records (their models are not the real
    # call's: no document is shared).
    assert rollups.build_built(path, sums) > 0
    fast = {c: _rows(path, c) for c in rollups.COLLECTIONS}
    assert all(len(fast[c]) > len(flushed[c]) for c in rollups.COLLECTIONS)
    assert _rebuilt(path) == fast
    for status in (200, 429):
        mine = [d for d in built if d["status"] == status]
        assert mine, status
        want = _shape(real[status])
        assert all(_shape(d) == want for d in mine), (status, sorted(want.items() ^ _shape(mine[0]).items()))
    # and the server reads them back as it reads its own
    relay = RelayProcess("", data, db_name=relay.db_name).start()
    try:
        db = MongoClient(database_of(data))[relay.db_name]
        one = db.usage.find_one({"_id": built[0]["_id"]})
        assert one == built[0]
    finally:
        relay.stop()


def _applied(db):
    assert db.usage.count_documents({"status": {"$in": [200, 429]}}) == 2
    total = sum(d.get("n", 0) for d in db.usage_days.find({}))
    assert total == 2
