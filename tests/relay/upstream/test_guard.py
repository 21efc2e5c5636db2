"""The SSRF guard's idea of a public address (relay/upstream/guard.py): every
way an IPv6 address can carry a private IPv4 one, and the deprecated ranges
Python's ipaddress calls global."""
from __future__ import annotations

import pytest

from relay.upstream.guard import Refused, check_url, is_public


@pytest.mark.parametrize("addr", [
    "127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "224.0.0.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1",            # IPv4-mapped
    "64:ff9b::7f00:1", "64:ff9b::a00:1",               # NAT64 of loopback, 10/8
    "64:ff9b:1::808:808",                              # local-use NAT64
    "2002:7f00:1::", "2002:a9fe:a9fe::1",              # 6to4 of loopback, link-local
    "::127.0.0.1", "::8.8.8.8",                        # IPv4-compatible (deprecated)
    "fec0::1", "fed0::5",                              # site-local (deprecated)
    "2001::1", "2001:db8::1",                          # Teredo, documentation
    "fe80::1%eth0"])
def test_not_public(addr):
    assert not is_public(addr)


@pytest.mark.parametrize("addr", [
    "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
    "64:ff9b::808:808",          # NAT64 of a public address (DNS64 networks)
    "2002:808:808::1"])          # 6to4 of a public address
def test_public(addr):
    assert is_public(addr)


@pytest.mark.parametrize("url", ["http://[64:ff9b::7f00:1]/x", "http://[2002:7f00:1::]:80/",
                                 "http://[::127.0.0.1]/", "https://[fec0::1]/",
                                 "http://localhost:9/", "http://a.localhost/", "ftp://8.8.8.8/"])
def test_urls_refused_before_any_io(url):
    with pytest.raises(Refused):
        check_url(url, allow_private=False)
    if not url.startswith("ftp"):
        check_url(url, allow_private=True)
