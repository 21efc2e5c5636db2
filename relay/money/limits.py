"""Rate and concurrency limits per key and per account.

Three limits, each settable on a key (its token document) and on an account
(its user document); 0 or absent means none (models/records.LIMIT_FIELDS):
- rpm_limit: requests per minute;
- tpm_limit: tokens per minute, input plus output as the vendor reports
  them.  A call is admitted while its minute has tokens left; its tokens
  are counted when it ends (the length of an answer is not known before);
- concurrency_limit: calls in flight at once.
A minute is a fixed window of the clock (UTC minute), so "k a minute" means
at most k in each calendar minute, and Retry-After names its end.

Exact across processes, off the hot path.  Like quota (relay/money/leases.py),
permits live in the database, one document per limit and window,
`{_id, left, limit, held.<process>}`, and a process leases them with one
atomic conditional update

    {_id, left >= take}  ->  $inc {left: -take, held.<process>: +take}

then admits calls from its lease in memory: a call within its limits does
not wait for the database, and nothing is counted per process, so N
processes never admit N times the limit.  A lease is a sixteenth of the
limit (at most 256), and the next one is taken in the background when a
quarter is left; when the pool runs low, a process takes exactly one.

Permits one process leased but does not use would make another refuse
calls under the limit.  So a process that finds the pool empty while
others hold permits sets `want` on the document and waits (up to `wait`
seconds, polling); at every flush tick each process gives back its unused
permits of wanted documents and writes how many it holds, so a waiter knows
whether waiting can help.  Only calls at the limit ever wait; the rest of
them get 429 at once until the window ends (or, for concurrency, a tick).

Crashes: a dead process's rate permits die with their minute; its
concurrency slots go back to the pool when billing reclaims the process
(relay/money/processes.py: one registry, one heartbeat and one staleness rule for
quota leases and limit permits alike, so the slots come back with the
quota, within `lease_stale_after`, or at once when the next relay on the
same data directory starts).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from relay.serving.background import cancel_and_wait
from relay.money.permits import CONC, TPM, Bucket, Permits


@dataclass
class Ticket:
    """What one admitted call holds; give it back with Limiter.done()."""
    token_id: int
    user_id: int
    buckets: list


class Limiter(Permits):
    """Admits calls from the permits this process holds (the pool documents
    behind them: relay/money/permits.py)."""

    def __init__(self, store, process_id: str, flush_interval: float = 0.25,
                 wait: float | None = None):
        self.store = store
        self.pid = process_id   # billing's process id (relay/money/processes.py), followed on a fence
        self.flush_interval = flush_interval
        self.wait = wait if wait is not None else max(0.5, 3 * flush_interval)
        self._buckets: dict[tuple, Bucket] = {}
        self._task: asyncio.Task | None = None
        self._bg: set = set()

    # ---- the hot path ---------------------------------------------------------
    async def admit(self, token, user) -> Ticket | None:
        """Take one permit of every limit on the key and the account, or
        raise LimitExceeded (nothing taken).  No await while the leases
        here cover the call."""
        if not (any(token.limits) or any(user.limits)):
            return None
        window = int(time.time() // 60)
        now = time.monotonic()
        taken: list[Bucket] = []
        try:
            for scope, ident, limits in (("token", token.id, token.limits),
                                         ("user", user.id, user.limits)):
                for kind, limit in enumerate(limits):
                    if limit <= 0:
                        continue
                    b = self._bucket(scope, ident, kind, limit, window, now)
                    while b.held < 1:
                        await self._lease(b)
                    # No await from the check to here: the take is atomic.
                    b.held -= 1
                    if kind == CONC:
                        b.busy += 1
                    taken.append(b)
                    if b.held < b.chunk // 4 and not b.refilling and kind != CONC:
                        self._refill(b)
        except BaseException:
            for b in taken:
                b.held += 1
                if b.kind == CONC:
                    b.busy -= 1
            raise
        return Ticket(token.id, user.id, taken)

    def done(self, ticket: Ticket | None, usage=None) -> None:
        """A call ended: free its concurrency slots and count its tokens
        (usage: relay.money.pricing.Usage or None) in the current minute."""
        if ticket is None:
            return
        tokens = (usage.prompt_tokens + usage.completion_tokens) if usage is not None else 0
        window = int(time.time() // 60)
        for b in ticket.buckets:
            if b.kind == CONC:
                b.busy -= 1
                b.held += 1
            elif b.kind == TPM:
                # The admission took one token already.
                cur = self._bucket(b.scope, b.ident, TPM, b.limit, window)
                more = tokens - 1
                if more < 0:
                    if cur is b:
                        b.held += 1
                    continue
                use = min(more, cur.held)
                cur.held -= use
                cur.debt += more - use

    # ---- starting and stopping ------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.flush(release_all=True)

    def fenced(self, old: str, new: str) -> None:
        """Billing was declared dead and carries on as `new`: whoever
        reclaimed `old` gave its slots back, so nothing held here is ours
        any more (calls in flight finish on buckets no longer kept)."""
        self.pid = new
        self._buckets = {}


def install(app) -> None:
    """Give the relay service its limiter, and run its flusher with the app."""
    s = app.settings
    billing = s["billing"]
    limiter = s["limits"] = Limiter(s["store"], billing.pid, s["config"].usage_flush_interval)
    s["service"].limits = limiter
    # One process registry for quota and limits (relay/money/processes.py).
    billing.on_reclaim.append(limiter.reclaim)
    billing.on_fence.append(limiter.fenced)

    async def on_start(_app) -> None:
        limiter.start()

    async def on_stop(_app) -> None:
        await limiter.stop()

    s["on_start"].append(on_start)
    s["on_stop"].append(on_stop)
