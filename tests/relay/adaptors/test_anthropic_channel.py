"""Anthropic channels serving other formats: the official openai SDK and
Gemini clients against a fake Anthropic upstream, converted both ways,
streaming with tools, mid-stream errors, billed to the unit."""
from __future__ import annotations

import base64
import json

import openai
import pytest
import requests

from tests.vendor_env import Env

pytestmark = pytest.mark.slow

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    yield e
    e.stop()


def last(fake) -> dict:
    return fake.requests[-1]


# ---- conversion: OpenAI client -> Anthropic channel --------------------------
def test_openai_client_to_anthropic_channel(env):
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    r = oc.chat.completions.create(
        model="anthropic-model", max_tokens=77, stop=["zzz"], temperature=1.5,
        messages=[{"role": "system", "content": "sys"},
                  {"role": "user", "content": [
                      {"type": "text", "text": "see"},
                      {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}])
    assert r.choices[0].message.content == "Hello from the fake Anthropic upstream."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 25 and r.usage.prompt_tokens_details.cached_tokens == 4
    up = last(env.anthropic)
    b = up["body"]
    assert up["path"] == "/v1/messages" and up["headers"]["X-Api-Key"] == "upstream-key"
    assert b["system"] == "sys" and b["max_tokens"] == 77 and b["stop_sequences"] == ["zzz"]
    assert b["temperature"] == 1.0  # Anthropic's range ends at 1
    assert b["messages"][0]["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": PNG}}
    env.check_billed(tok, prompt=25, completion=7, cached=4)


def test_openai_client_to_anthropic_channel_stream_tools(env):
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": TOOLS[0]["input_schema"]}}]
    stream = oc.chat.completions.create(model="anthropic-model", tools=tools, stream=True,
                                        stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": "weather?"}])
    text, args, finish, usage, name = "", "", None, None, None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                name = name or (tc.function.name if tc.function else None)
                args += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    assert text == "Let me check." and name == "get_weather"
    assert json.loads(args) == {"city": "Paris"} and finish == "tool_calls"
    assert usage.prompt_tokens == 25 and usage.completion_tokens == 7
    # A follow-up turn with the tool result converts back.
    oc.chat.completions.create(model="anthropic-model", tools=tools, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_fake1", "type": "function",
             "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "toolu_fake1", "content": "sunny"}])
    msgs = last(env.anthropic)["body"]["messages"]
    assert msgs[1]["content"] == [{"type": "tool_use", "id": "toolu_fake1", "name": "get_weather",
                                   "input": {"city": "Paris"}}]
    assert msgs[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_fake1", "content": "sunny"}]}
    env.check_billed(tok, prompt=25, completion=7, cached=4, n=2)


def test_mid_stream_error_reaches_converted_clients(env):
    """An Anthropic error event mid-stream, read by an OpenAI client and by a
    Gemini client: each gets an error in its own format, and the part that
    streamed is billed."""
    env.channel("anthropic", "claude-err-conv", mode="error_event")
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    with pytest.raises(openai.APIError) as ei:
        for _ in oc.chat.completions.create(model="claude-err-conv", stream=True,
                                            messages=[{"role": "user", "content": "hi"}]):
            pass
    assert "Overloaded" in str(ei.value)
    r = requests.post(env.relay.url + "/v1beta/models/claude-err-conv:streamGenerateContent",
                      headers={"x-goog-api-key": tok["key"]}, timeout=30,
                      json={"contents": [{"parts": [{"text": "hi"}]}]})
    arr = r.json()  # still one well-formed JSON array
    assert "Overloaded" in arr[-1]["error"]["message"]
    recs = env.logs(tok["id"], 2)
    assert all(x["prompt_tokens"] == 25 and x["estimated"] for x in recs)


def test_channel_options(env):
    env.channel("anthropic", "claude-opts", options={
        "auth": "bearer", "anthropic_version": "2024-01-01", "anthropic_beta": "beta-a",
        "default_max_tokens": 333}, key="bearer-key")
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    oc.chat.completions.create(model="claude-opts", messages=[{"role": "user", "content": "x"}])
    up = last(env.anthropic)
    assert up["headers"]["Authorization"] == "Bearer bearer-key"
    assert "X-Api-Key" not in up["headers"]
    assert up["headers"]["Anthropic-Version"] == "2024-01-01"
    assert up["headers"]["Anthropic-Beta"] == "beta-a"
    assert up["body"]["max_tokens"] == 333
    env.check_billed(tok, prompt=25, completion=7, cached=4)
