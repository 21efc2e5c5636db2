"""The console websocket: authentication, Origin, per-user authorisation of
pushed events, and the built-in chat streamed over it (real relay process,
real fake upstream, real websocket client with real session cookies)."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests
import websocket

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api

PASSWORD = "Blue-Kettle-Harbor-42"


@pytest.fixture(scope="module")
def upstream():
    fake = FakeOpenAI(slow_delay=1.0).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def env(relay, admin, upstream):
    admin.create_channel(upstream.url, ["gpt-4o-mini"], name="fast")
    admin.create_channel(upstream.url + "/mode/slow", ["slow-model"], name="slow")
    admin.set_price("gpt-4o-mini", input_price=1, output_price=2)
    admin.set_price("slow-model", input_price=1, output_price=2)
    users = {}
    for name in ("alice", "bob"):
        u = admin.create_user(name, PASSWORD, quota=5_000_000)
        api = Api.login(relay.url, name, PASSWORD)
        key = api.create_token(f"{name}-key", unlimited_quota=True)
        users[name] = {"user": u, "api": api, "key": key}
    return users


class Session:
    """A browser-like session: signed in with cookies, plus its websocket."""

    def __init__(self, base: str, username: str):
        self.base = base
        self.http = requests.Session()
        r = self.http.post(base + "/api/user/login", json={"username": username,
                                                            "password": PASSWORD})
        assert r.status_code == 200, r.text
        self.csrf = r.json()["data"]["csrf_token"]
        self.messages: list[dict] = []
        self.ws = None
        self._reader = None

    def cookie_header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.http.cookies)

    def connect(self, origin: str | None = None) -> "Session":
        url = self.base.replace("http://", "ws://") + "/console/ws"
        self.ws = websocket.create_connection(url, timeout=30, cookie=self.cookie_header(),
                                              origin=origin or self.base)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait(lambda m: m["type"] == "hello")
        return self

    def _read(self) -> None:
        while True:
            try:
                raw = self.ws.recv()
            except Exception:
                return
            if not raw:
                return
            self.messages.append(json.loads(raw))

    def send(self, msg: dict) -> None:
        self.ws.send(json.dumps(msg))

    def wait(self, pred, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in list(self.messages):
                if pred(m):
                    return m
            time.sleep(0.05)
        raise AssertionError(f"no matching message; got {self.messages[-10:]}")

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()


def relay_chat(base: str, key: str, model: str = "gpt-4o-mini") -> None:
    r = requests.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                      timeout=60)
    assert r.status_code == 200, r.text


def test_handshake_needs_a_session(relay):
    url = relay.url.replace("http://", "ws://") + "/console/ws"
    with pytest.raises(websocket.WebSocketBadStatusException) as exc:
        websocket.create_connection(url, timeout=10)
    assert exc.value.status_code == 401


def test_handshake_refuses_a_foreign_origin(relay, env):
    s = Session(relay.url, "alice")
    with pytest.raises(websocket.WebSocketBadStatusException) as exc:
        s.connect(origin="http://evil.example")
    assert exc.value.status_code == 403


def test_user_b_never_sees_user_a_balance_events(relay, admin, env):
    a = Session(relay.url, "alice").connect()
    b = Session(relay.url, "bob").connect()
    try:
        assert a.messages[0]["user_id"] == env["alice"]["user"]["id"]
        relay_chat(relay.url, env["alice"]["key"]["key"])
        admin.post(f"/api/user/{env['alice']['user']['id']}/quota",
                   {"amount": 123_456, "reason": "ws test"})
        got = a.wait(lambda m: m["type"] == "balance")
        assert got["quota"] > 0
        a.wait(lambda m: m["type"] == "usage" and m["record"]["model"] == "gpt-4o-mini")
        a.wait(lambda m: m["type"] == "token_balance"
               and m["token_id"] == env["alice"]["key"]["id"])
        # Let anything that could leak arrive, then look at everything bob got.
        time.sleep(1.5)
        leaked = [m for m in b.messages if m["type"] in ("balance", "token_balance", "usage")]
        assert leaked == []
        assert [m["type"] for m in b.messages] == ["hello"]
        # Bob's own events do reach bob, and not alice.
        n_alice = len(a.messages)
        relay_chat(relay.url, env["bob"]["key"]["key"])
        b.wait(lambda m: m["type"] == "balance")
        time.sleep(1.0)
        assert not [m for m in a.messages[n_alice:]
                    if m["type"] in ("balance", "token_balance", "usage")]
    finally:
        a.close()
        b.close()


def test_chat_streams_over_the_socket_and_bills(relay, env, upstream):
    a = Session(relay.url, "alice").connect()
    try:
        before = len(upstream.requests)
        a.send({"type": "chat", "id": "c1", "key_id": env["alice"]["key"]["id"],
                "model": "gpt-4o-mini", "base": relay.url + "/v1/chat/completions",
                "messages": [{"role": "user", "content": "hello"}], "stream": True})
        done = a.wait(lambda m: m["type"] in ("chat_done", "chat_error") and m["id"] == "c1")
        assert done["type"] == "chat_done", done
        text = "".join(m["text"] for m in a.messages if m["type"] == "chat_delta"
                       and m["id"] == "c1")
        assert text == "Hello from the fake upstream."
        assert done["usage"]["completion_tokens"] == 3
        assert upstream.requests[before:], "the relay called the upstream"
        a.wait(lambda m: m["type"] == "balance")
    finally:
        a.close()


def test_chat_refuses_other_users_keys_and_foreign_bases(relay, env):
    a = Session(relay.url, "alice").connect()
    try:
        a.send({"type": "chat", "id": "x1", "key_id": env["bob"]["key"]["id"],
                "model": "gpt-4o-mini", "base": relay.url,
                "messages": [{"role": "user", "content": "hi"}]})
        err = a.wait(lambda m: m.get("id") == "x1")
        assert err["type"] == "chat_error" and err["code"] == "bad_key"
        a.send({"type": "chat", "id": "x2", "key_id": env["alice"]["key"]["id"],
                "model": "gpt-4o-mini", "base": "http://127.0.0.1:9/v1",
                "messages": [{"role": "user", "content": "hi"}]})
        err = a.wait(lambda m: m.get("id") == "x2")
        assert err["type"] == "chat_error" and err["code"] == "base_not_allowed"
        a.send({"type": "chat", "id": "x3", "key_id": env["alice"]["key"]["id"],
                "model": "gpt-4o-mini", "base": relay.url + "/mj",
                "messages": [{"role": "user", "content": "hi"}]})
        assert a.wait(lambda m: m.get("id") == "x3")["code"] == "bad_base"
        a.send({"type": "chat", "id": "x4", "key_id": env["alice"]["key"]["id"],
                "model": "gpt-4o-mini", "base": relay.url,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]})
        assert a.wait(lambda m: m.get("id") == "x4")["type"] == "chat_error"
    finally:
        a.close()


def test_chat_stop_cancels_the_upstream_call(relay, env, upstream):
    a = Session(relay.url, "alice").connect()
    try:
        a.send({"type": "chat", "id": "s1", "key_id": env["alice"]["key"]["id"],
                "model": "slow-model", "base": relay.url + "/v1",
                "messages": [{"role": "user", "content": "take your time"}]})
        # The slow fake waits a second before every chunk; stop after the first.
        a.wait(lambda m: m["type"] == "chat_delta" and m["id"] == "s1", timeout=60)
        a.send({"type": "chat_stop", "id": "s1"})
        done = a.wait(lambda m: m["type"] in ("chat_done", "chat_error") and m["id"] == "s1",
                      timeout=60)
        assert done["type"] == "chat_done" and done.get("stopped") is True
        text = "".join(m["text"] for m in a.messages if m["type"] == "chat_delta"
                       and m["id"] == "s1")
        assert text != "Hello from the fake upstream."
    finally:
        a.close()


def test_announcements_reach_everyone_marketing_only_opted_in(relay, admin, env):
    bob_api = env["bob"]["api"]
    bob_api.put("/api/user/self", {"marketing_opt_in": True})
    a = Session(relay.url, "alice").connect()
    b = Session(relay.url, "bob").connect()
    try:
        admin.post("/api/announcement/", {"title": "Maintenance", "content": "Sunday",
                                          "kind": "announcement"})
        a.wait(lambda m: m["type"] == "announcement" and m["title"] == "Maintenance")
        b.wait(lambda m: m["type"] == "announcement" and m["title"] == "Maintenance")
        admin.post("/api/announcement/", {"title": "Sale", "content": "50% off",
                                          "kind": "marketing"})
        b.wait(lambda m: m["type"] == "announcement" and m["title"] == "Sale")
        time.sleep(1.0)
        assert not [m for m in a.messages if m.get("title") == "Sale"]
    finally:
        a.close()
        b.close()


class FakeImages:
    """An image endpoint on a real socket: OpenAI images and a Midjourney-proxy
    task that finishes on its second poll."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        seen = self.requests = []
        polls = {"n": 0}

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, doc):
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                seen.append({"path": self.path, "body": body,
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
                if self.path == "/v1/images/generations":
                    return self._reply({"created": 1, "data": [{"url": "https://cdn.test/a.png"}]})
                if self.path == "/mj/submit/imagine":
                    return self._reply({"code": 1, "description": "Submitted", "result": "t1"})
                self.send_error(404)

            def do_GET(self):
                seen.append({"path": self.path, "body": None,
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
                if self.path == "/mj/task/t1/fetch":
                    polls["n"] += 1
                    if polls["n"] < 2:
                        return self._reply({"id": "t1", "status": "IN_PROGRESS", "progress": "50%"})
                    return self._reply({"id": "t1", "status": "SUCCESS", "progress": "100%",
                                        "imageUrl": "https://cdn.test/mj.png"})
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_image_generation_through_a_configured_base_address(relay, admin, env):
    fake = FakeImages()
    admin.put("/api/console/options", {"base_addresses": [{"url": fake.url, "region": "img"}]})
    a = Session(relay.url, "alice").connect()
    try:
        a.send({"type": "image", "id": "i1", "key_id": env["alice"]["key"]["id"],
                "model": "dall-e-3", "base": fake.url, "prompt": "a red fox"})
        assert a.wait(lambda m: m.get("id") == "i1" and m["type"] in (
            "chat_image", "chat_error"))["url"] == "https://cdn.test/a.png"
        a.wait(lambda m: m.get("id") == "i1" and m["type"] == "chat_done")
        sent = [r for r in fake.requests if r["path"] == "/v1/images/generations"][0]
        assert sent["body"]["prompt"] == "a red fox"
        assert sent["headers"]["authorization"] == f"Bearer {env['alice']['key']['key']}"

        a.send({"type": "image", "id": "i2", "key_id": env["alice"]["key"]["id"],
                "model": "midjourney", "base": fake.url + "/mj", "prompt": "a blue fox"})
        img = a.wait(lambda m: m.get("id") == "i2" and m["type"] in ("chat_image", "chat_error"),
                     timeout=60)
        assert img["url"] == "https://cdn.test/mj.png", img
        a.wait(lambda m: m.get("id") == "i2" and m["type"] == "chat_done")
        progress = "".join(m["text"] for m in a.messages
                           if m["type"] == "chat_delta" and m["id"] == "i2")
        assert "t1" in progress and "50%" in progress
        submit = [r for r in fake.requests if r["path"] == "/mj/submit/imagine"][0]
        assert submit["headers"]["mj-api-secret"] == env["alice"]["key"]["key"]
    finally:
        a.close()
        admin.put("/api/console/options", {"base_addresses": []})
        fake.stop()


def test_a_session_signed_out_elsewhere_loses_the_socket(relay, admin, env):
    admin.create_user("frank", PASSWORD, quota=500_000)
    f = Session(relay.url, "frank").connect()
    try:
        # Changing the password signs out every session of the account.
        r = f.http.put(relay.url + "/api/user/self",
                       json={"password": "Quiet-Lantern-Orbit-88", "original_password": PASSWORD},
                       headers={"X-CSRF-Token": f.csrf}, timeout=10)
        assert r.status_code == 200
        f.http.cookies.clear()
        f.send({"type": "chat", "id": "z1", "key": "sk-whatever", "model": "gpt-4o-mini",
                "base": relay.url, "messages": [{"role": "user", "content": "hi"}]})
        deadline = time.monotonic() + 30
        while f._reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not f._reader.is_alive(), "the server closed the socket"
        assert not [m for m in f.messages if m.get("id") == "z1"]
    finally:
        f.close()


def test_a_redeemed_code_is_pushed_even_without_a_call_first(relay, admin):
    """A user who made no call in this process still sees a top-up live."""
    admin.create_user("carla", PASSWORD)
    s = Session(relay.url, "carla").connect()
    try:
        code = admin.post("/api/redemption/", {"name": "live", "quota": 4321, "count": 1})["data"][0]
        r = s.http.post(relay.url + "/api/user/topup", json={"key": code},
                        headers={"X-CSRF-Token": s.csrf})
        assert r.status_code == 200, r.text
        got = s.wait(lambda m: m["type"] == "balance")
        assert got["quota"] == 4321
    finally:
        s.close()


def test_a_forged_host_header_cannot_aim_the_chat_elsewhere(relay, env, upstream):
    """The console's "this server" is taken from the Host header; a caller who
    forges it (here: the fake upstream's own address) must still reach this
    relay, not the named host with the user's key."""
    s = Session(relay.url, "alice")
    other = upstream.url  # a real listener on 127.0.0.1 that records what it gets
    url = relay.url.replace("http://", "ws://") + "/console/ws"
    s.ws = websocket.create_connection(url, timeout=30, cookie=s.cookie_header(), origin=other,
                                       host=other.split("//")[1])
    s._reader = threading.Thread(target=s._read, daemon=True)
    s._reader.start()
    try:
        s.wait(lambda m: m["type"] == "hello")
        key = env["alice"]["key"]
        s.send({"type": "chat", "id": "forged", "key_id": key["id"], "model": "gpt-4o-mini",
                "base": other, "messages": [{"role": "user", "content": "hi"}]})
        done = s.wait(lambda m: m.get("id") == "forged" and m["type"] in ("chat_done", "chat_error"))
        assert done["type"] == "chat_done", done
        sent_with_user_key = [r for r in upstream.requests
                              if key["key"] in r["headers"].get("Authorization", "")]
        assert sent_with_user_key == []
    finally:
        s.close()
