"""GET /v1/models in the caller's family, parsed (and paged) by the three
official SDKs; and vendor endpoints this relay does not serve, which get a
404 in the caller's family saying so, while wrong paths keep their hint."""
from __future__ import annotations

import socket

import anthropic
import openai
import pytest
import requests
from google import genai
from google.genai import errors as gerrors
from google.genai import types

from tests.helpers import recv_all
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

MODELS = ["claude-list-a", "embed-list-b", "gem-list-c", "gpt-list-d", "gpt-list-e",
          "qwen2.5:7b"]


@pytest.fixture(scope="module")
def tenant(relay, admin):
    # Listing makes no upstream call: the base URL is never contacted.
    admin.create_channel("http://127.0.0.1:9", MODELS[:3], name="list-1")
    admin.create_channel("http://127.0.0.1:9", MODELS[2:], name="list-2", type="anthropic")
    admin.create_channel("http://127.0.0.1:9", ["other-group-model"], groups=["vip"],
                         name="list-vip")
    return Tenant(admin, relay.url)


def oai(relay, key):
    return openai.OpenAI(api_key=key, base_url=relay.url + "/v1", max_retries=0)


def claude(relay, key, old_style=False):
    if old_style:  # what anthropic 0.x sends: x-api-key and the 2023 version header
        return anthropic.Anthropic(base_url=relay.url, max_retries=0, api_key=None,
                                   default_headers={"x-api-key": key,
                                                    "anthropic-version": "2023-06-01"})
    return anthropic.Anthropic(api_key=key, base_url=relay.url, max_retries=0)


def gem(relay, key, version=None):
    opts = {"base_url": relay.url}
    if version:
        opts["api_version"] = version
    return genai.Client(api_key=key, http_options=types.HttpOptions(**opts))


# ---- the model list --------------------------------------------------------------
def test_openai_sdk_lists_and_retrieves(relay, tenant):
    c = oai(relay, tenant.key)
    listed = list(c.models.list())
    assert [m.id for m in listed] == MODELS
    assert {m.object for m in listed} == {"model"} and len({m.created for m in listed}) == 1
    assert c.models.retrieve("gpt-list-d").id == "gpt-list-d"
    assert c.models.retrieve("qwen2.5:7b").id == "qwen2.5:7b"      # Ollama-style names
    with pytest.raises(openai.NotFoundError) as ei:
        c.models.retrieve("other-group-model")
    assert ei.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("old_style", [False, True])
def test_anthropic_sdk_pages_through_the_list(relay, tenant, old_style):
    c = claude(relay, tenant.key, old_style)
    page = c.models.list(limit=2)
    assert [m.id for m in page.data] == MODELS[:2] and page.has_more
    assert page.first_id == MODELS[0] and page.last_id == MODELS[1]
    assert [m.id for m in c.models.list(limit=2)] == MODELS    # auto-paging follows after_id
    m = page.data[0]
    assert m.type == "model" and m.display_name == MODELS[0] and m.lifecycle == "active"
    assert m.created_at.year == 1970                            # "release date unknown"
    back = c.models.list(limit=2, before_id=MODELS[3])
    assert [m.id for m in back.data] == MODELS[1:3] and back.has_more
    last = c.models.list(limit=2, after_id=MODELS[3])
    assert [m.id for m in last.data] == MODELS[4:] and not last.has_more
    info = c.models.retrieve(MODELS[1])
    assert info.id == MODELS[1] and info.type == "model"
    with pytest.raises(anthropic.NotFoundError) as ei:
        c.models.retrieve("no-such-model")
    assert ei.value.body["error"]["type"] == "not_found_error"


def test_anthropic_bad_paging_is_its_400(relay, tenant):
    h = {"x-api-key": tenant.key, "anthropic-version": "2023-06-01"}
    for q in ("limit=0", "limit=1001", "limit=abc", "after_id=nope",
              f"after_id={MODELS[0]}&before_id={MODELS[3]}"):
        r = requests.get(f"{relay.url}/v1/models?{q}", headers=h)
        assert r.status_code == 400, (q, r.text)
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("version", [None, "v1beta", "v1"])
def test_genai_sdk_pages_through_the_list(relay, tenant, version):
    c = gem(relay, tenant.key, version)
    names = [m.name for m in c.models.list(config={"page_size": 2})]
    assert names == [f"models/{m}" for m in MODELS]
    pager = c.models.list(config={"page_size": 3})
    assert len(pager.page) == 3 and pager.config["page_token"]
    assert [m.name for m in pager.next_page()] == [f"models/{m}" for m in MODELS[3:]]
    assert c.models.get(model="qwen2.5:7b").name == "models/qwen2.5:7b"
    m = c.models.get(model="gem-list-c")
    assert m.name == "models/gem-list-c" and m.display_name == "gem-list-c"
    assert "generateContent" in m.supported_actions
    assert c.models.get(model="embed-list-b").supported_actions == ["embedContent",
                                                                    "batchEmbedContents"]
    with pytest.raises(gerrors.ClientError) as ei:
        c.models.get(model="other-group-model")
    assert ei.value.code == 404 and ei.value.status == "NOT_FOUND"


def test_gemini_shape_on_the_wire_and_bad_token(relay, tenant):
    r = requests.get(f"{relay.url}/v1beta/models?pageSize=4&key={tenant.key}")
    doc = r.json()
    assert [m["name"] for m in doc["models"]] == [f"models/{m}" for m in MODELS[:4]]
    r2 = requests.get(f"{relay.url}/v1beta/models", params={"pageToken": doc["nextPageToken"]},
                      headers={"x-goog-api-key": tenant.key})
    assert [m["name"] for m in r2.json()["models"]] == [f"models/{m}" for m in MODELS[4:]]
    assert "nextPageToken" not in r2.json()
    for q in ("pageToken=garbage", "pageSize=-1", "pageSize=x"):
        r = requests.get(f"{relay.url}/v1beta/models?{q}", headers={"x-goog-api-key": tenant.key})
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", q
    r = requests.get(f"{relay.url}/v1beta/models")
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"


def test_model_lock_filters_every_family(relay, admin, tenant):
    t = Tenant(admin, relay.url, model_limits_enabled=True,
               model_limits=["gpt-list-d", "claude-list-a"])
    assert [m.id for m in oai(relay, t.key).models.list()] == ["claude-list-a", "gpt-list-d"]
    assert [m.id for m in claude(relay, t.key).models.list()] == ["claude-list-a", "gpt-list-d"]
    g = gem(relay, t.key)  # held: the pager reads through it
    assert [m.name for m in g.models.list()] == ["models/claude-list-a", "models/gpt-list-d"]


# ---- endpoints this relay does not serve ------------------------------------------
@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/files"), ("POST", "/v1/files"), ("POST", "/v1/batches"),
    ("GET", "/v1/fine_tuning/jobs"), ("GET", "/v1/assistants"), ("POST", "/v1/vector_stores"),
    ("GET", "/v1/realtime"), ("GET", "/v1/audio/voices"), ("POST", "/v1/images/variations"),
    ("GET", "/v1/chat/completions/chatcmpl-123"), ("GET", "/v1/threads/t1/runs"),
    ("GET", "/files"), ("GET", "/v1/v1/batches/b1"), ("POST", "/v1/uploads"),
])
def test_openai_unsupported_endpoints(relay, tenant, method, path):
    r = requests.request(method, relay.url + path, json={},
                         headers={"Authorization": f"Bearer {tenant.key}"})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_endpoint" and err["type"] == "invalid_request_error"
    assert "is not supported by this relay" in err["message"]
    assert "/v1/chat/completions" in err["message"] and "request id" in err["message"]


def test_sdks_see_their_own_not_found(relay, tenant):
    with pytest.raises(openai.NotFoundError) as ei:
        oai(relay, tenant.key).files.list()
    assert "not supported by this relay" in ei.value.message
    with pytest.raises(openai.NotFoundError):
        oai(relay, tenant.key).batches.create(completion_window="24h",
                                             endpoint="/v1/chat/completions",
                                             input_file_id="file-1")
    c = claude(relay, tenant.key)
    with pytest.raises(anthropic.NotFoundError) as ei:
        c.messages.batches.list()
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "not_found_error"
    assert "not supported by this relay" in ei.value.body["error"]["message"]
    assert "POST /v1/messages" in ei.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as ei:
        c.beta.files.list()                                      # /v1/files, Anthropic's
    assert ei.value.body["error"]["type"] == "not_found_error"
    for version in ("v1beta", None):
        g = gem(relay, tenant.key, version)
        with pytest.raises(gerrors.ClientError) as ei:
            list(g.caches.list())
        assert ei.value.code == 404 and ei.value.status == "NOT_FOUND"
        assert "not supported by this relay" in ei.value.message
        with pytest.raises(gerrors.ClientError) as ei:
            list(g.files.list())
        assert ei.value.code == 404 and "not supported" in ei.value.message


def test_unsupported_vendor_paths_by_family(relay, tenant):
    ant = {"x-api-key": tenant.key, "anthropic-version": "2023-06-01"}
    r = requests.post(relay.url + "/v1/messages/batches", json={}, headers=ant)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = requests.post(relay.url + "/v1/complete", json={}, headers=ant)
    assert r.status_code == 404 and "not supported" in r.json()["error"]["message"]
    r = requests.get(relay.url + "/v1beta/cachedContents/c1", headers={"x-goog-api-key": "k"})
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    assert "not supported by this relay" in r.json()["error"]["message"]
    r = requests.post(relay.url + "/upload/v1beta/files", data=b"x")
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    r = requests.get(relay.url + "/v1/tunedModels?key=k")
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


@pytest.mark.parametrize("path,family,fragment", [
    ("/api/v1/chat/completions", "openai", "the prefix '/api/v1' is not served here"),
    ("/chat/completion", "openai", "/v1/chat/completions"),
    ("/v1/completion", "openai", "/v1/completions"),
    ("/v2/moderations", "openai", "the prefix '/v2' is not served here"),
    ("/openai/v1/rerank", "openai", "the prefix '/openai/v1' is not served here"),
    ("/api/v1/messages", "anthropic", "the SDK adds /v1/messages"),
    ("/gemini/v1beta/models/x:generateContent", "gemini", "the SDK adds /v1beta"),
])
def test_wrong_paths_keep_the_base_url_hint(relay, tenant, path, family, fragment):
    h = {"Authorization": f"Bearer {tenant.key}"}
    if family == "anthropic":
        h["anthropic-version"] = "2023-06-01"
    elif family == "gemini":
        h = {"x-goog-api-key": tenant.key}
    r = requests.post(relay.url + path, json={}, headers=h)
    assert r.status_code == 404, r.text
    doc = r.json()
    message = doc["error"]["message"]
    assert fragment in message and "not supported by this relay" not in message, message
    if family == "anthropic":
        assert doc["type"] == "error"
    elif family == "gemini":
        assert doc["error"]["status"] == "NOT_FOUND"
    else:
        assert doc["error"]["code"] == "unknown_path" and relay.url in message


def test_a_404_keeps_the_connection_usable(relay, tenant):
    """SDKs reuse connections: after a 404 (body and all) the same connection
    must answer the next request, not be closed under the client."""
    body = b'{"purpose": "batch"}'
    req = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tenant.key}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    nxt = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tenant.key}\r\n" \
          f"Connection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        s.sendall(req + body + nxt)
        reply = recv_all(s)
    assert reply.startswith(b"HTTP/1.1 404"), reply[:200]
    assert b"HTTP/1.1 200" in reply and b"gpt-list-d" in reply


def test_deleting_a_model_is_not_served(relay, tenant):
    with pytest.raises(openai.NotFoundError) as ei:
        oai(relay, tenant.key).models.delete("ft:gpt-list-d:me")
    assert ei.value.body["code"] == "unsupported_endpoint"
    assert [m.id for m in oai(relay, tenant.key).models.list()] == MODELS
