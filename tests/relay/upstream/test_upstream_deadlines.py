"""A stream whose upstream falls silent mid-way ends with an error event
once the relay's stream_idle_timeout has passed (relay/upstream/client.py's
once-a-second sweep does the watching), and its usage record says so; a
slow but steady stream, or one we paused, is not silent."""
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


def _chat_stream(relay, slow, model: str, chunks: int, delay: float):
    """A streamed chat through the relay to the slow fake, `delay` seconds
    between its pieces: the response, its data events and the tenant."""
    admin = Api.login(relay.url)
    admin.create_channel(slow, [model], name=model)
    admin.set_price(model, input_price=1, output_price=2)
    t = Tenant(admin, relay.url)
    r = requests.post(relay.url + "/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": model, "stream": True, "fake_chunks": chunks,
                            "fake_delay": delay, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    return r, [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")], t


def test_silence_mid_stream_ends_it_with_an_error_event(relay, slow):
    r, events, t = _chat_stream(relay, slow, "gpt-silent", 2, 40)
    assert '"role":"assistant"' in events[0]
    assert "stopped sending mid-stream" in r.text and events[-1] == "[DONE]"
    rec = t.logs(1)[0]
    assert rec["status"] == 504 and "stopped sending" in rec["error"]


def test_a_steady_trickle_is_not_silence(relay, slow):
    """Pieces 0.6 s apart under a 1 s idle timeout: the stream runs whole."""
    r, events, t = _chat_stream(relay, slow, "gpt-trickle", 6, 0.6)
    assert sum('"content":"piece ' in e for e in events) == 6 and events[-1] == "[DONE]"
    assert "stopped sending" not in r.text
    assert t.logs(1)[0]["status"] == 200


def test_a_stream_we_paused_is_not_silent_however_long(slow):
    """Back-pressure pauses a transfer while our client is slow to read; the
    upstream has not fallen silent then, and the idle timeout must not end
    it, nor end it at the first look after the resume (in-process: the
    relay's Upstream against the slow fake, its sweep driven by hand)."""
    import asyncio
    import json

    from relay.upstream.client import Cancel, Upstream

    class _NoTimer:
        def stop(self) -> None:
            pass

    async def go():
        up = Upstream(idle_timeout=1.0, first_byte_timeout=5)
        up._sweeper = _NoTimer()  # the looks below are the only ones
        cancel = Cancel()
        got = []
        loop = asyncio.get_running_loop()

        def resume() -> None:
            cancel.resume()
            up._sweep()  # 1.5 s after the last look: timed from the resume

        def on_chunk(data: bytes) -> None:
            got.append(data)
            if len(got) == 1:
                cancel.pause()  # our client stops reading, for 3 s
                up._sweep()     # answering: watched for silence from now
                loop.call_later(1.5, up._sweep)  # paused: not silence
                loop.call_later(3.0, resume)
        body = json.dumps({"model": "m", "stream": True, "fake_chunks": 4, "fake_delay": 0.2,
                           "messages": []}).encode()
        resp = await up.send("POST", slow + "/v1/chat/completions",
                             {"Content-Type": "application/json"}, body, on_chunk=on_chunk,
                             cancel=cancel)
        up.close()
        return resp, b"".join(got)
    resp, data = asyncio.run(go())
    assert resp.error is None, resp.error
    assert data.count(b'"content":"piece ') == 4 and data.endswith(b"data: [DONE]\n\n")
