"""What the tests of money across relays share: three relay processes on
one database, a round-robin client in front of them (as a load balancer),
every call noted with when it was sent and when its answer was whole, and
the books read from the database."""
from __future__ import annotations

import itertools
import threading
import time

import requests

from tests.helpers import RelayProcess, eventually
from tests.relay.money.money_env import MODEL


def start_relays(mongo_url: str, tmp_path, n: int = 3, args=(), extra: dict | None = None
                 ) -> list[RelayProcess]:
    """n relays on one database; `extra` maps an index to RelayProcess
    keyword arguments of its own (another --mongo-url, script or env)."""
    relays: list[RelayProcess] = []
    for i in range(n):
        kw = dict((extra or {}).get(i, {}))
        url = kw.pop("mongo_url", mongo_url)
        kw["args"] = list(args) + list(kw.get("args", []))
        db_name = relays[0].db_name if relays else None
        relays.append(RelayProcess(url, str(tmp_path / f"r{i}"), db_name=db_name, **kw).start())
    return relays


def stop_relays(relays) -> list[int]:
    return [r.stop() for r in relays]


def chat(url: str, key: str, stream: bool = False, timeout: float = 30):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if stream:
        body["fake_chunks"] = 3
    return requests.post(url + "/v1/chat/completions", json=body, timeout=timeout,
                         headers={"Authorization": f"Bearer {key}"})


def served_everywhere(relays, key: str) -> None:
    """Each relay answers the key (it has learnt of the channel and price)."""
    for r in relays:
        eventually(lambda r=r: _ok(r.url, key), timeout=10)


def _ok(url, key):
    assert chat(url, key).status_code == 200


class Call:
    __slots__ = ("url", "key", "stream", "sent", "done", "status", "code", "rid")

    def __init__(self, url, key, stream):
        self.url, self.key, self.stream = url, key, stream
        self.sent = self.done = 0.0
        self.status, self.code, self.rid = 0, "", ""


class RoundRobin:
    """Callers sharing one rotation over (relay, key) pairs, streams and
    plain calls in turn; `calls` holds every answered call."""

    def __init__(self, urls, keys, threads: int = 6):
        self.targets = itertools.cycle([(u, k) for k in keys for u in urls])
        self.turn = itertools.count()
        self.threads = threads
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self.limit: int | None = None   # calls left to make; None: until stopped

    def _next(self):
        with self.lock:
            if self.limit is not None:
                if self.limit <= 0:
                    return None
                self.limit -= 1
            url, key = next(self.targets)
            return Call(url, key, next(self.turn) % 2 == 1)

    def _run(self) -> None:
        s = requests.Session()
        while not self._stop.is_set():
            c = self._next()
            if c is None:
                return
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "stream": c.stream}
            if c.stream:
                body["fake_chunks"] = 3
            c.sent = time.time()
            try:
                r = s.post(c.url + "/v1/chat/completions", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {c.key}"})
            except requests.RequestException:   # a relay killed under load
                time.sleep(0.02)
                continue
            c.done = time.time()
            c.status, c.rid = r.status_code, r.headers.get("X-Request-Id", "")
            if r.status_code == 200 and c.stream and b"[DONE]" not in r.content:
                c.status = -1   # a stream cut short
            if r.status_code != 200:
                try:
                    c.code = r.json()["error"].get("code", "")
                except (ValueError, KeyError, AttributeError):
                    c.code = r.text[:200]
            with self.lock:
                self.calls.append(c)

    def run(self, n: int) -> list[Call]:
        """Make exactly n calls and return them."""
        self.limit = n
        self.start()
        for t in self._workers:
            t.join(120)
        return self.calls

    def start(self) -> "RoundRobin":
        self._stop.clear()
        self._workers = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(self.threads)]
        for t in self._workers:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(60)

    def ok(self) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.status == 200]


def remain(doc: dict) -> int:
    return int(doc.get("quota", 0)) + sum(int(v) for v in (doc.get("leases") or {}).values())


def balance_books(db, kind: str, ident: int) -> dict:
    """A balance from the database: remaining, used, the sum of its records'
    charges and what was put in (its ledger, plus the first grant)."""
    coll = db.users if kind == "user" else db.tokens
    doc = coll.find_one({"_id": ident})
    field = "user_id" if kind == "user" else "token_id"
    records = sum(int(r.get("quota") or 0) for r in db.usage.find({field: ident}, {"quota": 1}))
    ledger = sum(int(e.get("amount") or 0) for e in db.ledger.find(
        {"kind": kind, "subject": ident}, {"amount": 1}))
    return {"remain": remain(doc), "used": int(doc.get("used_quota", 0)), "records": records,
            "ledger": ledger, "leases": dict(doc.get("leases") or {})}


def settled(db, kind: str, ident: int, timeout: float = 10.0) -> dict:
    """The books once every charge is applied (used == records, steady)."""
    def check():
        b = balance_books(db, kind, ident)
        assert b["used"] == b["records"], b
        return b
    eventually(check, timeout=timeout)
    time.sleep(0.6)   # one more flush interval: nothing still on its way
    return eventually(check, timeout=timeout)
