"""Shared parts of the money tests: a tenant with a key, a load of
streaming and non-streaming calls in parallel threads, and the books read
straight from the database."""
from __future__ import annotations

import json
import os
import threading
import time

import requests
from pymongo import MongoClient

from tests.helpers import USER_PASSWORD, Api

MODEL = "gpt-4o-mini"
PRICE = 500           # units per call: a per-call key at $0.001
KEY_QUOTA = 50_000_000
USER_QUOTA = 80_000_000


def setup_tenant(relay, fake, key_quota: int = KEY_QUOTA, user_quota: int = USER_QUOTA):
    admin = Api.login(relay.url)
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=1, call_price=0.001)
    user = admin.create_user("payer", quota=user_quota)
    api = Api.login(relay.url, "payer", USER_PASSWORD)
    tok = api.create_token(name="load", remain_quota=key_quota, billing_mode="per_call")
    return {"admin": admin, "api": api, "user": user, "token": tok,
            "key_quota": key_quota, "user_quota": user_quota}


class Load:
    """Parallel callers on one key; every 200 is noted with its request id
    and the wall time its whole answer had arrived."""

    def __init__(self, url: str, key: str, threads: int = 6):
        self.url, self.key, self.threads = url, key, threads
        self.ok: list[tuple[str, float]] = []
        self.other: list[int] = []
        self.why: list[str] = []  # the other answers' bodies, for a failure's message
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def _run(self, n: int) -> None:
        s = requests.Session()
        stream = n % 2 == 1
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        if stream:
            body["fake_chunks"] = 4
        while not self._stop.is_set():
            try:
                r = s.post(self.url + "/v1/chat/completions", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {self.key}"})
                done = time.time()
            except requests.RequestException:
                time.sleep(0.02)
                continue
            with self.lock:
                if r.status_code == 200 and (not stream or b"[DONE]" in r.content):
                    self.ok.append((r.headers["X-Request-Id"], done))
                else:
                    self.other.append(r.status_code)
                    self.why.append(r.text[:300])

    def start(self) -> "Load":
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(self.threads)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)


def database_of(data_dir: str) -> str:
    """The embedded database's URL, as the relay holding `data_dir` wrote it."""
    with open(os.path.join(data_dir, "relay.lock")) as fh:
        return json.load(fh)["database"]


def books(db, env) -> dict:
    """Everything the invariants need, from the database itself."""
    u = db.users.find_one({"_id": env["user"]["id"]})
    t = db.tokens.find_one({"_id": env["token"]["id"]})

    def remain(d):
        return int(d.get("quota", 0)) + sum(int(v) for v in (d.get("leases") or {}).values())
    recs = list(db.usage.find({"user_id": env["user"]["id"]}, {"quota": 1, "token_id": 1}))
    # The rollups the flusher keeps of the same records (relay/money/rollups.py).
    rolled = list(db.usage_day_keys.find({"user_id": env["user"]["id"]}, {"n": 1, "q": 1}))
    return {"user_remain": remain(u), "user_used": int(u.get("used_quota", 0)),
            "rolled_records": sum(int(r.get("n") or 0) for r in rolled),
            "rolled_quota": sum(int(r.get("q") or 0) for r in rolled),
            "key_remain": remain(t), "key_used": int(t.get("used_quota", 0)),
            "user_records": sum(int(r["quota"]) for r in recs),
            "key_records": sum(int(r["quota"]) for r in recs if r.get("token_id") == t["_id"]),
            "ids": {r["_id"] for r in recs}, "leases": {**(u.get("leases") or {}),
                                                         **(t.get("leases") or {})}}


def assert_books(b: dict, env) -> None:
    assert b["key_remain"] + b["key_used"] == env["key_quota"], b
    assert b["user_remain"] + b["user_used"] == env["user_quota"], b
    assert b["key_used"] == b["key_records"], b
    assert b["user_used"] == b["user_records"], b
    # and the rollups hold each record once, crash or not, whichever relay applied it
    assert (b["rolled_records"], b["rolled_quota"]) == (len(b["ids"]), b["user_records"]), b


def client(url: str):
    return MongoClient(url, serverSelectionTimeoutMS=10000)


def record(env, rid: str) -> dict:
    """The usage record of request `rid`, as the user's log shows it once applied."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for r in env["api"].get("/api/log/self?size=100")["data"]["items"]:
            if r["request_id"] == rid:
                return r
        time.sleep(0.1)
    raise AssertionError(f"no usage record for {rid}")
