"""relay/upstream/pacer.py through relay/upstream/client.py, against a real
keep-alive HTTP/1.1 server on 127.0.0.1: a call that reuses a pooled
connection never waits for the address's window; one that needs a new
connection waits for a place, within its connect timeout (524 past it), in
a bounded queue (503 relay_overloaded past it)."""
from __future__ import annotations

import asyncio

from relay.upstream.client import Upstream
from relay.upstream.pacer import Pacer
from tests.relay.upstream.test_curl_sockets import _Upstream

BODY = b'{"ok":true}'


async def _upstream():
    """A keep-alive server, and the list of connections it accepted."""
    connections = []

    class Counted(_Upstream):
        mode = "keep"

        def connection_made(self, transport) -> None:
            connections.append(transport)
            super().connection_made(transport)
    server = await asyncio.get_running_loop().create_server(Counted, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x", connections


async def _until(cond, limit: int = 500) -> None:
    for _ in range(limit):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_reused_connection_never_waits_and_a_new_one_waits_for_a_place():
    async def go():
        server, url, connections = await _upstream()
        up = Upstream(connect_window=1)
        try:
            first = await up.send("POST", url, {}, BODY)
            assert (first.status, first.body, first.error) == (200, BODY, None)
            origin = up.pacer.origin(url)
            # The only place is taken (as by a connect whose SYN went unanswered).
            assert up.pacer.take(origin)
            again = await asyncio.wait_for(up.send("POST", url, {}, BODY), 10)
            assert (again.status, again.error) == (200, None)  # the pooled connection
            assert len(connections) == 1
            # Two at once: one takes the pooled connection, the other needs a
            # new one and waits for the place.
            a = asyncio.ensure_future(up.send("POST", url, {}, BODY))
            b = asyncio.ensure_future(up.send("POST", url, {}, BODY))
            await _until(lambda: len(origin.waiters) == 1 and (a.done() or b.done()))
            assert len(connections) == 1
            up.pacer.release(origin)
            for r in await asyncio.gather(a, b):
                assert (r.status, r.body, r.error) == (200, BODY, None)
            # (the one that waited may find the pooled connection free by then)
            assert len(connections) <= 2 and origin.connecting == 0
        finally:
            up.close()
            server.close()
    asyncio.run(go())


def test_a_call_waits_for_a_place_only_within_its_connect_timeout():
    async def go():
        server, url, connections = await _upstream()
        up = Upstream(connect_window=1, connect_timeout=0.5)
        try:
            origin = up.pacer.origin(url)
            assert up.pacer.take(origin)
            r = await up.send("POST", url, {}, BODY)
            assert r.error is not None and r.error.status == 524, r.error
            assert r.error.code == "upstream_connect_timeout"
            assert connections == []  # nothing was sent
            up.pacer.release(origin)
            ok = await up.send("POST", url, {}, BODY)
            assert (ok.status, ok.error) == (200, None)
            assert origin.connecting == 0 and not origin.waiters
        finally:
            up.close()
            server.close()
    asyncio.run(go())


def test_the_queue_for_a_place_is_bounded():
    async def go():
        server, url, connections = await _upstream()
        up = Upstream(connect_window=1)
        up.pacer.max_waiting = 2
        try:
            origin = up.pacer.origin(url)
            assert up.pacer.take(origin)
            waiting = [asyncio.ensure_future(up.send("POST", url, {}, BODY)) for _ in range(2)]
            await _until(lambda: len(origin.waiters) == 2)
            over = await up.send("POST", url, {}, BODY)
            assert over.error is not None and over.error.status == 503
            assert over.error.code == "relay_overloaded" and over.error.retry_after >= 1
            up.pacer.release(origin)
            for r in await asyncio.gather(*waiting):
                assert (r.status, r.error) == (200, None)
            assert len(connections) >= 1 and origin.connecting == 0
        finally:
            up.close()
            server.close()
    asyncio.run(go())


def test_the_window_grows_with_connections_opened_and_halves_on_a_connect_timeout():
    async def go():
        pacer = Pacer(max_window=8)
        o = pacer.origin("http://10.0.0.1:8000/v1/chat/completions")
        assert o is pacer.origin("http://10.0.0.1:8000/other")
        assert o is not pacer.origin("https://10.0.0.1:8000/v1")
        assert o.window == 4 and o.attempt_timeout(0) == 1.0  # nothing learnt yet
        for _ in range(10):
            assert pacer.take(o)
            pacer.release(o, took=0.002)
        assert o.window == 8  # its bound
        assert o.attempt_timeout(0) == 0.25 and o.attempt_timeout(2) == 1.0
        assert pacer.take(o)
        pacer.release(o, timed_out=True)
        assert o.window == 4
        for _ in range(5):
            assert pacer.take(o)
            pacer.release(o, timed_out=True)
        assert o.window == 1
        # One place: a second waits until the first gives it back, in order.
        assert pacer.take(o)
        assert not pacer.take(o)
        w1 = asyncio.ensure_future(pacer.wait(o, 5))
        w2 = asyncio.ensure_future(pacer.wait(o, 0.05))
        await asyncio.sleep(0)
        assert await w2 is False  # gave up: its deadline passed
        pacer.release(o, took=0.001)
        assert await w1 is True and o.connecting == 1
        pacer.release(o, took=0.001)
        assert o.connecting == 0 and pacer.take(o)
    asyncio.run(go())


def test_kept_alive_connections_are_still_reused_over_plain_http():
    """A transfer asks libcurl for a fresh connection only when none is
    known to be idle (relay/upstream/curl_client.py): three concurrent calls
    open three connections, and the calls after them reuse those."""
    async def go():
        server, url, connections = await _upstream()
        up = Upstream()
        try:
            first = await asyncio.gather(*(up.send("POST", url, {}, BODY) for _ in range(3)))
            assert [(r.status, r.error) for r in first] == [(200, None)] * 3
            assert len(connections) == 3
            for _ in range(3):
                rs = await asyncio.gather(*(up.send("POST", url, {}, BODY) for _ in range(3)))
                assert [(r.status, r.error) for r in rs] == [(200, None)] * 3
            for _ in range(5):
                assert (await up.send("POST", url, {}, BODY)).status == 200
            assert len(connections) == 3
        finally:
            up.close()
            server.close()
    asyncio.run(go())
