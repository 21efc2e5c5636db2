"""relay/serving/loop.py: the sockets Tornado watches are in an epoll of the loop's
own, on uvloop (as served) and on asyncio's own loop; a reader Tornado
lets go of rests registered until it is wanted again or fires.

Then the served relay, whose every client socket goes through it: requests
sent ahead on one connection, and a client that leaves before its answer
starts (noticed only through the reader Tornado wants back)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import pytest
import uvloop
from tornado.ioloop import IOLoop

from relay.serving import loop as relay_loop
from relay.serving.loop import RelayLoop
from tests.helpers import Api

READ, WRITE, ERROR = IOLoop.READ, IOLoop.WRITE, IOLoop.ERROR
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class Spy:
    """Calls to the wrapped object's methods named, counted and passed on:
    the asyncio loop's readers and writers, or the epoll's registrations."""

    NAMES = ("add_reader", "remove_reader", "add_writer", "remove_writer",
             "register", "modify", "unregister")

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[str, int]] = []
        self.polled: list[tuple[int, int]] = []   # every (fd, events) a poll returned
        self.polls: list[int] = []                 # how many each poll returned

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name in self.NAMES:
            def counted(fd, *args):
                self.calls.append((name, fd if isinstance(fd, int) else fd.fileno()))
                return fn(fd, *args)
            return counted
        if name == "poll":
            def poll(*args):
                got = fn(*args)
                self.polled.extend(got)
                self.polls.append(len(got))
                return got
            return poll
        return fn

    def count(self, name: str, fd: int | None = None) -> int:
        return sum(1 for n, f in self.calls if n == name and fd in (None, f))


def run(make, body):
    """body(io, aio, ep) as a coroutine on a fresh loop of the given kind:
    aio spies on the asyncio loop, ep on the relay loop's epoll."""
    loop = make()

    async def main():
        io = RelayLoop()
        aio = io.selector_loop = Spy(io.selector_loop)
        ep = io._ep = Spy(io._ep)
        try:
            await body(io, aio, ep)
        finally:
            io._ep = ep.inner
            io.selector_loop = aio.inner
            for fd in list(io.handlers):
                io.remove_handler(fd)
            io.selector_loop.remove_reader(io._ep.fileno())
            io._ep.close()
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
def test_sockets_are_watched_in_the_loops_epoll_not_by_the_asyncio_loop(kind):
    async def body(io, aio, ep):
        a, b, seen = watched(io)
        assert aio.calls == []            # no poll handle for it in the asyncio loop
        assert ep.count("register", a.fileno()) == 1
        b.send(b"hello")
        await turns()
        assert seen == [b"hello"]
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_descriptors_given_as_numbers_stay_with_the_asyncio_loop(kind):
    async def body(io, aio, ep):
        r, w = os.pipe()
        seen = []
        io.add_handler(r, lambda fd, ev: seen.append(os.read(fd, 100)), READ)
        assert aio.count("add_reader", r) == 1 and ep.calls == []
        os.write(w, b"piped")
        await turns()
        assert seen == [b"piped"]
        io.remove_handler(r)
        assert aio.count("remove_reader", r) == 1
        os.close(r), os.close(w)
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_reader_wanted_back_costs_no_system_call(kind):
    async def body(io, aio, ep):
        a, b, seen = watched(io)
        io.update_handler(a, ERROR)      # Tornado read a request
        io.update_handler(a, READ | ERROR)  # ... and listens for the client leaving
        assert ep.calls == [("register", a.fileno())]
        b.send(b"bye")
        await turns()
        assert seen == [b"bye"]
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_resting_reader_that_fires_is_taken_out_unseen_and_no_busy_loop(kind):
    async def body(io, aio, ep):
        a, b, seen = watched(io)
        io.update_handler(a, ERROR)
        b.send(b"early")
        await turns(10)
        assert seen == []                 # Tornado never saw an event it did not want
        assert ep.count("unregister", a.fileno()) == 1
        assert [fd for fd, _ in ep.polled].count(a.fileno()) == 1  # fired once, not every turn
        assert a.fileno() not in io.masks
        io.update_handler(a, READ | ERROR)
        await turns()
        assert seen == [b"early"]         # nothing was read behind Tornado's back
        assert ep.count("register", a.fileno()) == 2
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_removing_a_resting_reader_frees_the_number_for_the_next_socket(kind):
    async def body(io, aio, ep):
        a, b = socket.socketpair()
        io.add_handler(a, lambda fd, ev: None, READ | ERROR)
        io.update_handler(a, ERROR)
        number = a.fileno()
        io.remove_handler(a)
        assert number not in io.masks and number not in io.wants and number not in io.handlers
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
    async def body(io, aio, ep):
        a, b = socket.socketpair()
        events = []
        io.add_handler(a, lambda fd, ev: events.append(ev), READ | ERROR)
        io.update_handler(a, READ | WRITE | ERROR)
        await turns(2)
        assert WRITE in events
        io.update_handler(a, READ | ERROR)
        assert ep.count("modify", a.fileno()) == 2
        events.clear()
        await turns(3)
        assert events == []
        a.close(), b.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_hang_up_wakes_the_reader_and_what_was_sent_is_still_read(kind):
    async def body(io, aio, ep):
        a, b = socket.socketpair()
        a.setblocking(False)
        got, events = [], []

        def on(fd, ev):
            events.append(ev)
            data = a.recv(100)
            got.append(data)
            if not data:
                io.remove_handler(a)
        io.add_handler(a, on, READ | ERROR)
        b.send(b"last words")
        b.close()
        await turns()
        assert got == [b"last words", b""]
        assert set(events) == {READ}      # never ERROR, as on any asyncio loop
        a.close()
    run(LOOPS[kind], body)


@pytest.mark.parametrize("kind", LOOPS)
def test_one_turn_serves_a_bounded_batch_and_a_failing_handler_stops_no_other(kind, monkeypatch,
                                                                              caplog):
    monkeypatch.setattr(relay_loop, "_BATCH", 2)

    async def body(io, aio, ep):
        pairs = [socket.socketpair() for _ in range(5)]
        seen = []

        def handler(sock):
            def on(fd, ev):
                data = sock.recv(100)
                if data == b"boom":
                    raise RuntimeError("handler failed")
                seen.append(data)
            return on
        for i, (a, b) in enumerate(pairs):
            a.setblocking(False)
            io.add_handler(a, handler(a), READ | ERROR)
            b.send(b"boom" if i == 0 else b"ok %d" % i)
        with caplog.at_level(logging.ERROR, logger="tornado.application"):
            await turns(10)
        assert sorted(seen) == [b"ok 1", b"ok 2", b"ok 3", b"ok 4"]
        assert "Exception in I/O handler" in caplog.text
        assert max(ep.polls) == 2   # five ready, at most two a turn
        for a, b in pairs:
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
