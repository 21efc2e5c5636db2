"""Test plumbing: real processes on 127.0.0.1 (relay, database, fakes) and a
small client for the management API."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMIN_PASSWORD = "root-test-password"
# What test users sign in with (strong enough for the password rule).
USER_PASSWORD = "Blue-Kettle-Harbor-42"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0,
              what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout}s")


def children(pid: int) -> list[int]:
    """Pids of the processes `pid` started (the relay's embedded database)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


class RelayProcess:
    """`python server.py` as a real child process."""

    def __init__(self, mongo_url: str, data_dir: str, db_name: str | None = None,
                 env: dict | None = None, args: list | None = None, script: str = "server.py"):
        self.mongo_url = mongo_url
        self.data_dir = data_dir
        self.db_name = db_name or "t_" + uuid.uuid4().hex[:10]
        self.env = env or {}
        self.args = args or []
        self.script = script  # e.g. tests/clocked_server.py
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, "relay.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int | None = None) -> "RelayProcess":
        self.port = port or free_port()
        os.makedirs(self.data_dir, exist_ok=True)
        env = dict(os.environ, RELAY_ADMIN_PASSWORD=ADMIN_PASSWORD, RELAY_SECRET="test-secret",
                   RELAY_ALLOW_PRIVATE_WEBHOOKS="true", PYTHONUNBUFFERED="1")
        env.update(self.env)
        cmd = [sys.executable, os.path.join(ROOT, self.script), "--host", "127.0.0.1",
               "--port", str(self.port), "--data-dir", self.data_dir, "--db-name", self.db_name]
        if self.mongo_url:
            cmd += ["--mongo-url", self.mongo_url]
        cmd += self.args
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, what="relay")
        return self

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        self._log.close()
        return code

    def exit_code(self, timeout: float) -> int:
        """The code it exits with after a signal; past `timeout`, a failure
        that shows the end of its log (what it was stuck on), not a bare
        TimeoutExpired."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running {timeout:.0f}s after the signal; its log ends:\n"
                                 + self.log()[-4000:]) from None

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def billing_pid(self) -> str:
        """The billing process id this relay wrote into its data directory's lock."""
        import json
        with open(os.path.join(self.data_dir, "relay.lock")) as fh:
            return json.load(fh)["process_id"]

    def log(self) -> str:
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""


class Api:
    """The management API as a signed-in user (access token, no cookies)."""

    def __init__(self, base: str, token: str | None = None):
        self.base = base
        self.s = requests.Session()
        if token:
            self.s.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def login(cls, base: str, username: str = "root", password: str = ADMIN_PASSWORD) -> "Api":
        s = requests.Session()
        r = s.post(base + "/api/user/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        csrf = r.json()["data"]["csrf_token"]
        r = s.post(base + "/api/user/token", headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200, r.text
        return cls(base, r.json()["data"])

    def call(self, method: str, path: str, expect: int | None = 200, **kw):
        r = self.s.request(method, self.base + path, **kw)
        if expect is not None:
            assert r.status_code == expect, f"{method} {path} -> {r.status_code}: {r.text}"
        return r.json() if r.headers.get("Content-Type", "").startswith("application/json") else r

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def post(self, path, json=None, **kw):
        return self.call("POST", path, json=json, **kw)

    def put(self, path, json=None, **kw):
        return self.call("PUT", path, json=json, **kw)

    def delete(self, path, **kw):
        return self.call("DELETE", path, **kw)

    # ---- shortcuts used across the suite -----------------------------------
    def create_user(self, username: str, password: str = USER_PASSWORD, group: str = "default",
                    quota: int = 0, email: str = "") -> dict:
        d = self.post("/api/user/", {"username": username, "password": password,
                                     "email": email or f"{username}@example.test", "group": group})
        user = d["data"]
        if quota:
            self.post(f"/api/user/{user['id']}/quota", {"amount": quota, "reason": "test"})
        return user

    def create_channel(self, base_url: str, models: list, groups=("default",), name="ch",
                       type="openai", key="upstream-key", **extra) -> dict:
        body = {"name": name, "type": type, "base_url": base_url, "key": key,
                "models": list(models), "groups": list(groups)}
        body.update(extra)
        return self.post("/api/channel/", body)["data"]

    def set_price(self, model: str, input_price=0, output_price=0, cache_price=0, call_price=0,
                  group: str = "") -> dict:
        return self.post("/api/price/", {"model": model, "input_price": input_price,
                                         "output_price": output_price, "cache_price": cache_price,
                                         "call_price": call_price, "group": group})["data"]

    def create_token(self, name="k", remain_quota=0, unlimited_quota=False, **extra) -> dict:
        body = {"name": name, "remain_quota": remain_quota, "unlimited_quota": unlimited_quota}
        body.update(extra)
        return self.post("/api/token/", body)["data"]


def multipart(parts, boundary: str = "----relaytestboundary",
              file_type: str = "audio/wav") -> tuple[bytes, str]:
    """A multipart/form-data body built by hand (field order, framing and
    chunking under the test's control): parts are (name, bytes, filename or
    None).  Returns (body, Content-Type)."""
    out = b""
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        ctype = f"Content-Type: {file_type}\r\n" if filename else ""
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n{ctype}\r\n".encode()
        out += value + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def recv_all(sock) -> bytes:
    """Everything the peer sends until it closes the connection."""
    parts = []  # joined once: a stream of many megabytes is not copied at every read
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(parts)
        parts.append(data)


def dechunk(body: bytes) -> bytes:
    """A chunked HTTP/1.1 body, whole, decoded; its framing checked."""
    out, i = [], 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[j + 2:j + 2 + size])
        assert body[j + 2 + size:j + 4 + size] == b"\r\n", "chunk framing broken"
        i = j + 4 + size


def eventually(fn, timeout: float = 5.0, interval: float = 0.1):
    """Retry fn until it stops raising AssertionError (usage is written in batches)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)


def interleaved(target, args_list) -> None:
    """target(*args) on a thread each, switching between threads as often
    as the interpreter can (between any two lines): for state that threads
    share, a race shows in every run, not one in a hundred."""
    import threading
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target, args=args) for args in args_list]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
