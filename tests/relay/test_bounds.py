"""Issue 30, case 4: the reservation is an upper bound of what a call can
cost (relay/bounds.py).  `n`, Gemini's candidateCount and the model's own
output limit (when max_tokens is left out) multiply into it; a call whose
worst case is over the balance is refused up front with 403 in its
family's error body, before the upstream sees it; `unpaid` stays 0.  The
money path runs on three relays sharing one database as well."""
from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import requests

from models.records import Price
from relay import bounds
from relay.adaptors.base import Call
from tests.helpers import Api, RelayProcess, eventually
from tests.tenant import Tenant

MODEL = "bound-model"   # not in the catalogue: only max_tokens and n bound it
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def setup(relay, admin, fakes):
    admin.create_channel(fakes["openai"].url, [MODEL, "o3"], name="openai")
    admin.create_channel(fakes["anthropic"].url, ["claude-bound"], type="anthropic")
    admin.create_channel(fakes["gemini"].url, ["gemini-bound"], type="gemini")
    # $1/M in, $8/M out: 0.5 units an input token, 4 an output token.
    for m in (MODEL, "o3", "claude-bound", "gemini-bound"):
        admin.set_price(m, input_price="1", output_price="8")
    return relay


def chat(relay, key, **body):
    return requests.post(relay.url + "/v1/chat/completions", timeout=60,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": MODEL, "messages": HI, **body})


def seen(fake) -> int:
    return len([r for r in fake.requests if r["path"].endswith("/chat/completions")])


# ---- the case: n=50, max_tokens=4000 on 30,000 units ------------------------
def test_n_multiplies_the_reservation_and_a_call_over_the_balance_is_refused(setup, admin,
                                                                              fakes):
    t = Tenant(admin, setup.url, key_quota=30_000)
    before, sent = t.balances(), seen(fakes["openai"])
    r = chat(setup, t.key, n=50, max_tokens=4000)
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["code"] == "token_quota_exhausted" and err["type"] == "insufficient_quota"
    assert "could cost up to 800" in err["message"]   # 50 x 4000 x 4 units and the input
    assert seen(fakes["openai"]) == sent               # nothing reached the upstream
    assert t.balances() == before
    # one choice of 4000 fits (16,000 units and the input)
    r = chat(setup, t.key, max_tokens=4000)
    assert r.status_code == 200, r.text


def test_n_answered_is_charged_in_full_and_nothing_is_unpaid(setup, admin):
    t = Tenant(admin, setup.url, key_quota=900_000)
    before = t.balances()
    r = chat(setup, t.key, n=50, max_tokens=4000, fake_chunks=4000)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 50
    rec = t.logs(1, model=MODEL)[0]
    # 10 input tokens at 0.5, 200,000 output tokens at 4 units
    assert rec["completion_tokens"] == 200_000 and rec["cost"] == 800_005
    assert rec["quota"] == rec["cost"] and rec["unpaid"] == 0
    assert t.spent_since(before) == 800_005


@pytest.mark.parametrize("n", [0, 129, 2.5, "3", True])
def test_n_outside_openais_bounds_is_a_400_naming_it(setup, admin, n):
    t = Tenant(admin, setup.url)
    r = chat(setup, t.key, n=n)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "n"


def test_n_at_its_bound_is_taken(setup, admin):
    t = Tenant(admin, setup.url)
    r = chat(setup, t.key, n=128, max_tokens=5)
    assert r.status_code == 200 and len(r.json()["choices"]) == 128


# ---- without max_tokens: the model's own output limit --------------------------------
def test_a_reasoning_model_without_max_tokens_reserves_its_output_limit(setup, admin):
    """o3 writes up to 100,000 tokens (400,000 units here): a key with
    300,000 is refused; one with 500,000 is served and charged what the
    upstream reports, 60,000 tokens of it reasoning, to the unit."""
    t = Tenant(admin, setup.url, key_quota=300_000)
    r = chat(setup, t.key, model="o3")
    assert r.status_code == 403 and "could cost up to 400" in r.json()["error"]["message"]
    t = Tenant(admin, setup.url, key_quota=500_000)
    r = chat(setup, t.key, model="o3", fake_usage_doc={
        "prompt_tokens": 10, "completion_tokens": 60_000, "total_tokens": 60_010,
        "completion_tokens_details": {"reasoning_tokens": 59_990}})
    assert r.status_code == 200, r.text
    rec = t.logs(1, model="o3")[0]
    assert rec["cost"] == 240_005 and rec["quota"] == 240_005 and rec["unpaid"] == 0
    assert rec["reasoning_tokens"] == 59_990


# ---- every family refuses in its own body ---------------------------------------------
def test_anthropic_refusal_is_403_in_anthropics_body(setup, admin, fakes):
    t = Tenant(admin, setup.url, key_quota=10_000)
    r = requests.post(setup.url + "/v1/messages", timeout=60,
                      headers={"x-api-key": t.key, "anthropic-version": "2023-06-01"},
                      json={"model": "claude-bound", "max_tokens": 64_000, "messages": HI})
    assert r.status_code == 403
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "permission_error"
    assert "could cost up to" in body["error"]["message"]


def test_gemini_candidate_count_multiplies_and_is_bounded(setup, admin):
    t = Tenant(admin, setup.url, key_quota=100_000)
    url = setup.url + "/v1beta/models/gemini-bound:generateContent"
    contents = [{"role": "user", "parts": [{"text": "hi"}]}]
    # 8 x 4000 x 4 = 128,000 units: over the key's 100,000
    r = requests.post(url, headers={"x-goog-api-key": t.key}, timeout=60, json={
        "contents": contents, "generationConfig": {"candidateCount": 8, "maxOutputTokens": 4000}})
    assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
    # the snake_case spelling, which Gemini reads as well, counts the same
    r = requests.post(url, headers={"x-goog-api-key": t.key}, timeout=60, json={
        "contents": contents,
        "generation_config": {"candidate_count": 8, "max_output_tokens": 4000}})
    assert r.status_code == 403
    r = requests.post(url, headers={"x-goog-api-key": t.key}, timeout=60, json={
        "contents": contents, "generationConfig": {"candidateCount": 9}})
    assert r.status_code == 400 and "candidate_count" in r.json()["error"]["message"]
    r = requests.post(url, headers={"x-goog-api-key": t.key}, timeout=60, json={
        "contents": contents, "generationConfig": {"candidateCount": 2, "maxOutputTokens": 4000}})
    assert r.status_code == 200, r.text


# ---- three relays on one database ------------------------------------------------------
async def _fire(urls, key, n, body):
    async def one(url):
        host, port = url.split("//")[1].split(":")
        payload = json.dumps(body).encode()
        r, w = await asyncio.open_connection(host, int(port))
        w.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 f"{key}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}"
                 "\r\nConnection: close\r\n\r\n").encode() + payload)
        await w.drain()
        data = await r.read()
        w.close()
        return int(data.split(b" ", 2)[1])
    return await asyncio.gather(*[one(urls[i % len(urls)]) for i in range(n)])


@pytest.mark.slow
def test_three_relays_concurrent_n_calls_never_overdraw(setup, fakes, mongo_url, tmp_path):
    """Calls asking n=10, max_tokens=1000 (40,000 units of bound each) at
    once on three relays sharing a database, against a key of 200,000: no
    call is answered that could not be paid, every answered call is
    charged in full (unpaid 0), the key never goes below zero, and the
    records add up to what it spent."""
    relays = []
    try:
        a = RelayProcess(mongo_url, str(tmp_path / "a")).start()
        relays.append(a)
        for name in ("b", "c"):
            relays.append(RelayProcess(mongo_url, str(tmp_path / name), db_name=a.db_name).start())
        admin = Api.login(a.url)
        admin.create_channel(fakes["openai"].url, [MODEL])
        admin.set_price(MODEL, input_price="1", output_price="8")
        t = Tenant(admin, a.url, key_quota=200_000)
        # Each learns of the channel within invalidation_poll; a relay that
        # leased the whole small balance lets it go when idle (idle_release).
        for r in relays:
            eventually(lambda r=r: _served(r, t.key), timeout=40, interval=0.5)
        body = {"model": MODEL, "messages": HI, "n": 10, "max_tokens": 1000,
                "fake_chunks": 1000, "fake_delay": 0.05}
        statuses = asyncio.run(_fire([r.url for r in relays], t.key, 30, body))
        assert set(statuses) <= {200, 403}, statuses
        assert statuses.count(200) >= 1
        time.sleep(1.5)   # every relay flushes its records
        _, _, remain, used = t.balances()
        assert remain >= 0
        logs = t.api.get(f"/api/log/self?token_id={t.token_id}&size=200")["data"]
        items = logs["items"]
        assert all(i["unpaid"] == 0 and i["quota"] == i["cost"] for i in items)
        assert logs["totals"]["quota"] == used
        # each answered call made 10 choices of 1000 tokens
        assert sum(1 for i in items if i["completion_tokens"] == 10_000) == statuses.count(200)
    finally:
        for r in relays:
            r.stop()


def _served(relay, key):
    r = chat(relay, key, max_tokens=1)
    assert r.status_code == 200, r.text


# ---- the bound itself, as pure arithmetic ----------------------------------------------
class _Channel:
    type = "openai"
    options: dict = {}

    def upstream_model(self, model):
        return model


def _call(body, raw=None):
    raw = json.dumps(body).encode() if raw is None else raw
    return Call("r", "chat", "openai", body["model"], body, raw=raw, native_body=body)


def test_the_bound_prices_every_part_at_its_dearest():
    p = Price("m", "", input_price=Decimal(1), output_price=Decimal(2),
              cache_write_price=Decimal("1.25"), audio_output_price=Decimal(20))
    worst = bounds.dearest(p, 10)
    assert worst.input_price == Decimal("1.25") and worst.output_price == Decimal(20)
    body = {"model": "unknown-x", "messages": HI, "max_tokens": 100, "n": 3}
    call = _call(body)
    got = bounds.worst_case(call, _Channel(), p, Decimal(1), False, 4096)
    # (bytes x 1.25 + 300 x 20) / 1e6 USD x 500,000
    assert got == round((len(call.raw) * 1.25 + 300 * 20) / 2)


def test_references_and_tools_add_to_the_input_bound():
    body = {"model": "unknown-x", "max_tokens": 1, "tools": [{"type": "function"}],
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.test/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    call = _call(body)
    got = bounds.prompt_bound(call, _Channel())
    assert got == len(call.raw) + bounds.REFERENCE_TOKENS + bounds.TOOLS_TOKENS


@pytest.mark.parametrize("face", ["anthropic", "gemini", "responses"])
def test_a_face_that_defers_its_conversion_is_bounded_alike(face):
    """The Messages, Gemini and Responses faces convert to the canonical
    body only when something reads it; the bound read off their native body
    (references, output asked, candidates) equals the one read off the
    converted body, and is made without converting."""
    from relay.faces import anthropic as aface
    from relay.faces import gemini as gface
    from relay.faces import responses as rface
    if face == "responses":
        doc = {"model": "unknown-x", "max_output_tokens": 700, "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "https://x.test/a.png"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                {"type": "input_text", "text": "what"}]}]}
        call = rface.parse_create("r", json.dumps(doc).encode())
    elif face == "anthropic":
        doc = {"model": "unknown-x", "max_tokens": 700, "tools": [
            {"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AAAA"}},
                {"type": "text", "text": "what"}]}]}
        call = aface.parse_messages("r", json.dumps(doc).encode())
    else:
        doc = {"contents": [{"parts": [
            {"fileData": {"fileUri": "https://x.test/a.pdf", "mimeType": "application/pdf"}},
            {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, {"text": "what"}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}]}],
            "generationConfig": {"maxOutputTokens": 700, "candidateCount": 3}}
        call = gface.parse("r", json.dumps(doc).encode(), "unknown-x",
                           "streamGenerateContent", True)
    ch = _Channel()
    native = (bounds.prompt_bound(call, ch), bounds.output_bound(call, ch, 4096),
              bounds.worst_case(call, ch, Price("m", "", input_price=Decimal(1),
                                                output_price=Decimal(2)), Decimal(1), False, 4096))
    assert "body" not in call.__dict__ and "bridge" not in call.extra  # nothing converted
    assert native[0] == len(call.raw) + bounds.REFERENCE_TOKENS + bounds.TOOLS_TOKENS
    assert native[1] == 700 * (3 if face == "gemini" else 1)
    canonical = Call("r", "chat", "openai", "unknown-x", call.body, raw=call.raw)
    assert native == (bounds.prompt_bound(canonical, ch), bounds.output_bound(canonical, ch, 4096),
                      bounds.worst_case(canonical, ch, Price("m", "", input_price=Decimal(1),
                                                              output_price=Decimal(2)),
                                        Decimal(1), False, 4096))


def test_the_context_window_caps_the_input_bound():
    body = {"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user",
                                                               "content": "x" * 300_000}]}
    assert bounds.prompt_bound(_call(body), _Channel()) == 128_000


def test_a_conversation_held_upstream_counts_in_the_bound(setup, admin, fakes):
    """previous_response_id naming a response the upstream keeps: its input
    and output are this call's input too, though not in the body."""
    t = Tenant(admin, setup.url, key_quota=200_000)
    url, h = setup.url + "/v1/responses", {"Authorization": f"Bearer {t.key}"}
    first = requests.post(url, headers=h, timeout=30, json={
        "model": MODEL, "input": "Read this long file.",
        "metadata": {"fake_usage": "100000,0,6,0"}})
    assert first.status_code == 200, first.text
    # 100,006 tokens of context at 0.5 units, 4,096 of output at 4: about 66,500
    t.api.put("/api/token/", {"id": t.token_id, "remain_quota": 60_000})
    follow = {"model": MODEL, "input": "And now?", "previous_response_id": first.json()["id"]}
    r = requests.post(url, headers=h, timeout=30, json=follow)
    assert r.status_code == 403 and "could cost up to 6" in r.json()["error"]["message"]
    follow.pop("previous_response_id")
    assert requests.post(url, headers=h, timeout=30, json=follow).status_code == 200


_PARTS = st.sampled_from([
    {"type": "input_text", "text": "t"},
    {"type": "input_image", "image_url": "https://x.test/a.png"},
    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    {"type": "input_image", "file_id": "file-1"},
    {"type": "input_image", "image_url": ""},
    {"type": "input_file", "file_id": "file-2"},
    {"type": "input_file", "file_url": "https://x.test/a.pdf"},
    {"type": "input_file", "file_data": "data:application/pdf;base64,AAAA", "filename": "a.pdf"},
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "developer", "system"]),
                          st.lists(_PARTS, max_size=4)), max_size=4))
def test_responses_references_read_off_the_items_are_the_bridges(items):
    """What the Responses face counts off the items is what the bridge's
    chat messages and its problems (a file by id) counted."""
    from relay.convert import responses as rconv
    from relay.faces import responses as rface
    doc = {"model": "m", "input": [{"role": r, "content": parts} for r, parts in items]}
    bridge = rconv.request_to_chat(doc)
    was = bounds.references(bridge.body["messages"]) + sum(
        "file_id" in p for p in bridge.problems)
    assert rface.references(doc["input"]) == was


@pytest.mark.parametrize("face", ["anthropic", "gemini", "responses"])
@pytest.mark.parametrize("read_body", [False, True])
def test_a_deferring_faces_call_is_freed_by_its_last_reference(face, read_body):
    """No cycle through the deferred conversion keeps a Call, and the agent
    body it holds parsed, alive until the cyclic collector runs."""
    import gc
    import weakref
    from relay.faces import anthropic as aface
    from relay.faces import gemini as gface
    from relay.faces import responses as rface
    raw = {"anthropic": b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}',
           "gemini": b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
           "responses": b'{"model":"m","input":"hi"}'}[face]
    gc.disable()
    try:
        call = (aface.parse_messages("r", raw) if face == "anthropic"
                else gface.parse("r", raw, "m", "generateContent", False) if face == "gemini"
                else rface.parse_create("r", raw))
        if read_body:
            assert call.body["messages"]
        ref = weakref.ref(call)
        del call
        assert ref() is None
    finally:
        gc.enable()
