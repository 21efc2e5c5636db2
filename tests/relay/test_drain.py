"""Issue 30, case 7 (cut reasoning streams): a client that leaves a stream of
a model that reasons unseen (o3 here) left its reasoning tokens unbilled:
the estimate counts only what was streamed.  The relay now reads on for the
upstream's usage, at most `stream_drain_seconds` and `stream_drain_mb`; the
vendor bills what it writes meanwhile, and so does the relay (README,
Money).  Other streams stop at once, as before."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api, RelayProcess, eventually
from tests.tenant import Tenant

USAGE = {"prompt_tokens": 12, "completion_tokens": 5_000, "total_tokens": 5_012,
         "completion_tokens_details": {"reasoning_tokens": 4_900}}


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def relays(mongo_url, tmp_path_factory, fake):
    """One relay as configured by default, one that drains for half a second."""
    out = {}
    for name, args in (("default", []), ("short", ["--stream-drain-seconds", "0.5"])):
        r = RelayProcess(mongo_url, str(tmp_path_factory.mktemp(name)), args=args).start()
        admin = Api.login(r.url)
        admin.create_channel(fake.url, ["o3", "gpt-4o-mini"])
        for m in ("o3", "gpt-4o-mini"):
            admin.set_price(m, input_price="2", output_price="8")
        out[name] = (r, admin)
    yield out
    for r, _ in out.values():
        r.stop()


def cut_after(relay, key, body, events=3):
    """Start a stream, read `events` events, then leave (close the socket)."""
    host, port = relay.url.split("//")[1].split(":")
    payload = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
               f"\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload)
    got = b""
    while got.count(b"data: {") < events:
        got += s.recv(65536)
    s.close()


def last_request(fake, marker):
    return next(r for r in reversed(fake.requests) if r["body"].get("fake_text") == marker)


def test_a_cut_reasoning_stream_is_billed_its_reasoning(relays, fake):
    relay, admin = relays["default"]
    t = Tenant(admin, relay.url)
    before = t.balances()
    cut_after(relay, t.key, {"model": "o3", "stream": True, "fake_chunks": 20,
                             "fake_delay": 0.05, "fake_text": "reasoned " * 40,
                             "fake_usage_doc": USAGE, "messages": [{"role": "user",
                                                                    "content": "think"}]})
    rec = eventually(lambda: _one(t), timeout=20)
    assert rec["status"] == 499 and not rec["estimated"]
    assert rec["reasoning_tokens"] == 4_900 and rec["completion_tokens"] == 5_000
    # 12 x 2 + 5,000 x 8 USD per million: 20,012 units
    assert rec["quota"] == 20_012 and t.spent_since(before) == 20_012
    up = last_request(fake, "reasoned " * 40)
    assert not up["aborted"] and up["flushed_events"] == 22   # read to the end


def test_other_streams_stop_when_the_client_leaves(relays, fake):
    relay, admin = relays["default"]
    t = Tenant(admin, relay.url)
    cut_after(relay, t.key, {"model": "gpt-4o-mini", "stream": True, "fake_chunks": 40,
                             "fake_delay": 0.1, "fake_text": "plain " * 80,
                             "messages": [{"role": "user", "content": "hi"}]})
    rec = eventually(lambda: _one(t), timeout=20)
    assert rec["status"] == 499 and rec["estimated"]
    eventually(lambda: _aborted(fake, "plain " * 80), timeout=10)


def test_the_drain_is_bounded_in_time(relays, fake):
    """Past stream_drain_seconds the upstream is cut and the call estimated
    from what came, as before."""
    relay, admin = relays["short"]
    t = Tenant(admin, relay.url)
    cut_after(relay, t.key, {"model": "o3", "stream": True, "fake_chunks": 40,
                             "fake_delay": 0.2, "fake_text": "slow " * 80,
                             "fake_usage_doc": USAGE,
                             "messages": [{"role": "user", "content": "think"}]})
    rec = eventually(lambda: _one(t), timeout=20)
    assert rec["status"] == 499 and rec["estimated"] and rec["completion_tokens"] < 5_000
    eventually(lambda: _aborted(fake, "slow " * 80), timeout=10)


def _one(t):
    items = t.api.get("/api/log/self?size=10")["data"]["items"]
    assert items
    return items[0]


def _aborted(fake, marker):
    assert last_request(fake, marker)["aborted"]
    time.sleep(0)
