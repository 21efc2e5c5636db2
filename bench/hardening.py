"""Issue 31's attacks, measured: what each costs the relay, and whether it works.

    python bench/hardening.py [--root DIR] [--out FILE]

Starts a relay (from --root, default this tree: point it at a checkout of
another commit to compare) on an embedded database with default settings
(registration open, no trusted proxy but the default), fake upstreams and an
SMTP sink on 127.0.0.1, and runs each attack of the issue as a client would.
Prints one JSON object of figures, by the issue's item numbers; timings are
wall-clock on whatever the machine is doing (the load average is printed
with them), memory is the relay's VmRSS from /proc.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from models.embedded import EmbeddedMongo  # noqa: E402
from tests.fakes.mj_upstream import FakeMidjourney  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402
from tests.fakes.smtp_sink import SmtpSink  # noqa: E402
from tests.helpers import USER_PASSWORD, Api, RelayProcess  # noqa: E402

MODEL = "gpt-4o-mini"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pinger:
    """/api/ping, one after another, the whole time; the worst wait is the stall."""

    def __init__(self, base: str):
        self.base = base
        self.times: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        s = requests.Session()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            s.get(self.base + "/api/ping", timeout=120)
            self.times.append(time.perf_counter() - t0)

    def __enter__(self):
        self._t.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def worst_ms(self) -> float:
        return round(max(self.times) * 1000, 1) if self.times else 0.0


def user(admin: Api, base: str, quota: int = 10_000_000) -> tuple[str, Api]:
    name = "b" + uuid.uuid4().hex[:8]
    admin.create_user(name, quota=quota)
    return name, Api.login(base, name, USER_PASSWORD)


# ---- 1 -----------------------------------------------------------------------
def item1(relay: RelayProcess) -> dict:
    pid = relay.proc.pid
    s = requests.Session()
    before = rss_mib(pid)
    statuses: dict = {}
    for i in range(1000):
        key = "sk-" + f"{i:06d}" + "x" * 60_000
        r = s.get(relay.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    after = rss_mib(pid)
    # A 32 MB body announced with a wrong key: answered before it is sent?
    sock = socket.create_connection(("127.0.0.1", relay.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 b"sk-wrong\r\nContent-Type: application/json\r\nContent-Length: 33554000\r\n\r\n"
                 + b"{" * 1000)
    sock.settimeout(3)
    try:
        answered = sock.recv(200).split(b"\r\n")[0].decode()
    except socket.timeout:
        answered = "no answer within 3 s (waiting for the body)"
    sock.close()
    return {"bogus_60kb_keys": 1000, "statuses": statuses, "rss_before_mib": round(before),
            "rss_after_mib": round(after), "rss_growth_mib": round(after - before, 1),
            "unauthenticated_32mb_body": answered}


# ---- 2 -----------------------------------------------------------------------
def item2(relay: RelayProcess, admin: Api) -> dict:
    out: dict = {}
    name, api = user(admin, relay.url)
    tok = api.create_token(name="big", remain_quota=1_000_000)
    entries = "\n".join(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(500_000))
    with Pinger(relay.url) as p:
        t0 = time.perf_counter()
        r = api.s.put(relay.url + "/api/token/", json={"id": tok["id"], "allow_ips": entries})
        out["save_500k_allow_ips"] = {"status": r.status_code,
                                      "seconds": round(time.perf_counter() - t0, 2),
                                      "message": r.json().get("message", "")[:120]}
    out["save_500k_allow_ips"]["ping_worst_ms"] = p.worst_ms()
    with Pinger(relay.url) as p:
        t0 = time.perf_counter()
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {tok['key']}"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        out["next_use"] = {"status": r.status_code, "seconds": round(time.perf_counter() - t0, 2),
                           "ping_worst_ms": 0}
    out["next_use"]["ping_worst_ms"] = p.worst_ms()
    # The most the relay takes now (the bound, if there is one): 256 /24s.
    most = "\n".join(f"10.{i}.{i}.0/24" for i in range(0, 256))
    r = api.s.put(relay.url + "/api/token/", json={"id": tok["id"], "allow_ips": most})
    out["save_256_networks"] = r.status_code
    # Statistics: ten 90-day charts at once.
    with Pinger(relay.url) as p:
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(10) as pool:
            codes = list(pool.map(lambda _: api.s.get(relay.url + "/api/log/self/daily?days=90")
                                  .status_code, range(10)))
        out["daily_90_x10"] = {"statuses": sorted(codes), "seconds":
                               round(time.perf_counter() - t0, 2)}
    out["daily_90_x10"]["ping_worst_ms"] = p.worst_ms()
    r = api.s.get(relay.url + "/api/log/self/daily?days=1000")
    out["daily_1000_days"] = r.status_code
    codes = [api.s.get(relay.url + "/api/user/self").status_code for _ in range(700)]
    out["api_700_quick_calls"] = {c: codes.count(c) for c in set(codes)}
    return out


def item2k(relay: RelayProcess, admin: Api) -> dict:
    """Keys one account may make (the /api rate limit off, so only the cap counts)."""
    out: dict = {}
    name, api = user(admin, relay.url)
    n = 0
    for i in range(1100):
        r = api.s.post(relay.url + "/api/token/", json={"name": f"k{i}"})
        if r.status_code != 200:
            break
        n += 1
    out["keys_created_of_1100"] = n
    return out


# ---- 3 -----------------------------------------------------------------------
def item3(relay: RelayProcess, admin: Api) -> dict:
    out: dict = {}
    victim = "v" + uuid.uuid4().hex[:8]
    admin.create_user(victim)
    r = requests.post(relay.url + "/api/user/register",
                      json={"username": victim.upper(), "password": USER_PASSWORD})
    out["register_uppercase_twin"] = r.status_code
    # 30 concurrent guesses at a fresh account
    target = "w" + uuid.uuid4().hex[:8]
    admin.create_user(target)

    def guess(i):
        return requests.post(relay.url + "/api/user/login",
                             json={"username": target, "password": f"wrong-{i}"}).status_code
    with cf.ThreadPoolExecutor(30) as pool:
        codes = list(pool.map(guess, range(30)))
    out["concurrent_guesses_30"] = {c: codes.count(c) for c in set(codes)}
    return out


def item3b(relay: RelayProcess, admin: Api) -> dict:
    """A flood of sign-ins to names that do not exist, and one real sign-in meanwhile."""
    out: dict = {}
    owner = "o" + uuid.uuid4().hex[:8]
    admin.create_user(owner)

    def flood(i):
        # From as many addresses (a trusted proxy says so): the per-address
        # count does not stop it, only the password pool's bound can.
        return requests.post(relay.url + "/api/user/login",
                             json={"username": f"nobody{i}-{uuid.uuid4().hex[:6]}",
                                   "password": "whatever-it-is"},
                             headers={"X-Forwarded-For": f"198.18.{i // 250}.{i % 250 + 1}"}
                             ).status_code
    with cf.ThreadPoolExecutor(60) as pool:
        futs = [pool.submit(flood, i) for i in range(120)]
        time.sleep(0.3)
        t0 = time.perf_counter()
        r = requests.post(relay.url + "/api/user/login",
                          json={"username": owner, "password": USER_PASSWORD},
                          headers={"X-Forwarded-For": "192.0.2.77"})
        legit = round(time.perf_counter() - t0, 2)
        codes = [f.result() for f in futs]
    out["login_flood_120"] = {"statuses": {c: codes.count(c) for c in set(codes)},
                              "owner_status": r.status_code, "owner_seconds": legit}
    return out


# ---- 4 -----------------------------------------------------------------------
def item4(relay: RelayProcess, admin: Api, smtp: SmtpSink) -> dict:
    out: dict = {}
    name, api = user(admin, relay.url)
    r = api.s.put(relay.url + "/api/user/self", json={"email": "ceo@victim-corp.example"})
    out["set_email_status"] = r.status_code
    out["email_now"] = api.get("/api/user/self")["data"]["email"]
    api.create_token(name="Reset now at https://evil.example/r", remain_quota=10)
    sub = api.s.post(relay.url + "/api/subscription/", json={
        "name": "m", "event_types": ["key_quota_warning"], "key_threshold": 1000,
        "channel_type": "email", "channel_config": {}})
    sid = sub.json().get("data", {}).get("id") if sub.status_code == 200 else None
    sent = 0
    codes = []
    for _ in range(10):
        if sid is None:
            break
        r = api.s.post(relay.url + f"/api/subscription/{sid}/test")
        codes.append(r.status_code)
        sent += bool(r.status_code == 200 and r.json()["data"].get("ok"))
    out["test_sends_of_10"] = {"ok": sent, "statuses": {c: codes.count(c) for c in set(codes)}}
    time.sleep(0.5)
    mails = [m["message"] for m in smtp.messages if any("victim-corp" in t for t in m["to"])]
    out["mails_to_victim"] = len(mails)
    out["subjects_to_victim"] = sorted({str(m["Subject"]) for m in mails})
    out["test_subjects"] = sorted({str(m["message"]["Subject"]) for m in smtp.messages
                                   if "[Test]" in str(m["message"]["Subject"])})
    r = api.s.post(relay.url + "/api/subscription/", json={
        "name": "p", "event_types": ["announcement"], "channel_type": "personal_push",
        "channel_config": {"vendor": "wxpusher", "uid": "UID_someone_else"}})
    out["personal_push_uid_set_directly"] = (r.status_code == 200 and r.json()["data"]
                                             ["channel_config"].get("uid") == "UID_someone_else")
    return out


# ---- 5 -----------------------------------------------------------------------
def item5(relay: RelayProcess, admin: Api, mj: FakeMidjourney) -> dict:
    out: dict = {}
    name, api = user(admin, relay.url)
    key = api.create_token(name="mj", remain_quota=5_000_000)["key"]

    def task(image_type: str, image_url: str | None = None) -> str:
        mj.image_type, mj.image_url = image_type, image_url
        tid = requests.post(relay.url + "/mj/submit/imagine", json={"prompt": "a cat"},
                            headers={"mj-api-secret": key}).json()["result"]
        for _ in range(100):
            t = requests.get(relay.url + f"/mj/task/{tid}/fetch",
                             headers={"mj-api-secret": key}).json()
            if t.get("status") == "SUCCESS":
                break
            time.sleep(0.2)
        return tid
    mj.image_body = b"<html><script>alert(document.cookie)</script></html>"
    tid = task("text/html")
    r = requests.get(relay.url + f"/mj/image/{tid}")
    out["html_image_without_key"] = {"status": r.status_code,
                                     "content_type": r.headers.get("Content-Type"),
                                     "csp": r.headers.get("Content-Security-Policy")}
    # An imageUrl pointing at a loopback service that is not the channel.
    secret = FakeOpenAI().start()
    try:
        tid = task("image/png", secret.url + "/v1/models")
        r = requests.get(relay.url + f"/mj/image/{tid}", headers={"mj-api-secret": key})
        out["loopback_image_url"] = {"status": r.status_code,
                                     "fetched": any(q["path"].endswith("/models")
                                                    for q in secret.requests)}
    finally:
        secret.stop()
    mj.image_type, mj.image_url = "image/png", None
    return out


# ---- 6 -----------------------------------------------------------------------
def item6(relay: RelayProcess, admin: Api, fake: FakeOpenAI) -> dict:
    out: dict = {}
    secret = "sk-" + uuid.uuid4().hex + "SECRETKEY"
    requests.get(relay.url + f"/v1beta/models?key={secret}")
    time.sleep(0.3)
    out["key_in_access_log"] = secret in relay.log()
    name, api = user(admin, relay.url)
    key = api.create_token(name="e", remain_quota=1_000_000)["key"]
    leaks = {}
    for model in ("leak-429", "leak-400"):
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": model, "messages": [{"role": "user", "content": "x"}]})
        msg = r.json()["error"]["message"]
        leaks[model] = {"status": r.status_code,
                        "leaks": sorted(set(re.findall(r"org-\w+|proj_\w+|sk-[\w-]+|AKIA\w+|AIza"
                                                       r"[\w-]+", msg)))}
    out["upstream_errors"] = leaks
    return out


# ---- 7 and 8 -----------------------------------------------------------------
def item7(relay: RelayProcess, admin: Api, fake: FakeOpenAI) -> dict:
    out: dict = {}
    name, api = user(admin, relay.url)
    r = requests.post(relay.url + "/api/user/login", data=json.dumps(
        {"username": name, "password": USER_PASSWORD}), headers={"Content-Type": "text/plain"})
    out["login_as_text_plain"] = r.status_code
    sub_admin = "a" + uuid.uuid4().hex[:8]
    u = admin.create_user(sub_admin)
    admin.post("/api/user/manage", {"id": u["id"], "action": "promote"})
    a2 = Api.login(relay.url, sub_admin, USER_PASSWORD)
    r = a2.s.post(relay.url + "/api/user/1/quota", json={"amount": 1, "reason": "x"})
    out["admin_debits_root"] = r.status_code
    ssrf = {}
    for host in ("[64:ff9b::7f00:1]", "[2002:7f00:1::]", "[::127.0.0.1]", "[fec0::1]"):
        r = api.s.post(relay.url + "/api/subscription/", json={
            "name": "w", "event_types": ["announcement"], "channel_type": "webhook",
            "channel_config": {"url": f"http://{host}:9/hook"}})
        ssrf[host] = r.status_code
    out["webhook_to"] = ssrf
    r = api.s.post(relay.url + "/api/subscription/", json={
        "name": "w", "event_types": ["announcement"], "channel_type": ["email"],
        "channel_config": {}})
    out["channel_type_list"] = r.status_code
    tok = api.create_token(name="inv", remain_quota=10)
    for i in range(200):
        api.put("/api/token/", {"id": tok["id"], "name": f"n{i}"})
    for i in range(100):
        requests.post(relay.url + "/api/user/login",
                      json={"username": f"ghost{uuid.uuid4().hex[:8]}", "password": "x" * 9})
    from pymongo import MongoClient
    db = MongoClient(relay.mongo_url)[relay.db_name]
    out["invalidations_docs"] = db.invalidations.count_documents({})
    out["login_failures_docs"] = db.login_failures.count_documents({})
    # X-Real-IP (set by the proxy) against the client's own X-Forwarded-For
    key = api.create_token(name="ip", remain_quota=1_000_000, allow_ips="203.0.113.7")["key"]
    r = requests.post(relay.url + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {key}", "X-Real-IP": "198.51.100.9",
                               "X-Forwarded-For": "203.0.113.7"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    out["client_xff_beats_x_real_ip"] = r.status_code == 200
    return out


def item8(relay: RelayProcess, admin: Api) -> dict:
    name, _ = user(admin, relay.url)
    r = requests.post(relay.url + "/api/user/login", headers={"X-Forwarded-Proto": "https"},
                      json={"username": name, "password": USER_PASSWORD})
    return {"secure_cookie_behind_loopback_proxy": "; secure" in r.headers.get("Set-Cookie",
                                                                              "").lower()}


# Item 7 compares X-Real-IP with X-Forwarded-For from a proxy the relay trusts.
ENV = {"7": {"RELAY_TRUSTED_PROXIES": "127.0.0.1"}, "3b": {"RELAY_TRUSTED_PROXIES": "127.0.0.1"},
       "2k": {"RELAY_API_RATE_LIMIT": "0"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=ROOT, help="the source tree whose server.py to run")
    ap.add_argument("--out", default="", help="also write the figures to this file")
    ap.add_argument("--items", default="1,2,2k,3,3b,4,5,6,7,8")
    args = ap.parse_args()
    runs = {"1": lambda r, a: item1(r), "2": item2, "2k": item2k, "3": item3, "3b": item3b,
            "4": lambda r, a: item4(r, a, smtp), "5": lambda r, a: item5(r, a, mj),
            "6": lambda r, a: item6(r, a, fake), "7": lambda r, a: item7(r, a, fake),
            "8": item8}
    figures: dict = {"root": args.root, "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        db = EmbeddedMongo(os.path.join(tmp, "db"))
        url = db.start()
        fake, mj, smtp = FakeOpenAI(record=True).start(), FakeMidjourney().start(), SmtpSink()
        smtp.start()
        try:
            # A relay of its own for each item: sign-in failures of one must
            # not throttle the next (every client here is 127.0.0.1).
            for n in args.items.split(","):
                relay = RelayProcess(url, os.path.join(tmp, "relay" + n), script=os.path.join(
                    args.root, "server.py"), env={
                    "RELAY_ALLOW_PRIVATE_WEBHOOKS": "false", "RELAY_SMTP_HOST": "127.0.0.1",
                    "RELAY_SMTP_PORT": str(smtp.port), "RELAY_SMTP_TLS": "none",
                    "RELAY_MJ_POLL_INTERVAL": "0.2", **ENV.get(n, {})}).start()
                try:
                    admin = Api.login(relay.url)
                    admin.create_channel(fake.url, [MODEL], name="ok")
                    admin.create_channel(fake.mode_url("429org"), ["leak-429"], name="l429")
                    admin.create_channel(fake.mode_url("400key"), ["leak-400"], name="l400")
                    admin.create_channel(mj.url, ["mj_imagine"], name="mj", type="midjourney",
                                         key=mj.secret)
                    for m in (MODEL, "leak-429", "leak-400"):
                        admin.set_price(m, input_price=1, output_price=2)
                    admin.set_price("mj_imagine", call_price="0.05")
                    figures[n] = runs[n](relay, admin)
                except Exception as exc:  # a probe the tree cannot run is a figure too
                    figures[n] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                finally:
                    relay.stop()
                print(n, json.dumps(figures[n]), flush=True)
        finally:
            fake.stop()
            mj.stop()
            smtp.stop()
            db.stop()
    figures["load_average_after"] = os.getloadavg()
    print(json.dumps(figures, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
