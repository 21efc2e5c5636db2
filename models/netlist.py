"""Key allow-lists: the addresses and CIDR ranges a key may be used from.

A list is checked on every call of its key and loaded whenever the key is
cached again, so what a user may save is bounded, and the stored form is
cheap to load:

- saved (handlers/api_token.py): at most MAX_TEXT characters and
  MAX_ENTRIES entries as typed (checked before any entry is parsed); then
  parsed by the ipaddress module (every form it takes, netmasks included)
  off the event loop and collapsed (overlapping and adjacent ranges
  merged): at most MAX_NETWORKS networks may remain.  The text is kept as
  typed (`allow_ips`, what the API and the console show) and the networks
  beside it (`allow_nets`: each version's ranges as big-endian integers,
  packed and hex-encoded);
- loaded (Token.from_doc): one struct.unpack per version, some hundred
  times faster than parsing the text again (256 networks: about 20 us);
- checked (Token.ip_allowed): one binary search, whatever the length.

Keys saved before `allow_nets` existed are compiled at start
(models/migrations.py); until then they are parsed from their text.
"""
from __future__ import annotations

import ipaddress
import re
import socket
import struct
from bisect import bisect_right

from models.refusal import Refusal

MAX_TEXT = 64 * 1024
MAX_ENTRIES = 1024
MAX_NETWORKS = 256
_SPLIT = re.compile(r"[\s,;]+")
# No address or range is longer (an IPv6 address with a netmask is 83).
_LONGEST = 100


def entries(raw) -> list[str]:
    """The entries of an allow-list as sent (text, or a list of strings), in
    order, without blanks; ValueError past MAX_TEXT or MAX_ENTRIES, or for
    an entry too long to be an address.  Cheap: the bounds are checked
    before any entry is parsed."""
    if not raw:
        return []
    if isinstance(raw, list):
        if len(raw) > MAX_ENTRIES:
            raise Refusal(f"an allow-list takes at most {MAX_ENTRIES} entries "
                          f"({len(raw)} given)", "allow_ips_entries", max=MAX_ENTRIES,
                          given=len(raw))
        items = [x.strip() if isinstance(x, str) else str(x) for x in raw]
    else:
        text = str(raw)
        if len(text) > MAX_TEXT:
            raise Refusal(f"an allow-list takes at most {MAX_TEXT // 1024} KB of text",
                          "allow_ips_text", max_kb=MAX_TEXT // 1024)
        items = _SPLIT.split(text)
    items = [x for x in items if x]
    if len(items) > MAX_ENTRIES:
        raise Refusal(f"an allow-list takes at most {MAX_ENTRIES} entries ({len(items)} given)",
                      "allow_ips_entries", max=MAX_ENTRIES, given=len(items))
    for item in items:
        if len(item) > _LONGEST:
            raise Refusal(f"not an IP address or CIDR range: {item[:60]!r}", "allow_ips_entry",
                          entry=item[:60])
    return items


def _network(item: str):
    net = ipaddress.ip_network(item, strict=False)
    mapped = getattr(net.network_address, "ipv4_mapped", None)
    if mapped is not None and net.prefixlen >= 96:
        # ::ffff:a.b.c.d is how an IPv4 client may look; it is matched as one.
        return ipaddress.ip_network((mapped, net.prefixlen - 96))
    return net


def _pack(nets: list) -> dict:
    out: dict = {"n": 0}
    for version, fmt in ((4, ">II"), (6, ">QQQQ")):
        raw = bytearray()
        for net in ipaddress.collapse_addresses(n for n in nets if n.version == version):
            start, end = int(net.network_address), int(net.broadcast_address)
            if version == 4:
                raw += struct.pack(fmt, start, end)
            else:
                raw += struct.pack(fmt, start >> 64, start & (2 ** 64 - 1), end >> 64,
                                   end & (2 ** 64 - 1))
            out["n"] += 1
        out[f"v{version}"] = raw.hex()
    return out


def compile(items: list[str]) -> dict:  # noqa: A001 (the module's verb)
    """The stored networks of checked entries; ValueError naming the first
    entry that is no address or range, or when more than MAX_NETWORKS remain
    once merged.  CPU work (about 10 ms for MAX_ENTRIES): off the event loop."""
    nets = []
    for item in items:
        try:
            nets.append(_network(item))
        except ValueError:
            raise Refusal(f"not an IP address or CIDR range: {item[:60]!r}", "allow_ips_entry",
                          entry=item[:60]) from None
    packed = _pack(nets)
    if packed["n"] > MAX_NETWORKS:
        raise Refusal(f"the allow-list is {packed['n']} networks once overlapping and "
                      f"adjacent ranges are merged; at most {MAX_NETWORKS} are allowed",
                      "allow_ips_networks", networks=packed["n"], max=MAX_NETWORKS)
    return packed


def legacy(text) -> dict:
    """The stored networks of a list saved before the bounds: every entry
    that parses still counts, however many there are (a key that worked
    keeps working).  CPU work: off the event loop."""
    nets = []
    for item in _SPLIT.split(str(text or "")):
        try:
            nets.append(_network(item))
        except ValueError:
            pass
    return _pack(nets)


def _number(addr: str) -> tuple[int, int] | None:
    """(version, integer) of a client address, or None if it is not one."""
    addr = addr.split("%", 1)[0]
    try:
        if ":" in addr:
            n = int.from_bytes(socket.inet_pton(socket.AF_INET6, addr), "big")
            if n >> 32 == 0xFFFF:  # ::ffff:a.b.c.d is an IPv4 client
                return 4, n & 0xFFFFFFFF
            return 6, n
        return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, addr), "big")
    except (OSError, ValueError):
        return None


class NetList:
    """Sorted, non-overlapping ranges per IP version; empty means any address."""

    __slots__ = ("_spans", "size")

    def __init__(self, spans: dict[int, tuple[tuple, tuple]]):
        self._spans = spans
        self.size = sum(len(s[0]) for s in spans.values())

    def __bool__(self) -> bool:
        return self.size > 0

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"NetList({self.size} ranges)"

    @classmethod
    def unpack(cls, stored: dict) -> "NetList":
        spans = {}
        v4 = bytes.fromhex(stored.get("v4") or "")
        if v4:
            flat = struct.unpack(f">{len(v4) // 4}I", v4)
            spans[4] = (flat[0::2], flat[1::2])
        v6 = bytes.fromhex(stored.get("v6") or "")
        if v6:
            q = struct.unpack(f">{len(v6) // 8}Q", v6)
            wide = [(q[i] << 64) | q[i + 1] for i in range(0, len(q), 2)]
            spans[6] = (tuple(wide[0::2]), tuple(wide[1::2]))
        return cls(spans)

    @classmethod
    def of(cls, doc: dict) -> "NetList":
        """A token document's list: its stored networks, else its text."""
        stored = doc.get("allow_nets")
        if isinstance(stored, dict):
            return cls.unpack(stored)
        return cls.unpack(legacy(doc.get("allow_ips"))) if doc.get("allow_ips") else cls({})

    def contains(self, ip: str) -> bool:
        num = _number(ip or "")
        if num is None:
            return False
        spans = self._spans.get(num[0])
        if not spans:
            return False
        i = bisect_right(spans[0], num[1]) - 1
        return i >= 0 and spans[1][i] >= num[1]
