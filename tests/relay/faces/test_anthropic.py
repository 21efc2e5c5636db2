"""The Anthropic Messages face, end to end with the official anthropic SDK
(2.x, which sends `Authorization: Bearer` and anthropic-version 2026-10-21,
and the 0.x style `x-api-key` + 2023-06-01), against fake upstreams of
every channel type, with billing checked to the unit."""
from __future__ import annotations

import base64
import json
import time

import anthropic
import pytest
import requests

from tests.vendor_env import Env, expected_units

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


def client(env, key, old_style=False) -> anthropic.Anthropic:
    if old_style:
        # What anthropic 0.x sends: x-api-key and the 2023 version header.
        return anthropic.Anthropic(base_url=env.relay.url, max_retries=0, api_key=None,
                                   default_headers={"x-api-key": key,
                                                    "anthropic-version": "2023-06-01"})
    return anthropic.Anthropic(api_key=key, base_url=env.relay.url, max_retries=0)


def last(fake) -> dict:
    return fake.requests[-1]


# ---- native: Anthropic client -> anthropic channel ---------------------------
@pytest.mark.parametrize("old_style", [False, True], ids=["bearer-2.x", "x-api-key-0.x"])
def test_native_passthrough_and_billing(env, old_style):
    tok = env.token()
    c = client(env, tok["key"], old_style)
    n0 = len(env.anthropic.requests)
    msg = c.messages.create(model="anthropic-model", max_tokens=100, extra_body={"top_k": 5},
                            system=[{"type": "text", "text": "be brief",
                                     "cache_control": {"type": "ephemeral"}}],
                            metadata={"user_id": "u-1"},
                            messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "Hello from the fake Anthropic upstream."
    assert msg.model == "anthropic-model" and msg.id == "msg_fake01"
    assert msg._request_id.startswith("req_")  # the relay's id, as Anthropic's header
    assert msg.usage.input_tokens == 21 and msg.usage.cache_read_input_tokens == 4
    assert len(env.anthropic.requests) == n0 + 1
    up = last(env.anthropic)
    # The body went through as the client sent it, only the model mapped:
    # fields a conversion would drop (top_k, cache_control) are still there.
    assert up["body"]["model"] == "anthropic-upstream-model"
    assert up["body"]["top_k"] == 5
    assert up["body"]["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert up["body"]["metadata"] == {"user_id": "u-1"}
    assert up["headers"]["X-Api-Key"] == "upstream-key"
    # The client's own version goes upstream (2026-10-21 from anthropic 2.x).
    assert up["headers"]["Anthropic-Version"] == c.default_headers["anthropic-version"] == \
        ("2023-06-01" if old_style else "2026-10-21")
    assert "Authorization" not in up["headers"]
    # input 21 + cache read 4 = 25 prompt tokens, of which 4 cached.
    env.check_billed(tok, prompt=25, completion=7, cached=4)


def test_native_stream_with_tools_exact_events(env):
    tok = env.token()
    c = client(env, tok["key"])
    events = list(c.messages.create(model="anthropic-model", max_tokens=100, tools=TOOLS,
                                    stream=True,
                                    messages=[{"role": "user", "content": "weather in Paris?"}]))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta"
    assert events[-2].delta.stop_reason == "tool_use"
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == \
        ["text", "tool_use"]
    args = "".join(e.delta.partial_json for e in events
                   if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}
    # The SDK's own accumulator agrees.
    with c.messages.stream(model="anthropic-model", max_tokens=100, tools=TOOLS,
                           messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    tool = [b for b in final.content if b.type == "tool_use"][0]
    assert tool.name == "get_weather" and tool.input == {"city": "Paris"}
    assert final.usage.output_tokens == 7
    env.check_billed(tok, prompt=25, completion=7, cached=4, n=2)


def test_native_stream_event_sequence_and_rename(env):
    tok = env.token()
    r = requests.post(env.relay.url + "/v1/messages", stream=True, timeout=30,
                      headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01"},
                      json={"model": "anthropic-model", "max_tokens": 50, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    blocks = [b for b in r.content.decode().split("\n\n") if b.strip()]
    names = [b.split("\n")[0] for b in blocks]
    assert names == ["event: message_start", "event: content_block_start", "event: ping",
                     "event: content_block_delta", "event: content_block_delta",
                     "event: content_block_delta", "event: content_block_stop",
                     "event: message_delta", "event: message_stop"]
    start = json.loads(blocks[0].split("data: ", 1)[1])
    # The one change on the way back: the mapped model is renamed to the public one.
    assert start["message"]["model"] == "anthropic-model"


def test_native_unmapped_bytes_untouched(env):
    """Without a model mapping the client reads the upstream's bytes exactly."""
    env.channel("anthropic", "claude-plain")
    tok = env.token()
    body = {"model": "claude-plain", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    via = requests.post(env.relay.url + "/v1/messages", json=body, timeout=30,
                        headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01"})
    direct = requests.post(env.anthropic.url + "/v1/messages", json=body, timeout=30,
                           headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert via.content == direct.content and len(via.content) > 500
    # ... and the upstream reads the client's request bytes exactly.
    sent = b'{ "model" :"claude-plain","max_tokens":5,  "messages":[{"role":"user","content":"hi"}]}'
    requests.post(env.relay.url + "/v1/messages", data=sent, timeout=30,
                  headers={"x-api-key": tok["key"], "content-type": "application/json"})
    assert env.anthropic.requests[-1]["raw"] == sent
    body["stream"] = False
    via = requests.post(env.relay.url + "/v1/messages", json=body, timeout=30,
                        headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01"})
    direct = requests.post(env.anthropic.url + "/v1/messages", json=body, timeout=30,
                           headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert via.content == direct.content


def test_stop_sequences_and_max_tokens_native(env):
    tok = env.token()
    c = client(env, tok["key"])
    msg = c.messages.create(model="anthropic-model", max_tokens=100, stop_sequences=["fake"],
                            messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "fake"
    assert msg.content[0].text == "Hello from the "
    msg = c.messages.create(model="anthropic-model", max_tokens=2,
                            messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason == "max_tokens" and msg.content[0].text == "Hello from"


# ---- conversion: Anthropic client -> OpenAI channel --------------------------
def test_messages_to_openai_channel_full_conversion(env):
    tok = env.token()
    c = client(env, tok["key"])
    msg = c.messages.create(
        model="openai-model", max_tokens=64, extra_body={"temperature": 0.3}, stop_sequences=["END"],
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Be kind."}],
        tools=TOOLS, tool_choice={"type": "auto"},
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Look at these"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PNG}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "and now?"}]}])
    up = last(env.openai)["body"]
    assert up["model"] == "openai-upstream-model"
    assert up["max_tokens"] == 64 and up["temperature"] == 0.3 and up["stop"] == ["END"]
    roles = [m["role"] for m in up["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert up["messages"][0]["content"] == "You are terse.\nBe kind."
    parts = up["messages"][1]["content"]
    assert parts[1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert parts[2]["image_url"]["url"] == "https://x.test/a.jpg"
    assert up["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city":"Rome"}'}
    assert up["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    assert up["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    assert up["tool_choice"] == "auto"
    # The fake answers a call with tools by calling the first tool.
    assert msg.model == "openai-model"
    assert msg.stop_reason == "tool_use"
    tool = [b for b in msg.content if b.type == "tool_use"][0]
    assert tool.id == "call_fake1" and tool.input == {"city": "Paris"}
    assert msg.usage.input_tokens == 10 and msg.usage.output_tokens == 3
    env.check_billed(tok, prompt=10, completion=3)


def test_messages_to_openai_channel_stream_with_tools(env):
    tok = env.token()
    c = client(env, tok["key"])
    events = list(c.messages.create(model="openai-model", max_tokens=100, tools=TOOLS,
                                    stream=True,
                                    messages=[{"role": "user", "content": "weather?"}]))
    kinds = [e.type for e in events]  # the SDK hides ping events
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in start] == ["tool_use"]
    assert start[0].content_block.name == "get_weather"
    args = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(args) == {"city": "Paris"}
    delta = events[-2]
    assert delta.delta.stop_reason == "tool_use"
    assert delta.usage.output_tokens == 3 and delta.usage.input_tokens == 10
    assert last(env.openai)["body"]["stream_options"] == {"include_usage": True}
    env.check_billed(tok, prompt=10, completion=3)


def test_messages_to_openai_channel_raw_event_sequence(env):
    tok = env.token()
    r = requests.post(env.relay.url + "/messages", stream=True, timeout=30,
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": "openai-model", "max_tokens": 50, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    blocks = [b for b in r.content.decode().split("\n\n") if b.strip()]
    names = [b.split("\n")[0][len("event: "):] for b in blocks]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    datas = [json.loads(b.split("data: ", 1)[1]) for b in blocks]
    assert all(d["type"] == n for d, n in zip(datas, names))
    assert datas[0]["message"]["model"] == "openai-model"
    assert datas[7]["usage"]["output_tokens"] == 3
    env.check_billed(tok, prompt=10, completion=3)


def test_messages_to_openai_channel_stream_text(env):
    tok = env.token()
    c = client(env, tok["key"])
    with c.messages.stream(model="openai-model", max_tokens=100,
                           messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello from the fake upstream."
    assert final.stop_reason == "end_turn" and final.content[0].text == text
    env.check_billed(tok, prompt=10, completion=3)


def test_messages_to_gemini_channel_stream(env):
    tok = env.token()
    c = client(env, tok["key"])
    with c.messages.stream(model="gemini-model", max_tokens=100, tools=TOOLS,
                           messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    tool = [b for b in final.content if b.type == "tool_use"][0]
    assert tool.input == {"city": "Paris"} and final.stop_reason == "tool_use"
    up = last(env.gemini)
    assert up["path"] == "/v1beta/models/gemini-upstream-model:streamGenerateContent"
    assert up["body"]["tools"][0]["functionDeclarations"][0]["parameters"]["type"] == "OBJECT"
    # Gemini: promptTokenCount 12 (3 of them cached), candidatesTokenCount 5.
    env.check_billed(tok, prompt=12, completion=5, cached=3)


# ---- coding agents -------------------------------------------------------------
def test_coding_agent_beta_stream_with_tools(env):
    """What Claude Code sends given only the base address: the beta route
    (?beta=true), anthropic-beta, system blocks with cache_control, tools,
    streaming; and count_tokens."""
    tok = env.token()
    c = client(env, tok["key"])
    with c.beta.messages.stream(
            model="anthropic-model", max_tokens=1000, betas=["interleaved-thinking-2025-05-14"],
            system=[{"type": "text", "text": "You are a coding agent.",
                     "cache_control": {"type": "ephemeral"}}],
            tools=TOOLS, messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    up = last(env.anthropic)
    assert up["headers"]["Anthropic-Beta"] == "interleaved-thinking-2025-05-14"
    n = c.beta.messages.count_tokens(model="anthropic-model", tools=TOOLS,
                                     messages=[{"role": "user", "content": "weather?"}])
    assert n.input_tokens > 5
    # The same agent pointed at a model served by an OpenAI channel.
    with c.beta.messages.stream(model="openai-model", max_tokens=1000, tools=TOOLS,
                                messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Paris"}
    # count_tokens is free: two billed calls only.
    env.check_billed(tok, prompt=10, completion=3, n=2)


def test_models_list_in_anthropic_format(env):
    tok = env.token()
    ids = [m.id for m in client(env, tok["key"]).models.list()]
    assert "anthropic-model" in ids and "openai-model" in ids


# ---- errors --------------------------------------------------------------------
def test_errors_use_anthropic_body(env):
    tok = env.token()
    c = client(env, tok["key"])
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(model="anthropic-model", max_tokens=-1,
                          messages=[{"role": "user", "content": "hi"}])
    body = ei.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"] and "request id" in body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as ei:
        client(env, "sk-wrong").messages.create(model="anthropic-model", max_tokens=5,
                                                messages=[{"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "authentication_error"
    r = requests.post(env.relay.url + "/v1/messages", data=b"{not json",
                      headers={"x-api-key": tok["key"]}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    with pytest.raises(anthropic.NotFoundError) as ei:
        c.messages.create(model="no-such-model", max_tokens=5,
                          messages=[{"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "not_found_error"
    r = requests.post(env.relay.url + "/v1/messages/batches", json={}, timeout=30,
                      headers={"x-api-key": tok["key"]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert env.logs(tok["id"], 0) == []  # nothing billed for refused calls


def test_upstream_failures(env):
    env.channel("anthropic", "claude-429", mode="429")
    env.channel("anthropic", "claude-err-event", mode="error_event")
    tok = env.token()
    c = client(env, tok["key"])
    with pytest.raises(anthropic.RateLimitError) as ei:
        c.messages.create(model="claude-429", max_tokens=5,
                          messages=[{"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "rate_limit_error"
    # An error event mid-stream reaches the client as Anthropic sends it.
    with pytest.raises(anthropic.APIStatusError) as ei:
        list(c.messages.create(model="claude-err-event", max_tokens=50, stream=True,
                               messages=[{"role": "user", "content": "hi"}]))
    assert "overloaded_error" in str(ei.value)
    # The part that streamed is billed (input from message_start).
    rec = env.logs(tok["id"], 2)[-1]
    assert rec["prompt_tokens"] == 25 and rec["quota"] > 0


def test_client_gone_mid_stream_is_billed_for_what_streamed(env):
    env.channel("anthropic", "claude-slow", mode="slow")
    tok = env.token()
    r = requests.post(env.relay.url + "/v1/messages", stream=True, timeout=30,
                      headers={"x-api-key": tok["key"]},
                      json={"model": "claude-slow", "max_tokens": 50, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]})
    seen = []
    for line in r.iter_lines():
        if line.startswith(b"event: "):
            seen.append(line[7:].decode())
        if seen.count("content_block_delta") == 1:
            break
    r.close()  # the client goes away before message_delta
    rec = env.logs(tok["id"])[-1]
    assert rec["status"] == 499 and rec["estimated"] is True
    # Input exactly as the upstream reported it; output counted from the text sent.
    assert rec["prompt_tokens"] == 25 and rec["cached_tokens"] == 4
    assert 1 <= rec["completion_tokens"] < 7
    assert rec["quota"] == expected_units(rec["prompt_tokens"], rec["completion_tokens"],
                                          rec["cached_tokens"])
    deadline = time.monotonic() + 10
    while not env.anthropic.requests[-1].get("aborted"):
        assert time.monotonic() < deadline, "the upstream call was not cancelled"
        time.sleep(0.1)


def test_a_body_the_conversion_cannot_read(env):
    """A block shape the validator does not look into: a 400 in Anthropic's
    body, before anything is reserved, from a channel the call is converted
    for; an Anthropic channel is sent the bytes (its upstream judges them)."""
    tok = env.token()
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "content", "content": 5}}]}]}
    r = requests.post(env.relay.url + "/v1/messages", json=dict(body, model="openai-model"),
                      headers={"x-api-key": tok["key"]}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert "malformed" in r.json()["error"]["message"]
    assert env.logs(tok["id"], 0) == []
    n0 = len(env.anthropic.requests)
    r = requests.post(env.relay.url + "/v1/messages", json=dict(body, model="anthropic-model"),
                      headers={"x-api-key": tok["key"]}, timeout=30)
    assert len(env.anthropic.requests) == n0 + 1
    assert last(env.anthropic)["body"]["messages"] == body["messages"]
