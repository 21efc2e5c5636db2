"""Base-address variants users type into clients: each either works or gets a
404 whose hint names the base URL to use.  Driven with the official openai
SDK (it builds the URL from base_url exactly as users' tools do) and with
raw requests for paths no SDK would build."""
from __future__ import annotations

import openai
import pytest
import requests

from tests.fakes.media_upstream import FakeMedia, make_wav
from tests.tenant import Tenant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake():
    f = FakeMedia().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def tenant(relay, admin, fake):
    admin.create_channel(fake.url, ["gpt-4o-mini", "text-embedding-3-small", "dall-e-3",
                                    "whisper-1", "tts-1"], name="variants")
    admin.set_price("gpt-4o-mini", input_price="1", output_price="2")
    admin.set_price("text-embedding-3-small", input_price="1")
    admin.set_price("dall-e-3", call_price="0.04")
    admin.set_price("whisper-1", call_price="0.0001")
    admin.set_price("tts-1", call_price="0.000015")
    return Tenant(admin, relay.url)


@pytest.mark.parametrize("suffix", [
    "/v1", "/v1/", "", "/", "//v1", "/v1//", "/v1/v1", "/v1/v1/",
    "/v1/chat/completions",           # a chat framework given the full URL as its base
    "/v1/chat/completions/",
])
def test_sdk_chat_works_with_base_variants(relay, tenant, suffix):
    before = tenant.balances()
    c = openai.OpenAI(api_key=tenant.key, base_url=relay.url + suffix, max_retries=0)
    res = c.chat.completions.create(model="gpt-4o-mini",
                                    messages=[{"role": "user", "content": "hi"}])
    assert res.choices[0].message.content == "Hello from the fake upstream."
    # 10 prompt x 1 + 3 completion x 2 = 16 USD per million -> 8 units
    assert tenant.spent_since(before) == 8


@pytest.mark.parametrize("suffix", ["/v1/v1", "", "/v1/chat/completions"])
def test_sdk_media_and_models_work_with_base_variants(relay, tenant, suffix):
    c = openai.OpenAI(api_key=tenant.key, base_url=relay.url + suffix, max_retries=0)
    before = tenant.balances()
    assert "gpt-4o-mini" in [m.id for m in c.models.list()]
    emb = c.embeddings.create(model="text-embedding-3-small", input="hello")
    assert len(emb.data[0].embedding) == 8
    img = c.images.generate(model="dall-e-3", prompt="a fox")
    assert img.data[0].url
    text = c.audio.transcriptions.create(model="whisper-1", file=("a.wav", make_wav(1.5)),
                                         response_format="text")
    assert "1.50 seconds" in text
    speech = c.audio.speech.create(model="tts-1", voice="alloy", input="hey")
    assert len(speech.content) == 900
    # embeddings 5 tokens x 1 USD/M -> 3 units (2.5 rounds up); image 20,000;
    # transcription 2 s x 0.0001 -> 100; speech 3 chars x 0.000015 -> 22.5 -> 23
    assert tenant.spent_since(before) == 3 + 20_000 + 100 + 23


@pytest.mark.parametrize("path,fragment", [
    ("/api/v1/chat/completions", "the prefix '/api/v1' is not served here"),
    ("/v2/chat/completions", "the prefix '/v2' is not served here"),
    ("/openai/v1/embeddings", "the prefix '/openai/v1' is not served here"),
    ("/v1/chat/completion", "/v1/chat/completions"),
    ("/v1/mj/submit/imagine", "/mj/submit/imagine"),
    ("/nothing/here", "followed by /v1"),
])
def test_unknown_variants_get_404_with_a_hint(relay, tenant, path, fragment):
    r = requests.post(relay.url + path, json={"model": "gpt-4o-mini", "messages": []},
                      headers={"Authorization": f"Bearer {tenant.key}"})
    assert r.status_code == 404, r.text
    doc = r.json()
    message = doc["error"]["message"] if "error" in doc else doc["description"]
    assert fragment in message and relay.url in message, message
    assert "request id" in message


def test_mj_unknown_path_answers_in_mj_shape(relay, tenant):
    r = requests.post(relay.url + "/v1/mj/submit/imagine", json={"prompt": "x"},
                      headers={"mj-api-secret": tenant.key})
    assert r.status_code == 404
    assert r.json()["code"] == 3
