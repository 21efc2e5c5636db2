"""Usage statistics for the console: totals, spend and requests per day and
model, and CSV export of usage records.

Totals and charts read the rollups the billing flusher keeps
(relay/money/rollups.py), never the records: a 90-day chart reads at most
91 x models documents whatever the traffic.  Records are read a page at a
time (models/queries.py).  Everything here reads `store.reports`, the
connection that cannot hold up billing (models/store.py).
"""
from __future__ import annotations

import asyncio
import csv
import io
import math
import time
from datetime import datetime, timedelta, timezone

from models import queries
from relay.money import rollups

MAX_DAYS = 90
# The most records one CSV export writes; a larger one is refused before
# anything is sent, with the number of records and how to narrow it.
MAX_EXPORT_ROWS = 1_000_000
EXPORT_CHUNK = 500
HOUR = 3600
DAY = rollups.DAY


def _family(fields: dict) -> str:
    return rollups.family_for({k for k, v in fields.items() if v is not None})


def _dims(fields: dict, family: str) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


async def totals(db, fields: dict, since: float | None = None,
                 until: float | None = None) -> dict:
    """Requests, quota charged, full cost, unpaid, tokens and the prompt
    cache's figures of the records with these field values between `since`
    and `until`, from the rollups: exact for whole hours; a bound inside an
    hour counts that whole hour (`since`/`until` in the answer say which
    hours were counted, `exact` whether they are the ones asked for)."""
    groups, lo, hi = await sums_by(db, fields, since, until)
    sums = groups.get(None) or {m: 0 for m in rollups.METRICS}
    return _totals_view(sums, since, until, lo, hi)


async def sums_by(db, fields: dict, since: float | None = None, until: float | None = None,
                  by: str | None = None) -> tuple[dict, int | None, int | None]:
    """({group: {metric: sum}}, lo, hi): the rollups' sums of the records
    with these field values in the whole hours [lo, hi) around [since,
    until), grouped by the rollup field `by` (None: one group, None).  Read
    from the smallest family that holds the filters and `by`, a day's sums
    for whole days and the hours' for the rest (segments())."""
    names = {k for k, v in fields.items() if v is not None} | ({by} if by else set())
    family = rollups.family_for(names)
    coll = db[family]
    dims = _dims(fields, family)
    lo = None if since is None else math.floor(since / HOUR) * HOUR
    hi = None if until is None else math.ceil(until / HOUR) * HOUR
    groups: dict = {}

    async def add(first_day, end_day, metric_fields: dict) -> None:
        if first_day is not None and end_day is not None and first_day >= end_day:
            return
        flt = queries.rollup_match(dims, first_day, end_day, rollups.INDEXED[family])
        got = await queries.rollup_sums(coll, flt, list(metric_fields),
                                        by=rollups.GROUP_COPIES.get(by, by) if by else None)
        for key, row in got.items():
            sums = groups.setdefault(key, {m: 0 for m in rollups.METRICS})
            for f, m in metric_fields.items():
                sums[m] += row.get(f, 0)

    if lo is not None and hi is not None and lo >= hi:
        return groups, lo, hi
    for kind, a, b, c in segments(lo, hi):
        if kind == "days":
            await add(a, b, {m: m for m in rollups.METRICS})
        else:  # hours b..c of day a
            await add(a, a + DAY, {rollups.hour_field(h, m): m for h in range(b, c)
                                   for m in rollups.METRICS})
    return groups, lo, hi


def segments(lo: int | None, hi: int | None) -> list[tuple]:
    """[lo, hi) (whole hours; None: unbounded) as whole days, read from the
    day's sums, and the hours of at most two partial days:
    ("days", first, end, None) and ("hours", day, first hour, end hour)."""
    out: list[tuple] = []
    if lo is not None and hi is not None and rollups.day_of(lo) == rollups.day_of(hi - 1):
        day = rollups.day_of(lo)
        if lo == day and hi == day + DAY:
            return [("days", day, hi, None)]
        return [("hours", day, (lo - day) // HOUR, (hi - day) // HOUR)]
    full_lo = lo
    if lo is not None and lo % DAY:
        day = rollups.day_of(lo)
        out.append(("hours", day, (lo - day) // HOUR, 24))
        full_lo = day + DAY
    full_hi = hi if hi is None else hi - hi % DAY
    if full_lo is None or full_hi is None or full_lo < full_hi:
        out.append(("days", full_lo, full_hi, None))
    if hi is not None and hi % DAY:
        out.append(("hours", full_hi, 0, (hi - full_hi) // HOUR))
    return out


def _totals_view(sums: dict, since, until, lo, hi) -> dict:
    return {"requests": sums["n"], "quota": sums["q"], "cost": sums["q"] + sums["u"],
            "unpaid": sums["u"], "prompt_tokens": sums["p"], "completion_tokens": sums["o"],
            "cached_tokens": sums["c"], "cache_write_5m_tokens": sums["w5"],
            "cache_write_1h_tokens": sums["w1"], "cache_saved": sums["s"],
            "cache_unread": sums["r"],
            "since": lo, "until": hi, "exact": lo == since and hi == until}


def split_hour(tz_offset_min: int) -> int:
    """The first UTC hour (0-24) whose start falls on the next local day:
    hours before it count in the local day before (a zone whose offset is
    not whole hours counts each hour in the day it starts in)."""
    return math.ceil(((-tz_offset_min) % 1440) / 60)


async def daily(db, fields: dict, days: int = 30, tz_offset_min: int = 0,
                now: float | None = None) -> dict:
    """Per-day, per-model sums of quota and requests for the last `days` days.

    Days are calendar days in the browser's time zone (`tz_offset_min` east
    of UTC), from the rollups: a local day is the end of one UTC day and the
    start of the next, so besides each UTC day's sums only the hours on the
    smaller side of the split are read (none at UTC, at most twelve).  Days
    without usage are zeros; with no usage at all, `models` is empty.
    """
    days = max(1, min(int(days), MAX_DAYS))
    now = time.time() if now is None else now
    tz = timezone(timedelta(minutes=tz_offset_min))
    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    starts = [today - timedelta(days=days - 1 - i) for i in range(days)]
    first = starts[0].timestamp()
    end = (starts[-1] + timedelta(days=1)).timestamp()
    split = split_hour(tz_offset_min)
    # UTC day of the first local day's first hour, and every UTC day after
    # it up to the last local day's end.
    day0 = rollups.day_of(first + 3600 - 3600 * split)
    first_day, end_day = day0, rollups.day_of(end - 1) + DAY
    head = split <= 12
    hours = range(0, split) if head else range(split, 24)
    wanted = ["n", "q"] + [rollups.hour_field(h, m) for h in hours for m in ("n", "q")]
    family = _family(fields)
    dims = _dims(fields, family)
    flt = queries.rollup_match(dims, first_day, end_day, rollups.INDEXED[family])
    # Summed by (day, model) in SQL, only the fields wanted: a whole
    # document is a day's sums and each hour's (about a hundred fields at
    # a busy relay's), and the embedded server walks every value of an
    # answer in Python before encoding it, most of a 90-day chart's cost.
    got = await queries.rollup_sums(db[family], flt, wanted, by="dm")
    rows = []
    for dm, sums in got.items():
        day, _, model = str(dm).partition("|")
        rows.append((int(day), model, sums))
    models = sorted({m for _, m, _ in rows})
    quota = {m: [0] * days for m in models}
    requests = {m: [0] * days for m in models}
    for day, model, sums in rows:
        total = {m: int(sums.get(m) or 0) for m in ("n", "q")}
        part = {m: sum(int(sums.get(rollups.hour_field(h, m)) or 0) for h in hours)
                for m in ("n", "q")}
        before = part if head else {m: total[m] - part[m] for m in total}
        # Hours before the split count in the local day before this UTC day's.
        j = (day - day0) // DAY
        for i, share in ((j - 1, before), (j, {m: total[m] - before[m] for m in total})):
            if 0 <= i < days:
                requests[model][i] += share["n"]
                quota[model][i] += share["q"]
    return {
        "days": [s.strftime("%Y-%m-%d") for s in starts],
        "timestamps": [int(s.timestamp()) for s in starts],
        "models": models, "quota": quota, "requests": requests,
        "total_quota": [sum(quota[m][i] for m in models) for i in range(days)],
        "total_requests": [sum(requests[m][i] for m in models) for i in range(days)],
    }


def _cell(value) -> str:
    if value is None:
        return ""
    text = str(value)
    # A spreadsheet runs a cell that starts like a formula; keep it text.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


class ExportTooLarge(Exception):
    """More records match than one export writes; str() says how many and
    what to do."""

    def __init__(self, records: int):
        super().__init__(
            f"Up to {records:,} usage records match; one export holds at most "
            f"{MAX_EXPORT_ROWS:,}. Narrow the time range (start, end) or filter by key, model "
            "or status, and export the parts one after another.")
        self.records = records


async def check_export(db, fields: dict, since: float | None, until: float | None) -> int:
    """How many records an export would write at most (from the rollups,
    whole hours); ExportTooLarge above MAX_EXPORT_ROWS."""
    n = (await totals(db, fields, since, until))["requests"]
    if n > MAX_EXPORT_ROWS:
        raise ExportTooLarge(n)
    return n


def _rows(docs: list[dict], columns: list[str], view, sums: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    for doc in docs:
        row = view(doc)
        for c in sums:
            sums[c] += int(row.get(c) or 0)
        ts = row.get("created_at") or 0
        w.writerow([_cell(row.get(c)) for c in columns]
                   + [datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")])
    return buf.getvalue()


async def export_csv(db, flt: dict, columns: list[str], view, totals_of: tuple = ()):
    """Yield the CSV text of every matching record, newest first: the header
    at once, then each chunk as it is read (models/queries.usage_chunks),
    formatted off the event loop.  `view(doc)` turns a stored record into
    the dict the API shows.  With `totals_of`, a last row named TOTAL sums
    those columns over every row: written only when every row was (an
    error on the way ends the stream without it, and the caller without
    the end of the chunked body, so a cut export never looks whole)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(columns + ["time_utc"])
    yield buf.getvalue()
    sums = {c: 0 for c in totals_of}
    async for docs in queries.usage_chunks(db.usage, flt, EXPORT_CHUNK):
        yield await asyncio.to_thread(_rows, docs, columns, view, sums)
    if totals_of:
        buf = io.StringIO()
        csv.writer(buf).writerow([("TOTAL" if i == 0 else sums[c] if c in sums else "")
                                  for i, c in enumerate(columns)] + [""])
        yield buf.getvalue()
