"""relay/curl_client.py's event-loop registrations, against a real socket.

CurlClient changes a socket's handler in place and keeps libcurl's own
wake-up descriptor registered, where Tornado removes and re-adds at every
wish.  What must hold: every call completes, whether the upstream keeps the
connection, closes it with `Connection: close`, or drops it silently while
idle (libcurl then opens a new socket, often under the same number, and the
old registration must not be taken for the new socket's); and a kept-alive
connection costs fewer than one registration per call.
"""
from __future__ import annotations

import asyncio
import os
import time

import pycurl
import pytest

from relay.curl_client import CurlClient, Transfer

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


def test_a_kept_alive_connection_is_not_registered_again_for_every_call():
    results, adds, removes = asyncio.run(_calls("keep", 60))
    assert results == [(0, 200, BODY)] * 60
    # Tornado's way: two adds and two removes a call (the socket and
    # libcurl's wake-up eventfd, each re-added at every wish).
    assert adds < 1.5 * 60 and removes < 1.5 * 60


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
        fds = list(client._fds)
        assert fds  # at least the wake-up descriptor stays registered
        client.close()
        assert not client._fds
        handlers = client.io_loop.handlers
        assert not [fd for fd in fds if fd in handlers]
        server.close()
    asyncio.run(go())


def test_a_kept_descriptor_ready_while_libcurl_does_not_watch_it_is_let_go():
    """libcurl's wake-up eventfd stays registered between calls; should it
    become readable then (libcurl signalling itself), the event must not
    repeat for ever on a descriptor nobody will read."""
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        assert await _one_call(client, port) == 0
        kept = [fd for fd in client._fds if fd in client._unwatched]
        assert kept, "libcurl's wake-up descriptor is kept between calls"
        calls = 0
        handle = client._handle_events

        def counted(fd, events):
            nonlocal calls
            calls += 1
            return handle(fd, events)

        client.io_loop.handlers[kept[0]] = (kept[0], counted)
        os.eventfd_write(kept[0], 1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            await asyncio.sleep(0.01)
        assert calls == 1
        assert kept[0] not in client._fds
        # and the next call re-adds it and still works
        assert await _one_call(client, port) == 0
        client.close()
        server.close()
    asyncio.run(go())


def test_only_the_multi_handles_own_eventfds_are_kept():
    """A DNS lookup in libcurl's threaded resolver signals through an
    eventfd of its own, reported to us, then let go and closed.  Keeping it
    registered would leave the loop watching a closed number that the next
    socket may get."""
    async def go():
        server, port = await _serve("keep")
        client = CurlClient()
        assert client._kept, "the multi handle's eventfds are found (Linux /proc)"
        assert await _one_call(client, port) == 0
        assert set(client._fds) <= client._kept  # between calls only the kept remain
        lookup = os.eventfd(0)
        try:
            client._handle_socket(pycurl.POLL_IN, lookup, None, None)
            assert lookup in client._fds
            client._handle_socket(pycurl.POLL_REMOVE, lookup, None, None)
            assert lookup not in client._fds and lookup not in client.io_loop.handlers
        finally:
            os.close(lookup)
        assert await _one_call(client, port) == 0
        client.close()
        server.close()
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
