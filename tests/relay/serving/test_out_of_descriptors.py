"""A relay out of file descriptors says so, cleanly, and blames no upstream.

Each HTTP/1.1 stream holds two descriptors (the client's socket and the
upstream's), so 10,000 streams need 20,000 and more: past the limit the
upstream connect failed and was answered 502 "Could not connect to the
upstream", and the breaker rested a healthy channel for minutes (issue 33:
29 streams of 10,000).  Now a call that cannot open its upstream socket
gets 503 relay_overloaded with Retry-After, and the channel stays in
service; a connection the relay cannot accept gets a canned 503 and is
closed, instead of the loop spinning on a listening socket it cannot
empty."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from tests.helpers import Api, RelayProcess
from tests.tenant import Tenant

NOFILE = 160
PRICE = {"input_price": 1, "output_price": 2}


@pytest.fixture
def tight(mongo_url, tmp_path, fake):
    relay = RelayProcess(mongo_url, str(tmp_path / "relay"), script="tests/fd_limited_server.py",
                         env={"RELAY_TEST_NOFILE": str(NOFILE)}).start()
    admin = Api.login(relay.url)
    ch = admin.create_channel(fake.url, ["fd-model"], name="fd")
    admin.set_price("fd-model", **PRICE)
    t = Tenant(admin, relay.url)
    yield relay, admin, ch, t
    relay.stop()


def _request(key: str) -> bytes:
    body = b'{"model": "fd-model", "messages": [{"role": "user", "content": "hi"}]}'
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json"
            b"\r\nAuthorization: Bearer " + key.encode() + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _answer(sock: socket.socket, timeout: float = 15.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            break
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    n = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
              if ln.lower().startswith(b"content-length:")), 0)
    while len(rest) < n:
        got = sock.recv(65536)
        if not got:
            break
        rest += got
    return head + b"\r\n\r\n" + rest


def test_out_of_descriptors_is_a_503_not_an_upstream_failure(tight):
    relay, admin, ch, t = tight
    held, refused = [], []
    try:
        # More connections than the relay has descriptors: it accepts and
        # keeps (idle keep-alive) what it can; the others get the canned 503.
        conns = [socket.create_connection(("127.0.0.1", relay.port), 5)
                 for _ in range(NOFILE + 20)]
        time.sleep(2)
        for s in conns:
            s.setblocking(False)
            try:
                got = s.recv(4096)
            except BlockingIOError:
                held.append(s)
                continue
            refused.append(got)
            s.close()
        assert refused and all(r.startswith(b"HTTP/1.1 503") for r in refused), refused[:1]
        assert b"Retry-After: 1" in refused[0] and b"relay_overloaded" in refused[0]
        for s in held:
            s.setblocking(True)
        # A call on a connection it holds: no descriptor for the upstream.
        answers = []
        for s in held[-3:]:
            s.sendall(_request(t.key))
            answers.append(_answer(s))
        assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers[0][:300]
        assert all(b"relay_overloaded" in a and b"Retry-After" in a for a in answers)
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)
    health = next(c for c in admin.get("/api/channel/?size=100")["data"]["items"]
                  if c["id"] == ch["id"])["health"]
    assert not health.get("resting_seconds"), health  # the upstream was never at fault
    r = requests.post(relay.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "fd-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
