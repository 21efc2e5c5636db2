"""Usage rollups: the sums the charts and totals read, made by the billing
flusher from the same records, in the same tick, as the balances.

A report that summed raw usage records read a row per call: a 90-day chart
of a relay making a million calls a day read 90 million.  So the flusher
keeps, per UTC day, four families of sums (relay/money/flusher.py applies
them; console/stats.py and handlers/api_log.py read them):

  usage_days          per (day, model): the whole relay's chart and totals;
  usage_day_channels  per (day, channel, model): an administrator's view
                      of one channel;
  usage_day_statuses  per (day, status, model): of one status;
  usage_day_keys      per (day, user, key, model, channel, status): a
                      user's or a key's, and any mix of filters.

Each filter reads the smallest family that holds it: a 90-day chart of
the whole relay, a channel or a status reads at most 91 x models (x 1)
documents, a user's or a key's at most 91 x its own combinations.

A document holds the day's sums (`n` requests, `q` quota charged, `u`
unpaid, `p` prompt and `o` completion tokens, `c` read from a prompt cache,
`w5`/`w1` written to one for 5 minutes/1 hour, `s` quota units the cache
saved (negative when writes cost more), `r` cache writes never read; each
but `n` only when not 0, as a record stores it) and the same per UTC hour (`h07q` ...), so a chart's days
follow the browser's time zone and totals follow a time range to the hour.
A 90-day chart of the whole relay reads at most 91 x models documents.

Idempotent like the balances (relay/money/leases.py): a document carries
`a.<P>`, the last sequence number of process P applied to it, and each
update is conditional on it (`a.<P>` below the first sequence number of
the batch, or absent), so a batch applied twice, or by a reclaim racing a
replay, changes nothing.  Records of one process reach a document in
sequence order (the journal keeps it), which is what makes one number
per process enough.

An `_id` is the day, the family's fields and the model, `|` between them
(`day|user|key|channel|status|model`): every part but the model is a
number (or "-" for none), so the model at the end may hold any character.
`dm` (`day|model`) lets a chart group by one field, the only grouping the
embedded server does in SQL (models/queries.py); `gk` and `gc`, copies of
the key's and the channel's id where a family has them, let cache health
group by key or channel along the day's index (GROUP_COPIES).

"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

DAY = 86400
DAYS = "usage_days"
CHANNELS = "usage_day_channels"
STATUSES = "usage_day_statuses"
KEYS = "usage_day_keys"
# Each family's fields besides day and model, in its _id's order.
FAMILIES = {DAYS: (), CHANNELS: ("channel_id",), STATUSES: ("status",),
            KEYS: ("user_id", "token_id", "channel_id", "status")}
COLLECTIONS = tuple(FAMILIES)
# The fields each family has an index on (with the day), rarest first
# (models/store.INDEXES): the one a query looks up by.
INDEXED = {DAYS: (), CHANNELS: ("channel_id",), STATUSES: ("status",),
           KEYS: ("token_id", "user_id", "channel_id")}


# A field a report groups by has an unindexed copy to group by: grouping by
# an indexed field, SQLite walks that field's whole index (it gives the
# groups in order) instead of searching the day range by the day's index
# (console/cache_health.py groups by key or channel; tests/models/
# test_query_plans.py).
GROUP_COPIES = {"token_id": "gk", "channel_id": "gc"}


def family_for(filters: set) -> str:
    """The smallest family that holds every filter in `filters` (names of
    the fields given; the model is in every family)."""
    for coll in (DAYS, CHANNELS, STATUSES):
        if filters - {"model"} <= set(FAMILIES[coll]):
            return coll
    return KEYS


METRICS = ("n", "q", "u", "p", "o", "c", "w5", "w1", "s", "r")
# What each metric sums from a record ("n" counts records): every figure the
# log's totals and the CSV's TOTAL row sum (handlers/api_log.TOTALS; `cost`
# is quota + unpaid), and what cache health reads (console/cache_health.py).
SOURCES = {"q": "quota", "u": "unpaid", "p": "prompt_tokens", "o": "completion_tokens",
           "c": "cached_tokens", "w5": "cache_write_5m_tokens", "w1": "cache_write_1h_tokens",
           "s": "cache_saved", "r": "cache_unread"}
# The metrics by the record field they sum.
NAMES = {src: m for m, src in SOURCES.items()}
MARK = "a"


def day_of(ts: float) -> int:
    return int(math.floor(float(ts) / DAY) * DAY)


def hour_field(hour: int, metric: str) -> str:
    return f"h{hour:02d}{metric}"


def _part(value) -> str:
    return "-" if value is None else str(int(value))


# Per family: its fields, and those that have a copy to group by.
_PLANS = tuple((coll, names, tuple((n, GROUP_COPIES[n]) for n in names if n in GROUP_COPIES))
               for coll, names in FAMILIES.items())


def targets(r: dict) -> list[tuple[str, str, dict]]:
    """(collection, _id, the document's fixed fields) of each rollup a
    record adds to.  Written out, not with comprehensions: the flusher
    makes these for each group of records of every tick."""
    day = day_of(r.get("created_at") or 0)
    model = str(r.get("model") or "")
    dm = f"{day}|{model}"
    sday = str(day)
    out = []
    for coll, names, copies in _PLANS:
        dims = {"day": day}
        parts = [sday]
        for n in names:
            v = dims[n] = r.get(n)
            parts.append(_part(v))
        dims["model"] = model
        dims["dm"] = dm
        for n, c in copies:
            dims[c] = dims[n]
        parts.append(model)
        out.append((coll, "|".join(parts), dims))
    return out


# Each hour's field names, made once: amounts() runs for every record.
_HOURS = [{m: hour_field(h, m) for m in METRICS} for h in range(24)]
_SOURCE_ITEMS = tuple(SOURCES.items())


def amounts(r: dict) -> dict[str, int]:
    """What one record adds: the day's sums and its hour's."""
    names = _HOURS[int((float(r.get("created_at") or 0) % DAY) // 3600)]
    out = {"n": 1, names["n"]: 1}
    for m, src in _SOURCE_ITEMS:
        v = r.get(src)
        if v:
            v = int(v)
            if v:
                out[m] = v
                out[names[m]] = v
    return out


@dataclass
class Delta:
    """One process's records on one rollup document."""
    collection: str
    id: str
    proc: str
    dims: dict
    items: list = field(default_factory=list)  # (seq, amounts), any order
    # deltas() keeps the sums of all items and their first and last
    # sequence numbers as it adds them (None: read off the items).
    total: dict | None = None
    low: int | None = None
    high: int | None = None

    @property
    def first(self) -> int:
        return self.low if self.low is not None else min(s for s, _ in self.items)

    @property
    def last(self) -> int:
        return self.high if self.high is not None else max(s for s, _ in self.items)

    def add(self, items: list, total: dict, low: int, high: int) -> None:
        """A group of records (deltas()): their items and their sums."""
        self.items.extend(items)
        if self.total is None:
            self.total, self.low, self.high = dict(total), low, high
            return
        mine = self.total
        for k, v in total.items():
            mine[k] = mine.get(k, 0) + v
        self.low, self.high = min(self.low, low), max(self.high, high)

    def inc(self, after: int = -1) -> dict[str, int]:
        """The sums of the records after sequence number `after`."""
        if self.total is not None and after < self.low:
            return dict(self.total)
        return _summed(self.items, after)


def _summed(items, after: int = -1) -> dict[str, int]:
    out: dict[str, int] = {}
    for seq, amt in items:
        if seq > after:
            for k, v in amt.items():
                out[k] = out.get(k, 0) + v
    return out


def deltas(records: list[dict]) -> list[Delta]:
    """The records' rollup changes, one per (document, process).

    Records are grouped first by everything the key family is keyed by (a
    busy tick's records fall into far fewer groups than there are
    records), and each group's targets are made and added once: a record's
    own cost is its amounts and one sum, not four families' documents."""
    groups: dict[tuple, list] = {}
    for r in records:
        key = (r["proc"], day_of(r.get("created_at") or 0), r.get("user_id"), r.get("token_id"),
               r.get("channel_id"), r.get("status"), str(r.get("model") or ""))
        seq = int(r["seq"])
        amt = amounts(r)
        g = groups.get(key)
        if g is None:
            groups[key] = [r, [(seq, amt)], dict(amt), seq, seq]
            continue
        g[1].append((seq, amt))
        total = g[2]
        for k, v in amt.items():
            total[k] = total.get(k, 0) + v
        if seq < g[3]:
            g[3] = seq
        elif seq > g[4]:
            g[4] = seq
    out: dict[tuple, Delta] = {}
    for r, items, total, low, high in groups.values():
        proc = r["proc"]
        for coll, ident, dims in targets(r):
            d = out.get((coll, ident, proc))
            if d is None:
                d = out[(coll, ident, proc)] = Delta(coll, ident, proc, dims)
            d.add(items, total, low, high)
    return list(out.values())


def documents(records) -> dict[str, dict[str, dict]]:
    """Whole rollup documents from records not applied anywhere yet:
    {collection: {_id: document}} (models/bulkload.py builds with it)."""
    out: dict[str, dict[str, dict]] = {c: {} for c in COLLECTIONS}
    for r in records:
        amt = amounts(r)
        for coll, ident, dims in targets(r):
            doc = out[coll].get(ident)
            if doc is None:
                doc = out[coll][ident] = {"_id": ident, **dims, MARK: {}}
            for k, v in amt.items():
                doc[k] = doc.get(k, 0) + v
            marks = doc[MARK]
            marks[r["proc"]] = max(marks.get(r["proc"], 0), int(r["seq"]))
    return out


# What sum_records groups by: everything a family keys on, the hour, the process.
GRAIN = ("day", *FAMILIES[KEYS], "model", "hour", "proc")


def from_sums(rows) -> list[Delta]:
    """Rollup changes from records already summed by GRAIN
    (models/bulkload.sum_records): one Delta per (document, process), its
    one item the process's last sequence number and the sums.  Records
    from before sequence numbers count as one process, "legacy"."""
    out: dict[tuple, Delta] = {}
    for row in rows:
        proc = row["proc"] if row["proc"] is not None else "legacy"
        fake = {"created_at": row["day"], **row}
        amt = {"n": row["n"], **{m: row[src] for m, src in SOURCES.items() if row[src]}}
        hourly = {hour_field(int(row["hour"]), m): v for m, v in amt.items()}
        last = int(row["last_seq"] if row["last_seq"] is not None else row["n"])
        for coll, ident, dims in targets(fake):
            d = out.get((coll, ident, proc))
            if d is None:
                d = out[(coll, ident, proc)] = Delta(coll, ident, proc, dims, [(last, {})])
            seq, sums = d.items[0]
            for k, v in (*amt.items(), *hourly.items()):
                sums[k] = sums.get(k, 0) + v
            d.items[0] = (max(seq, last), sums)
    return list(out.values())


def build_file(path: str) -> None:
    """The rollups of every record in the embedded server's file at `path`,
    written into it (bench/datascale.py and the tests at a million records:
    records written there directly get their rollups the same way).  SQLite
    sums the records once by GRAIN (models/bulkload.sum_records); the
    documents are made here, by the same targets() and hour_field() the
    flusher uses."""
    from models import bulkload
    docs: dict[str, dict[str, dict]] = {c: {} for c in COLLECTIONS}
    for d in from_sums(bulkload.sum_records(path, GRAIN, SOURCES.values())):
        doc = docs[d.collection].get(d.id)
        if doc is None:
            doc = docs[d.collection][d.id] = {"_id": d.id, **d.dims, MARK: {}}
        for k, v in d.inc().items():
            doc[k] = doc.get(k, 0) + v
        doc[MARK][d.proc] = max(doc[MARK].get(d.proc, 0), d.last)
    for coll, by_id in docs.items():
        bulkload.write_documents(path, coll, by_id.values())


def build_built(path: str, sums: str) -> int:
    """The rollups of records that models/bulkload.build_usage made with a
    `sums` scratch file, written into the embedded server's file at `path`
    by SQLite from those sums (bench/datascale.py at ten million records:
    build_file reads every record back and makes each document in Python,
    about an hour there).  The same documents as build_file's
    (tests/models/test_bulkload.py); returns how many."""
    from models import bulkload
    return bulkload.write_rollups(path, sums, FAMILIES, GROUP_COPIES, SOURCES, MARK)
