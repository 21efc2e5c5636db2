"""Outbound HTTP for notifications, behind an SSRF guard.

Users choose webhook and bot URLs, so a URL could point at the relay's own
network (the database, a metadata service).  The guard sits in the DNS
resolver: every address a host name resolves to is checked at connect time,
so a name that resolves to 127.0.0.1, or re-resolves differently after a
check ("DNS rebinding"), is refused too.  Redirects are not followed, for the
same reason.  `allow_private` (the admin setting allow_private_webhooks)
turns the guard off, e.g. for tests and intranet receivers.
"""
from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.netutil import DefaultExecutorResolver, Resolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient


class Refused(Exception):
    """The destination is not allowed (scheme, or a private address)."""


def is_public(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class GuardedResolver(Resolver):
    def initialize(self, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self._inner = DefaultExecutorResolver()

    async def resolve(self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC):
        addrs = await self._inner.resolve(host, port, family)
        if self.allow_private:
            return addrs
        ok = [a for a in addrs if is_public(a[1][0])]
        if not ok:
            raise Refused(f"{host} resolves to a private or loopback address; an administrator "
                          "can allow these with allow_private_webhooks.")
        return ok


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict

    def json(self):
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    def snippet(self, n: int = 300) -> str:
        return self.body[:n].decode("utf-8", "replace")


class HttpClient:
    """One guarded client per notifier; send() never follows redirects."""

    def __init__(self, allow_private: bool, timeout: float = 20.0):
        self.allow_private = allow_private
        self.timeout = timeout
        self._client = SimpleAsyncHTTPClient(
            force_instance=True, max_clients=32,
            resolver=GuardedResolver(allow_private=allow_private))

    def check_url(self, url: str) -> None:
        """Refuse a URL before any I/O when its scheme or literal address is wrong."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Refused(f"Not an http(s) URL: {url[:100]!r}.")
        if self.allow_private:
            return
        try:
            literal = ipaddress.ip_address(parts.hostname)
        except ValueError:
            if parts.hostname.lower() in ("localhost",) or parts.hostname.endswith(".localhost"):
                raise Refused("localhost is not allowed; an administrator can allow private "
                              "addresses with allow_private_webhooks.") from None
            return
        if not is_public(str(literal)):
            raise Refused(f"{parts.hostname} is a private or loopback address; an administrator "
                          "can allow these with allow_private_webhooks.")

    async def send(self, method: str, url: str, headers: dict | None = None,
                   body: bytes | str | None = None, json_body=None) -> Reply:
        """Send one request; raises Refused or OSError-like errors, returns any status."""
        self.check_url(url)
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False).encode()
            headers.setdefault("Content-Type", "application/json; charset=utf-8")
        if isinstance(body, str):
            body = body.encode()
        req = HTTPRequest(url, method=method, headers=headers, body=body,
                          follow_redirects=False, connect_timeout=min(self.timeout, 10.0),
                          request_timeout=self.timeout,
                          allow_nonstandard_methods=True)
        try:
            resp = await self._client.fetch(req, raise_error=False)
        except HTTPClientError as exc:  # timeouts come back as 599
            raise ConnectionError(str(exc)) from None
        if resp.code == 599:
            err = resp.error
            if isinstance(err, Refused):
                raise err
            raise ConnectionError(f"no answer from {urlsplit(url).hostname}: {err}")
        return Reply(resp.code, resp.body or b"", dict(resp.headers.get_all()))

    def close(self) -> None:
        self._client.close()
