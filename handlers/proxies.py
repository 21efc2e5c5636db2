"""The client's real address and scheme behind a reverse proxy or CDN.

X-Real-IP, X-Forwarded-For and X-Forwarded-Proto are believed only when
the connection comes from an address in the `trusted_proxies` setting
(CIDR ranges; by default the loopback addresses, as uvicorn does, so that a
proxy on the same host works as it comes; "none" trusts nobody).

X-Real-IP, when the proxy sends it, is the client: a proxy that sets it
(nginx's `proxy_set_header X-Real-IP $remote_addr`, Traefik) replaces
whatever the client sent, while a client's own X-Forwarded-For is passed on
by nginx unless told otherwise, and would win if read first.  Without it,
X-Forwarded-For is read from the right: each hop that is itself a trusted
proxy is skipped, and the first one that is not is the client; whatever a
client writes there itself sits to the left of what its first proxy
appended, so it is never taken.  A proxy that neither sets X-Real-IP nor
drops the client's (Caddy, HAProxy as they come) must be told to
(`header_up X-Real-IP {remote_host}`), or the client's own would count.

`apply` runs once per request, before routing (server.RelayApplication), and
rewrites request.remote_ip and request.protocol: key allow-lists, sign-in
throttling, usage records, Secure cookies and the access log all see the
result.
"""
from __future__ import annotations

import ipaddress

from models.records import parse_networks


class Trusted(tuple):
    """The trusted networks, and which peer addresses are in them: a relay
    sees few peers, and parsing the peer's address for every request was
    about 1% of a relayed call once loopback was trusted by default."""

    PEERS = 4096

    def __new__(cls, nets=()):
        obj = super().__new__(cls, nets)
        obj.peers = {}
        return obj

    def peer(self, remote_ip: str) -> bool:
        hit = self.peers.get(remote_ip)
        if hit is None:
            hit = _trusted(_ip(remote_ip), self)
            if len(self.peers) >= self.PEERS:
                self.peers.clear()
            self.peers[remote_ip] = hit
        return hit


def networks(setting: str) -> Trusted:
    """The trusted_proxies setting (comma- or space-separated CIDRs, or
    "none") parsed; raises ValueError naming a bad entry."""
    if (setting or "").strip().lower() == "none":
        return Trusted()
    return Trusted(parse_networks(setting or ""))


def _ip(text: str):
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return addr


def _trusted(addr, nets: tuple) -> bool:
    return addr is not None and any(addr in n for n in nets if n.version == addr.version)


def apply(request, nets: Trusted) -> None:
    if not nets or not nets.peer(request.remote_ip or ""):
        return
    client = _ip(request.headers.get("X-Real-IP", ""))
    if client is None:
        hops = [h for v in request.headers.get_list("X-Forwarded-For") for h in v.split(",")]
        for hop in reversed(hops):
            addr = _ip(hop)
            if addr is None:
                break  # garbage: stop at the last hop we could read
            client = addr
            if not _trusted(addr, nets):
                break
    if client is not None:
        request.remote_ip = str(client)
    proto = request.headers.get("X-Forwarded-Proto", "") or request.headers.get("X-Scheme", "")
    proto = proto.split(",")[-1].strip().lower()
    if proto in ("http", "https"):
        request.protocol = proto
