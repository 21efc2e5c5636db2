"""A cheap OpenAI-format upstream that holds thousands of slow streams.

    python -m tests.fakes.slow_upstream --port P [--chunks 15] [--interval 2]

The wire format is OpenAI's chat completions over HTTP/1.1 keep-alive:
a streamed answer is `text/event-stream` in chunked transfer encoding, one
`chat.completion.chunk` event per piece (the first carries the role), then
a finish event, a usage event when `stream_options.include_usage` asks for
it, and `data: [DONE]`.  A plain call is answered at once with a
`chat.completion` and its usage, so a probe of plain calls through the
same channel measures the relay, not this fake.

It is a bare asyncio protocol rather than a Tornado app: one stream costs a
socket, a small object and a timer handle, so 10,000 of them fit in a few
tens of megabytes and a fraction of a core (bench/streams.py).

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
import time

USAGE_PROMPT = 10


def _event(doc: dict) -> bytes:
    data = b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
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
            self.answer(head[0].split(" ")[1] if " " in head[0] else "/", body)

    def answer(self, path: str, raw: bytes) -> None:
        self.fake.requests += 1
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        model = body.get("model", "")
        cid = f"chatcmpl-slow{self.fake.requests}"
        usage = {"prompt_tokens": USAGE_PROMPT,
                 "completion_tokens": int(body.get("fake_chunks", self.fake.chunks)),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if not body.get("stream"):
            doc = json.dumps({
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": "Hello from the slow upstream."}}],
                "usage": dict(usage, completion_tokens=1, total_tokens=USAGE_PROMPT + 1)},
                separators=(",", ":")).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc))
            return
        self.busy = True
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        state = {"i": 0, "n": usage["completion_tokens"], "cid": cid, "model": model,
                 "usage": usage if (body.get("stream_options") or {}).get("include_usage")
                 else None,
                 "delay": float(body.get("fake_delay", self.fake.interval)),
                 "drop": "/mode/drop/" in path}
        self.send(state)

    def _chunk(self, state: dict, delta: dict, finish=None) -> bytes:
        return _event({"id": state["cid"], "object": "chat.completion.chunk",
                       "created": int(time.time()), "model": state["model"],
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def send(self, state: dict) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        i = state["i"]
        state["i"] = i + 1
        if i == 0:
            self.transport.write(self._chunk(state, {"role": "assistant", "content": ""}))
            if state["drop"]:
                self.transport.close()
                return
        else:
            self.transport.write(self._chunk(state, {"content": f"piece {i} "}))
        if i < state["n"]:
            self.timer = asyncio.get_running_loop().call_later(state["delay"], self.send, state)
            return
        out = self._chunk(state, {}, "stop")
        if state["usage"] is not None:
            out += _event({"id": state["cid"], "object": "chat.completion.chunk",
                           "created": int(time.time()), "model": state["model"],
                           "choices": [], "usage": state["usage"]})
        data = b"data: [DONE]\n\n"
        self.transport.write(out + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        self.fake.finished += 1
        self.busy = False
        if self.buf:
            self.data_received(b"")


class SlowUpstream:
    def __init__(self, chunks: int = 15, interval: float = 2.0):
        self.chunks = chunks
        self.interval = interval
        self.open = self.requests = self.finished = self.aborted = 0

    async def serve(self, host: str, port: int, backlog: int = 4096):
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _Conn(self), host, port, backlog=backlog)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--interval", type=float, default=2.0)
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
        server = await fake.serve("127.0.0.1", args.port)
        print(f"slow upstream on 127.0.0.1:{args.port}", flush=True)
        async with server:
            await server.serve_forever()
    asyncio.run(run())


if __name__ == "__main__":
    main()
