"""The Gemini face, end to end with the official google-genai SDK (3.x:
/v1 by default, /v1beta via http_options) and with the raw REST shapes the
legacy google-generativeai library uses, against fake upstreams of every
channel type, with billing checked to the unit."""
from __future__ import annotations

import base64
import json

import openai
import pytest
import requests
from google import genai
from google.genai import errors as gerrors
from google.genai import types

from tests.vendor_env import Env

pytestmark = pytest.mark.slow

WEATHER = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="get_weather", description="Weather for a city",
    parameters={"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
                "required": ["city"]})])
PNG = b"\x89PNG\r\n\x1a\nfake"


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    yield e
    e.stop()


def client(env, key, version=None) -> genai.Client:
    opts = {"base_url": env.relay.url}
    if version:
        opts["api_version"] = version
    return genai.Client(api_key=key, http_options=types.HttpOptions(**opts))


def last(fake) -> dict:
    return fake.requests[-1]


# ---- native: Gemini client -> gemini channel ----------------------------------
@pytest.mark.parametrize("version", [None, "v1beta"], ids=["v1-default", "v1beta"])
def test_native_generate_passthrough_and_billing(env, version):
    tok = env.token()
    g = client(env, tok["key"], version)
    n0 = len(env.gemini.requests)
    r = g.models.generate_content(
        model="gemini-model", contents="hi",
        config=types.GenerateContentConfig(
            system_instruction="be brief", max_output_tokens=50,
            safety_settings=[types.SafetySetting(category="HARM_CATEGORY_HARASSMENT",
                                                 threshold="BLOCK_NONE")]))
    assert r.text == "Hello from the fake Gemini upstream."
    assert r.usage_metadata.prompt_token_count == 12
    assert len(env.gemini.requests) == n0 + 1
    up = last(env.gemini)
    # The channel's own version (v1beta) whatever the client used; the body
    # as the client sent it, fields a conversion drops (safetySettings) included.
    assert up["path"] == "/v1beta/models/gemini-upstream-model:generateContent"
    assert up["headers"]["X-Goog-Api-Key"] == "upstream-key"
    assert up["body"]["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT",
                                             "threshold": "BLOCK_NONE"}]
    assert up["body"]["systemInstruction"]["parts"][0]["text"] == "be brief"
    # promptTokenCount 12 includes cachedContentTokenCount 3.
    env.check_billed(tok, prompt=12, completion=5, cached=3)


def test_native_stream_sse(env):
    tok = env.token()
    g = client(env, tok["key"])
    chunks = list(g.models.generate_content_stream(model="gemini-model", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello from the fake Gemini upstream."
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == 5
    assert last(env.gemini)["path"].endswith(":streamGenerateContent")
    env.check_billed(tok, prompt=12, completion=5, cached=3)


def test_native_stream_json_array_legacy(env):
    """Without alt=sse (the legacy library's REST transport) the stream is one
    JSON array; the key may come as ?key=."""
    tok = env.token()
    r = requests.post(f"{env.relay.url}/v1beta/models/gemini-model:streamGenerateContent"
                      f"?$alt=json;enum-encoding=int&key={tok['key']}", timeout=30,
                      json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    arr = r.json()
    assert isinstance(arr, list) and len(arr) == 3
    assert "".join(d["candidates"][0]["content"]["parts"][0]["text"] for d in arr) == \
        "Hello from the fake Gemini upstream."
    assert arr[-1]["usageMetadata"]["candidatesTokenCount"] == 5
    env.check_billed(tok, prompt=12, completion=5, cached=3)


def test_native_unmapped_bytes_untouched(env):
    """Without a model mapping a Gemini client reads the upstream's bytes."""
    env.channel("gemini", "gemini-plain")
    tok = env.token()
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    for method in ("streamGenerateContent?alt=sse", "generateContent"):
        via = requests.post(f"{env.relay.url}/v1beta/models/gemini-plain:{method}", json=body,
                            headers={"x-goog-api-key": tok["key"]}, timeout=30)
        direct = requests.post(f"{env.gemini.url}/v1beta/models/gemini-plain:{method}",
                               json=body, headers={"x-goog-api-key": "k"}, timeout=30)
        assert via.status_code == 200 and via.content == direct.content
        assert env.gemini.requests[-1]["raw"] == env.gemini.requests[-2]["raw"]
    assert b"\r\n\r\n" in direct.content or method == "generateContent"


def test_json_array_from_openai_channel(env):
    tok = env.token()
    r = requests.post(f"{env.relay.url}/v1beta/models/openai-model:streamGenerateContent",
                      headers={"x-goog-api-key": tok["key"]}, timeout=30,
                      json={"contents": [{"parts": [{"text": "hi"}]}]})
    assert r.status_code == 200, r.text
    arr = r.json()
    assert "".join(p.get("text", "") for d in arr
                   for p in d["candidates"][0]["content"]["parts"]) == "Hello from the fake upstream."
    assert arr[-1]["candidates"][0]["finishReason"] == "STOP"
    assert arr[-1]["usageMetadata"] == {"promptTokenCount": 10, "candidatesTokenCount": 3,
                                        "totalTokenCount": 13}
    env.check_billed(tok, prompt=10, completion=3)


# ---- conversion: Gemini client -> OpenAI channel -------------------------------
def test_gemini_to_openai_channel_full_conversion(env):
    tok = env.token()
    g = client(env, tok["key"])
    contents = [
        types.Content(role="user", parts=[types.Part(text="look"),
                                          types.Part.from_bytes(data=PNG, mime_type="image/png")]),
        types.Content(role="model", parts=[types.Part.from_function_call(
            name="get_weather", args={"city": "Rome"})]),
        types.Content(role="user", parts=[types.Part.from_function_response(
            name="get_weather", response={"forecast": "sunny"})]),
    ]
    r = g.models.generate_content(
        model="openai-model", contents=contents,
        config=types.GenerateContentConfig(system_instruction="sys", temperature=0.2,
                                           max_output_tokens=33, stop_sequences=["END"],
                                           tools=[WEATHER]))
    up = last(env.openai)["body"]
    assert up["model"] == "openai-upstream-model"
    assert [m["role"] for m in up["messages"]] == ["system", "user", "assistant", "tool"]
    assert up["messages"][1]["content"][1]["image_url"]["url"] == \
        "data:image/png;base64," + base64.b64encode(PNG).decode()
    call_id = up["messages"][2]["tool_calls"][0]["id"]
    assert up["messages"][3]["tool_call_id"] == call_id
    assert json.loads(up["messages"][3]["content"]) == {"forecast": "sunny"}
    assert up["max_tokens"] == 33 and up["temperature"] == 0.2 and up["stop"] == ["END"]
    assert up["tools"][0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    # Given the tool's result, the upstream answers with text quoting it.
    assert r.function_calls is None
    assert r.text == 'The tool returned: {"forecast":"sunny"}'
    assert r.usage_metadata.prompt_token_count == 10
    env.check_billed(tok, prompt=10, completion=3)


def test_gemini_to_openai_channel_stream_with_tools(env):
    tok = env.token()
    g = client(env, tok["key"], "v1beta")
    chunks = list(g.models.generate_content_stream(
        model="openai-model", contents="weather?",
        config=types.GenerateContentConfig(tools=[WEATHER])))
    calls = [fc for c in chunks for fc in (c.function_calls or ())]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].args == {"city": "Paris"}
    assert chunks[-1].usage_metadata.prompt_token_count == 10
    assert chunks[-1].usage_metadata.candidates_token_count == 3
    env.check_billed(tok, prompt=10, completion=3)


def test_gemini_to_openai_channel_stream_text(env):
    tok = env.token()
    g = client(env, tok["key"])
    chunks = list(g.models.generate_content_stream(model="openai-model", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello from the fake upstream."
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    env.check_billed(tok, prompt=10, completion=3)


def test_gemini_to_anthropic_channel_stream(env):
    tok = env.token()
    g = client(env, tok["key"])
    chunks = list(g.models.generate_content_stream(
        model="anthropic-model", contents="weather?",
        config=types.GenerateContentConfig(tools=[WEATHER], system_instruction="sys")))
    assert "".join(c.text or "" for c in chunks if c.candidates and not c.function_calls) \
        .startswith("Let me check.")
    calls = [fc for c in chunks for fc in (c.function_calls or ())]
    assert calls[0].args == {"city": "Paris"}
    up = last(env.anthropic)["body"]
    assert up["system"] == "sys" and up["tools"][0]["input_schema"]["type"] == "object"
    env.check_billed(tok, prompt=25, completion=7, cached=4)


# ---- conversion: OpenAI client -> Gemini channel ------------------------------
def test_openai_client_to_gemini_channel_stream_tools(env):
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": ["string", "null"]}},
        "additionalProperties": False}}}]
    args, finish, usage = "", None, None
    for ch in oc.chat.completions.create(model="gemini-model", tools=tools, stream=True,
                                         stream_options={"include_usage": True},
                                         messages=[{"role": "system", "content": "sys"},
                                                   {"role": "user", "content": "weather?"}]):
        usage = ch.usage or usage
        for c in ch.choices:
            for tc in c.delta.tool_calls or ():
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert json.loads(args) == {"city": "Paris"} and finish == "tool_calls"
    assert usage.prompt_tokens == 12 and usage.prompt_tokens_details.cached_tokens == 3
    up = last(env.gemini)
    assert up["path"] == "/v1beta/models/gemini-upstream-model:streamGenerateContent"
    assert up["query"] == "alt=sse"
    decl = up["body"]["tools"][0]["functionDeclarations"][0]
    assert decl["parameters"] == {"type": "OBJECT", "properties": {
        "city": {"type": "STRING", "nullable": True}}}
    assert up["body"]["systemInstruction"] == {"parts": [{"text": "sys"}]}
    env.check_billed(tok, prompt=12, completion=5, cached=3)


def test_openai_embeddings_to_gemini_channel(env):
    tok = env.token()
    oc = openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)
    r = oc.embeddings.create(model="gemini-model", input=["a", "b"])  # base64 by default
    assert len(r.data) == 2 and len(r.data[0].embedding) == 8
    assert abs(r.data[1].embedding[0] - 0.2) < 1e-6
    up = last(env.gemini)
    assert up["path"] == "/v1beta/models/gemini-upstream-model:batchEmbedContents"
    rec = env.logs(tok["id"])[-1]
    assert rec["estimated"] is True and rec["prompt_tokens"] > 0  # Gemini reports no usage
    assert rec["quota"] == 1000 * rec["prompt_tokens"]


# ---- embeddings and tokens from Gemini clients --------------------------------
def test_embed_native_and_to_openai(env):
    # The SDK sends one request per text only for models named *embedding*.
    env.channel("gemini", "text-embedding-gem", upstream="text-embedding-004")
    env.channel("openai", "text-embedding-oa", upstream="text-embedding-3-small")
    tok = env.token()
    g = client(env, tok["key"])
    r = g.models.embed_content(model="text-embedding-gem", contents=["a", "b"])
    assert [len(e.values) for e in r.embeddings] == [8, 8]
    assert [q["model"] for q in last(env.gemini)["body"]["requests"]] == \
        ["models/text-embedding-004"] * 2
    r = g.models.embed_content(model="text-embedding-oa", contents=["a", "b"])
    assert r.embeddings[1].values[0] == pytest.approx(0.2)
    assert last(env.openai)["body"]["input"] == ["a", "b"]
    assert last(env.openai)["body"]["model"] == "text-embedding-3-small"
    # embedContent (single) through the raw REST route, to an OpenAI channel.
    rr = requests.post(f"{env.relay.url}/v1beta/models/text-embedding-oa:embedContent",
                       headers={"x-goog-api-key": tok["key"]}, timeout=30,
                       json={"content": {"parts": [{"text": "x"}]}})
    assert rr.status_code == 200 and len(rr.json()["embedding"]["values"]) == 8
    logs = env.logs(tok["id"], 3)
    assert logs[0]["estimated"] is True  # Gemini reports no usage for embeddings
    assert [r["prompt_tokens"] for r in logs[1:]] == [10, 5]  # the OpenAI fake's usage
    assert [r["quota"] for r in logs[1:]] == [10000, 5000]


def test_count_tokens_is_free(env):
    tok = env.token()
    g = client(env, tok["key"])
    n = g.models.count_tokens(model="openai-model", contents="hello there, how are you?")
    assert n.total_tokens > 5
    env.unbilled(tok["id"])


def test_models_list_both_versions(env):
    tok = env.token()
    for version in (None, "v1beta"):
        g = client(env, tok["key"], version)  # held: the pager reads through it
        names = [m.name for m in g.models.list()]
        assert "models/gemini-model" in names and "models/openai-model" in names
    g = client(env, tok["key"])
    m = g.models.get(model="gemini-model")
    assert m.name == "models/gemini-model"


# ---- errors --------------------------------------------------------------------
def test_errors_use_gemini_body(env):
    tok = env.token()
    bad, g = client(env, "sk-wrong"), client(env, tok["key"])
    with pytest.raises(gerrors.ClientError) as ei:
        bad.models.generate_content(model="gemini-model", contents="hi")
    assert ei.value.code == 401 and ei.value.status == "UNAUTHENTICATED"
    r = requests.post(f"{env.relay.url}/v1beta/models/gemini-model:generateContent",
                      headers={"x-goog-api-key": tok["key"]}, json={"contents": []}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["status"] == "INVALID_ARGUMENT" and "contents" in err["message"]
    r = requests.post(f"{env.relay.url}/v1beta/models/gemini-model:fooBar",
                      headers={"x-goog-api-key": tok["key"]}, json={}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    r = requests.get(f"{env.relay.url}/v1beta/cachedContents", timeout=30,
                     headers={"x-goog-api-key": tok["key"]})
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    env.channel("gemini", "gem-429", mode="429")
    with pytest.raises(gerrors.ClientError) as ei:
        g.models.generate_content(model="gem-429", contents="hi")
    assert ei.value.code == 429 and ei.value.status == "RESOURCE_EXHAUSTED"
    # A channel whose own key is wrong is the relay's problem, not the caller's.
    env.channel("gemini", "gem-badkey", key="bad-key")
    with pytest.raises(gerrors.ServerError) as ei:
        g.models.generate_content(model="gem-badkey", contents="hi")
    assert ei.value.code == 503


def test_upstream_reset_mid_stream_keeps_usage(env):
    """The upstream dies after its first chunk: the client sees a Gemini error
    object, and the call is still logged and billed from the usageMetadata
    that arrived (running totals: 12 prompt, 1 output so far)."""
    env.channel("gemini", "gem-reset", mode="reset")
    tok = env.token()
    r = requests.post(f"{env.relay.url}/v1beta/models/gem-reset:streamGenerateContent?alt=sse",
                      headers={"x-goog-api-key": tok["key"]}, timeout=30,
                      json={"contents": [{"parts": [{"text": "hi"}]}]})
    events = [json.loads(b[len("data: "):]) for b in r.content.decode().split("\r\n\r\n")
              if b.startswith("data: ")]
    assert "candidates" in events[0] and events[-1]["error"]["code"] >= 500
    rec = env.logs(tok["id"])[-1]
    assert rec["status"] >= 500
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["cached_tokens"]) == (12, 1, 3)
    assert rec["quota"] == 1000 * 9 + 250 * 3 + 4000 * 1
