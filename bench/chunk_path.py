"""CPU per streamed chunk on the relay's own path, without libcurl or an upstream.

    python bench/chunk_path.py [--streams 200] [--chunks 200] [--rounds 5]

At 10,000 open streams the relay spends most of its time on chunks (5,000 a
second in bench/streams.py), and that run moves 10-20% from one run to the
next on a shared machine: too much to see a change of a few microseconds a
chunk.  This runs the part that is ours, in one process on the relay's loop
(uvloop and relay/serving/loop.py): --streams clients, each holding one streamed
chat call open on the relay's HTTP server class, and for each of --chunks
rounds one OpenAI chunk per stream handed to the same Transfer objects
libcurl's callbacks fill (relay/upstream/curl_client.py), delivered as the client's
loop turn does, read by the OpenAI stream reader, written by the OpenAI
face, flushed to a real socket.  The clients are a process of their own
that only reads.
It prints the process CPU (user + system) per chunk, the median of
--rounds, and writes nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tornado.web import Application  # noqa: E402

from handlers.relay_base import BodyFirstRouting, RelayHandler  # noqa: E402
from relay.serving import loop as relay_loop, process  # noqa: E402
from relay.adaptors.base import Call  # noqa: E402
from relay.adaptors.openai import OpenAIStream  # noqa: E402
from relay.attempts import _Streaming  # noqa: E402
from relay.upstream.transfer import Transfer  # noqa: E402
from relay.faces.openai import StreamWriter  # noqa: E402


def _chunk(i: int) -> bytes:
    doc = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
           "model": "gpt-4o-mini",
           "choices": [{"index": 0, "delta": {"content": f"piece {i} "}, "finish_reason": None}]}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class _Client:
    """What CurlClient is to a Transfer: the list of transfers with chunks."""

    def __init__(self):
        self._dirty: list = []


class _Open(RelayHandler):
    """Starts a stream and hands it to the bench, which feeds it."""

    async def post(self) -> None:
        bench = self.application.settings["bench"]
        call = Call(request_id=self.request_id, endpoint="chat", face="openai",
                    model="gpt-4o-mini", body={}, stream=True, upstream_model="gpt-4o-mini")
        s = _Streaming(call, self, self.cancel, OpenAIStream(keep_raw=True, lazy=True),
                       StreamWriter(call), 1)
        t = Transfer("POST", "https://x/v1/chat/completions", [])
        t.on_chunk, t.client, t.ok_status, t.final = s.on_chunk, bench.client, True, True
        done = asyncio.get_running_loop().create_future()
        bench.transfers.append(t)
        bench.dones.append(done)
        await done
        self.finish()


class Bench:
    def __init__(self, streams: int, chunks: int):
        self.streams, self.chunks = streams, chunks
        self.client = _Client()
        self.transfers: list = []
        self.dones: list = []

    async def run(self, rounds: int) -> list[float]:
        config = types.SimpleNamespace(max_body_bytes=1 << 20, max_body_mb=1)
        app = type("App", (BodyFirstRouting, Application), {})([("/s", _Open)], config=config,
                                                               bench=self)
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(4096)
        lst.setblocking(False)
        server = process.RelayHTTPServer(app, xheaders=False)
        server.add_sockets([lst])
        port = lst.getsockname()[1]
        readers = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--read",
                                    str(port), "--streams", str(self.streams)])
        while len(self.transfers) < self.streams:
            await asyncio.sleep(0.01)
        per_chunk = []
        payload = [_chunk(i) for i in range(self.chunks)]
        for _ in range(rounds):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for data in payload:
                for t in self.transfers:
                    t._write(data)           # libcurl's write callback
                dirty, self.client._dirty = self.client._dirty, []
                for t in dirty:              # CurlClient._finish_pending_requests
                    t.deliver()
                await asyncio.sleep(0)       # the turn in which the flushes run
            await asyncio.sleep(0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            per_chunk.append(cpu / (self.chunks * self.streams) * 1e6)
        for d in self.dones:
            d.set_result(None)
        await asyncio.sleep(0.2)
        server.stop()
        readers.wait(30)
        return per_chunk


async def _read_all(port: int, n: int) -> None:
    """The clients (a process of their own): open n streams, read to the end."""
    body = b'{"model":"gpt-4o-mini","stream":true}'
    request = (b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    async def one():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        while await reader.read(65536):
            pass
        writer.close()
    await asyncio.gather(*(one() for _ in range(n)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read", type=int, help=argparse.SUPPRESS)  # the clients' process
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    if args.read:
        asyncio.run(_read_all(args.read, args.streams))
        return 0

    async def go():
        relay_loop.install()
        return await Bench(args.streams, args.chunks).run(args.rounds)
    per_chunk = asyncio.run(go())
    print(f"CPU per chunk (us): median {statistics.median(per_chunk):.2f}, rounds "
          + ", ".join(f"{v:.2f}" for v in per_chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
