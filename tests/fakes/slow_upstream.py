"""A cheap OpenAI-format upstream that holds thousands of slow streams.

    python -m tests.fakes.slow_upstream --port P [--chunks 15] [--interval 2]

The wire format is OpenAI's chat completions over HTTP/1.1 keep-alive:
a streamed answer is `text/event-stream` in chunked transfer encoding, one
`chat.completion.chunk` event per piece (the first carries the role), then
a finish event, a usage event when `stream_options.include_usage` asks for
it, and `data: [DONE]`.  A plain call is answered at once with a
`chat.completion` and its usage, so a probe of plain calls through the
same channel measures the relay, not this fake.

With `--tls DIR` it serves HTTPS instead, from a certificate made under DIR
by a test CA (`DIR/ca.pem`, for the relay's `upstream_ca_file`), and
speaks HTTP/2 to clients that offer it by ALPN, as the vendors' own APIs
do: up to 100 concurrent streams per connection (SETTINGS_MAX_CONCURRENT_
STREAMS), each event one DATA frame.

It is a bare asyncio protocol rather than a Tornado app: one stream costs a
small object and a timer handle (plus a socket over HTTP/1.1), so 10,000
of them fit in a few tens of megabytes and a fraction of a core
(bench/streams.py).

The body may steer a stream, as with tests/fakes/openai_upstream.py:
`fake_chunks` (pieces of content) and `fake_delay` (seconds between them).
Failure modes, by path prefix `/mode/<name>`:
    ok       answer normally (also the bare path)
    drop     send the first event, then close the connection mid-stream
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import threading
import time

USAGE_PROMPT = 10
MAX_STREAMS_PER_CONNECTION = 100


def _sse(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class _Answer:
    """One request's answer, as pieces of the body: a whole JSON document
    for a plain call, or the events of a stream, one piece per tick."""

    __slots__ = ("i", "n", "cid", "model", "usage", "delay", "drop", "plain")

    def __init__(self, fake: "SlowUpstream", path: str, raw: bytes):
        fake.requests += 1
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        self.model = body.get("model", "")
        self.cid = f"chatcmpl-slow{fake.requests}"
        n = int(body.get("fake_chunks", fake.chunks))
        usage = {"prompt_tokens": USAGE_PROMPT, "completion_tokens": n,
                 "total_tokens": USAGE_PROMPT + n, "prompt_tokens_details": {"cached_tokens": 0}}
        self.plain = None
        if not body.get("stream"):
            self.plain = json.dumps({
                "id": self.cid, "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": "Hello from the slow upstream."}}],
                "usage": dict(usage, completion_tokens=1, total_tokens=USAGE_PROMPT + 1)},
                separators=(",", ":")).encode()
        self.i, self.n = 0, n
        self.usage = usage if (body.get("stream_options") or {}).get("include_usage") else None
        self.delay = float(body.get("fake_delay", fake.interval))
        self.drop = "/mode/drop/" in path

    def _chunk(self, delta: dict, finish=None) -> bytes:
        return _sse({"id": self.cid, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": self.model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def next(self) -> tuple[bytes, bool]:
        """The next piece of the stream, and whether it is the last."""
        i = self.i
        self.i += 1
        if i == 0:
            return self._chunk({"role": "assistant", "content": ""}), False
        out = self._chunk({"content": f"piece {i} "})
        if i < self.n:
            return out, False
        out += self._chunk({}, "stop")
        if self.usage is not None:
            out += _sse({"id": self.cid, "object": "chat.completion.chunk",
                         "created": int(time.time()), "model": self.model, "choices": [],
                         "usage": self.usage})
        return out + b"data: [DONE]\n\n", True


class _H1(asyncio.Protocol):
    """HTTP/1.1 keep-alive; a stream in chunked transfer encoding."""

    def __init__(self, fake: "SlowUpstream"):
        self.fake = fake
        self.buf = bytearray()
        self.transport = None
        self.busy = False
        self.timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.fake.open += 1

    def connection_lost(self, exc) -> None:
        self.fake.open -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.fake.aborted += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            parts = head[0].split(" ")
            self.answer(_Answer(self.fake, parts[1] if len(parts) > 1 else "/", body))

    def answer(self, a: _Answer) -> None:
        if a.plain is not None:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(a.plain), a.plain))
            return
        self.busy = True
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.send(a)

    def send(self, a: _Answer) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        data, last = a.next()
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) + (b"0\r\n\r\n" if last else b""))
        if a.drop:
            self.transport.close()
        elif not last:
            self.timer = asyncio.get_running_loop().call_later(a.delay, self.send, a)
        else:
            self.fake.finished += 1
            self.busy = False
            if self.buf:
                self.data_received(b"")


class _H2(asyncio.Protocol):
    """HTTP/2 (h2 by ALPN over TLS): many streams on one connection."""

    def __init__(self, fake: "SlowUpstream", transport):
        import h2.config
        import h2.connection
        self.fake = fake
        self.transport = transport
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        self.conn.local_settings.max_concurrent_streams = MAX_STREAMS_PER_CONNECTION
        self.conn.initiate_connection()
        self.requests: dict[int, list] = {}   # stream id -> [path, body]
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.kinds: set[str] = set()          # "plain", "stream": what it carried
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        import h2.events
        import h2.exceptions
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                path = dict(ev.headers).get(":path", "/")
                self.requests[ev.stream_id] = [path, bytearray()]
                self.fake.peak_streams = max(self.fake.peak_streams,
                                             self.conn.open_inbound_streams)
            elif isinstance(ev, h2.events.DataReceived):
                req = self.requests.get(ev.stream_id)
                if req is not None:
                    req[1] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                req = self.requests.pop(ev.stream_id, None)
                if req is not None:
                    self.answer(ev.stream_id, _Answer(self.fake, req[0], bytes(req[1])))
            elif isinstance(ev, h2.events.StreamReset):
                self.requests.pop(ev.stream_id, None)
                timer = self.timers.pop(ev.stream_id, None)
                if timer is not None:
                    timer.cancel()
                    self.fake.aborted += 1
        self.flush()

    def answer(self, sid: int, a: _Answer) -> None:
        self.kinds.add("stream" if a.plain is None else "plain")
        if a.plain is not None:
            self.conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                                         ("content-length", str(len(a.plain)))])
            self.conn.send_data(sid, a.plain, end_stream=True)
            return
        self.conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream"),
                                     ("cache-control", "no-cache")])
        self.send(sid, a)

    def send(self, sid: int, a: _Answer) -> None:
        import h2.exceptions
        self.timers.pop(sid, None)
        if self.transport.is_closing():
            return
        data, last = a.next()
        try:
            self.conn.send_data(sid, data, end_stream=last)
        except h2.exceptions.StreamClosedError:
            return
        if a.drop:
            self.conn.reset_stream(sid)
        elif not last:
            self.timers[sid] = asyncio.get_running_loop().call_later(a.delay, self.send, sid, a)
        else:
            self.fake.finished += 1
        self.flush()

    def connection_lost(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
            self.fake.aborted += 1
        self.timers.clear()


class _Conn(asyncio.Protocol):
    """Picks HTTP/2 or HTTP/1.1 by what TLS negotiated."""

    def __init__(self, fake: "SlowUpstream"):
        self.fake = fake
        self.impl = None

    def connection_made(self, transport) -> None:
        ssl_obj = transport.get_extra_info("ssl_object")
        if ssl_obj is not None and ssl_obj.selected_alpn_protocol() == "h2":
            self.fake.open += 1
            self.fake.h2_connections += 1
            self.impl = _H2(self.fake, transport)
            self.fake.h2_conns.append(self.impl)
        else:
            self.impl = _H1(self.fake)
            self.impl.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.impl.data_received(data)

    def connection_lost(self, exc) -> None:
        if isinstance(self.impl, _H2):
            self.fake.open -= 1
            self.impl.connection_lost()
        elif self.impl is not None:
            self.impl.connection_lost(exc)


class SlowUpstream:
    def __init__(self, chunks: int = 15, interval: float = 2.0):
        self.chunks = chunks
        self.interval = interval
        self.open = self.requests = self.finished = self.aborted = 0
        # HTTP/2 connections ever opened, and the most streams open at once
        # on one of them.
        self.h2_connections = self.peak_streams = 0
        self.h2_conns: list = []  # every HTTP/2 connection's _H2 (its `kinds`)

    async def serve(self, host: str, port: int, backlog: int = 4096, tls_dir: str = ""):
        ssl_ctx = make_tls(tls_dir) if tls_dir else None
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _Conn(self), host, port, backlog=backlog,
                                        ssl=ssl_ctx)

    def start(self, tls_dir: str = "") -> str:
        """Serve on a free 127.0.0.1 port from a thread and loop of its own
        (for tests); returns the base URL, https with tls_dir."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        box = {}

        def run():
            asyncio.set_event_loop(loop)
            box["server"] = loop.run_until_complete(self.serve("127.0.0.1", 0, tls_dir=tls_dir))
            ready.set()
            loop.run_forever()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(20):
            raise RuntimeError("the slow upstream did not start")
        self._loop = loop
        port = box["server"].sockets[0].getsockname()[1]
        return f"{'https' if tls_dir else 'http'}://127.0.0.1:{port}"

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def make_tls(tls_dir: str):
    """A server context for 127.0.0.1 signed by a throw-away CA, whose
    certificate is written to tls_dir/ca.pem for the client to trust."""
    import os
    import ssl

    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    os.makedirs(tls_dir, exist_ok=True)
    ca.cert_pem.write_to_path(os.path.join(tls_dir, "ca.pem"))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--tls", default="", help="serve HTTPS (and HTTP/2); the CA goes here")
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def run():
        fake = SlowUpstream(args.chunks, args.interval)
        server = await fake.serve("127.0.0.1", args.port, tls_dir=args.tls)
        print(f"slow upstream on 127.0.0.1:{args.port}", flush=True)
        async with server:
            await server.serve_forever()
    asyncio.run(run())


if __name__ == "__main__":
    main()
