"""console/stats.py reads charts and totals from the rollups: against the
real database server, rollups of random records give what the records
themselves say, for every kind of time zone (whole hours either way,
half and three-quarter hours, the extremes) and time range (whole days,
cut hours, open ends), through each rollup family."""
from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from datetime import datetime, timedelta, timezone

from console import stats
from models.store import Store
from relay.money import rollups

NOW = time.time()
rng = random.Random(28)
RECS = [{"user_id": 1 + i % 2, "token_id": 10 + i % 3, "model": rng.choice("ab"),
         "channel_id": 1 + i % 2, "status": rng.choice((200, 200, 429)),
         "quota": rng.randrange(100), "unpaid": rng.choice((0, 0, 0, 5)),
         "prompt_tokens": rng.randrange(50), "completion_tokens": rng.randrange(9),
         "created_at": NOW - rng.uniform(0, 40 * 86400), "proc": "p", "seq": i + 1}
        for i in range(2000)]
FILTERS = ({}, {"model": "a"}, {"channel_id": 2}, {"status": 429}, {"user_id": 1},
           {"token_id": 11, "model": "b"}, {"channel_id": 1, "status": 200})


def _match(r, fields):
    return all(r.get(k) == v for k, v in fields.items())


def run_with_rollups(mongo_url, body):
    async def go():
        store = Store(mongo_url, db_name="st_" + uuid.uuid4().hex[:8])
        await store.start()
        try:
            for coll, docs in rollups.documents(RECS).items():
                await store.db[coll].insert_many(list(docs.values()))
            return await body(store.reports)
        finally:
            await store.client.drop_database(store.db_name)
            await store.close()
    return asyncio.run(go())


def test_daily_in_every_kind_of_time_zone(mongo_url):
    async def body(db):
        for tz in (0, 480, -300, 330, 345, -570, 840, -840, 30):
            for fields in FILTERS:
                got = await stats.daily(db, dict(fields), 30, tz, NOW)
                zone = timezone(timedelta(minutes=tz))
                want: dict = {}
                for r in RECS:
                    if _match(r, fields):
                        # an hour counts in the local day it starts in
                        start = math.floor(r["created_at"] / 3600) * 3600
                        d = datetime.fromtimestamp(start, zone).strftime("%Y-%m-%d")
                        want[d] = want.get(d, 0) + r["quota"]
                assert got["total_quota"] == [want.get(d, 0) for d in got["days"]], (tz, fields)
    run_with_rollups(mongo_url, body)


def test_totals_whole_hours_of_any_range(mongo_url):
    async def body(db):
        day = rollups.day_of(NOW)
        ranges = [(None, None), (day - 10 * 86400, day - 3 * 86400),
                  (day - 10 * 86400 + 5 * 3600, day - 3 * 86400 + 7 * 3600),
                  (day - 5 * 86400 + 1800.5, None), (None, day - 20 * 86400 + 99),
                  (day - 2 * 86400 + 3600, day - 2 * 86400 + 7200), (NOW, NOW - 5)]
        for since, until in ranges:
            for fields in FILTERS:
                got = await stats.totals(db, dict(fields), since, until)
                lo = None if since is None else math.floor(since / 3600) * 3600
                hi = None if until is None else math.ceil(until / 3600) * 3600
                mine = [r for r in RECS if _match(r, fields)
                        and (lo is None or r["created_at"] >= lo)
                        and (hi is None or r["created_at"] < hi)]
                assert (got["requests"], got["quota"], got["unpaid"], got["cost"],
                        got["prompt_tokens"], got["completion_tokens"]) == (
                    len(mine), sum(r["quota"] for r in mine), sum(r["unpaid"] for r in mine),
                    sum(r["quota"] + r["unpaid"] for r in mine),
                    sum(r["prompt_tokens"] for r in mine),
                    sum(r["completion_tokens"] for r in mine)), (since, until, fields)
                assert got["exact"] == (lo == since and hi == until)
    run_with_rollups(mongo_url, body)
