"""A connect that failed sent nothing, so it is retried; a burst of them is
one trip of the channel's breaker, not five.

The upstream here is a real port that refuses connections (nothing listens
on it) until the test starts the fake OpenAI upstream's server on it: what a
server restarting, or a burst of new connections past an upstream's accept
backlog, looks like to the relay (issue 33: 29 streams answered 502 within
2 ms, then the channel's rest doubled five times, 30 s to 480 s)."""
from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import pytest
import requests
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api, free_port
from tests.tenant import Tenant

PRICE = {"input_price": 1, "output_price": 2}


class LateServer:
    """The fake OpenAI upstream served on a port chosen now, listening only
    from start(): until then every connect to it is refused."""

    def __init__(self):
        self.port = free_port()
        self.fake = FakeOpenAI()
        self._loop = None
        self._thread = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ready = threading.Event()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        sock.setblocking(False)

        def run():
            import asyncio
            asyncio.set_event_loop(asyncio.new_event_loop())
            self._loop = IOLoop.current()
            server = HTTPServer(tornado.web.Application(self.fake.routes()))
            server.add_sockets([sock])
            ready.set()
            self._loop.start()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.add_callback(self._loop.stop)
            self._thread.join(5)


def chat(relay, key: str, model: str, stream: bool = False) -> requests.Response:
    return requests.post(relay.url + "/v1/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": model, "stream": stream,
                               "messages": [{"role": "user", "content": "hi"}]})


def test_a_refused_connect_is_retried_on_the_same_channel(relay, admin):
    late = LateServer()
    admin.create_channel(late.url, ["late-model"], name="late")
    admin.set_price("late-model", **PRICE)
    t = Tenant(admin, relay.url)
    # The server starts listening a moment after the call began: the first
    # connect is refused, a retry after a short backoff finds it.
    timer = threading.Timer(0.06, late.start)
    try:
        timer.start()
        r = chat(relay, t.key, "late-model")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert len(late.fake.requests) == 1  # sent once: the refused tries sent nothing
    finally:
        timer.join()
        late.stop()


def test_a_stream_whose_connect_was_refused_is_retried(relay, admin):
    late = LateServer()
    admin.create_channel(late.url, ["late-stream"], name="late-stream")
    admin.set_price("late-stream", **PRICE)
    t = Tenant(admin, relay.url)
    timer = threading.Timer(0.06, late.start)
    try:
        timer.start()
        r = chat(relay, t.key, "late-stream", stream=True)
        assert r.status_code == 200, r.text
        assert r.text.rstrip().endswith("data: [DONE]")
    finally:
        timer.join()
        late.stop()


def test_a_burst_of_refused_connects_is_one_trip(relay, admin):
    dead = LateServer()  # never started: every connect is refused
    ch = admin.create_channel(dead.url, ["dead-model"], name="dead")
    admin.set_price("dead-model", **PRICE)
    t = Tenant(admin, relay.url)
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: chat(relay, t.key, "dead-model"), range(40)))
    assert {r.status_code for r in answers} == {502}
    assert all(r.json()["error"]["code"] == "upstream_unreachable" for r in answers)
    health = next(c for c in admin.get("/api/channel/?size=100")["data"]["items"]
                  if c["id"] == ch["id"])["health"]
    # One burst, one trip: the first rest (30 s), not 30 s doubled per five failures.
    assert 0 < health["resting_seconds"] <= 30, health
    time.sleep(0.2)
    # Calls while it rests (it is the only channel, so it is still tried)
    # do not lengthen the rest either.
    for _ in range(12):
        assert chat(relay, t.key, "dead-model").status_code == 502
    health = next(c for c in admin.get("/api/channel/?size=100")["data"]["items"]
                  if c["id"] == ch["id"])["health"]
    assert 0 < health["resting_seconds"] <= 30, health


@pytest.fixture(scope="module")
def admin(relay) -> Api:
    return Api.login(relay.url)
