"""No secrets in logs or upstream URLs (issue 31, item 6), over real
sockets: a Gemini-style ?key= in the access log and in the query of a
forwarded call, and upstream errors that name the organisation or echo a
key.  The relay's log is its own file; the upstreams are fakes on 127.0.0.1."""
from __future__ import annotations

import re
import time
import uuid

import pytest
import requests

from relay.serving import redact
from tests.helpers import RelayProcess
from tests.vendor_env import Env

LEAKS = re.compile(r"org-\w+|proj_\w+|sk-[\w-]+|AKIA\w+|AIza[\w-]+")


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("redact"))).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("openai", "resp-model")
    admin.create_channel(e.openai.mode_url("429org"), ["leak-429"], name="l429")
    admin.create_channel(e.openai.mode_url("400key"), ["leak-400"], name="l400")
    for m in ("leak-429", "leak-400"):
        admin.set_price(m, input_price=1, output_price=1)
    yield e
    e.stop()


def test_a_key_in_the_query_is_not_in_the_access_log(relay):
    secret = "sk-" + uuid.uuid4().hex + "NOTINLOGS"
    for path in ("/v1beta/models", "/v1/chat/completions", "/api/user/self"):
        requests.get(relay.url + path, params={"key": secret, "alt": "sse"})
    requests.post(relay.url + "/api/notify/push/callback", params={"token": secret}, json={})
    deadline = time.monotonic() + 5
    while "/api/notify/push/callback" not in relay.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = relay.log()
    assert secret not in log
    assert "/v1beta/models?key=[redacted]&alt=sse" in log


def test_a_key_in_the_query_is_not_forwarded(env):
    tok = env.token()
    r = requests.post(env.relay.url + "/v1/responses", json={"model": "resp-model", "input": "x"},
                      headers={"Authorization": f"Bearer {tok['key']}"})
    rid = r.json()["id"]
    # A Gemini-minded client: the key in the query, beside a real parameter.
    r = requests.get(env.relay.url + f"/v1/responses/{rid}",
                     params={"key": tok["key"], "include[]": "message.output_text.logprobs"})
    assert r.status_code == 200, r.text
    sent = [q for q in env.openai.requests if q["path"].endswith(f"/responses/{rid}")][-1]
    assert tok["key"] not in sent["query"] and "include" in sent["query"]


@pytest.mark.parametrize("model,status,kind", [("leak-429", 429, "rate_limit_exceeded"),
                                               ("leak-400", 400, "model_not_permitted")])
def test_upstream_errors_lose_keys_and_account_ids_not_their_status(env, model, status, kind):
    tok = env.token()
    r = requests.post(env.relay.url + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {tok['key']}"},
                      json={"model": model, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == status
    msg = r.json()["error"]["message"]
    assert LEAKS.findall(msg) == [], msg
    assert f"[{status} {kind}]" in msg and "[redacted]" in msg
    # The same through a stream's error and the Anthropic face.
    r = requests.post(env.relay.url + "/v1/messages",
                      headers={"x-api-key": tok["key"], "anthropic-version": "2023-06-01"},
                      json={"model": model, "max_tokens": 5, "stream": True,
                            "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == status and LEAKS.findall(r.text) == [], r.text


def test_scrub_and_strip():
    text = ("Incorrect API key provided: sk-proj-abcd************************wxyz. Org "
            "org-AbCdEf0123456789 (2fd3c2fc-6a1b-4c0e-9a51-0f2d3c4b5a69) key "
            "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStU Bearer abc.def-ghi_12345 "
            "token 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
    out = redact.scrub(text)
    assert out == ("Incorrect API key provided: [redacted]. Org [redacted] ([redacted]) key "
                   "[redacted] [redacted] token [redacted]")
    kept = "Rate limit reached for gpt-4o-mini-2024-07-18 on tokens per min (TPM): Limit 30000"
    assert redact.scrub(kept) == kept
    assert redact.strip_credentials("beta=true&key=sk-x&api_key=y&alt=sse") == "beta=true&alt=sse"
    assert redact.strip_credentials("beta=true") == "beta=true"
    assert redact.redact_uri("/v1beta/models/m:generateContent?key=sk-x&alt=sse") == \
        "/v1beta/models/m:generateContent?key=[redacted]&alt=sse"
    assert redact.redact_uri("/api/notify/push/callback?token=abc") == \
        "/api/notify/push/callback?token=[redacted]"
    assert redact.redact_uri("/v1/models") == "/v1/models"
