"""/api/openapi.json describes /api truly: every /api route the application
registers is described with exactly the methods its handler answers, and
every described path is routed to such a handler."""
import re

import pytest
import requests

import server
from handlers.openapi import spec

SAMPLES = {"id": "12", "name": "vip", "model": "gpt-4o", "sid": "abc123"}


def sample(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: SAMPLES[m.group(1)], path)


def routes():
    # A Rule (the Responses socket's, matched on its upgrade header too) by its path.
    return [(r[0], r[1]) if isinstance(r, tuple) else (r.matcher.regex.pattern, r.target)
            for r in server._handlers()]


def route_for(path: str):
    """The handler Tornado picks for path: the first rule that matches."""
    for pattern, cls in routes():
        if re.fullmatch(pattern, path):
            return pattern, cls
    return None, None


def methods_of(cls) -> set[str]:
    return {m.lower() for m in cls.ALLOWED_METHODS}


def test_every_described_path_is_routed_with_those_methods():
    for path, ops in spec()["paths"].items():
        pattern, cls = route_for(sample(path))
        assert cls is not None and pattern.startswith("/api"), path
        assert set(ops) == methods_of(cls), (path, cls.__name__)


def test_every_api_route_is_described():
    described = {route_for(sample(p))[0] for p in spec()["paths"]}
    missing = [p for p, _ in routes() if p.startswith("/api") and p not in described]
    assert missing == []


def test_served_and_well_formed(relay):
    r = requests.get(relay.url + "/api/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.") and doc["servers"][0]["url"] == relay.url
    schemathesis = pytest.importorskip("schemathesis")
    schema = schemathesis.openapi.from_dict(doc)
    assert len(list(schema.get_all_operations())) >= 60
