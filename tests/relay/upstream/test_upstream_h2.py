"""Streams to an HTTPS upstream that speaks HTTP/2 share connections, at
most `upstream_h2_streams` to one (relay/upstream/curl_client.py: libcurl runs every
transfer of a connection whenever it has data, so the CPU per chunk grows
with the count).  The upstream is tests/fakes/slow_upstream.py over TLS
with its own test CA; it allows 100 streams a connection, as vendors do,
and counts what it sees.  Plain calls go on connections of their own,
never multiplexed with streams."""
from __future__ import annotations

import concurrent.futures

import pytest
import requests

from tests.fakes.slow_upstream import SlowUpstream
from tests.helpers import Api, RelayProcess, eventually
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

PER_CONNECTION = 3
STREAMS = 8


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """(the fake, its https URL, its CA file), served from a thread."""
    tls = str(tmp_path_factory.mktemp("tls"))
    fake = SlowUpstream()
    yield fake, fake.start(tls_dir=tls), f"{tls}/ca.pem"
    fake.stop()


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory, slow):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("h2")),
                     env={"RELAY_UPSTREAM_CA_FILE": slow[2]},
                     args=["--upstream-h2-streams", str(PER_CONNECTION)]).start()
    yield p
    p.stop()


def stream(relay, key: str, delay: float = 0.5) -> list[str]:
    r = requests.post(relay.url + "/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": "gpt-h2", "stream": True, "fake_chunks": 3, "fake_delay": delay,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]


def test_streams_spread_over_connections_of_at_most_the_setting(relay, slow):
    fake, url, _ = slow
    admin = Api.login(relay.url)
    admin.create_channel(url, ["gpt-h2"], name="h2")
    admin.set_price("gpt-h2", input_price=1, output_price=2)
    t = Tenant(admin, relay.url)
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        answers = list(pool.map(lambda _: stream(relay, t.key), range(STREAMS)))
    for events in answers:
        assert events[-1] == "[DONE]" and '"usage"' in events[-2], events
        assert sum('"content":"piece ' in e for e in events) == 3, events
    # All eight were open at once (each lasts over a second): on one
    # connection a vendor would allow, but not more than three a connection.
    assert fake.h2_connections >= -(-STREAMS // PER_CONNECTION), fake.h2_connections
    assert fake.peak_streams == PER_CONNECTION, fake.peak_streams
    assert fake.finished == STREAMS

    def logged():
        items = admin.get("/api/log/?size=100")["data"]["items"]
        assert len(items) == STREAMS and all(r["status"] == 200 for r in items), items
    eventually(logged)


def test_plain_calls_never_share_a_connection_with_streams(relay, slow):
    """Multiplexed onto a connection that carries streams, a plain call's
    answer waits for the loop to get through those streams' chunks; on a
    connection of its own it is read at once."""
    fake, url, _ = slow
    t = Tenant(Api.login(relay.url), relay.url)  # the channel of the test above
    for conn in fake.h2_conns:
        conn.kinds.clear()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream, relay, t.key, 0.3) for _ in range(2)]
        eventually(lambda: sum("stream" in c.kinds for c in fake.h2_conns) >= 1)
        for _ in range(5):
            r = requests.post(relay.url + "/v1/chat/completions", timeout=30,
                              headers={"Authorization": f"Bearer {t.key}"},
                              json={"model": "gpt-h2",
                                    "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["choices"], r.text
        for f in streams:
            assert f.result()[-1] == "[DONE]"
    kinds = [c.kinds for c in fake.h2_conns if c.kinds]
    assert {"plain"} in kinds and {"stream"} in kinds, kinds
    assert all(len(k) == 1 for k in kinds), kinds
