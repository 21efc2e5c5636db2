"""Azure OpenAI channels: deployment addressing, api-version, the api-key
header, and every inbound format (OpenAI, Anthropic, Gemini SDKs) reaching
them, billed to the unit."""
from __future__ import annotations

import json

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from tests.vendor_env import Env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    yield e
    e.stop()


def last(fake) -> dict:
    return fake.requests[-1]


def oai(env, key) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=env.relay.url + "/v1", max_retries=0)


def test_openai_client_deployment_and_api_version(env):
    tok = env.token()
    r = oai(env, tok["key"]).chat.completions.create(
        model="azure-model", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello from the fake upstream."
    up = last(env.azure)
    # Deployment = the channel's upstream model name; the default api-version.
    assert up["path"] == "/openai/deployments/azure-upstream-model/chat/completions"
    assert up["query"] == "api-version=2024-10-21"
    assert up["headers"]["Api-Key"] == "upstream-key"
    assert "Authorization" not in up["headers"]
    assert env.azure.requests[-1]["body"]["model"] == "azure-upstream-model"
    env.check_billed(tok, prompt=10, completion=3)


def test_api_version_option_and_base_with_openai_suffix(env):
    env.admin.create_channel(env.azure.url + "/openai/", ["azure-pinned"], type="azure",
                                  name="az-pinned", key="k2",
                                  options={"api_version": "2025-01-01-preview"})
    env.admin.set_price("azure-pinned", input_price=2000, output_price=8000, cache_price=500)
    tok = env.token()
    oai(env, tok["key"]).chat.completions.create(
        model="azure-pinned", messages=[{"role": "user", "content": "hi"}])
    up = env.azure.requests[-1]
    assert up["path"] == "/openai/deployments/azure-pinned/chat/completions"
    assert up["headers"]["Api-Key"] == "k2"
    assert up["query"] == "api-version=2025-01-01-preview"
    env.check_billed(tok, prompt=10, completion=3)


def test_v1_api_routes(env):
    env.channel("azure", "azure-v1", options={"api_version": "v1"}, upstream="gpt-4o-deploy")
    tok = env.token()
    oai(env, tok["key"]).chat.completions.create(
        model="azure-v1", messages=[{"role": "user", "content": "hi"}])
    up = last(env.azure)
    assert up["path"] == "/openai/v1/chat/completions" and up["query"] == ""
    assert up["body"]["model"] == "gpt-4o-deploy"


def test_stream_with_usage_and_embeddings(env):
    tok = env.token()
    c = oai(env, tok["key"])
    text, usage = "", None
    for ch in c.chat.completions.create(model="azure-model", stream=True,
                                        stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": "hi"}]):
        usage = ch.usage or usage
        text += "".join(x.delta.content or "" for x in ch.choices)
    assert text == "Hello from the fake upstream." and usage.completion_tokens == 3
    env.check_billed(tok, prompt=10, completion=3)
    e = c.embeddings.create(model="azure-model", input=["a", "b"])
    assert len(e.data) == 2
    assert last(env.azure)["path"] == "/openai/deployments/azure-upstream-model/embeddings"
    env.check_billed(tok, prompt=10, completion=0, n=2)


def test_anthropic_client_to_azure_stream_tools(env):
    tok = env.token()
    c = anthropic.Anthropic(api_key=tok["key"], base_url=env.relay.url, max_retries=0)
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}}}}]
    with c.messages.stream(model="azure-model", max_tokens=100, tools=tools,
                           messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert last(env.azure)["body"]["stream_options"] == {"include_usage": True}
    env.check_billed(tok, prompt=10, completion=3)


def test_gemini_client_to_azure(env):
    tok = env.token()
    g = genai.Client(api_key=tok["key"], http_options=types.HttpOptions(base_url=env.relay.url))
    r = g.models.generate_content(model="azure-model", contents="hi")
    assert r.text == "Hello from the fake upstream."
    assert json.loads(json.dumps(last(env.azure)["body"]["messages"])) == [
        {"role": "user", "content": "hi"}]
    env.check_billed(tok, prompt=10, completion=3)


def test_azure_errors_map(env):
    env.channel("azure", "azure-429", mode="429")
    env.channel("azure", "azure-badkey", key="bad-key")
    tok = env.token()
    c = oai(env, tok["key"])
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model="azure-429", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="azure-badkey",
                                  messages=[{"role": "user", "content": "x"}])
    assert ei.value.status_code == 503  # the channel's key, not the caller's


def test_channel_test_endpoint_for_every_type(env):
    """The console's channel test (an OpenAI-shaped ping) works against each
    type, converted as needed, and reports a wrong key as a failure."""
    for kind in ("anthropic", "gemini", "azure"):
        ch = env.channel(kind, f"ping-{kind}")
        r = env.admin.post(f"/api/channel/{ch['id']}/test", {})
        assert r["data"]["ok"] is True, (kind, r)
        bad = env.channel(kind, f"ping-bad-{kind}", key="bad-key")
        r = env.admin.post(f"/api/channel/{bad['id']}/test", {})
        assert r["data"]["ok"] is False, (kind, r)
    assert last(env.anthropic)["body"]["max_tokens"] == 1
    assert last(env.gemini)["path"].endswith("/ping-bad-gemini:generateContent")
