"""A stream whose upstream falls silent mid-way ends with an error event
once the relay's stream_idle_timeout has passed (libcurl's low-speed check
does the watching), and its usage record says so."""
from __future__ import annotations


import pytest
import requests

from tests.fakes.slow_upstream import SlowUpstream
from tests.helpers import Api, RelayProcess
from tests.tenant import Tenant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow():
    """The slow fake on its own loop in a thread: the first event at once,
    then the next only after `fake_delay` seconds."""
    fake = SlowUpstream()
    yield fake.start()
    fake.stop()


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("deadlines")),
                     args=["--stream-idle-timeout", "1", "--first-byte-timeout", "5"]).start()
    yield p
    p.stop()


def test_silence_mid_stream_ends_it_with_an_error_event(relay, slow):
    admin = Api.login(relay.url)
    admin.create_channel(slow, ["gpt-silent"], name="silent")
    admin.set_price("gpt-silent", input_price=1, output_price=2)
    t = Tenant(admin, relay.url)
    r = requests.post(relay.url + "/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "gpt-silent", "stream": True, "fake_chunks": 2,
                            "fake_delay": 40, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert '"role":"assistant"' in events[0]
    assert "stopped sending mid-stream" in r.text and events[-1] == "[DONE]"
    rec = t.logs(1)[0]
    assert rec["status"] == 504 and "stopped sending" in rec["error"]
