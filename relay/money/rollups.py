"""Usage rollups: the sums the charts and totals read, made by the billing
flusher from the same records, in the same tick, as the balances.

A report that summed raw usage records read a row per call: a 90-day chart
of a relay making a million calls a day read 90 million.  So the flusher
keeps, per UTC day, two families of sums (relay/money/flusher.py applies
them; console/stats.py and handlers/api_log.py read them):

  usage_days      per (day, model): the whole relay's chart and totals;
  usage_day_keys  per (day, user, key, model, channel, status): every
                  filter the console offers (a user, a key, a model, a
                  channel, a status, and any mix of them).

A document holds the day's sums (`n` requests, `q` quota charged, `u`
unpaid, `p` prompt and `o` completion tokens; `u` only when not 0, as a
record stores it) and the same per UTC hour (`h07q` ...), so a chart's days
follow the browser's time zone and totals follow a time range to the hour.
A 90-day chart of the whole relay reads at most 91 x models documents.

Idempotent like the balances (relay/money/leases.py): a document carries
`a.<P>`, the last sequence number of process P applied to it, and each
update is conditional on it (`a.<P>` below the first sequence number of
the batch, or absent), so a batch applied twice, or by a reclaim racing a
replay, changes nothing.  Records of one process reach a document in
sequence order (the journal keeps it), which is what makes one number
per process enough.

The `_id`s are `day|model` and `day|user|key|model|channel|status`: every
part but the model is a number (or "-" for none), so the model in the
middle may hold any character.  `dm` (`day|model`) lets a filtered chart
group by one field, the only grouping the embedded server does in SQL
(models/queries.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

DAY = 86400
DAYS = "usage_days"
KEYS = "usage_day_keys"
COLLECTIONS = (DAYS, KEYS)
METRICS = ("n", "q", "u", "p", "o")
# What each metric sums from a record ("n" counts records).
SOURCES = {"q": "quota", "u": "unpaid", "p": "prompt_tokens", "o": "completion_tokens"}
MARK = "a"


def day_of(ts: float) -> int:
    return int(math.floor(float(ts) / DAY) * DAY)


def hour_field(hour: int, metric: str) -> str:
    return f"h{hour:02d}{metric}"


def _part(value) -> str:
    return "-" if value is None else str(int(value))


def targets(r: dict) -> list[tuple[str, str, dict]]:
    """(collection, _id, the document's fixed fields) of each rollup a
    record adds to."""
    day = day_of(r.get("created_at") or 0)
    model = str(r.get("model") or "")
    dims = {"day": day, "user_id": r.get("user_id"), "token_id": r.get("token_id"),
            "model": model, "channel_id": r.get("channel_id"), "status": r.get("status"),
            "dm": f"{day}|{model}"}
    key = (f"{day}|{_part(r.get('user_id'))}|{_part(r.get('token_id'))}|{model}|"
           f"{_part(r.get('channel_id'))}|{_part(r.get('status'))}")
    return [(DAYS, f"{day}|{model}", {"day": day, "model": model}), (KEYS, key, dims)]


def amounts(r: dict) -> dict[str, int]:
    """What one record adds: the day's sums and its hour's."""
    hour = int((float(r.get("created_at") or 0) % DAY) // 3600)
    out = {"n": 1, hour_field(hour, "n"): 1}
    for m, src in SOURCES.items():
        v = int(r.get(src) or 0)
        if v:
            out[m] = v
            out[hour_field(hour, m)] = v
    return out


@dataclass
class Delta:
    """One process's records on one rollup document."""
    collection: str
    id: str
    proc: str
    dims: dict
    items: list = field(default_factory=list)  # (seq, amounts) in sequence order

    @property
    def first(self) -> int:
        return self.items[0][0]

    @property
    def last(self) -> int:
        return self.items[-1][0]

    def inc(self, after: int = -1) -> dict[str, int]:
        """The sums of the records after sequence number `after`."""
        out: dict[str, int] = {}
        for seq, amt in self.items:
            if seq > after:
                for k, v in amt.items():
                    out[k] = out.get(k, 0) + v
        return out


def deltas(records: list[dict]) -> list[Delta]:
    """The records' rollup changes, one per (document, process), in the
    order of the records."""
    out: dict[tuple, Delta] = {}
    for r in sorted(records, key=lambda r: (str(r.get("proc")), int(r.get("seq") or 0))):
        amt = amounts(r)
        for coll, ident, dims in targets(r):
            d = out.get((coll, ident, r["proc"]))
            if d is None:
                d = out[(coll, ident, r["proc"])] = Delta(coll, ident, r["proc"], dims)
            d.items.append((int(r["seq"]), amt))
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


# Fields a rollup needs from a stored record (models/bulkload.read_records).
RECORD_FIELDS = ("user_id", "token_id", "model", "channel_id", "status", "created_at", "quota",
                 "unpaid", "prompt_tokens", "completion_tokens", "proc", "seq")


def build_file(path: str) -> None:
    """The rollups of every record in the embedded server's file at `path`,
    written into it (bench/datascale.py and the tests at a million records:
    records written there directly get their rollups the same way)."""
    from models import bulkload
    docs: dict[str, dict[str, dict]] = {c: {} for c in COLLECTIONS}
    for batch in bulkload.read_records(path, RECORD_FIELDS):
        part = documents(batch)
        for coll, by_id in part.items():
            into = docs[coll]
            for ident, d in by_id.items():
                have = into.get(ident)
                if have is None:
                    into[ident] = d
                    continue
                for k, v in d.items():
                    if k in METRICS or (k[:1] == "h" and k[-1:] in METRICS and len(k) == 4):
                        have[k] = have.get(k, 0) + v
                for p, s in d[MARK].items():
                    have[MARK][p] = max(have[MARK].get(p, 0), s)
    for coll, by_id in docs.items():
        bulkload.write_documents(path, coll, by_id.values())
