"""What a person is shown of a balance, from any one document of it.

A balance document moves in the database before this process hears back:
a lease moves `quota` into `leases.<P>`, a flush moves spend into
`used_quota`.  A document read in between, put beside this process's
in-memory counters, counted a charge twice or a lease not at all (the
key's `used_quota` one call too high, caught by CI on 2026-11-25).

So a balance is shown from the document alone, plus the charges of this
process the document does not count yet.  `applied.<P>` in the document
says which those are: every record of P up to that sequence number is in
it.  Leases do not need a mark: `quota + sum(leases)` does not change
when one is taken or given back.  Charges applied in the database are
kept here a while (`retain`) for documents read before the flush that
applied them and looked at after; a document older than that is not used
(the caller falls back to the last document it kept, which is advanced
as charges are let go).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque


class Spend:
    """One process id's charges on one balance, in sequence order, as
    running totals: what a document with mark m does not count is the
    total less the running total at m."""

    __slots__ = ("seqs", "used", "paid", "base_used", "base_paid", "floor", "done",
                 "applied_at")

    def __init__(self):
        self.seqs: list[int] = []
        self.used: list[int] = []   # running total of charges
        self.paid: list[int] = []   # of those taken from `quota + leases`
        self.base_used = self.base_paid = 0
        self.floor = 0              # charges up to here were let go
        self.done = 0               # charges up to here are applied in the database
        self.applied_at: deque[tuple[float, int]] = deque()

    def add(self, seq: int, amount: int, paid: bool) -> None:
        used, paid_total = self._at(len(self.seqs))
        self.seqs.append(seq)
        self.used.append(used + amount)
        self.paid.append(paid_total + (amount if paid else 0))

    def _at(self, i: int) -> tuple[int, int]:
        return (self.used[i - 1], self.paid[i - 1]) if i else (self.base_used, self.base_paid)

    def after(self, mark: int) -> tuple[int, int] | None:
        """(used, paid) of the charges after `mark`; None if some were let go."""
        if mark < self.floor:
            return None
        u, p = self._at(bisect_right(self.seqs, mark))
        tu, tp = self._at(len(self.seqs))
        return tu - u, tp - p

    def applied(self, seq: int, now: float) -> None:
        self.done = max(self.done, seq)
        self.applied_at.append((now, seq))

    def let_go(self, before: float) -> int | None:
        """Forget charges applied in the database before `before`; returns
        the mark up to which they were forgotten, if it moved."""
        upto = self.floor
        while self.applied_at and self.applied_at[0][0] <= before:
            upto = max(upto, self.applied_at.popleft()[1])
        if upto <= self.floor:
            return None
        i = bisect_right(self.seqs, upto)
        self.base_used, self.base_paid = self._at(i)
        del self.seqs[:i], self.used[:i], self.paid[:i]
        self.floor = upto
        return upto


class Shown:
    """A balance's charges by process id, and the last document kept of it."""

    __slots__ = ("runs", "total", "used", "marks")

    def __init__(self):
        self.runs: dict[str, Spend] = {}
        self.total = self.used = 0       # `quota + sum(leases)`, `used_quota`
        self.marks: dict[str, int] = {}  # `applied`

    def charge(self, proc: str, seq: int, amount: int, paid: bool) -> None:
        run = self.runs.get(proc)
        if run is None:
            run = self.runs[proc] = Spend()
        run.add(seq, amount, paid)

    @property
    def unapplied(self) -> int:
        """Charged here and not yet applied in the database."""
        return sum(run.after(run.done)[0] for run in self.runs.values())

    @property
    def holding(self) -> bool:
        """Charges not yet let go (the document's mark must stay)."""
        return any(run.seqs for run in self.runs.values())

    def of(self, total: int, used: int, marks: dict) -> tuple[int, int] | None:
        """(remaining, used) from a document's figures; None if too old."""
        for proc, run in self.runs.items():
            got = run.after(int(marks.get(proc, 0)))
            if got is None:
                return None
            used += got[0]
            total -= got[1]
        return total, used

    def keep(self, doc: dict) -> None:
        """Keep a document as the live view's base, unless it is too old."""
        total, used, marks = figures(doc)
        if self.of(total, used, marks) is not None:
            self.total, self.used, self.marks = total, used, marks

    def live(self) -> tuple[int, int]:
        return self.of(self.total, self.used, self.marks) or (self.total, self.used)

    def let_go(self, before: float) -> None:
        for proc, run in self.runs.items():
            mark = self.marks.get(proc, 0)
            gone = run.after(mark)
            upto = run.let_go(before)
            if upto is not None and mark < upto and gone is not None:
                # The kept document is advanced by what the database added.
                left = run.after(upto)
                self.used += gone[0] - left[0]
                self.total -= gone[1] - left[1]
                self.marks[proc] = upto

    def unmarked(self, proc: str) -> None:
        """The document's mark for `proc` was removed, when nothing of it was
        held: any charge here now is one made since, which no document
        counts."""
        run = self.runs.get(proc)
        if run is not None:
            run.floor = 0
            run.applied_at.clear()
        self.marks.pop(proc, None)


def figures(doc: dict) -> tuple[int, int, dict]:
    leases = doc.get("leases") or {}
    return (int(doc.get("quota", 0)) + sum(int(v) for v in leases.values()),
            int(doc.get("used_quota", 0)), dict(doc.get("applied") or {}))
