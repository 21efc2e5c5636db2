"""The floor of our stack: a Tornado server that forwards each POST to one
upstream with the curl AsyncHTTPClient, and does nothing else (no key, no
billing, no usage log, no JSON parsing).

    python bench/bare_proxy.py --port P --upstream http://127.0.0.1:Q

bench/run.py measures it next to the relay: relay req/s over bare-proxy
req/s is the share of the stack's own ceiling the relay logic leaves.
"""
from __future__ import annotations

import argparse

import tornado.web
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop


PASSED = {"Authorization", "X-Api-Key", "X-Goog-Api-Key", "Anthropic-Version"}


class Forward(tornado.web.RequestHandler):
    def initialize(self, upstream: str, client: CurlAsyncHTTPClient):
        self.upstream = upstream
        self.client = client

    async def post(self, path: str) -> None:
        # The vendor's own key headers pass (bench/agents.py sends each
        # format's); otherwise the fake's test key.
        headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
        headers.update((h, v) for h, v in self.request.headers.get_all() if h in PASSED)
        url = self.upstream + self.request.uri
        if b'"stream":true' not in self.request.body and "alt=sse" not in url:
            r = await self.client.fetch(url, method="POST", headers=headers,
                                        body=self.request.body, raise_error=False)
            self.set_status(r.code)
            self.set_header("Content-Type", r.headers.get("Content-Type", "application/json"))
            self.finish(r.body)
            return
        self.set_header("Content-Type", "text/event-stream")

        def chunk(data: bytes) -> None:
            self.write(data)
            self.flush()
        await self.client.fetch(url, method="POST", headers=headers,
                                body=self.request.body, streaming_callback=chunk,
                                raise_error=False)
        self.finish()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--uvloop", action="store_true",
                    help="run on uvloop, as the relay does (default: asyncio's own loop)")
    args = ap.parse_args()
    if args.uvloop:
        import asyncio

        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    client = CurlAsyncHTTPClient(force_instance=True, max_clients=512)
    app = tornado.web.Application([(r"(/.*)", Forward,
                                    {"upstream": args.upstream, "client": client})])
    HTTPServer(app).listen(args.port, "127.0.0.1")
    IOLoop.current().start()


if __name__ == "__main__":
    main()
