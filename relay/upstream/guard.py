"""The SSRF guard: outbound HTTP to addresses a user or an upstream chose
(webhooks, bots, Midjourney images) reaches only public addresses.

Users choose webhook and bot URLs, and a third-party Midjourney proxy
chooses its image URLs, so a URL could point at the relay's own network
(the database, a metadata service).  The guard sits in the DNS resolver:
every address a host name resolves to is checked at connect time, so a name
that resolves to 127.0.0.1, or re-resolves differently after a check ("DNS
rebinding"), is refused too.  Redirects are not followed, for the same
reason.  `allow_private` (the admin setting allow_private_webhooks) turns
the guard off, e.g. for tests and intranet receivers.

An address is public when it is globally routable and not multicast, and
when an IPv6 address carries an IPv4 one, that one is public too: IPv4-mapped
(::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d; the local-use 64:ff9b:1::/48 is
refused) and 6to4 (2002:AABB:CCDD::).  IPv4-compatible addresses (::a.b.c.d,
deprecated) and site-local ones (fec0::/10, deprecated) are refused: Python's
ipaddress calls all of these global.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from tornado.httpclient import HTTPRequest
from tornado.httputil import HTTPHeaders
from tornado.netutil import DefaultExecutorResolver, Resolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


class Refused(Exception):
    """The destination is not allowed (scheme, or a private address)."""


def _public4(ip: ipaddress.IPv4Address) -> bool:
    return ip.is_global and not ip.is_multicast


def is_public(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if ip.version == 4:
        return _public4(ip)
    if ip.ipv4_mapped is not None:
        return _public4(ip.ipv4_mapped)
    if ip in _NAT64:
        return _public4(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        return _public4(ip.sixtofour)
    if ip in _NAT64_LOCAL or ip in _SITE_LOCAL or int(ip) >> 32 == 0:
        return False
    return ip.is_global and not ip.is_multicast


def _refusal(host: str) -> Refused:
    return Refused(f"{host} is a private or loopback address; an administrator can allow "
                   "these with allow_private_webhooks.")


def check_url(url: str, allow_private: bool) -> None:
    """Refuse a URL before any I/O when its scheme or literal address is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"Not an http(s) URL: {url[:100]!r}.")
    if allow_private:
        return
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        if parts.hostname.lower() in ("localhost",) or parts.hostname.endswith(".localhost"):
            raise Refused("localhost is not allowed; an administrator can allow private "
                          "addresses with allow_private_webhooks.") from None
        return
    if not is_public(str(literal)):
        raise _refusal(parts.hostname)


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


def guarded_client(allow_private: bool, max_clients: int = 32) -> SimpleAsyncHTTPClient:
    """A client of its own whose connections go only where the guard allows."""
    return SimpleAsyncHTTPClient(force_instance=True, max_clients=max_clients,
                                 resolver=GuardedResolver(allow_private=allow_private))


async def stream(client: SimpleAsyncHTTPClient, url: str, on_start, on_chunk,
                 max_bytes: int, timeout: float = 60.0) -> tuple[int, str | None]:
    """GET `url` through a guarded client, passing the body on as it comes:
    on_start(status, headers) once, before the first byte (it returns False
    to refuse the answer), then on_chunk(bytes).  Returns (status, why it
    failed or was cut short, else None).  Never follows redirects; stops at
    `max_bytes`."""
    allow = not isinstance(client.resolver, GuardedResolver) or client.resolver.allow_private
    try:
        check_url(url, allow)
    except Refused as exc:
        return 0, str(exc)
    state = {"status": 0, "headers": HTTPHeaders(), "started": False, "refused": None, "n": 0}

    def header_line(line: str) -> None:
        if line.startswith("HTTP/"):
            parts = line.split()
            state["status"] = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            state["headers"] = HTTPHeaders()
        elif line.strip():
            state["headers"].parse_line(line)

    def start() -> bool:
        if not state["started"]:
            state["started"] = True
            if not on_start(state["status"], state["headers"]):
                state["refused"] = "refused"
        return state["refused"] is None

    def chunk(data: bytes) -> None:
        if not start():
            raise Refused("the answer was refused")  # ends the transfer
        state["n"] += len(data)
        if state["n"] > max_bytes:
            state["refused"] = f"larger than {max_bytes // (1024 * 1024)} MB"
            raise Refused(state["refused"])
        on_chunk(data)

    req = HTTPRequest(url, method="GET", follow_redirects=False, connect_timeout=min(timeout, 10),
                      request_timeout=timeout, header_callback=header_line,
                      streaming_callback=chunk)
    resp = await client.fetch(req, raise_error=False)
    if state["refused"] is not None:
        return state["status"], state["refused"]
    if resp.code == 599:
        err = resp.error
        return state["status"], str(err) if isinstance(err, Refused) else \
            f"no answer from {urlsplit(url).hostname}: {err}"
    start()  # an empty body: the answer is judged all the same
    return resp.code, state["refused"]
