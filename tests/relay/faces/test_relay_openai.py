"""The OpenAI face end to end: official SDK (sync, async, streaming,
embeddings in base64) and raw HTTP, against a fake upstream on a socket."""
import asyncio
import base64
import struct
import time

import openai
import pytest
import requests

from tests.helpers import Api, eventually

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def world(relay, admin, fake):
    user = admin.create_user("alice", quota=50_000_000)
    api = Api.login(relay.url, "alice", "Blue-Kettle-Harbor-42")
    admin.create_channel(fake.url, [MODEL, "text-embedding-3-small", "public-name"],
                         model_mapping={"public-name": MODEL})
    admin.set_price(MODEL, input_price=0.15, output_price=0.6)
    admin.set_price("public-name", input_price=0.15, output_price=0.6)
    admin.set_price("text-embedding-3-small", input_price=0.02)
    token = api.create_token(name="main", remain_quota=10_000_000)
    return {"user": user, "api": api, "key": token["key"], "token": token, "url": relay.url}


def client(world, **kw):
    return openai.OpenAI(api_key=world["key"], base_url=world["url"] + "/v1", max_retries=0, **kw)


def test_chat_sync(world, fake):
    r = client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0.2,
        response_format={"type": "json_object"}, seed=7)
    assert r.choices[0].message.content == "Hello from the fake upstream."
    assert r.usage.prompt_tokens == 10
    sent = fake.requests[-1]["body"]
    assert sent["response_format"] == {"type": "json_object"} and sent["seed"] == 7
    assert fake.requests[-1]["headers"]["Authorization"] == "Bearer upstream-key"


def test_chat_async(world):
    async def go():
        c = openai.AsyncOpenAI(api_key=world["key"], base_url=world["url"] + "/v1", max_retries=0)
        rs = await asyncio.gather(*[c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"n{i}"}]) for i in range(5)])
        await c.close()
        return rs
    rs = asyncio.run(go())
    assert all(r.choices[0].message.content == "Hello from the fake upstream." for r in rs)


def test_stream_without_usage_request_hides_usage_chunk(world, fake):
    chunks = list(client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the fake upstream."
    assert all(c.choices for c in chunks), "the client did not ask for a usage chunk"
    # ...but we asked the upstream for usage on our own account
    assert fake.requests[-1]["body"]["stream_options"] == {"include_usage": True}


def test_stream_with_usage(world):
    chunks = list(client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 10


def test_stream_arrives_chunk_by_chunk(world):
    """Chunks reach the client as the upstream sends them, not at the end."""
    url = world["url"] + "/v1/chat/completions"
    t0 = time.monotonic()
    arrivals = []
    with requests.post(url, headers={"Authorization": f"Bearer {world['key']}"}, stream=True,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                             "stream": True, "fake_chunks": 4, "fake_delay": 0.3}) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                arrivals.append(time.monotonic() - t0)
    # the first content arrived well before the last (0.3 s apart upstream)
    assert len(arrivals) >= 4 and arrivals[-1] - arrivals[0] > 0.5


def test_tools_and_multimodal_pass_through(world, fake):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    content = [{"type": "text", "text": "what is this"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
               {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    r = client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], tools=tools)
    assert r.choices[0].message.tool_calls[0].function.name == "weather"
    body = fake.requests[-1]["body"]
    assert body["tools"] == tools and body["messages"][0]["content"] == content


def test_streaming_tool_calls(world):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    chunks = list(client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools, stream=True))
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                   for tc in (c.choices[0].delta.tool_calls or []))
    assert args == '{"city": "Paris"}'


def test_model_mapping(world, fake):
    r = client(world).chat.completions.create(model="public-name",
                                              messages=[{"role": "user", "content": "hi"}])
    assert fake.requests[-1]["body"]["model"] == MODEL
    assert r.model == "public-name"


def test_embeddings_float_and_base64(world):
    c = client(world)
    r = c.embeddings.create(model="text-embedding-3-small", input=["a", "b"], encoding_format="float")
    assert len(r.data) == 2 and len(r.data[0].embedding) == 8
    # the SDK asks for base64 by default and decodes it
    r2 = c.embeddings.create(model="text-embedding-3-small", input="a")
    assert r2.data[0].embedding == pytest.approx(r.data[0].embedding, rel=1e-6)
    raw = requests.post(world["url"] + "/v1/embeddings",
                        headers={"Authorization": f"Bearer {world['key']}"},
                        json={"model": "text-embedding-3-small", "input": "a",
                              "encoding_format": "base64"}).json()
    vec = struct.unpack("<8f", base64.b64decode(raw["data"][0]["embedding"]))
    assert vec[0] == pytest.approx(0.1)


def test_models_lists_only_group_models(world):
    ids = sorted(m.id for m in client(world).models.list())
    assert ids == sorted([MODEL, "text-embedding-3-small", "public-name"])
    assert client(world).models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions",
                                  "/v1/chat/completions/", "/chat/completions/",
                                  "//v1/chat/completions"])
def test_route_variants(world, path):
    r = requests.post(world["url"] + path, headers={"Authorization": f"Bearer {world['key']}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("where", ["bearer", "x-api-key", "x-goog-api-key", "query", "mj"])
def test_key_sources(world, where):
    key = world["key"]
    headers, params = {}, {}
    if where == "bearer":
        headers["Authorization"] = f"Bearer {key}"
    elif where == "query":
        params["key"] = key
    elif where == "mj":
        headers["mj-api-secret"] = key
    else:
        headers[where] = key
    r = requests.get(world["url"] + "/v1/models", headers=headers, params=params)
    assert r.status_code == 200, r.text


def test_request_id_header_and_usage_record(world, admin):
    r = requests.post(world["url"] + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {world['key']}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    rid = r.headers["X-Request-Id"]
    assert rid.startswith("req_")
    for _ in range(40):
        items = world["api"].get("/api/log/self?size=50")["data"]["items"]
        rec = next((i for i in items if i["request_id"] == rid), None)
        if rec:
            break
        time.sleep(0.1)
    assert rec is not None
    assert rec["prompt_tokens"] == 10 and rec["completion_tokens"] == 3
    assert rec["model"] == MODEL and rec["status"] == 200 and rec["stream"] is False
    assert rec["client_ip"] == "127.0.0.1" and rec["token_name"] == "main"
    # 10*0.15 + 3*0.6 = 3.3e-6 USD = 1.65 units -> 2
    assert rec["quota"] == 2
    assert rec["duration_ms"] >= 0 and rec["ttfb_ms"] >= 0


def test_legacy_billing_endpoints(world):
    h = {"Authorization": f"Bearer {world['key']}"}
    sub = requests.get(world["url"] + "/v1/dashboard/billing/subscription", headers=h).json()
    use = requests.get(world["url"] + "/v1/dashboard/billing/usage", headers=h).json()
    tok = world["api"].get(f"/api/token/{world['token']['id']}")["data"]
    assert sub["hard_limit_usd"] == pytest.approx((tok["remain_quota"] + tok["used_quota"]) / 500_000)
    assert use["total_usage"] == pytest.approx(tok["used_quota"] / 500_000 * 100)


def test_channel_can_opt_out_of_stream_usage(relay, admin, fake, world):
    admin.create_channel(fake.url, ["no-stream-opts"], options={"stream_usage": False})
    admin.set_price("no-stream-opts", input_price=1, output_price=1)
    chunks = list(client(world).chat.completions.create(
        model="no-stream-opts", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "stream_options" not in fake.requests[-1]["body"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # billed all the same, from a count of what was sent and streamed
    def billed():
        items = world["api"].get("/api/log/self?model=no-stream-opts")["data"]["items"]
        assert items and items[0]["estimated"] is True and items[0]["quota"] > 0
        assert items[0]["completion_tokens"] > 0 and items[0]["prompt_tokens"] > 0
    eventually(billed)


def test_special_token_text_is_just_text(world):
    r = client(world).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "end <|endoftext|> <|im_start|>"}])
    assert r.choices[0].message.content
