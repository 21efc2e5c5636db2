"""relay/upstream/curl_client.py's event-loop registrations, against a real socket.

CurlClient watches libcurl's sockets in an epoll of its own, which the
event loop watches as one descriptor, where Tornado removes and re-adds
each socket at every wish.  What must hold: every call completes, whether
the upstream keeps the connection, closes it with `Connection: close`, or
drops it silently while idle (libcurl then opens a new socket, often under
the same number, which must be registered afresh); a socket nobody watches
does not wake the loop for ever; and a kept-alive connection costs the
event loop nothing per call.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pycurl
import pytest

from relay.upstream.curl_client import CurlClient
from relay.upstream.transfer import Transfer

BODY = b'{"ok":true}'


class _Upstream(asyncio.Protocol):
    """HTTP/1.1, one fixed answer per request; `mode` says what happens to
    the connection after it."""

    mode = "keep"

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin1").lower()
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length:]
            close = "Connection: close\r\n" if self.mode == "close" else ""
            self.transport.write(
                f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{close}"
                f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
            if self.mode in ("close", "drop"):
                self.transport.close()
                return


async def _serve(mode: str):
    cls = type("Upstream", (_Upstream,), {"mode": mode})
    server = await asyncio.get_running_loop().create_server(cls, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _calls(mode: str, n: int) -> tuple[list, int, int]:
    server, port = await _serve(mode)
    client = CurlClient()
    loop = client.io_loop
    counts = {"add": 0, "remove": 0}
    add, remove = loop.add_handler, loop.remove_handler

    def counted_add(*a):
        counts["add"] += 1
        return add(*a)

    def counted_remove(*a):
        counts["remove"] += 1
        return remove(*a)

    loop.add_handler, loop.remove_handler = counted_add, counted_remove
    results = []
    try:
        for i in range(n):
            t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x",
                         ["Content-Type: application/json"], b'{"i":%d}' % i)
            client.start(t)
            err, msg = await asyncio.wait_for(t.done, 10)
            results.append((err, t.status, b"".join(t.chunks)))
            if mode == "drop":
                await asyncio.sleep(0.005)  # the upstream's close reaches us while idle
    finally:
        loop.add_handler, loop.remove_handler = add, remove
        client.close()
        server.close()
    return results, counts["add"], counts["remove"]


@pytest.mark.parametrize("mode", ["keep", "close", "drop"])
def test_every_call_completes_however_the_upstream_treats_its_connection(mode):
    results, _, _ = asyncio.run(_calls(mode, 60))
    assert results == [(0, 200, BODY)] * 60


class _CountingEpoll:
    """The client's epoll, its calls counted (a C object's methods cannot be
    patched in place)."""

    def __init__(self, ep):
        self.ep = ep
        self.counts = {"register": 0, "modify": 0, "unregister": 0, "poll": 0}

    def __getattr__(self, name):
        fn = getattr(self.ep, name)
        if name in self.counts:
            def counted(*a):
                self.counts[name] += 1
                return fn(*a)
            return counted
        return fn


def test_a_kept_alive_connection_costs_the_event_loop_nothing_per_call():
    """Tornado's way is two adds and two removes a call (the socket and
    libcurl's wake-up eventfd, each re-added at every wish); on uvloop each
    add makes a poll handle and each remove closes it.  Here the loop holds
    one descriptor, the client's own epoll, for the client's life, and each
    descriptor libcurl watches for a call (the socket, its wake-up eventfd)
    costs that epoll one change a call."""
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        loop = client.io_loop
        counts = {"add": 0, "update": 0, "remove": 0}
        for name in counts:
            real = getattr(loop, name + "_handler")

            def counted(*a, _real=real, _name=name):
                counts[_name] += 1
                return _real(*a)
            setattr(loop, name + "_handler", counted)
        ep = client._ep = _CountingEpoll(client._ep)
        for _ in range(60):
            assert await _one_call(client, port) == 0
        assert counts == {"add": 0, "update": 0, "remove": 0}
        changes = ep.counts["register"] + ep.counts["modify"] + ep.counts["unregister"]
        assert changes <= 2 * 60 + 5, ep.counts
        client.close()
        server.close()
    asyncio.run(go())


async def _one_call(client: CurlClient, port: int) -> int:
    t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x", [], BODY)
    client.start(t)
    err, _ = await asyncio.wait_for(t.done, 10)
    return err


def test_closing_the_client_leaves_no_handler_behind():
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        assert await _one_call(client, port) == 0
        ep = client._ep
        number = ep.fileno()
        assert number in client.io_loop.handlers
        client.close()
        assert number not in client.io_loop.handlers and ep.closed
        server.close()
    asyncio.run(go())


def test_an_idle_socket_the_upstream_closes_is_let_go_once_not_at_every_turn():
    """Between calls libcurl does not watch its kept-alive socket, and ours
    stays in the epoll.  When the upstream closes it there, it is readable
    for good: it must be taken out at the first event, not repeat."""
    async def go():
        server, port = await _serve("drop")
        client = CurlClient()
        number = client._ep.fileno()
        calls = 0
        _, handle = client.io_loop.handlers[number]

        def counted(fd, events):
            nonlocal calls
            calls += 1
            return handle(fd, events)
        client.io_loop.handlers[number] = (number, counted)
        assert await _one_call(client, port) == 0
        calls = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            await asyncio.sleep(0.01)
        assert calls <= 2
        assert not client._wanted and client._ep.poll(0) == []
        assert await _one_call(client, port) == 0  # a new connection, often the same number
        client.close()
        server.close()
    asyncio.run(go())


def test_a_number_closed_while_resting_and_reused_is_registered_afresh():
    """libcurl closes sockets it is not watching without telling us (an
    idle connection dropped from its cache).  The kernel takes a closed
    descriptor out of an epoll by itself, so the number's next owner must
    be registered anew, not taken as already there."""
    async def go():
        client = CurlClient()
        first = os.eventfd(0)
        client._handle_socket(pycurl.POLL_IN, first, None, None)
        client._handle_socket(pycurl.POLL_REMOVE, first, None, None)
        assert first in client._registered and first not in client._wanted  # resting
        os.close(first)
        second = os.eventfd(0)
        try:
            assert second == first  # the kernel gives out the lowest free number
            client._handle_socket(pycurl.POLL_IN, second, None, None)
            os.eventfd_write(second, 1)
            assert [fd for fd, _ in client._ep.poll(0)] == [second]
        finally:
            client._handle_socket(pycurl.POLL_REMOVE, second, None, None)
            os.close(second)
            client.close()
    asyncio.run(go())


def test_a_socket_let_go_while_writing_leaves_at_once():
    """A writable socket would fire at the next turn anyway."""
    async def go():
        client = CurlClient()
        fd = os.eventfd(0)
        try:
            client._handle_socket(pycurl.POLL_OUT, fd, None, None)
            client._handle_socket(pycurl.POLL_REMOVE, fd, None, None)
            assert fd not in client._registered
            assert client._ep.poll(0) == []
        finally:
            os.close(fd)
            client.close()
    asyncio.run(go())


def test_ready_sockets_are_taken_a_bounded_batch_per_turn():
    """Thousands of streams may be ready at once; one turn of the loop
    takes a bounded batch so the client's own sockets cannot hold it."""
    async def go():
        client = CurlClient()
        fds = [os.eventfd(1) for _ in range(300)]  # all readable
        acted = []
        client._act = lambda fd, action: acted.append(fd)
        try:
            for fd in fds:
                client._handle_socket(pycurl.POLL_IN, fd, None, None)
            client._on_ready(client._ep.fileno(), 1)
            first = len(acted)
            client._on_ready(client._ep.fileno(), 1)
            # (nothing reads them here, so all stay ready: the second turn
            # starts with those the first left, as the kernel queues them)
            assert 0 < first < 300 and set(acted) == set(fds)
        finally:
            for fd in fds:
                client._handle_socket(pycurl.POLL_REMOVE, fd, None, None)
                os.close(fd)
            client.close()
    asyncio.run(go())


def test_many_transfers_started_at_once_all_complete():
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        transfers = []
        for i in range(40):
            t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x", [], b'{"i":%d}' % i)
            client.start(t)
            transfers.append(t)
        done = await asyncio.wait_for(asyncio.gather(*(t.done for t in transfers)), 10)
        assert [d[0] for d in done] == [0] * 40
        assert all(t.status == 200 and b"".join(t.chunks) == BODY for t in transfers)
        client.close()
        server.close()
    asyncio.run(go())


def test_a_transfer_goes_out_when_started_not_a_loop_turn_later():
    """A transfer added to libcurl is run at once: its request is on the
    wire before start() returns, on a kept-alive connection.  Waiting for
    libcurl's zero timeout cost every call one more loop turn, which lasts
    milliseconds with thousands of streams open."""
    import socket
    import threading

    seen = []
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)

    def serve():
        conn, _ = lst.accept()
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf and len(buf) >= buf.index(b"\r\n\r\n") + 4 + len(BODY):
                buf = buf[buf.index(b"\r\n\r\n") + 4 + len(BODY):]
                seen.append(time.monotonic())
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    threading.Thread(target=serve, daemon=True).start()
    port = lst.getsockname()[1]

    async def go():
        client = CurlClient()
        assert await _one_call(client, port) == 0  # the connection, kept alive
        t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x", [], BODY)
        client.start(t)
        time.sleep(0.3)  # no loop turn meanwhile
        assert len(seen) == 2, seen
        err, _ = await asyncio.wait_for(t.done, 10)
        assert err == 0 and b"".join(t.chunks) == BODY
        client.close()
    try:
        asyncio.run(go())
    finally:
        lst.close()


@contextlib.contextmanager
def _slow_ready_sockets(client, n=40):
    """n sockets that stay readable, each taking a millisecond to serve;
    yields the list of those served, in order."""
    fds = [os.eventfd(1) for _ in range(n)]
    acted = []

    def slow_act(fd, action):
        acted.append(fd)
        time.sleep(0.001)
    client._act = slow_act
    try:
        for fd in fds:
            client._handle_socket(pycurl.POLL_IN, fd, None, None)
        yield fds, acted
    finally:
        client.active = 0
        for fd in fds:
            client._handle_socket(pycurl.POLL_REMOVE, fd, None, None)
            os.close(fd)
        client.close()


def test_a_turn_budget_bounds_the_time_one_turn_gives_ready_sockets():
    """The streams' client gives each loop turn at most its budget (the rest
    stays ready for the next turn, after the loop's other work); every
    socket is still served in its turn."""
    async def go():
        client = CurlClient(turn_budget=0.003)
        with _slow_ready_sockets(client) as (fds, acted):
            client._on_ready(client._ep.fileno(), 1)
            assert 1 <= len(acted) <= 4, len(acted)
            turns = 1
            while set(acted) != set(fds) and turns < 40:
                client._on_ready(client._ep.fileno(), 1)
                turns += 1
            assert set(acted) == set(fds) and turns >= 10, turns
    asyncio.run(go())


def test_below_budget_from_a_turn_serves_every_ready_socket():
    """With few transfers open the budget is not applied: a turn's batch is
    short anyway, and cutting it costs CPU."""
    async def go():
        client = CurlClient(turn_budget=0.003, budget_from=100)
        with _slow_ready_sockets(client) as (fds, acted):
            client._on_ready(client._ep.fileno(), 1)
            assert sorted(acted) == sorted(fds)
            acted.clear()
            client.active = 100  # a crowd: the budget holds again
            client._on_ready(client._ep.fileno(), 1)
            assert 1 <= len(acted) <= 4, len(acted)
    asyncio.run(go())


def test_an_agent_body_goes_out_in_few_turns_of_the_loop():
    """libcurl 8 sends even a body handed over whole (POSTFIELDS) through
    its upload buffer, one buffer-full per socket_action: with the 16 KB
    the relay gives a small call, Claude Code's 100 KB went out in seven
    turns of the loop (and as many epoll changes), against two for a body
    that fits.  A body past 16 KB gets libcurl's own 64 KB."""
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        serves = 0
        real = client._serve

        def counted(fd, mask):
            nonlocal serves
            serves += 1
            return real(fd, mask)
        client._serve = counted
        big = b'{"pad":"' + b"x" * 100_000 + b'"}'
        turns = {}
        for name, body in (("small", BODY), ("agent", big)):
            t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x", [], body)
            client.start(t)
            assert (await asyncio.wait_for(t.done, 10))[0] == 0  # the connection is made
            serves = 0
            for _ in range(20):
                t = Transfer("POST", f"http://127.0.0.1:{port}/v1/x", [], body)
                client.start(t)
                assert (await asyncio.wait_for(t.done, 10))[0] == 0
                assert b"".join(t.chunks) == BODY
            turns[name] = serves / 20
        client.close()
        server.close()
        return turns
    turns = asyncio.run(go())
    assert turns["agent"] <= turns["small"] + 1.5, turns
