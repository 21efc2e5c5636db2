"""A relay with a million usage records, on its embedded database, as the
README's default runs it (issue 28).  Times are not asserted here (they go
to bench/datascale.py); what is:

- while the heaviest console reports run at once (every log filter, every
  chart, two exports of ten days of the heavy user, some 33,000 rows each),
  plain relay calls never get a 503 nor anything but 200: reports read
  through their own server process and cannot hold up billing;
- an export is complete: every record of the range, and a TOTAL row that
  sums them all;
- retention prunes a day's records at this size, a batch at a time, and the
  file gives the space back.

The million records are written straight into the server's file
(models/bulkload.py says why that is the relay's own shape), once for the
module: a minute, not the hours the driver would take."""
from __future__ import annotations

import csv
import io
import os
import shutil
import sqlite3
import threading
import time

import pytest
import requests

from models import bulkload
from relay.money import rollups
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api, RelayProcess, eventually

# Building the million records and their rollups is part of the first test's
# time (4 minutes at a load of 12 to 20 on 2 cores, with everything else running).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N = 1_000_000
MODEL = "gpt-4o-mini"
MODELS = [f"scale-model-{i}" for i in range(10)]


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI(record=False).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def million(tmp_path_factory, fake):
    """A data directory with a tenant (user "heavy", who makes a tenth of the
    calls with five keys; a probe key) and a million records over 30 days."""
    data = str(tmp_path_factory.mktemp("million") / "data")
    relay = RelayProcess("", data).start()
    try:
        admin = Api.login(relay.url)
        admin.create_channel(fake.url, [MODEL] + MODELS, name="scale")
        admin.set_price(MODEL, input_price=1, output_price=2)
        heavy = admin.create_user("heavy", quota=10 ** 13)
        api = Api.login(relay.url, "heavy", USER_PASSWORD)
        keys = [api.create_token(name=f"h{i}", remain_quota=10 ** 12)["id"] for i in range(5)]
        probe = api.create_token(name="probe", unlimited_quota=True)["key"]
    finally:
        relay.stop()
    now = time.time()
    pop = bulkload.Population(
        keys=[(heavy["id"], "heavy", k, f"h{i}") for i, k in enumerate(keys)]
        + [(100 + u, f"user{u}", 1000 + u * 2 + j, f"k{j}") for u in range(100) for j in range(2)],
        heavy=list(range(len(keys))), models=MODELS, channels=[1, 2, 3, 4], now=now - 60,
        models_per_key=2, channels_per_model=1)
    path = bulkload.db_file(data, relay.db_name)
    # Rollups from the sums kept as the records are made (tests/models/
    # test_bulkload.py: the documents rollups.build_file makes from the
    # records): minutes less than reading a million records back.
    sums = os.path.join(os.path.dirname(data), "sums.db")
    bulkload.build_usage(path, N, pop, sums=sums)
    rollups.build_built(path, sums)
    return {"data": data, "db_name": relay.db_name, "heavy": heavy, "keys": keys,
            "probe": probe, "now": now, "path": path}


class Probe(threading.Thread):
    def __init__(self, url: str, key: str):
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.statuses: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        s = requests.Session()
        while not self.stopping.is_set():
            try:
                r = s.post(self.url + "/v1/chat/completions", timeout=60,
                           headers={"Authorization": f"Bearer {self.key}"},
                           json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
                self.statuses.append(r.status_code)
            except requests.RequestException:
                self.statuses.append(0)
            time.sleep(0.05)


def _sums(path: str, user_id: int, since: float, until: float) -> dict:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute(
            "SELECT COUNT(*), TOTAL(json_extract(data, '$.quota')), "
            "TOTAL(json_extract(data, '$.prompt_tokens')) FROM usage WHERE "
            "json_extract(data, '$.user_id') = ? AND json_extract(data, '$.created_at') >= ? "
            "AND json_extract(data, '$.created_at') < ?", (user_id, since, until)).fetchone()
        return {"rows": row[0], "quota": int(row[1]), "prompt_tokens": int(row[2])}
    finally:
        db.close()


def _export(api: Api, path: str) -> list[list[str]]:
    r = api.s.get(api.base + path, timeout=600)
    assert r.status_code == 200, r.text[:300]
    return list(csv.reader(io.StringIO(r.text)))


def test_reports_never_hold_up_calls_and_exports_are_whole(million):
    m = million
    relay = RelayProcess("", m["data"], db_name=m["db_name"]).start()
    probe = Probe(relay.url, m["probe"])
    try:
        admin = Api.login(relay.url)
        heavy = Api.login(relay.url, "heavy", USER_PASSWORD)
        probe.start()
        now = m["now"]
        since, until = now - 12 * 86400, now - 2 * 86400
        results: dict = {}

        def run(name, fn):
            try:
                results[name] = fn()
            except Exception as exc:  # noqa: BLE001 - reported below
                results[name] = exc
        month = f"start={since:.0f}&end={until:.0f}"
        jobs = [("export self", lambda: _export(heavy, f"/api/log/self/export?{month}")),
                ("export admin", lambda: _export(
                    admin, f"/api/log/export?user_id={m['heavy']['id']}&{month}"))]
        queries = ["/api/log/?size=200", f"/api/log/?user_id={m['heavy']['id']}",
                   f"/api/log/?token_id={m['keys'][0]}", f"/api/log/?model={MODELS[3]}",
                   "/api/log/?channel_id=2", "/api/log/?status=429",
                   f"/api/log/?status=429&model={MODELS[1]}&channel_id=2",
                   f"/api/log/?{month}", "/api/log/daily?days=90&tz_offset=330",
                   "/api/log/daily?days=30&channel_id=3", "/api/log/daily?days=30&status=429",
                   f"/api/log/daily?days=90&user_id={m['heavy']['id']}&tz_offset=-480"]
        threads = [threading.Thread(target=run, args=job) for job in jobs]
        for t in threads:
            t.start()
        for _ in range(2):
            for q in queries:
                r = admin.s.get(relay.url + q, timeout=120)
                assert r.status_code == 200, (q, r.text[:300])
            page = heavy.get("/api/log/self?size=100")["data"]
            for _ in range(5):
                page = heavy.get(f"/api/log/self?size=100&older={page['older']}")["data"]
                assert len(page["items"]) == 100
            heavy.get("/api/log/self/daily?days=30&tz_offset=60")
        for t in threads:
            t.join(600)
    finally:
        probe.stopping.set()
        probe.join(70)
        relay.stop()
    # Not one call refused or failed while all of that ran.
    assert len(probe.statuses) > 20 and set(probe.statuses) == {200}, sorted(set(probe.statuses))
    want = _sums(m["path"], m["heavy"]["id"], since, until)
    assert want["rows"] > 30_000  # ten days of a tenth of a million over thirty
    for name in ("export self", "export admin"):
        rows = results[name]
        assert not isinstance(rows, Exception), (name, rows)
        header, body, total = rows[0], rows[1:-1], rows[-1]
        assert len(body) == want["rows"] and total[0] == "TOTAL", name
        assert len({r[0] for r in body}) == want["rows"]  # no record twice
        assert int(total[header.index("quota")]) == want["quota"] == sum(
            int(r[header.index("quota")]) for r in body)
        assert int(total[header.index("prompt_tokens")]) == want["prompt_tokens"]


def test_retention_prunes_a_day_and_gives_the_space_back(million, tmp_path):
    data = str(tmp_path / "data")
    shutil.copytree(million["data"], data, ignore=shutil.ignore_patterns("*.pid", "relay.lock"))
    path = bulkload.db_file(data, million["db_name"])
    before = os.path.getsize(path)
    cutoff = time.time() - 29 * 86400
    old = _sums(path, million["heavy"]["id"], 0, cutoff)
    relay = RelayProcess("", data, db_name=million["db_name"],
                         args=["--usage-retention-days", "29"]).start()
    try:
        def pruned():
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                oldest = db.execute("SELECT MIN(json_extract(data, '$.created_at')) FROM usage "
                                    "INDEXED BY idx_usage_created_at").fetchone()[0]
            finally:
                db.close()
            assert oldest >= cutoff - 1
        eventually(pruned, timeout=240, interval=2)
    finally:
        relay.stop()
    assert old["rows"] > 0
    # About a thirtieth of the records went, and with them their space.
    assert os.path.getsize(path) < before - (N / 30) * 400, (before, os.path.getsize(path))
