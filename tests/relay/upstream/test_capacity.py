"""Upstream capacity is limited per kind of work (plain calls, streams,
uploads), never in one shared line: a kind at its limit does not hold up
another kind, and a call that finds its own kind full past the bounded wait
gets 503 with Retry-After in its route family's error body, unbilled.

The relay here allows two concurrent upstream calls of each kind and waits
half a second for a place.  "Holders" are calls to a channel whose upstream
accepts and never answers; closing a holder's socket frees its place."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import requests

from relay.upstream.gate import Gate
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.mj_upstream import FakeMidjourney
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api, RelayProcess
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

PRICE = {"input_price": 1, "output_price": 2}


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("capacity")), env={
        "RELAY_MAX_UPSTREAM_CLIENTS": "2", "RELAY_MAX_UPSTREAM_STREAMS": "2",
        "RELAY_UPSTREAM_QUEUE_WAIT": "0.5", "RELAY_MJ_POLL_INTERVAL": "30"}).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def env(relay):
    fakes = {"openai": FakeOpenAI().start(), "anthropic": FakeAnthropic().start(),
             "gemini": FakeGemini().start(), "mj": FakeMidjourney().start()}
    admin = Api.login(relay.url)
    admin.create_channel(fakes["openai"].url, ["gpt-ok"], name="ok")
    admin.create_channel(fakes["openai"].mode_url("hang"), ["gpt-hang"], name="hang")
    admin.create_channel(fakes["anthropic"].url, ["claude-ok"], name="claude", type="anthropic")
    admin.create_channel(fakes["gemini"].url, ["gemini-ok"], name="gemini", type="gemini")
    admin.create_channel(fakes["mj"].url, ["mj_imagine"], name="mj", type="midjourney",
                         key=fakes["mj"].secret)
    for model in ("gpt-ok", "gpt-hang", "claude-ok", "gemini-ok"):
        admin.set_price(model, **PRICE)
    admin.set_price("mj_imagine", call_price="0.05")
    t = Tenant(admin, relay.url, quota=10 ** 9, key_quota=10 ** 8)
    yield t
    for f in fakes.values():
        f.stop()


class Holders:
    """Calls that occupy upstream places until closed (raw sockets, so that
    closing one is our client going away)."""

    def __init__(self, relay, key: str):
        self.relay, self.key, self.socks = relay, key, []

    def open(self, n: int, stream: bool) -> None:
        body = json.dumps({"model": "gpt-hang", "stream": stream,
                           "messages": [{"role": "user", "content": "hold"}]}).encode()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", self.relay.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      + self.key.encode() + b"\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.socks.append(s)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []


def held_until_busy(t: Tenant, relay, stream: bool) -> tuple[requests.Response, int]:
    """Holders of a kind are in place once a call of that kind is refused
    (they may take a moment to reach the upstream).  Also returns how many
    calls were answered (and billed) before that."""
    deadline = time.monotonic() + 20
    answered = 0
    while True:
        r = chat(relay, t, "gpt-ok", stream)
        if r.status_code == 503 or time.monotonic() > deadline:
            return r, answered
        answered += r.status_code == 200
        time.sleep(0.1)


def chat(relay, t: Tenant, model: str, stream: bool) -> requests.Response:
    return requests.post(relay.url + "/v1/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {t.key}"},
                         json={"model": model, "stream": stream,
                               "messages": [{"role": "user", "content": "hi"}]})


def test_streams_at_their_limit_refuse_streams_in_each_family_and_leave_plain_calls_alone(
        relay, env):
    holders = Holders(relay, env.key)
    before = env.balances()
    try:
        holders.open(2, stream=True)
        r, early = held_until_busy(env, relay, stream=True)
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "relay_overloaded" and "streaming" in err["message"]
        assert "request id" in err["message"]

        # Plain calls have places of their own.
        for _ in range(3):
            r = chat(relay, env, "gpt-ok", stream=False)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]

        r = requests.post(relay.url + "/v1/messages", timeout=30,
                          headers={"x-api-key": env.key, "anthropic-version": "2023-06-01"},
                          json={"model": "claude-ok", "max_tokens": 50, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and "Retry-After" in r.headers
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        assert "concurrent streaming calls" in body["error"]["message"]

        r = requests.post(relay.url + "/v1beta/models/gemini-ok:streamGenerateContent?alt=sse",
                          timeout=30, headers={"x-goog-api-key": env.key},
                          json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert r.json()["error"]["status"] == "UNAVAILABLE"
        assert "concurrent streaming calls" in r.json()["error"]["message"]
    finally:
        holders.close()
    # The places come back once the holders' clients have gone.
    deadline = time.monotonic() + 20
    while (r := chat(relay, env, "gpt-ok", stream=True)).status_code == 503:
        assert time.monotonic() < deadline, "the stream places never came back"
        time.sleep(0.2)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    refused = env.logs(1, status=503)
    assert refused and all(rec["quota"] == 0 for rec in refused)
    # the answered calls, 8 units each (10 + 3 tokens): three plain, one
    # stream after, and any stream answered before the holders were in place
    plain_and_stream = (4 + early) * 8
    deadline = time.monotonic() + 10
    while env.spent_since(before) != plain_and_stream and time.monotonic() < deadline:
        time.sleep(0.1)
    assert env.spent_since(before) == plain_and_stream


def test_plain_calls_at_their_limit_refuse_plain_calls_and_leave_streams_alone(relay, env):
    holders = Holders(relay, env.key)
    try:
        holders.open(2, stream=False)
        r, _ = held_until_busy(env, relay, stream=False)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "relay_overloaded"

        r = chat(relay, env, "gpt-ok", stream=True)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")

        # Midjourney submits are plain calls: its own body, code 23 (queue full).
        r = requests.post(relay.url + "/mj/submit/imagine", timeout=30,
                          headers={"mj-api-secret": env.key}, json={"prompt": "a cat"})
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert r.json()["code"] == 23 and "concurrent calls" in r.json()["description"]
    finally:
        holders.close()


def test_gate_passes_places_on_in_order_and_gives_up_after_its_wait():
    async def run():
        gate = Gate("stream", limit=1, wait=30)
        assert gate.try_enter() and not gate.try_enter()
        first = asyncio.ensure_future(gate.enter())
        second = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        gate.leave()                     # the place goes to the first waiter
        assert await first is True and not second.done()
        second.cancel()                  # a waiter that left takes no place
        await asyncio.sleep(0)
        gate.leave()
        assert gate.active == 0 and gate.try_enter()
        short = Gate("call", limit=1, wait=0.01)
        assert short.try_enter()
        assert await short.enter() is False and short.active == 1
    asyncio.run(run())
