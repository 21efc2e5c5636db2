"""Accounts that can be recovered: changing one's own password, an
administrator's reset (the user must then choose a new password, enforced
on the API, the console pages and the websocket chat), and recovering a
lost root password from the machine with `server.py --reset-admin-password`
against the embedded database (stopped, or through a live relay's) and
against a database URL."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import requests
from pymongo import MongoClient

from tests.helpers import ADMIN_PASSWORD, ROOT, USER_PASSWORD, Api, RelayProcess, children

NEW = "Tangerine-Harbor-71"
NEWER = "Quiet-Lantern-Orbit-9"


def login(base: str, username: str, password: str) -> tuple[requests.Session, dict]:
    s = requests.Session()
    r = s.post(base + "/api/user/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    s.headers["X-CSRF-Token"] = data["csrf_token"]
    return s, data


def test_own_password_change_asks_for_the_current_one(relay, admin):
    admin.create_user("rhea")
    s, data = login(relay.url, "rhea", USER_PASSWORD)
    assert data["must_change_password"] is False
    url = relay.url + "/api/user/self"
    r = s.put(url, json={"original_password": "wrong-one", "password": NEW})
    assert r.status_code == 403 and "current password is wrong" in r.json()["message"]
    r = s.put(url, json={"password": NEW})
    assert r.status_code == 403
    r = s.put(url, json={"original_password": USER_PASSWORD, "password": "short"})
    assert r.status_code == 400 and "8 characters" in r.json()["message"]
    r = s.put(url, json={"original_password": USER_PASSWORD, "password": USER_PASSWORD})
    assert r.status_code == 400 and "differ" in r.json()["message"]
    r = s.put(url, json={"original_password": USER_PASSWORD, "password": NEW})
    assert r.status_code == 200 and r.json()["message"] == "Password changed."
    assert requests.post(relay.url + "/api/user/login",
                         json={"username": "rhea", "password": USER_PASSWORD}).status_code == 401
    login(relay.url, "rhea", NEW)


def test_admin_reset_forces_a_new_password_before_anything_else(relay, admin, mongo_url):
    sessions = MongoClient(mongo_url)[relay.db_name].sessions
    user = admin.create_user("sven")
    old, _ = login(relay.url, "sven", USER_PASSWORD)
    token_api = Api.login(relay.url, "sven", USER_PASSWORD)
    assert sessions.count_documents({"uid": user["id"]}) == 2
    reset = admin.post(f"/api/user/{user['id']}/password")["data"]
    temp = reset["password"]
    assert reset["username"] == "sven" and len(temp) >= 16
    # The reset ends the user's sessions (gone from the database, in every
    # process) and access token.
    assert sessions.count_documents({"uid": user["id"]}) == 0
    assert old.get(relay.url + "/api/user/self").status_code == 401
    assert token_api.get("/api/user/self", expect=401)
    assert requests.post(relay.url + "/api/user/login",
                         json={"username": "sven", "password": USER_PASSWORD}).status_code == 401

    s, data = login(relay.url, "sven", temp)
    assert data["must_change_password"] is True
    # Only the own account answers until the password is changed.
    r = s.get(relay.url + "/api/token/")
    assert r.status_code == 403 and "new password" in r.json()["message"]
    assert s.post(relay.url + "/api/token/", json={"name": "x"}).status_code == 403
    assert s.get(relay.url + "/api/log/self").status_code == 403
    assert s.get(relay.url + "/api/user/self").json()["data"]["must_change_password"] is True
    page = s.get(relay.url + "/console/keys", allow_redirects=False)
    assert page.status_code == 302
    assert page.headers["Location"] == "/console/account?next=/console/keys"
    assert s.get(relay.url + "/console/account", allow_redirects=False).status_code == 200
    # Signing out, here or everywhere, and the session list still work.
    assert s.get(relay.url + "/api/user/sessions").status_code == 200
    elsewhere, _ = login(relay.url, "sven", temp)
    r = elsewhere.post(relay.url + "/api/user/logout", json={"everywhere": True})
    assert r.status_code == 200, r.text
    assert s.get(relay.url + "/api/user/self").status_code == 401
    s, _ = login(relay.url, "sven", temp)
    # Keeping the temporary password is not choosing a new one.
    r = s.put(relay.url + "/api/user/self", json={"original_password": temp, "password": temp})
    assert r.status_code == 400
    r = s.put(relay.url + "/api/user/self", json={"original_password": temp, "password": NEW})
    assert r.status_code == 200 and r.json()["data"]["must_change_password"] is False
    s.headers["X-CSRF-Token"] = s.cookies["csrf_token"]  # the session was renewed
    assert s.get(relay.url + "/api/token/").status_code == 200
    assert s.get(relay.url + "/console/keys", allow_redirects=False).status_code == 200


def test_admin_sets_a_password_the_user_must_replace(relay, admin):
    user = admin.create_user("tove")
    before, _ = login(relay.url, "tove", USER_PASSWORD)
    admin.put("/api/user/", {"id": user["id"], "password": "short"}, expect=400)
    admin.put("/api/user/", {"id": user["id"], "password": "password123"}, expect=400)
    admin.put("/api/user/", {"id": user["id"], "password": NEW})
    assert before.get(relay.url + "/api/user/self").status_code == 401
    _, data = login(relay.url, "tove", NEW)
    assert data["must_change_password"] is True
    me = admin.get("/api/user/self")["data"]
    admin.put("/api/user/", {"id": me["id"], "password": NEWER}, expect=400)  # own: account page
    admin.post(f"/api/user/{me['id']}/password", expect=400)


def test_only_a_higher_rank_may_reset(relay, admin):
    admin.create_user("ulla")
    other = admin.create_user("vera")
    ulla = Api.login(relay.url, "ulla", USER_PASSWORD)
    ulla.post(f"/api/user/{other['id']}/password", expect=403)
    root_id = admin.get("/api/user/self")["data"]["id"]
    admin.post("/api/user/manage", {"id": ulla.get("/api/user/self")["data"]["id"],
                                    "action": "promote"})
    ulla.post(f"/api/user/{root_id}/password", expect=403)
    ulla.post("/api/user/99999/password", expect=404)


def run_reset(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return subprocess.run([sys.executable, os.path.join(ROOT, "server.py"),
                           "--reset-admin-password", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def reset_cli(*args: str) -> str:
    out = run_reset(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"New password for the administrator 'root': (\S+)", out.stdout)
    assert m, out.stdout
    return m.group(1)


@pytest.mark.slow
def test_reset_admin_password_with_the_embedded_database(tmp_path):
    data = str(tmp_path / "data")
    first = reset_cli("--data-dir", data)  # no database yet: creates root
    second = reset_cli("--data-dir", data)
    assert first != second
    # The relay on that data directory; RELAY_ADMIN_PASSWORD (set by the
    # test helper) differs from root's password now: ignored, with a warning.
    proc = RelayProcess("", data, db_name="relay").start()
    try:
        assert requests.post(proc.url + "/api/user/login",
                             json={"username": "root", "password": first}).status_code == 401
        assert requests.post(proc.url + "/api/user/login",
                             json={"username": "root", "password": ADMIN_PASSWORD}
                             ).status_code == 401
        s, data_ = login(proc.url, "root", second)
        assert data_["must_change_password"] is True
        assert s.get(proc.url + "/api/user/").status_code == 403
        assert "RELAY_ADMIN_PASSWORD" in proc.log() and "--reset-admin-password" in proc.log()
    finally:
        proc.stop()


@pytest.mark.slow
def test_reset_admin_password_while_a_relay_runs_on_the_embedded_database(tmp_path):
    """The live relay holds the data directory (models/datadir.py): the reset
    goes through that relay's database, named in the lock, and starts no
    second database on the directory."""
    data = str(tmp_path / "data")
    proc = RelayProcess("", data, db_name="relay").start()
    try:
        lock = open(os.path.join(data, "relay.lock")).read()
        db_pids = children(proc.proc.pid)
        session, _ = login(proc.url, "root", ADMIN_PASSWORD)
        password = reset_cli("--data-dir", data, "--db-name", "relay")
        assert session.get(proc.url + "/api/user/self").status_code == 401
        s, data_ = login(proc.url, "root", password)
        assert data_["must_change_password"] is True
        # the relay, its database and its lock are as they were
        assert children(proc.proc.pid) == db_pids
        assert open(os.path.join(data, "relay.lock")).read() == lock
        assert requests.get(proc.url + "/api/status").status_code == 200
    finally:
        assert proc.stop() == 0


def test_reset_admin_password_refuses_while_the_relay_is_still_starting(tmp_path):
    """A live holder that has not named its database yet: one line, exit 1."""
    from models.datadir import DataDirLock
    data = str(tmp_path / "data")
    lock = DataDirLock(data)
    lock.acquire()
    try:
        lock.write(port=4321, process_id="starting")
        out = run_reset("--data-dir", data)
    finally:
        lock.release()
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(os.getpid()) in lines[0] and "4321" in lines[0], out.stderr
    assert "still starting" in lines[0] and "Traceback" not in out.stderr + out.stdout
    assert not os.path.exists(os.path.join(data, "db")), "a database was started"


def test_reset_admin_password_with_a_database_url_while_a_relay_runs(fresh_relay, mongo_url):
    relay = fresh_relay()
    session, data = login(relay.url, "root", ADMIN_PASSWORD)
    sessions = MongoClient(mongo_url)[relay.db_name].sessions
    assert sessions.count_documents({"uid": data["id"]}) == 1
    password = reset_cli("--mongo-url", mongo_url, "--db-name", relay.db_name)
    assert sessions.count_documents({"uid": data["id"]}) == 0
    assert session.get(relay.url + "/api/user/self").status_code == 401
    s, data = login(relay.url, "root", password)
    assert data["must_change_password"] is True
    r = s.put(relay.url + "/api/user/self",
              json={"original_password": password, "password": ADMIN_PASSWORD})
    assert r.status_code == 200
    Api.login(relay.url).get("/api/user/")
