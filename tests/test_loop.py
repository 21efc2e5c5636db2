"""relay/loop.py: a reader Tornado lets go of rests registered until it is
wanted again or fires, on uvloop (as served) and on asyncio's own loop.

Then the served relay, whose every client socket goes through it: requests
sent ahead on one connection, and a client that leaves before its answer
starts (noticed only through the reader Tornado wants back)."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop
from tornado.ioloop import IOLoop

from relay.loop import RelayLoop
from tests.helpers import Api

READ, WRITE, ERROR = IOLoop.READ, IOLoop.WRITE, IOLoop.ERROR
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class Spy:
    """The asyncio loop's reader and writer calls, counted and passed on."""

    def __init__(self, loop):
        self.loop = loop
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name):
        fn = getattr(self.loop, name)
        if name in ("add_reader", "remove_reader", "add_writer", "remove_writer"):
            def counted(fd, *args):
                self.calls.append((name, fd))
                return fn(fd, *args)
            return counted
        return fn

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)


def run(make, body):
    """body(io, spy) as a coroutine on a fresh loop of the given kind."""
    loop = make()

    async def main():
        io = RelayLoop()
        spy = io.selector_loop = Spy(io.selector_loop)
        try:
            await body(io, spy)
        finally:
            for fd in list(io.handlers):
                io.remove_handler(fd)
            del IOLoop._ioloop_for_asyncio[loop]
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def watched(io):
    """A socket pair whose first end io watches for reads, as Tornado's
    IOStream does; what the handler reads lands in the returned list."""
    a, b = socket.socketpair()
    a.setblocking(False)
    seen: list[bytes] = []
    io.add_handler(a, lambda fd, ev: seen.append(a.recv(100)), READ | ERROR)
    return a, b, seen


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_reader_wanted_back_costs_no_registration(kind):
    async def body(io, spy):
        a, b, seen = watched(io)
        io.update_handler(a, ERROR)      # Tornado read a request
        io.update_handler(a, READ | ERROR)  # ... and listens for the client leaving
        assert spy.count("add_reader") == 1 and spy.count("remove_reader") == 0
        b.send(b"bye")
        await turns()
        assert seen == [b"bye"]
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_resting_reader_that_fires_is_removed_unseen_and_no_busy_loop(kind):
    async def body(io, spy):
        a, b, seen = watched(io)
        io.update_handler(a, ERROR)
        b.send(b"early")
        await turns(10)
        assert seen == []                 # Tornado never saw an event it did not want
        assert spy.count("remove_reader") == 1
        assert a.fileno() not in io.readers and a.fileno() not in io.resting
        io.update_handler(a, READ | ERROR)
        await turns()
        assert seen == [b"early"]         # nothing was read behind Tornado's back
        assert spy.count("add_reader") == 2
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_resting_reader_fires_once_not_at_every_turn(kind):
    async def body(io, spy):
        a, b = socket.socketpair()
        a.setblocking(False)
        fired = []
        io.add_handler(a, lambda fd, ev: fired.append(ev), READ | ERROR)
        io.update_handler(a, ERROR)
        real = io.selector_loop.loop

        # Count how often the loop calls back for this descriptor: the
        # resting reader is replaced by one that counts, then rests again.
        calls = []
        real.remove_reader(a.fileno())

        def counting(fd, ev):
            calls.append(ev)
            io._handle_events(fd, ev)
        real.add_reader(a.fileno(), counting, a.fileno(), READ)
        b.send(b"x" * 10)
        await turns(10)
        assert calls == [READ] and fired == []
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_removing_a_resting_reader_frees_the_number_for_the_next_socket(kind):
    async def body(io, spy):
        a, b = socket.socketpair()
        io.add_handler(a, lambda fd, ev: None, READ | ERROR)
        io.update_handler(a, ERROR)
        number = a.fileno()
        io.remove_handler(a)
        assert number not in io.readers and number not in io.resting
        a.close()
        c, d = socket.socketpair()
        fd = c if c.fileno() == number else d
        other = d if fd is c else c
        assert fd.fileno() == number      # the kernel gave the number out again
        fd.setblocking(False)
        seen = []
        io.add_handler(fd, lambda f, ev: seen.append(fd.recv(100)), READ | ERROR)  # not "added twice"
        other.send(b"new")
        await turns()
        assert seen == [b"new"]
        b.close(), c.close(), d.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_writers_are_added_and_removed_at_once(kind):
    async def body(io, spy):
        a, b = socket.socketpair()
        events = []
        io.add_handler(a, lambda fd, ev: events.append(ev), READ | ERROR)
        io.update_handler(a, READ | WRITE | ERROR)
        await turns(2)
        assert WRITE in events
        io.update_handler(a, READ | ERROR)
        assert spy.count("remove_writer") == 1 and a.fileno() not in io.writers
        events.clear()
        await turns(3)
        assert events == []
        a.close(), b.close()
    run(LOOPS[kind], body)


# ---- the served relay ----------------------------------------------------------
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def key(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=4)
    admin.create_user("lena", quota=10 ** 9)
    api = Api.login(relay.url, "lena", "Blue-Kettle-Harbor-42")
    return api, api.create_token(name="loop", remain_quota=10 ** 8)["key"]


def _request(key: str, body: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}").encode()


def _answers(sock, n: int, timeout: float = 20.0) -> list[tuple[int, bytes]]:
    """n HTTP/1.1 answers with Content-Length, in the order they came."""
    sock.settimeout(timeout)
    data, out = b"", []
    while len(out) < n:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin1")
            length = int(next(line.split(":", 1)[1] for line in head.split("\r\n")
                              if line.lower().startswith("content-length:")))
            if len(data) >= head_end + 4 + length:
                out.append((int(head.split(" ", 2)[1]), data[head_end + 4:head_end + 4 + length]))
                data = data[head_end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(out)} of {n} answers"
        data += chunk
    return out


def test_requests_sent_ahead_on_one_connection_are_all_answered_in_order(relay, key):
    _, k = key
    host, port = relay.url.split("//")[1].split(":")
    texts = [f"answer number {i}" for i in range(6)]
    bodies = ['{"model": "%s", "fake_text": "%s", "fake_delay": %s, "messages": '
              '[{"role": "user", "content": "hi"}]}' % (MODEL, t, 0.05 * (i % 2))
              for i, t in enumerate(texts)]
    with socket.create_connection((host, int(port))) as s:
        # three at once, then three more while the first are being served
        s.sendall(b"".join(_request(k, b) for b in bodies[:3]))
        time.sleep(0.02)
        for b in bodies[3:]:
            s.sendall(_request(k, b))
        got = _answers(s, 6)
    assert [status for status, _ in got] == [200] * 6
    assert [t in body.decode() for t, (_, body) in zip(texts, got)] == [True] * 6


def test_a_client_that_leaves_before_its_answer_starts_is_noticed(relay, key, fake):
    api, k = key
    host, port = relay.url.split("//")[1].split(":")
    body = ('{"model": "%s", "stream": true, "fake_chunks": 30, "fake_delay": 0.2, '
            '"fake_text": "left early", "messages": [{"role": "user", "content": "hi"}]}' % MODEL)
    s = socket.create_connection((host, int(port)))
    s.sendall(_request(k, body))
    time.sleep(0.1)   # the relay has read the request and called the upstream
    s.close()         # before any answer came
    up = None
    for _ in range(100):
        up = next((q for q in fake.requests if q["body"].get("fake_text") == "left early"), None)
        if up is not None and up.get("aborted"):
            break
        time.sleep(0.1)
    assert up is not None and up.get("aborted"), "the relay did not notice its client leave"
    assert up["sent_events"] < 5
    rec = None
    for _ in range(60):
        items = api.get("/api/log/self?size=50")["data"]["items"]
        rec = next((i for i in items if i["status"] == 499), None)
        if rec:
            break
        time.sleep(0.1)
    assert rec is not None, "the call of a client that left has no usage record"
