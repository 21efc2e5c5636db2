"""A burst of calls to an HTTP/1.1 upstream whose accept backlog is tiny:
the relay paces the connections it opens, so none fails (issue 33).

The upstream is a real server on 127.0.0.1 that listens with a backlog of
one and accepts only every 30 ms, as a busy single-threaded server does: at
most two connections wait in the kernel's accept queue, and a SYN that
arrives while it is full is dropped.  The client's kernel resends a dropped
SYN after 1 s, then 3 s, 7 s: a burst that overflowed retries in step and
overflows again, so without pacing most calls of the burst end in 524 when
their connect timeout (here 5 s) runs out.  With pacing, the connections
still connecting to one address are bounded (the bound halves when a
connect times out), the rest wait their turn, and a connect whose SYN went
unanswered is given up early and made again (it sent nothing).
"""
from __future__ import annotations

import concurrent.futures
import json
import selectors
import socket
import threading
import time

import pytest
import requests

from tests.helpers import Api, RelayProcess
from tests.tenant import Tenant

BURST = 40
ANSWER = json.dumps({
    "id": "chatcmpl-paced", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "paced"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


class SlowAcceptor:
    """HTTP/1.1 keep-alive, one JSON answer per request; listen(1), and the
    pending connections are accepted only every `accept_every` seconds."""

    def __init__(self, accept_every: float = 0.03):
        self.accept_every = accept_every
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.lsock.setblocking(False)
        self.port = self.lsock.getsockname()[1]
        self.requests = 0
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SlowAcceptor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.lsock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        bufs: dict = {}
        next_accept = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_accept:
                next_accept = now + self.accept_every
                while True:
                    try:
                        conn, _ = self.lsock.accept()
                    except BlockingIOError:
                        break
                    self.accepted += 1
                    conn.setblocking(False)
                    bufs[conn] = b""
                    sel.register(conn, selectors.EVENT_READ)
            for key, _ in sel.select(max(0.0, min(0.005, next_accept - time.monotonic()))):
                conn = key.fileobj
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(conn)
                    conn.close()
                    bufs.pop(conn, None)
                    continue
                bufs[conn] = self._answer(conn, bufs[conn] + data)
        for conn in list(bufs):
            conn.close()

    def _answer(self, conn, buf: bytes) -> bytes:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return buf
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) < end + 4 + length:
                return buf
            buf = buf[end + 4 + length:]
            self.requests += 1
            conn.setblocking(True)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
            conn.setblocking(False)


@pytest.fixture
def upstream():
    u = SlowAcceptor().start()
    yield u
    u.stop()


@pytest.fixture
def paced_relay(mongo_url, tmp_path):
    proc = RelayProcess(mongo_url, str(tmp_path / "relay"),
                        env={"RELAY_CONNECT_TIMEOUT": "5"}).start()
    yield proc
    proc.stop()


def test_a_burst_past_a_tiny_accept_backlog_is_paced_without_errors(paced_relay, upstream):
    admin = Api.login(paced_relay.url)
    admin.create_channel(upstream.url, ["tiny-backlog"], name="tiny")
    admin.set_price("tiny-backlog", input_price=1, output_price=2)
    t = Tenant(admin, paced_relay.url)
    start = threading.Barrier(BURST)

    def call(_):
        start.wait(10)
        return requests.post(paced_relay.url + "/v1/chat/completions", timeout=60,
                             headers={"Authorization": f"Bearer {t.key}"},
                             json={"model": "tiny-backlog",
                                   "messages": [{"role": "user", "content": "hi"}]})

    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(call, range(BURST)))
    failed = [(r.status_code, r.text[:200]) for r in answers if r.status_code != 200]
    assert not failed, f"{len(failed)} of {BURST} failed: {failed[:3]}"
    assert all(r.json()["choices"][0]["message"]["content"] == "paced" for r in answers)
    # Every call was sent once: the connects given up on sent nothing.
    assert upstream.requests == BURST
