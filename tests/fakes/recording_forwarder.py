"""A recording forwarder on 127.0.0.1: put it between a client and the
relay to see exactly what the client sends (headers, query, body bytes).

Every request is recorded in `requests` ({method, path, query, headers,
raw, body}) and forwarded to `target`; the answer (status, content type,
body) goes back to the client whole, once the target has finished it.
"""
from __future__ import annotations

import json

import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from tests.fakes.server import ThreadedServer

_HOP = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding"}


class _Forward(tornado.web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "POST", "DELETE")

    def initialize(self, fwd):
        self.fwd = fwd

    def check_xsrf_cookie(self):
        pass

    async def _any(self):
        r = self.request
        try:
            body = json.loads(r.body) if r.body else None
        except ValueError:
            body = None
        self.fwd.requests.append({"method": r.method, "path": r.path, "query": r.query,
                                  "headers": dict(r.headers), "raw": r.body, "body": body})
        headers = {k: v for k, v in r.headers.get_all() if k.lower() not in _HOP}
        resp = await AsyncHTTPClient().fetch(HTTPRequest(
            self.fwd.target + r.uri, method=r.method, headers=headers,
            body=r.body if r.method == "POST" else None, request_timeout=300,
            decompress_response=True), raise_error=False)
        self.set_status(resp.code if resp.code != 599 else 502)
        self.set_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
        self.finish(resp.body or b"")

    get = post = delete = _any


class RecordingForwarder(ThreadedServer):
    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.requests: list[dict] = []

    def routes(self):
        return [(r"/.*", _Forward, {"fwd": self})]
