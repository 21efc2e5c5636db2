"""Legacy completions, moderations and rerank end to end: the official openai
SDK (requests for rerank, which no OpenAI SDK speaks) -> relay -> a fake
upstream built from the vendors' wire formats (tests/fakes/text_upstream.py);
every charge checked to the unit against the key and the account."""
from __future__ import annotations

import json

import openai
import pytest
import requests

from relay.money import tokenizer
from tests.fakes.openai_upstream import DEFAULT_TEXT, _split
from tests.fakes.text_upstream import FakeText
from tests.helpers import eventually
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

INSTRUCT = "gpt-3.5-turbo-instruct"
MOD = "omni-moderation-latest"
RERANK = "jina-reranker-v2-base-multilingual"
DOCS = ["Paris is the capital of France.", "Berlin is in Germany.",
        "The capital of France has the Eiffel tower.", "Bananas are yellow."]


@pytest.fixture(scope="module")
def fake():
    f = FakeText().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, [INSTRUCT, "instruct-alias", MOD, "text-moderation-stable",
                                    "mod-per-call", RERANK, "rerank-alias"], name="text",
                         model_mapping={"instruct-alias": INSTRUCT, "rerank-alias": RERANK,
                                        "mod-per-call": MOD})
    admin.create_channel(fake.mode_url("nousage"), ["instruct-nousage", "rerank-nousage"],
                         name="nousage", model_mapping={"instruct-nousage": INSTRUCT})
    admin.create_channel(fake.mode_url("reset"), ["instruct-reset"], name="reset")
    admin.create_channel(fake.mode_url("slow"), ["instruct-slow"], name="slow")
    admin.create_channel(fake.mode_url("cohere"), ["rerank-english-v3.0", "rerank-units"],
                         name="cohere")
    admin.create_channel(fake.url, ["azure-instruct", "azure-only-mod", "azure-only-rerank"],
                         type="azure", name="azure", key="az-key",
                         model_mapping={"azure-instruct": "instruct-deploy"})
    # USD per million tokens; 500,000 units per USD: units = (100 x in + 200 x out) / 2.
    for m in (INSTRUCT, "instruct-alias", "instruct-nousage", "instruct-reset", "instruct-slow",
              "azure-instruct"):
        admin.set_price(m, input_price="100", output_price="200")
    admin.set_price(MOD, input_price="0", output_price="0")            # free, as at OpenAI
    admin.set_price("text-moderation-stable", input_price="50")
    admin.set_price("mod-per-call", call_price="0.002")
    for m in (RERANK, "rerank-alias", "rerank-nousage", "rerank-english-v3.0"):
        admin.set_price(m, input_price="20")
    admin.set_price("rerank-units", call_price="0.002")                # per search unit
    for m in ("azure-only-mod", "azure-only-rerank"):
        admin.set_price(m, input_price="1")
    return relay


def client(relay, key):
    return openai.OpenAI(api_key=key, base_url=relay.url + "/v1", max_retries=0)


def sent(fake, path):
    return [r for r in fake.requests if r["path"].endswith(path)][-1]


def units(prompt, completion=0, input_price=100, output_price=200):
    """Quota units at rate 1, rounded half-up (pricing.to_units)."""
    return int((input_price * prompt + output_price * completion) / 2 + 0.5)


# ---- legacy completions ----------------------------------------------------------
def test_completion_plain_billed_from_usage(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).completions.create(model=INSTRUCT, prompt="Say hello",
                                                  max_tokens=20, temperature=0.1, suffix="!")
    assert res.object == "text_completion" and res.choices[0].text == DEFAULT_TEXT
    assert res.usage.prompt_tokens == 4 and res.usage.completion_tokens == 3
    assert t.spent_since(before) == units(4, 3) == 500
    body = sent(fake, "/completions")["body"]
    assert body["prompt"] == "Say hello" and body["suffix"] == "!" and body["max_tokens"] == 20
    assert "stream_options" not in body
    rec = t.logs(1, model=INSTRUCT)[0]
    assert rec["endpoint"] == "completions" and rec["quota"] == 500 and not rec["estimated"]
    assert rec["prompt_tokens"] == 4 and rec["completion_tokens"] == 3


def test_completion_streamed_usage_asked_for_but_not_shown(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    chunks = list(client(setup, t.key).completions.create(model=INSTRUCT, prompt="hi",
                                                          stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == DEFAULT_TEXT
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    assert sent(fake, "/completions")["body"]["stream_options"] == {"include_usage": True}
    assert t.spent_since(before) == 500
    rec = t.logs(1, model=INSTRUCT)[0]
    assert rec["stream"] is True and rec["completion_tokens"] == 3 and not rec["estimated"]


def test_completion_streamed_with_usage_and_mapping(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    chunks = list(client(setup, t.key).completions.create(
        model="instruct-alias", prompt=["one", "two"], n=2, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 8
    assert chunks[-1].usage.completion_tokens == 12          # 3 chunks x 2 prompts x n=2
    assert {c.model for c in chunks} == {"instruct-alias"}
    assert {ch.index for c in chunks for ch in c.choices} == {0, 1, 2, 3}
    assert sent(fake, "/completions")["body"]["model"] == INSTRUCT
    assert t.spent_since(before) == units(8, 12)


def test_completion_token_prompts_and_echo(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).completions.create(model=INSTRUCT, prompt=[[1, 2, 3], [4, 5]],
                                                  max_tokens=2, extra_body={"fake_chunks": 5})
    # max_tokens 2 caps the fake at 2 chunks: finish_reason "length", as OpenAI.
    assert [c.finish_reason for c in res.choices] == ["length", "length"]
    assert sent(fake, "/completions")["body"]["prompt"] == [[1, 2, 3], [4, 5]]
    assert t.spent_since(before) == units(8, 4)


def test_completion_without_upstream_usage_is_estimated(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    prompt = "Write a haiku about relays"
    res = client(setup, t.key).completions.create(model="instruct-nousage", prompt=prompt)
    assert res.usage is None and res.model == "instruct-nousage"
    p = tokenizer.count_text(prompt, "instruct-nousage")
    c = tokenizer.count_text(DEFAULT_TEXT, "instruct-nousage")
    assert t.spent_since(before) == units(p, c)
    rec = t.logs(1, model="instruct-nousage")[0]
    assert rec["estimated"] and rec["prompt_tokens"] == p and rec["completion_tokens"] == c


def test_completion_stream_cut_by_upstream_bills_what_arrived(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/completions", stream=True,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "instruct-reset", "prompt": "go", "stream": True})
    body = r.content.decode()
    events = [json.loads(line[6:]) for line in body.splitlines()
              if line.startswith("data: {")]
    got = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    arrived = "".join(_split(DEFAULT_TEXT, 3)[:2])
    assert got == arrived and "error" in events[-1]
    p = tokenizer.count_text("go", "instruct-reset")
    c = tokenizer.count_text(arrived, "instruct-reset")
    assert t.spent_since(before) == units(p, c)
    rec = t.logs(1, model="instruct-reset")[0]
    assert rec["estimated"] and rec["status"] >= 500 and rec["completion_tokens"] == c


def test_completion_client_leaving_mid_stream_pays_for_what_it_got(setup, admin, fake):
    """The client reads one chunk and hangs up: the upstream transfer is
    cut and the call is billed, estimated, for what was streamed."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/completions", stream=True,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "instruct-slow", "prompt": "go", "stream": True,
                            "fake_chunks": 8})
    first = next(r.iter_lines())
    assert first.startswith(b"data: {")
    r.close()
    rec = t.logs(1, model="instruct-slow")[0]
    assert rec["status"] == 499 and rec["estimated"]
    assert 1 <= rec["completion_tokens"] < tokenizer.count_text(DEFAULT_TEXT, "instruct-slow")
    p = tokenizer.count_text("go", "instruct-slow")
    assert rec["prompt_tokens"] == p
    assert t.spent_since(before) == rec["quota"] == units(p, rec["completion_tokens"])
    up = sent(fake, "/completions")
    assert up["mode"] == "slow"

    def upstream_cut():
        assert up["aborted"]
    eventually(upstream_cut)


def test_completion_reserves_max_tokens(setup, admin, fake):
    """2,000 output tokens x 200 USD/M = 200,000 units reserved; the key has 100,000."""
    t = Tenant(admin, setup.url, key_quota=100_000)
    before = t.balances()
    n = len(fake.requests)
    with pytest.raises(openai.PermissionDeniedError) as ei:
        client(setup, t.key).completions.create(model=INSTRUCT, prompt="x", max_tokens=1000,
                                                n=2)
    assert ei.value.body["code"] == "token_quota_exhausted"
    assert len(fake.requests) == n and t.spent_since(before) == 0


@pytest.mark.parametrize("body,param,code", [
    ({"model": INSTRUCT}, "prompt", "missing_prompt"),
    ({"model": INSTRUCT, "prompt": {"text": "x"}}, "prompt", "invalid_value"),
    ({"model": INSTRUCT, "prompt": []}, "prompt", "invalid_value"),
    ({"model": INSTRUCT, "prompt": ["a", 1]}, "prompt", "invalid_value"),
    ({"model": INSTRUCT, "prompt": "x", "n": 0}, "n", "invalid_value"),
    ({"model": INSTRUCT, "prompt": "x", "max_tokens": -1}, "max_tokens", "invalid_value"),
    ({"model": INSTRUCT, "prompt": "x", "n": 3, "best_of": 2}, "best_of", "invalid_value"),
    ({"prompt": "x"}, "model", "missing_model"),
])
def test_completion_bad_input_is_400_and_free(setup, admin, body, param, code):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert "request id" in err["message"]
    assert t.spent_since(before) == 0


def test_completion_errors(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    c = client(setup, t.key)
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model=INSTRUCT, prompt=None)
    assert ei.value.body["param"] == "prompt"
    r = requests.post(setup.url + "/v1/completions", data=b"{nope",
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.APIStatusError) as ei:
        c.completions.create(model=INSTRUCT, prompt="CONTEXT_TOO_LONG")
    assert ei.value.status_code == 413
    assert ei.value.body["code"] == "context_length_exceeded"
    assert t.spent_since(before) == 0


def test_completion_through_azure_deployment(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).completions.create(model="azure-instruct", prompt="hello")
    assert res.choices[0].text == DEFAULT_TEXT and res.model == "azure-instruct"
    up = sent(fake, "/completions")
    assert up["path"] == "/openai/deployments/instruct-deploy/completions"
    assert up["query"] == "api-version=2024-10-21" and up["headers"]["Api-Key"] == "az-key"
    assert t.spent_since(before) == 500


# ---- moderations ---------------------------------------------------------------
def test_moderation_free_when_priced_zero_and_default_model(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).moderations.create(input="I will kill the process")
    assert res.model == MOD and len(res.results) == 1
    r0 = res.results[0]
    assert r0.flagged and r0.categories.violence and r0.category_scores.violence > 0.5
    assert r0.categories.self_harm is False
    assert sent(fake, "/moderations")["body"] == {"input": "I will kill the process",
                                                   "model": MOD}
    assert t.spent_since(before) == 0
    rec = t.logs(1, model=MOD)[0]
    assert rec["endpoint"] == "moderations" and rec["quota"] == 0 and rec["status"] == 200
    assert rec["prompt_tokens"] == tokenizer.count_text("I will kill the process", MOD)


def test_moderation_billed_per_token_as_priced(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    texts = ["a peaceful sentence", "another calm line of text"]
    res = client(setup, t.key).moderations.create(model="text-moderation-stable", input=texts)
    assert [r.flagged for r in res.results] == [False, False]
    n = tokenizer.count_text("\n".join(texts), "text-moderation-stable")
    assert t.spent_since(before) == units(n, input_price=50)
    rec = t.logs(1, model="text-moderation-stable")[0]
    assert rec["prompt_tokens"] == n and not rec["estimated"]


def test_moderation_multimodal_per_call(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    inp = [{"type": "text", "text": "a picture"},
           {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}]
    res = client(setup, t.key).moderations.create(model="mod-per-call", input=inp)
    assert res.model == "mod-per-call"                      # the mapped name is ours
    assert res.results[0].category_applied_input_types.violence == ["text", "image"]
    assert sent(fake, "/moderations")["body"]["model"] == MOD
    assert t.spent_since(before) == 1000                    # 0.002 USD per call


@pytest.mark.parametrize("body", [{"model": MOD}, {"input": []}, {"input": 5},
                                  {"input": [{"type": "audio", "audio": "x"}]},
                                  {"input": [{"type": "image_url", "image_url": "x"}]}])
def test_moderation_bad_input_is_400_and_free(setup, admin, body):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/moderations", json=body,
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input"
    assert t.spent_since(before) == 0


def test_moderation_and_rerank_not_routed_to_azure(setup, admin):
    t = Tenant(admin, setup.url)
    h = {"Authorization": f"Bearer {t.key}"}
    r = requests.post(setup.url + "/v1/moderations", headers=h,
                      json={"model": "azure-only-mod", "input": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_available"
    r = requests.post(setup.url + "/v1/rerank", headers=h,
                      json={"model": "azure-only-rerank", "query": "q", "documents": ["d"]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_available"


# ---- rerank --------------------------------------------------------------------
def rerank(relay, key, **body):
    return requests.post(relay.url + "/v1/rerank", json=body,
                         headers={"Authorization": f"Bearer {key}"})


def test_rerank_jina_shape_billed_from_upstream_usage(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = rerank(setup, t.key, model=RERANK, query="capital of France", documents=DOCS, top_n=2,
               return_documents=True)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [x["index"] for x in doc["results"]] == [0, 2]
    assert doc["results"][0]["relevance_score"] > doc["results"][1]["relevance_score"]
    assert doc["results"][0]["document"] == {"text": DOCS[0]}
    tokens = 3 + sum(len(d.split()) for d in DOCS)
    assert doc["usage"] == {"total_tokens": tokens, "prompt_tokens": tokens}
    assert sent(fake, "/rerank")["body"]["top_n"] == 2
    assert t.spent_since(before) == units(tokens, input_price=20)
    rec = t.logs(1, model=RERANK)[0]
    assert rec["endpoint"] == "rerank" and rec["prompt_tokens"] == tokens


def test_rerank_mapping_and_no_documents(setup, admin, fake):
    t = Tenant(admin, setup.url)
    r = rerank(setup, t.key, model="rerank-alias", query="yellow fruit", documents=DOCS,
               return_documents=False)
    doc = r.json()
    assert doc["model"] == "rerank-alias" and len(doc["results"]) == 4
    assert doc["results"][0]["index"] == 3 and all("document" not in x for x in doc["results"])
    assert sent(fake, "/rerank")["body"]["model"] == RERANK


def test_rerank_cohere_shape_gets_usage_and_documents(setup, admin):
    """Cohere reports search units and no tokens: the answer still carries
    usage (our count of query and documents), billed per token here."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    docs = [{"text": "Paris is the capital of France."}, "Bananas are yellow."]
    r = rerank(setup, t.key, model="rerank-english-v3.0", query="capital of France",
               documents=docs, return_documents=True)
    doc = r.json()
    assert doc["meta"]["billed_units"] == {"search_units": 1}
    assert doc["results"][0] == {"index": 0, "relevance_score": doc["results"][0][
        "relevance_score"], "document": {"text": "Paris is the capital of France."}}
    ours = (tokenizer.count_text("capital of France", "rerank-english-v3.0")
            + tokenizer.count_text("Paris is the capital of France.", "rerank-english-v3.0")
            + tokenizer.count_text("Bananas are yellow.", "rerank-english-v3.0"))
    assert doc["usage"] == {"prompt_tokens": ours, "total_tokens": ours}
    assert t.spent_since(before) == units(ours, input_price=20)
    assert not t.logs(1, model="rerank-english-v3.0")[0]["estimated"]


def test_rerank_per_search_unit(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = rerank(setup, t.key, model="rerank-units", query="q", documents=["a", "b"])
    assert r.status_code == 200 and all("document" not in x for x in r.json()["results"])
    assert t.spent_since(before) == 1000                 # 1 search unit x 0.002 USD
    assert t.logs(1, model="rerank-units")[0]["units"] == 1


def test_rerank_without_upstream_usage_is_estimated(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = rerank(setup, t.key, model="rerank-nousage", query="q", documents=["one two"])
    ours = tokenizer.count_text("q", "rerank-nousage") + tokenizer.count_text(
        "one two", "rerank-nousage")
    assert r.json()["usage"] == {"prompt_tokens": ours, "total_tokens": ours}
    assert t.spent_since(before) == units(ours, input_price=20)
    assert t.logs(1, model="rerank-nousage")[0]["estimated"]


@pytest.mark.parametrize("body,param", [
    ({"model": RERANK, "documents": ["a"]}, "query"),
    ({"model": RERANK, "query": "  ", "documents": ["a"]}, "query"),
    ({"model": RERANK, "query": "q"}, "documents"),
    ({"model": RERANK, "query": "q", "documents": []}, "documents"),
    ({"model": RERANK, "query": "q", "documents": [1]}, "documents"),
    ({"model": RERANK, "query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"model": RERANK, "query": "q", "documents": ["a"], "return_documents": "yes"},
     "return_documents"),
    ({"query": "q", "documents": ["a"]}, "model"),
])
def test_rerank_bad_input_is_400_and_free(setup, admin, body, param):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = rerank(setup, t.key, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert t.spent_since(before) == 0
