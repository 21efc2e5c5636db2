"""The legacy google-generativeai library (0.8, REST transport) against the
relay: it calls /v1beta with `$alt=json;enum-encoding=int`, reads streams
as one JSON array (not SSE), and sends countTokens as a wrapped
generateContentRequest.  Billing checked to the unit."""
from __future__ import annotations

import warnings

import pytest

from tests.vendor_env import Env

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the library announces its own deprecation
    import google.generativeai as legacy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    yield e
    e.stop()


def configure(env, key) -> None:
    legacy.configure(api_key=key, transport="rest",
                     client_options={"api_endpoint": env.relay.url})


def test_generate_native_and_converted(env):
    tok = env.token()
    configure(env, tok["key"])
    r = legacy.GenerativeModel("gemini-model").generate_content("hi")
    assert r.text == "Hello from the fake Gemini upstream."
    assert r.usage_metadata.prompt_token_count == 12
    env.check_billed(tok, prompt=12, completion=5, cached=3)
    r = legacy.GenerativeModel("openai-model", system_instruction="sys").generate_content("hi")
    assert r.text == "Hello from the fake upstream."
    assert env.openai.requests[-1]["body"]["messages"][0] == {"role": "system", "content": "sys"}
    env.check_billed(tok, prompt=10, completion=3, n=2)


@pytest.mark.parametrize("model, text, usage", [
    ("gemini-model", "Hello from the fake Gemini upstream.", (12, 5, 3)),
    ("openai-model", "Hello from the fake upstream.", (10, 3, 0)),
    ("anthropic-model", "Hello from the fake Anthropic upstream.", (25, 7, 4)),
])
def test_stream_as_json_array(env, model, text, usage):
    tok = env.token()
    configure(env, tok["key"])
    chunks = list(legacy.GenerativeModel(model).generate_content("hi", stream=True))
    assert "".join(c.text for c in chunks) == text
    env.check_billed(tok, *usage)


def test_function_calling_through_openai_channel(env):
    tok = env.token()
    configure(env, tok["key"])

    def get_weather(city: str) -> str:
        """Weather for a city."""
        return "sunny"
    r = legacy.GenerativeModel("openai-model", tools=[get_weather]).generate_content("weather?")
    fc = r.candidates[0].content.parts[0].function_call
    assert fc.name == "get_weather" and dict(fc.args) == {"city": "Paris"}
    tools = env.openai.requests[-1]["body"]["tools"]
    assert tools[0]["function"]["name"] == "get_weather"
    assert tools[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"


def test_count_tokens_embed_and_list(env):
    env.channel("gemini", "text-embedding-leg", upstream="text-embedding-004")
    tok = env.token()
    configure(env, tok["key"])
    n = legacy.GenerativeModel("gemini-model").count_tokens("hello there, how are you?")
    assert n.total_tokens > 5
    e = legacy.embed_content(model="models/text-embedding-leg", content="x")
    assert len(e["embedding"]) == 8
    assert env.gemini.requests[-1]["path"] == "/v1beta/models/text-embedding-004:embedContent"
    names = [m.name for m in legacy.list_models()]
    assert "models/gemini-model" in names
    recs = env.logs(tok["id"])
    assert len(recs) == 1 and recs[0]["model"] == "text-embedding-leg"  # countTokens is free
