"""An open stream does not carry its request's headers, nor its own, once
its answer has begun (handlers/relay_base.py): with 10,000 streams open
they were a few KB each, and a coding agent sends twenty-odd headers.

Served in this process by the relay's own HTTP server class and a relay
handler, over a real socket, so that the live objects can be looked at
while the stream is open."""
from __future__ import annotations

import asyncio
import gc
import socket
import types

import pytest
from tornado import httputil
from tornado.web import Application

from handlers.relay_base import RelayHandler
from relay.serving import process
from tests.helpers import dechunk

SECRET = "Bearer sk-shed-test-0123456789"


class _Stream(RelayHandler):
    """Starts an answer, writes a piece, and looks at what is still held
    before writing the last one."""

    async def post(self):
        self.start(200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        self.write(b"data: one\n\n")
        for _ in range(50):  # until the first piece has gone out
            await asyncio.sleep(0.01)
            if self._headers_written:
                break
        seen = self.application.settings["seen"]
        seen["headers"] = len(self.request.headers) + len(self._headers)
        seen["held"] = _headers_holding(SECRET, self.request_id)
        self.write(b"data: two\n\n")
        self.finish()


def _headers_holding(*values: str) -> int:
    """HTTPHeaders objects alive that hold one of `values`: one collection
    and one pass over the heap (in a suite's process, with every module
    loaded, a pass takes seconds on a busy machine)."""
    gc.collect()
    wanted = set(values)
    return sum(1 for o in gc.get_objects()
               if isinstance(o, httputil.HTTPHeaders) and wanted & set(dict(o.get_all()).values()))


def _request(body: bytes, close: bool) -> bytes:
    return (f"POST /s HTTP/1.1\r\nHost: x\r\nAuthorization: {SECRET}\r\n"
            f"User-Agent: shed-test/1.0\r\nX-Stainless-Lang: python\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n").encode() + body


def _read_answer(s: socket.socket) -> tuple[dict, bytes]:
    """One chunked answer off a kept-alive socket: its headers and its body."""
    buf = b""
    while not buf.endswith(b"\r\n0\r\n\r\n"):
        data = s.recv(65536)
        assert data, "connection closed before the answer's last chunk"
        buf += data
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return headers, dechunk(body)


@pytest.fixture
def served():
    loop = asyncio.new_event_loop()
    seen: dict = {}
    config = types.SimpleNamespace(max_body_bytes=1 << 20, max_body_mb=1)
    app = Application([("/s", _Stream)], config=config, seen=seen)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)

    async def serve():
        server = process.RelayHTTPServer(app, xheaders=False)
        server.add_sockets([sock])
        return server
    server = loop.run_until_complete(serve())
    yield loop, sock.getsockname()[1], seen
    server.stop()
    loop.close()


def _client(loop, port: int, rounds: list[bool]) -> list:
    """Requests on one connection (True: the last, with Connection: close),
    run in a thread while the loop serves."""
    def talk():
        out = []
        # Generous: the handler looks through the whole heap while this waits.
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            for close in rounds:
                s.sendall(_request(b'{"stream": true}', close))
                out.append(_read_answer(s))
        return out
    return loop.run_until_complete(loop.run_in_executor(None, talk))


def test_an_open_stream_holds_neither_the_requests_headers_nor_its_own(served):
    loop, port, seen = served
    [(headers, body)] = _client(loop, port, [True])
    assert seen["held"] == 0
    assert seen["headers"] == 0
    # What the client got is whole: the answer's headers were written first.
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    assert headers["transfer-encoding"] == "chunked"
    assert headers["x-request-id"].startswith("req_")
    assert body == b"data: one\n\ndata: two\n\n"


def test_the_next_request_on_a_kept_connection_has_its_headers(served):
    loop, port, seen = served
    answers = _client(loop, port, [False, False, True])
    assert [body for _, body in answers] == [b"data: one\n\ndata: two\n\n"] * 3
    ids = {h["x-request-id"] for h, _ in answers}
    assert len(ids) == 3
    assert "connection" not in answers[0][0]  # kept alive: not told to close
    assert seen["held"] == 0
