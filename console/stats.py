"""Usage statistics for the console: spend and requests per day and model,
and CSV export of usage records."""
from __future__ import annotations

import asyncio
import csv
import io
import time
from datetime import datetime, timedelta, timezone

MAX_DAYS = 90
MAX_EXPORT_ROWS = 100_000


async def daily(store, flt: dict, days: int = 30, tz_offset_min: int = 0,
                now: float | None = None) -> dict:
    """Per-day, per-model sums of quota and requests for the last `days` days.

    Days are calendar days in the browser's time zone (`tz_offset_min` east
    of UTC).  One `$group` by model per day: it runs on the embedded server
    too, which cannot group on computed keys.  Days without usage are zeros;
    with no usage at all, `models` is empty.
    """
    days = max(1, min(int(days), MAX_DAYS))
    now = time.time() if now is None else now
    tz = timezone(timedelta(minutes=tz_offset_min))
    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    starts = [today - timedelta(days=days - 1 - i) for i in range(days)]

    async def one(start: datetime) -> list[dict]:
        match = {**flt, "created_at": {"$gte": start.timestamp(),
                                       "$lt": (start + timedelta(days=1)).timestamp()}}
        pipeline = [{"$match": match}, {"$group": {
            "_id": "$model", "quota": {"$sum": "$quota"}, "requests": {"$sum": 1}}}]
        return await (await store.db.usage.aggregate(pipeline)).to_list(None)

    per_day = await asyncio.gather(*(one(s) for s in starts))
    models = sorted({str(r["_id"] or "") for rows in per_day for r in rows})
    quota = {m: [0] * days for m in models}
    requests = {m: [0] * days for m in models}
    for i, rows in enumerate(per_day):
        for r in rows:
            m = str(r["_id"] or "")
            quota[m][i] += int(r.get("quota") or 0)
            requests[m][i] += int(r.get("requests") or 0)
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


async def export_csv(store, flt: dict, columns: list[str], view, totals: tuple = ()):
    """Yield the CSV text of matching records in chunks, newest first.

    `view(doc)` turns a stored record into the dict the API shows; at most
    MAX_EXPORT_ROWS rows are written.  With `totals`, a last row named
    TOTAL sums those columns over the rows written.
    """
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns + ["time_utc"])
    cursor = store.db.usage.find(flt).sort("created_at", -1).limit(MAX_EXPORT_ROWS)
    n = 0
    sums = {c: 0 for c in totals}
    async for doc in cursor:
        row = view(doc)
        for c in totals:
            sums[c] += int(row.get(c) or 0)
        ts = row.get("created_at") or 0
        w.writerow([_cell(row.get(c)) for c in columns]
                   + [datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")])
        n += 1
        if n % 500 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    if totals:
        w.writerow([("TOTAL" if i == 0 else sums[c] if c in sums else "")
                    for i, c in enumerate(columns)] + [""])
    yield buf.getvalue()
