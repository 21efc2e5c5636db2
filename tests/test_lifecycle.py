"""The process: embedded database lifecycle, restart persistence, kill -9,
graceful shutdown on SIGTERM, first-start admin."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.helpers import ROOT, Api, RelayProcess, eventually, free_port, wait_port

MODEL = "gpt-4o-mini"


def _children(pid):
    """Child pids, read from /proc (no `ps`: procps may be missing)."""
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:  # not a process, or gone meanwhile
            continue
        # The command name (field 2) may hold spaces; ppid follows the ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return kids


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "X"
    return state != "Z"


def _setup(relay, fake, quota=10_000_000):
    admin = Api.login(relay.url)
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=1, call_price=0.001)
    me = admin.get("/api/user/self")["data"]
    admin.post(f"/api/user/{me['id']}/quota", {"amount": quota, "reason": "test"})
    tok = admin.create_token(name="p", remain_quota=quota, billing_mode="per_call")
    return admin, tok


def _chat(relay, key, **kw):
    return requests.post(relay.url + "/v1/chat/completions",
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw})


@pytest.mark.slow
def test_embedded_database_survives_kill9_and_restart(tmp_path, fake):
    data = str(tmp_path / "data")
    relay = RelayProcess("", data).start()  # embedded database
    admin, tok = _setup(relay, fake)
    for _ in range(3):
        assert _chat(relay, tok["key"]).status_code == 200
    time.sleep(0.6)  # one flush
    db_children = _children(relay.proc.pid)
    assert db_children, "the embedded database should be a child process"
    relay.kill9()
    for _ in range(50):  # the database follows its parent
        if not any(_alive(p) for p in db_children):
            break
        time.sleep(0.1)
    assert not any(_alive(p) for p in db_children)
    # a pid file left by a crash (here naming a live process that is not our
    # database: pids get reused) must not block the next start, nor kill that process
    with open(os.path.join(data, "db", "nx-27017.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    relay2 = RelayProcess("", data, db_name=relay.db_name).start()
    try:
        admin2 = Api.login(relay2.url)
        t = admin2.get(f"/api/token/{tok['id']}")["data"]
        assert t["used_quota"] == 1500 and t["remain_quota"] == 10_000_000 - 1500
        assert _chat(relay2, tok["key"]).status_code == 200
        def four_records():
            assert admin2.get("/api/log/self")["data"]["total"] == 4
        eventually(four_records)
        # both die hard this time: the database first, then the relay
        for pid in _children(relay2.proc.pid):
            os.kill(pid, signal.SIGKILL)
        relay2.kill9()
        relay3 = RelayProcess("", data, db_name=relay.db_name).start()
        try:
            t = Api.login(relay3.url).get(f"/api/token/{tok['id']}")["data"]
            assert t["used_quota"] == 2000
        finally:
            relay3.stop()
    finally:
        relay2.stop()


def test_restart_persists_everything(mongo_url, tmp_path, fake):
    relay = RelayProcess(mongo_url, str(tmp_path / "a")).start()
    admin, tok = _setup(relay, fake)
    for _ in range(4):
        assert _chat(relay, tok["key"]).status_code == 200
    assert relay.stop() == 0  # SIGTERM: flush and give leases back
    relay2 = RelayProcess(mongo_url, str(tmp_path / "b"), db_name=relay.db_name).start()
    try:
        admin2 = Api.login(relay2.url)
        t = admin2.get(f"/api/token/{tok['id']}")["data"]
        assert (t["remain_quota"], t["used_quota"]) == (10_000_000 - 2000, 2000)
        me = admin2.get("/api/user/self")["data"]
        assert (me["quota"], me["used_quota"]) == (10_000_000 - 2000, 2000)
        assert admin2.get("/api/log/self")["data"]["total"] == 4
        assert _chat(relay2, tok["key"]).status_code == 200
    finally:
        relay2.stop()


def test_kill9_leases_return_and_balances_stay_consistent(mongo_url, tmp_path, fake):
    relay = RelayProcess(mongo_url, str(tmp_path / "a")).start()
    admin, tok = _setup(relay, fake)
    for _ in range(4):
        assert _chat(relay, tok["key"]).status_code == 200
    time.sleep(0.8)
    relay.kill9()
    relay2 = RelayProcess(mongo_url, str(tmp_path / "b"), db_name=relay.db_name).start()
    try:
        admin2 = Api.login(relay2.url)
        t = admin2.get(f"/api/token/{tok['id']}")["data"]
        # what people see is right at once, leases included
        assert t["remain_quota"] + t["used_quota"] == 10_000_000
        logs = admin2.get("/api/log/self")["data"]
        assert logs["totals"]["quota"] == t["used_quota"]
    finally:
        relay2.stop()


def test_sigterm_lets_a_running_stream_finish(mongo_url, tmp_path, fake):
    relay = RelayProcess(mongo_url, str(tmp_path / "a")).start()
    admin, tok = _setup(relay, fake)
    result = {}

    def stream():
        r = _chat(relay, tok["key"], stream=True, fake_chunks=8, fake_delay=0.25)
        result["status"] = r.status_code
        result["body"] = r.content

    th = threading.Thread(target=stream)
    th.start()
    time.sleep(0.8)
    relay.proc.send_signal(signal.SIGTERM)
    th.join(20)
    assert result.get("status") == 200
    assert result["body"].rstrip().endswith(b"data: [DONE]")
    assert relay.stop() == 0
    # new connections are refused once stopping began
    relay2 = RelayProcess(mongo_url, str(tmp_path / "b"), db_name=relay.db_name).start()
    try:
        logs = Api.login(relay2.url).get("/api/log/self")["data"]
        assert logs["total"] == 1 and logs["items"][0]["status"] == 200
    finally:
        relay2.stop()


def test_first_start_prints_generated_password_once(mongo_url, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RELAY_ADMIN_PASSWORD"}
    cmd = [sys.executable, os.path.join(ROOT, "server.py"), "--host", "127.0.0.1", "--port",
           str(port), "--mongo-url", mongo_url, "--db-name", "first_" + str(port),
           "--data-dir", str(tmp_path)]
    out = open(tmp_path / "out.log", "w+")
    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    wait_port(port, p)
    p.send_signal(signal.SIGTERM)
    p.wait(20)
    text = open(tmp_path / "out.log").read()
    line = next(l for l in text.splitlines() if "password:" in l)
    password = line.split("password:")[1].strip()
    assert text.count(password) == 1
    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    wait_port(port, p)
    try:
        r = requests.post(f"http://127.0.0.1:{port}/api/user/login",
                          json={"username": "root", "password": password}, timeout=30)
        # A printed password is replaced at the first sign-in.
        assert r.status_code == 200 and r.json()["data"]["must_change_password"] is True
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
    assert open(tmp_path / "out.log").read().count(password) == 1


def test_usage_retention_prunes_old_records(mongo_url, tmp_path):
    from pymongo import MongoClient
    relay = RelayProcess(mongo_url, str(tmp_path), args=["--usage-retention-days", "7"])
    db = MongoClient(mongo_url)[relay.db_name]
    now = time.time()
    db.usage.insert_many([{"_id": "old", "user_id": 1, "quota": 1, "created_at": now - 8 * 86400},
                          {"_id": "new", "user_id": 1, "quota": 1, "created_at": now - 6 * 86400}])
    relay.start()
    try:
        eventually(lambda: _assert_ids(db, {"new"}))
    finally:
        relay.stop()


def _assert_ids(db, ids):
    assert {d["_id"] for d in db.usage.find({})} == ids
