"""A relay handler gets a small request's body whole, before it runs
(handlers/relay_base.py, BodyFirst): no turns of the loop between the
request's headers and post() but the one that makes the handler.  Bodies
that are large, chunked or for an upload still stream in, so that one over
the limit is refused unread and an upload passes on as it arrives.

Served in this process by the relay's HTTP server class over a real socket;
the handler records what it saw and counts the loop's turns."""
from __future__ import annotations

import asyncio
import gc
import json
import socket
import types

import pytest
from tornado.web import Application

from handlers.relay_base import EAGER_BODY, BodyFirst, BodyFirstRouting, RelayHandler
from relay.serving import process
from relay.errors import RelayError
from tests.helpers import recv_all


class _Echo(RelayHandler):
    key_first = False  # no relay service here: the body's path, not the key, is tested

    def initialize(self) -> None:
        super().initialize()
        self.pieces = 0

    def data_received(self, chunk: bytes) -> None:
        self.pieces += 1
        super().data_received(chunk)

    async def prepare(self) -> None:
        await super().prepare()
        seen = self.application.settings["seen"]
        seen["at_prepare"] = len(self.request.body)
        seen["turn_at_prepare"] = seen["turns"]
        if self.request.headers.get("X-Refuse"):
            raise RelayError(401, "no key", "authentication_error", "invalid_api_key")

    async def post(self) -> None:
        seen = self.application.settings["seen"]
        seen["streamed_pieces"] = self.pieces
        seen["turn_at_post"] = seen["turns"]
        body = self.body
        seen["held"] = sum(len(o.chunks or b"") for o in gc.get_referrers(self.request)
                           if isinstance(o, BodyFirst))
        self.finish({"length": len(body), "tail": body[-8:].decode()})


class _Upload(_Echo):
    buffer_body = False


class _App(BodyFirstRouting, Application):
    pass


@pytest.fixture
def served():
    loop = asyncio.new_event_loop()
    seen: dict = {"turns": 0}
    config = types.SimpleNamespace(max_body_bytes=4 << 20, max_body_mb=4)
    app = _App([("/echo", _Echo), ("/upload", _Upload)], config=config, seen=seen)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)

    def turn():  # counts the loop's turns (a timer, so the loop still sleeps)
        seen["turns"] += 1
        loop.call_later(0.0005, turn)

    async def serve():
        server = process.RelayHTTPServer(app, xheaders=False)
        server.add_sockets([sock])
        loop.call_soon(turn)
        return server
    server = loop.run_until_complete(serve())
    yield loop, sock.getsockname()[1], seen
    server.stop()
    loop.close()


def _exchange(loop, port: int, head: str, body: bytes) -> tuple[int, dict]:
    def talk():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head.encode() + body)
            buf = recv_all(s)
        status = int(buf.split(b" ", 2)[1])
        payload = buf.split(b"\r\n\r\n", 1)[1]
        return status, (json.loads(payload) if payload.startswith(b"{") else {})
    return loop.run_until_complete(loop.run_in_executor(None, talk))


def _post(path: str, body: bytes, extra: str = "") -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n")


def test_a_small_body_is_whole_when_the_handler_starts(served):
    loop, port, seen = served
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    status, doc = _exchange(loop, port, _post("/echo", body), body)
    assert status == 200 and doc == {"length": len(body), "tail": body[-8:].decode()}
    assert seen["at_prepare"] == len(body) and seen["streamed_pieces"] == 0
    # prepare() and post() in the same turn: nothing awaited in between.
    assert seen["turn_at_post"] == seen["turn_at_prepare"]
    # The body is held once (request.body), not also by Tornado's delegate,
    # which lives as long as the request: a coding agent's body is 100 KB.
    assert seen["held"] == 0


def test_a_large_body_still_streams_in(served):
    loop, port, seen = served
    body = b'{"pad":"' + b"y" * (EAGER_BODY + 100_000) + b'"}'
    status, doc = _exchange(loop, port, _post("/echo", body), body)
    assert status == 200 and doc["length"] == len(body)
    assert seen["at_prepare"] == 0 and seen["streamed_pieces"] >= 1


def test_a_body_over_the_limit_is_refused_unread(served):
    loop, port, seen = served
    head = _post("/echo", b"").replace("Content-Length: 0", f"Content-Length: {5 << 20}")
    status, doc = _exchange(loop, port, head, b"")  # the body is never sent
    assert status == 413 and doc["error"]["code"] == "request_too_large"


def test_a_chunked_body_streams_in(served):
    loop, port, seen = served
    head = ("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    status, doc = _exchange(loop, port, head, b"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n")
    assert status == 200 and doc == {"length": 7, "tail": '{"a":1}'}
    assert seen["at_prepare"] == 0 and seen["streamed_pieces"] >= 1


def test_an_upload_handler_always_streams(served):
    loop, port, seen = served
    status, _ = _exchange(loop, port, _post("/upload", b'{"a":1}'), b'{"a":1}')
    assert status == 200
    assert seen["at_prepare"] == 0 and seen["streamed_pieces"] == 1


def test_a_refusal_in_prepare_is_still_answered_after_the_body(served):
    loop, port, seen = served
    body = b'{"model":"m"}'
    status, doc = _exchange(loop, port, _post("/echo", body, "X-Refuse: 1\r\n"), body)
    assert status == 401 and doc["error"]["code"] == "invalid_api_key"
