"""rollups.deltas, the flusher's per-tick sums (relay/money/rollups.py),
against the plain definition: every record adds its amounts to each of its
targets, in sequence order, and inc(after) sums those after a mark.  The
flusher groups records by key before it makes targets (a call's share of
the tick's work was most of a small chat's cost); the answer must not move."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.money import rollups


def reference_targets(r: dict) -> list:
    """Each family's document: its _id (day, the family's fields, the model)
    and its fixed fields, copies to group by included."""
    day = rollups.day_of(r.get("created_at") or 0)
    model = str(r.get("model") or "")
    out = []
    for coll, names in rollups.FAMILIES.items():
        dims = {"day": day, **{n: r.get(n) for n in names}, "model": model,
                "dm": f"{day}|{model}",
                **{rollups.GROUP_COPIES[n]: r.get(n) for n in names if n in rollups.GROUP_COPIES}}
        ident = "|".join([str(day), *("-" if r.get(n) is None else str(int(r.get(n)))
                                      for n in names), model])
        out.append((coll, ident, dims))
    return out


def reference(records: list[dict]) -> dict:
    """{(collection, id, proc): (dims, [(seq, amounts)] in sequence order)}"""
    out: dict = {}
    for r in sorted(records, key=lambda r: (str(r.get("proc")), int(r.get("seq") or 0))):
        amt = rollups.amounts(r)
        assert rollups.targets(r) == reference_targets(r)
        for coll, ident, dims in reference_targets(r):
            out.setdefault((coll, ident, r["proc"]), (dims, []))[1].append((int(r["seq"]), amt))
    return out


def _sum(items, after=-1):
    total: dict = {}
    for seq, amt in items:
        if seq > after:
            for k, v in amt.items():
                total[k] = total.get(k, 0) + v
    return total


_record = st.fixed_dictionaries({
    "proc": st.sampled_from(["p1", "p2"]),
    "created_at": st.floats(1_790_000_000, 1_790_300_000),
    "user_id": st.sampled_from([1, 2]),
    "token_id": st.sampled_from([None, 10, 11]),
    "channel_id": st.sampled_from([None, 1, 2]),
    "status": st.sampled_from([200, 499]),
    "model": st.sampled_from(["gpt-4o", "m|odd", ""]),
    "quota": st.integers(0, 50), "unpaid": st.integers(0, 3),
    "prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9),
    "cached_tokens": st.integers(0, 2), "cache_saved": st.integers(-3, 3),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(_record, max_size=40), st.data())
def test_the_grouped_sums_are_the_records_sums(recs, data):
    seqs = {"p1": 0, "p2": 0}
    for r in recs:
        seqs[r["proc"]] += 1 + data.draw(st.integers(0, 2))
        r["seq"] = seqs[r["proc"]]
    data.draw(st.randoms()).shuffle(recs)       # the journal's order is not assumed
    want = reference(recs)
    got = {(d.collection, d.id, d.proc): d for d in rollups.deltas(recs)}
    assert set(got) == set(want)
    for key, (dims, items) in want.items():
        d = got[key]
        assert d.dims == dims
        assert (d.first, d.last) == (items[0][0], items[-1][0])
        assert d.inc() == _sum(items)
        for after in {items[0][0] - 1, items[0][0], items[len(items) // 2][0], items[-1][0]}:
            assert d.inc(after) == _sum(items, after), (key, after)


def test_inc_is_a_copy():
    r = {"proc": "p", "seq": 1, "created_at": 1_790_000_000.0, "user_id": 1, "token_id": 2,
         "channel_id": 3, "status": 200, "model": "m", "quota": 5}
    d = rollups.deltas([r])[0]
    d.inc()["q"] = 99
    assert d.inc()["q"] == 5
