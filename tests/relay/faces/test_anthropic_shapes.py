"""What the current Anthropic clients send, through every channel type,
with the official anthropic SDK (2.x): system-role messages inside
`messages`, every block shape, tool round trips, thinking, streaming,
header and query pass-through, count_tokens; billed to the unit."""
from __future__ import annotations

import base64
import json

import anthropic
import pytest
import requests

from tests.fakes import anthropic_upstream as fa
from tests.fakes import gemini_upstream as fg
from tests.vendor_env import Env

pytestmark = pytest.mark.slow

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
PDF = base64.b64encode(b"%PDF-1.4 fake").decode()
# (prompt, completion, cached) each fake reports for one call.
USAGE = {"anthropic": (25, 7, 4), "openai": (10, 3, 0), "azure": (10, 3, 0),
         "gemini": (12, 5, 3)}
KINDS = ["anthropic", "openai", "gemini", "azure"]


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("openai", "openai-reasoning", upstream="o3-mini")
    e.channel("gemini", "gemini-three", upstream="gemini-3-pro-preview")
    e.channel("anthropic", "claude-redacted", mode="redacted")
    e.channel("anthropic", "claude-raw")
    e.channel("anthropic", "claude-extra-beta", options={"anthropic_beta": "extra-2099-01-01"})
    e.channel("anthropic", "claude-no-count", mode="no_count_tokens")
    e.channel("anthropic", "claude-down", mode="500")
    e.channel("openai", "gpt4o-plain", upstream="gpt-4o")
    e.channel("openai", "gpt4o-capped", upstream="gpt-4o", options={"max_output_tokens": 16384})
    yield e
    e.stop()


def client(env, key) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=env.relay.url, max_retries=0)


def last(fake) -> dict:
    return fake.requests[-1]


# ---- system messages inside `messages` ---------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_system_message_inside_messages(env, kind):
    """Claude Code's shape: a system-role message (with cache_control and a
    per-turn output_config) after the first user turn."""
    tok = env.token()
    msg = client(env, tok["key"]).messages.create(
        model=env.models[kind], max_tokens=200, system="top",
        messages=[{"role": "user", "content": "hi"},
                  {"role": "system", "content": [{"type": "text", "text": "Environment: test",
                                                  "cache_control": {"type": "ephemeral"}}],
                   "output_config": {"effort": "medium"}},
                  {"role": "user", "content": "and?"}])
    assert msg.content[-1].type == "text" and msg.content[-1].text
    up = last(env.fakes[kind])["body"]
    if kind == "anthropic":
        assert up["messages"][1]["role"] == "system"  # untouched
    elif kind == "gemini":
        assert up["systemInstruction"] == {"parts": [{"text": "top\n\nEnvironment: test"}]}
        assert [c["role"] for c in up["contents"]] == ["user"]
        # The per-turn effort is the thinking setting; the thoughts are billed as output.
        assert up["generationConfig"]["thinkingConfig"]["thinkingBudget"] == 8192
        env.check_billed(tok, 12, 5 + fg.THOUGHT_TOKENS, 3)
        return
    else:
        assert up["messages"][0] == {"role": "system", "content": "top\n\nEnvironment: test"}
        assert [m["role"] for m in up["messages"]] == ["system", "user", "user"]
        # effort "medium" maps to reasoning_effort, which this model does not take.
        assert "reasoning_effort" not in up
    env.check_billed(tok, *USAGE[kind])


# ---- every block shape -----------------------------------------------------------------
def _every_shape() -> dict:
    """One conversation with every block shape the SDK types allow."""
    cc = {"cache_control": {"type": "ephemeral"}}
    return dict(
        max_tokens=4000, betas=["interleaved-thinking-2025-05-14", "context-management-2025-06-27"],
        system=[{"type": "text", "text": "You are a coding agent.", **cc}],
        thinking={"type": "adaptive"}, output_config={"effort": "low"},
        metadata={"user_id": json.dumps({"device_id": "d" * 64, "session_id": "s" * 36})},
        extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                      "keep": "all"}]},
                    "cache_control": {"type": "ephemeral"}},
        tools=TOOLS + [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
                       {"name": "Deferred", "input_schema": {"type": "object", "properties": {}},
                        "defer_loading": True, **cc}],
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Look at these", **cc},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PNG}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                {"type": "document", "title": "spec.pdf",
                 "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
                {"type": "document", "citations": {"enabled": True},
                 "source": {"type": "text", "media_type": "text/plain", "data": "plain doc"}},
                {"type": "search_result", "source": "https://x.test", "title": "Result",
                 "content": [{"type": "text", "text": "found it"}]}]},
            {"role": "system", "content": "Environment block", "output_config": {"effort": "low"}},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": fa.SIGNATURE},
                {"type": "redacted_thinking", "data": fa.REDACTED},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                 "input": {"query": "weather"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                    {"type": "web_search_result", "url": "https://w.test", "title": "W",
                     "encrypted_content": "abc", "page_age": None}]},
                {"type": "text", "text": "Checking.", "citations": None},
                {"type": "tool_use", "id": "toolu_a", "name": "get_weather",
                 "input": {"city": "Rome"}, **cc}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "is_error": False,
                 "content": [{"type": "text", "text": "sunny"},
                             {"type": "image", "source": {"type": "base64",
                                                          "media_type": "image/png", "data": PNG}}],
                 **cc}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "again", "signature": fa.SIGNATURE},
                {"type": "tool_use", "id": "toolu_b", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "no such city",
                 "is_error": True}]}])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_block_shape_is_accepted(env, kind, stream):
    tok = env.token()
    c = client(env, tok["key"])
    if stream:
        with c.beta.messages.stream(model=env.models[kind], **_every_shape()) as s:
            final = s.get_final_message()
    else:
        final = c.beta.messages.create(model=env.models[kind], **_every_shape())
    # The last turn is a tool result: every fake answers by quoting it.
    assert final.content[-1].text.endswith("no such city")
    up = last(env.fakes[kind])["body"]
    if kind == "anthropic":
        sent = _every_shape()
        assert up["messages"] == sent["messages"] and up["tools"] == sent["tools"]
        assert up["thinking"] == {"type": "adaptive"} and "context_management" in up
    elif kind == "gemini":
        roles = [c["role"] for c in up["contents"]]
        assert roles == ["user", "model", "user", "model", "user"]
        parts = up["contents"][0]["parts"]
        assert {"inlineData": {"mimeType": "application/pdf", "data": PDF}} in parts
        assert up["contents"][2]["parts"][0]["functionResponse"]["response"] == {
            "content": "sunny"}
        # The tool result's image follows it as the user's own part.
        assert up["contents"][2]["parts"][1] == {"inlineData": {"mimeType": "image/png",
                                                                 "data": PNG}}
        assert up["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 1024,
                                                            "includeThoughts": True}
        assert [f["name"] for f in up["tools"][0]["functionDeclarations"]] == [
            "get_weather", "Deferred"]
    else:
        roles = [m["role"] for m in up["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
        assert up["messages"][0]["content"] == "You are a coding agent.\n\nEnvironment block"
        kinds = [p["type"] for p in up["messages"][1]["content"]]
        assert kinds == ["text", "image_url", "image_url", "file", "text", "text"]
        assert up["messages"][1]["content"][3]["file"]["file_data"] == \
            f"data:application/pdf;base64,{PDF}"
        assert up["messages"][2] == {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]}
        assert up["messages"][3] == {"role": "tool", "tool_call_id": "toolu_a", "content": "sunny"}
        assert up["messages"][4]["content"][0]["type"] == "image_url"
        assert up["messages"][6]["content"] == "Error: no such city"
        assert [t["function"]["name"] for t in up["tools"]] == ["get_weather", "Deferred"]
        assert "user" not in up  # Claude Code's long JSON user id does not fit OpenAI's field
        assert "reasoning_effort" not in up  # not a reasoning model
    prompt, completion, cached = USAGE[kind]
    if kind == "gemini":
        completion += fg.THOUGHT_TOKENS  # includeThoughts: the thoughts are billed as output
    env.check_billed(tok, prompt, completion, cached)


# ---- tool round trips --------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_tool_round_trip(env, kind, stream):
    tok = env.token()
    c = client(env, tok["key"])
    convo = [{"role": "user", "content": "What is the weather in Paris?"}]

    def ask():
        if stream:
            with c.messages.stream(model=env.models[kind], max_tokens=500, tools=TOOLS,
                                   messages=convo) as s:
                return s.get_final_message()
        return c.messages.create(model=env.models[kind], max_tokens=500, tools=TOOLS,
                                 messages=convo)

    first = ask()
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    convo += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "Sunny, 24 degrees"}]}]
    final = ask()
    assert final.stop_reason == "end_turn"
    assert final.content[-1].text.endswith("Sunny, 24 degrees")
    env.check_billed(tok, *USAGE[kind], n=2)


# ---- thinking ----------------------------------------------------------------------
def test_thinking_passes_through_byte_for_byte(env):
    """An Anthropic channel: thinking_delta, signature_delta and
    input_json_delta events reach the client exactly as the upstream sent
    them, and the signed blocks go back unchanged on the next turn."""
    tok = env.token()
    body = {"model": "claude-raw", "max_tokens": 4000, "stream": True, "tools": TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [{"role": "user", "content": "weather?"}]}
    head = {"anthropic-version": "2023-06-01"}
    via = requests.post(env.relay.url + "/v1/messages?beta=true", json=body, timeout=30,
                        headers=dict(head, **{"x-api-key": tok["key"]}))
    direct = requests.post(env.anthropic.url + "/v1/messages?beta=true", json=body, timeout=30,
                           headers=dict(head, **{"x-api-key": "k"}))
    assert via.status_code == 200 and via.content == direct.content
    for delta in (b'"thinking_delta"', b'"signature_delta"', b'"input_json_delta"'):
        assert delta in via.content
    c = client(env, tok["key"])
    with c.messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
        first = s.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].signature == fa.SIGNATURE
    # The next turn sends the signed thinking back: the upstream accepts it.
    final = c.messages.create(
        model="claude-raw", max_tokens=4000, tools=TOOLS, thinking=body["thinking"],
        messages=[{"role": "user", "content": "weather?"},
                  {"role": "assistant",
                   "content": [b.model_dump(exclude_none=True) for b in first.content]},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": "toolu_fake1", "content": "rain"}]}])
    assert final.content[0].type == "thinking" and final.content[-1].text.endswith("rain")
    env.check_billed(tok, 25, 7, 4, n=3)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_mapped_model_is_the_only_byte_renamed(env, stream):
    """Through a channel that maps the model: the client reads the
    upstream's exact bytes but for the model's name, streamed or not."""
    tok = env.token()
    body = {"max_tokens": 4000, "stream": stream, "tools": TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [{"role": "user", "content": "weather?"}]}
    via = requests.post(env.relay.url + "/v1/messages",
                        data=json.dumps(dict(body, model="anthropic-model"), indent=1).encode(),
                        headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01",
                                 "content-type": "application/json"}, timeout=30)
    upstream_read = last(env.anthropic)["raw"]
    direct = requests.post(env.anthropic.url + "/v1/messages",
                           json=dict(body, model="anthropic-upstream-model"), timeout=30,
                           headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert via.status_code == 200 and direct.content.count(b"anthropic-upstream-model") == 1
    assert via.content == direct.content.replace(b'"model": "anthropic-upstream-model"',
                                                 b'"model": "anthropic-model"')
    # ... and the upstream read the client's exact bytes but for the model.
    sent = json.dumps(dict(body, model="anthropic-model"), indent=1).encode()
    assert upstream_read == sent.replace(b'"anthropic-model"', b'"anthropic-upstream-model"')
    env.check_billed(tok, 25, 7, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_redacted_thinking_reaches_the_client(env, stream):
    tok = env.token()
    c = client(env, tok["key"])
    args = dict(model="claude-redacted", max_tokens=4000,
                thinking={"type": "enabled", "budget_tokens": 1024},
                messages=[{"role": "user", "content": "hi"}])
    if stream:
        with c.messages.stream(**args) as s:
            msg = s.get_final_message()
    else:
        msg = c.messages.create(**args)
    assert [b.type for b in msg.content] == ["thinking", "redacted_thinking", "text"]
    assert msg.content[1].data == fa.REDACTED
    env.check_billed(tok, 25, 7, 4)


@pytest.mark.parametrize("thinking, output_config, effort", [
    ({"type": "enabled", "budget_tokens": 10000}, None, "high"),
    ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
    ({"type": "adaptive"}, {"effort": "max"}, "high"),
    ({"type": "adaptive"}, {"effort": "medium"}, "medium"),
    ({"type": "disabled"}, {"effort": "high"}, None),
])
def test_thinking_becomes_reasoning_effort_on_openai(env, thinking, output_config, effort):
    tok = env.token()
    extra = {"output_config": output_config} if output_config else {}
    with client(env, tok["key"]).messages.stream(
            model="openai-reasoning", max_tokens=20000, thinking=thinking,
            messages=[{"role": "user", "content": "hi"}], **extra) as s:
        assert s.get_final_message().content[0].text == "Hello from the fake upstream."
    up = last(env.openai)["body"]
    assert up.get("reasoning_effort") == effort and up["model"] == "o3-mini"
    assert up["max_completion_tokens"] == 20000 and "max_tokens" not in up
    env.check_billed(tok, 10, 3)


def test_thinking_on_gemini_channels(env):
    """Gemini 2.5 gets a thinking budget, Gemini 3 a thinking level; the
    thoughts come back as a thinking block; a converted tool loop through
    Gemini 3 carries the signature stand-in its validator accepts."""
    tok = env.token()
    c = client(env, tok["key"])
    with c.messages.stream(model="gemini-model", max_tokens=20000,
                           thinking={"type": "enabled", "budget_tokens": 4096},
                           messages=[{"role": "user", "content": "hi"}]) as s:
        msg = s.get_final_message()
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == fg.THOUGHT
    assert last(env.gemini)["body"]["generationConfig"]["thinkingConfig"] == {
        "thinkingBudget": 8192, "includeThoughts": True}
    env.check_billed(tok, 12, 5 + fg.THOUGHT_TOKENS, 3)
    convo = [{"role": "user", "content": "weather?"}]
    args = dict(model="gemini-three", max_tokens=20000, tools=TOOLS,
                thinking={"type": "adaptive"}, output_config={"effort": "high"})
    first = c.messages.create(messages=convo, **args)
    assert first.stop_reason == "tool_use"
    assert last(env.gemini)["body"]["generationConfig"]["thinkingConfig"] == {
        "thinkingLevel": "high", "includeThoughts": True}
    use = first.content[-1]
    convo += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "snow"}]}]
    final = c.messages.create(messages=convo, **args)
    assert final.content[-1].text.endswith("snow")
    model_turn = last(env.gemini)["body"]["contents"][1]
    assert model_turn["parts"][-1]["thoughtSignature"] == "skip_thought_signature_validator"
    env.check_billed(tok, 12, 5 + fg.THOUGHT_TOKENS, 3, n=3)


# ---- reasoning from other formats to Anthropic channels -------------------------------
def test_openai_reasoning_effort_becomes_anthropic_thinking(env):
    import openai
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    reasoning = []
    for ch in oc.chat.completions.create(
            model="anthropic-model", reasoning_effort="medium", max_completion_tokens=8000,
            temperature=0.5, top_p=0.5, stream=True,
            messages=[{"role": "user", "content": "hi"}]):
        for choice in ch.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
    assert "".join(reasoning) == fa.THINKING_TEXT
    up = last(env.anthropic)["body"]
    assert up["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert "temperature" not in up and "top_p" not in up  # thinking rules them out
    # Too few tokens for the smallest budget, or a tool loop in progress
    # (no signed thinking to start it with): no thinking, and no 400.
    oc.chat.completions.create(model="anthropic-model", reasoning_effort="high", max_tokens=900,
                               messages=[{"role": "user", "content": "hi"}])
    assert "thinking" not in last(env.anthropic)["body"]
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": TOOLS[0]["input_schema"]}}]
    r = oc.chat.completions.create(
        model="anthropic-model", reasoning_effort="high", max_tokens=9000, tools=tools,
        messages=[{"role": "user", "content": "weather?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "toolu_x", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "toolu_x", "content": "hail"}])
    assert r.choices[0].message.content.endswith("hail")
    assert "thinking" not in last(env.anthropic)["body"]
    env.check_billed(tok, 25, 7, 4, n=3)


def test_gemini_thinking_config_becomes_anthropic_thinking(env):
    from google import genai
    from google.genai import types
    tok = env.token()
    g = genai.Client(api_key=tok["key"], http_options=types.HttpOptions(base_url=env.relay.url))
    r = g.models.generate_content(
        model="anthropic-model", contents="hi",
        config=types.GenerateContentConfig(
            max_output_tokens=9000,
            thinking_config=types.ThinkingConfig(thinking_budget=20000, include_thoughts=True)))
    assert last(env.anthropic)["body"]["thinking"] == {"type": "enabled", "budget_tokens": 8999}
    parts = r.candidates[0].content.parts
    assert parts[0].thought is True and parts[0].text == fa.THINKING_TEXT
    assert r.text == fa.DEFAULT_TEXT
    env.check_billed(tok, 25, 7, 4)


def test_output_limit_capped_for_the_channel(env):
    """Claude Code asks for max_tokens 128000, more than a gpt-4o takes: the
    channel option max_output_tokens cuts it; without it the upstream's 400
    reaches the client in Anthropic's body."""
    tok = env.token()
    c = client(env, tok["key"])
    args = dict(max_tokens=128000, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as ei:
        with c.messages.stream(model="gpt4o-plain", **args) as s:
            s.get_final_message()
    assert "max_tokens is too large" in ei.value.body["error"]["message"]
    with c.messages.stream(model="gpt4o-capped", **args) as s:
        msg = s.get_final_message()
    assert msg.content[0].text == "Hello from the fake upstream."
    assert last(env.openai)["body"]["max_tokens"] == 16384
    env.check_billed(tok, 10, 3, n=2)  # the refused call is logged, free


# ---- headers and query -------------------------------------------------------------
def test_version_betas_and_query_pass_through(env):
    tok = env.token()
    body = {"model": "claude-extra-beta", "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}]}
    r = requests.post(env.relay.url + "/v1/messages?beta=true", json=body, timeout=30,
                      headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01",
                               "anthropic-beta": "claude-code-20250219,effort-2025-11-24"})
    assert r.status_code == 200, r.text
    up = last(env.anthropic)
    assert up["path"] == "/v1/messages" and up["query"] == "beta=true"
    assert up["headers"]["Anthropic-Version"] == "2023-06-01"
    # The client's betas as sent, then the one the channel adds.
    assert up["headers"]["Anthropic-Beta"] == \
        "claude-code-20250219,effort-2025-11-24,extra-2099-01-01"
    # The SDK's own version header; a key in the query; no betas of its own.
    c = client(env, tok["key"])
    c.beta.messages.create(model="claude-raw", max_tokens=50, betas=["files-api-2025-04-14"],
                           messages=[{"role": "user", "content": "hi"}])
    up = last(env.anthropic)
    assert up["headers"]["Anthropic-Version"] == c.default_headers["anthropic-version"]
    assert up["headers"]["Anthropic-Beta"] == "files-api-2025-04-14"
    requests.post(env.relay.url + "/v1/messages?key=" + tok["key"], json=body, timeout=30)
    up = last(env.anthropic)
    assert up["query"] == "" and up["headers"]["Anthropic-Version"] == "2023-06-01"
    assert up["headers"]["Anthropic-Beta"] == "extra-2099-01-01"
    # Other channel types do not take Anthropic's headers: dropped, not refused.
    c.beta.messages.create(model="openai-model", max_tokens=50, betas=["files-api-2025-04-14"],
                           messages=[{"role": "user", "content": "hi"}])
    up = last(env.openai)
    assert not any(h.lower().startswith("anthropic") for h in up["headers"])
    assert up["query"] == ""
    env.check_billed(tok, 10, 3, n=4)


# ---- count_tokens ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_count_tokens_on_every_channel_type(env, kind):
    tok = env.token()
    c = client(env, tok["key"])
    n0 = len(env.fakes[kind].requests)
    got = c.beta.messages.count_tokens(
        model=env.models[kind], betas=["token-counting-2024-11-01"], system="sys", tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 2048},
        messages=[{"role": "user", "content": "how many tokens is this?"},
                  {"role": "system", "content": "Environment"}])
    if kind == "anthropic":
        assert got.input_tokens == 4242  # the upstream's own count
        up = last(env.anthropic)
        assert up["path"] == "/v1/messages/count_tokens"
        # (the SDK names this beta twice; it goes on as sent)
        assert set(up["headers"]["Anthropic-Beta"].split(",")) == {"token-counting-2024-11-01"}
        assert up["body"]["model"] == "anthropic-upstream-model"
        assert "max_tokens" not in up["body"]
    else:
        assert 20 < got.input_tokens < 200  # our estimate; the upstream is not asked
        assert len(env.fakes[kind].requests) == n0
    env.unbilled(tok["id"])  # free: nothing billed


def test_count_tokens_falls_back_and_passes_errors(env):
    tok = env.token()
    c = client(env, tok["key"])
    # An Anthropic-compatible upstream without the endpoint: our estimate.
    for model in ("claude-no-count", "claude-down"):  # ... or one that fails
        got = c.messages.count_tokens(model=model,
                                      messages=[{"role": "user", "content": "hello there"}])
        assert 5 < got.input_tokens < 50
    # The upstream's verdict on a bad request reaches the client as it is.
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.count_tokens(model="claude-raw", thinking={"type": "enabled",
                                                              "budget_tokens": 100},
                                messages=[{"role": "user", "content": "hi"}])
    assert "budget_tokens" in ei.value.body["error"]["message"]
    env.unbilled(tok["id"])


# ---- validation ----------------------------------------------------------------------
@pytest.mark.parametrize("doc, field", [
    ({"max_tokens": 10, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]}, "messages.0.content.0.tool_use_id"),
    ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
])
def test_bad_bodies_name_the_field(env, doc, field):
    tok = env.token()
    r = requests.post(env.relay.url + "/v1/messages", json=dict(doc, model="anthropic-model"),
                      headers={"x-api-key": tok["key"]}, timeout=30)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(field + ":")
