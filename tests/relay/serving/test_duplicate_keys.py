"""Issue 30, case 6 (JSON): what is authorised is what is sent.  A
pass-through body (Anthropic, Responses, Gemini) with a key twice is parsed
to its last value; the upstream now gets the body re-encoded from what was
parsed, authorised (the key's model lock) and billed, so an upstream that
keeps the first value cannot run the other.  A body without duplicates still
goes byte for byte."""
from __future__ import annotations

import json

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.serving import jsonin
from tests.tenant import Tenant


@pytest.fixture(scope="module")
def setup(relay, admin, fakes):
    admin.create_channel(fakes["anthropic"].url, ["claude-dear", "claude-cheap"],
                         type="anthropic")
    admin.create_channel(fakes["openai"].url, ["resp-dear", "resp-cheap"])
    admin.create_channel(fakes["gemini"].url, ["gemini-dup"], type="gemini")
    for m, p in (("claude-dear", "75"), ("claude-cheap", "1"), ("resp-dear", "75"),
                 ("resp-cheap", "1"), ("gemini-dup", "1")):
        admin.set_price(m, input_price=p, output_price=p)
    return relay


def _locked(admin, relay, models):
    return Tenant(admin, relay.url, model_limits_enabled=True, model_limits=models)


def test_anthropic_duplicate_model_runs_what_was_authorised(setup, admin, fakes):
    """The key may use only claude-cheap; the body names claude-dear first.
    The relay reads the last (cheap): the upstream must not see dear."""
    t = _locked(admin, setup, ["claude-cheap"])
    raw = (b'{"model": "claude-dear", "max_tokens": 20, "model": "claude-cheap", '
           b'"messages": [{"role": "user", "content": "hi"}]}')
    r = requests.post(setup.url + "/v1/messages", data=raw, timeout=30,
                      headers={"x-api-key": t.key, "anthropic-version": "2023-06-01",
                               "content-type": "application/json"})
    assert r.status_code == 200, r.text
    sent = fakes["anthropic"].requests[-1]["raw"]
    assert b"claude-dear" not in sent
    assert json.loads(sent) == {"model": "claude-cheap", "max_tokens": 20,
                                "messages": [{"role": "user", "content": "hi"}]}
    assert t.logs(1)[0]["model"] == "claude-cheap"


def test_responses_duplicate_key_is_re_encoded(setup, admin, fakes):
    t = _locked(admin, setup, ["resp-cheap"])
    raw = b'{"model":"resp-dear","model":"resp-cheap","input":"hi","store":false}'
    r = requests.post(setup.url + "/v1/responses", data=raw, timeout=30,
                      headers={"Authorization": f"Bearer {t.key}",
                               "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    sent = fakes["openai"].requests[-1]["raw"]
    assert sent == b'{"model":"resp-cheap","input":"hi","store":false}'


def test_gemini_duplicate_generation_config_is_re_encoded(setup, admin, fakes):
    """candidateCount twice: the bound was reserved for the last (1); the
    upstream sees only that one."""
    t = Tenant(admin, setup.url)
    raw = (b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": '
           b'{"candidateCount": 8, "candidateCount": 1, "maxOutputTokens": 10}}')
    r = requests.post(setup.url + "/v1beta/models/gemini-dup:generateContent", data=raw,
                      timeout=30, headers={"x-goog-api-key": t.key,
                                           "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    sent = json.loads(fakes["gemini"].requests[-1]["raw"])
    assert sent["generationConfig"] == {"candidateCount": 1, "maxOutputTokens": 10}
    assert fakes["gemini"].requests[-1]["raw"].count(b"candidateCount") == 1


def test_a_body_without_duplicates_goes_byte_for_byte(setup, admin, fakes):
    t = Tenant(admin, setup.url)
    raw = (b'{ "model" : "claude-cheap" ,"max_tokens":20, "messages":[{"role":"user",'
           b'"content":"a: b \\u00e9"}]}')
    r = requests.post(setup.url + "/v1/messages", data=raw, timeout=30,
                      headers={"x-api-key": t.key, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    assert fakes["anthropic"].requests[-1]["raw"] == raw


# ---- the check itself ------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    b'{"a":1,"a":2}',
    b'{"a": {"b": 1, "b": 2}}',
    b'{"x":"\\u003a","a":1,"a":2}',          # a colon escaped to hide the duplicate key's
    b'{"a":[{"k":"v","k":"w"}]}',
    b'{"a":{"deep":{"c":":"}},"a":1}',
])
def test_duplicates_are_re_encoded(raw):
    doc = jsonin.parse(raw)
    assert jsonin.passed_on(raw, doc) == jsonin.dumps(doc)


@pytest.mark.parametrize("raw", [
    b'{"a":1}', b'{ "a" : 1 ,\n "b":"x: y"}', b'{"t":"tab\\there","u":"\\u00e9"}',
    b'{"n":[1,2,{"a":"b"}]}',
])
def test_bodies_without_duplicates_pass_as_sent(raw):
    assert jsonin.passed_on(raw, jsonin.parse(raw)) == raw


_keys = st.sampled_from(["a", "b", "model", "k:", "\u00e9", "\\"])
_json = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.lists(st.tuples(_keys, inner), max_size=4), max_leaves=12)


def _encode(v, spaced: bool) -> str:
    """JSON text of a value where lists of pairs are objects that may repeat keys."""
    sep = ", " if spaced else ","
    if isinstance(v, list) and v and all(isinstance(x, tuple) for x in v):
        return "{" + sep.join(json.dumps(k) + (": " if spaced else ":") + _encode(x, spaced)
                              for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + sep.join(_encode(x, spaced) for x in v) + "]"
    return json.dumps(v, ensure_ascii=spaced)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_whatever_is_passed_on_parses_to_what_was_parsed(value, spaced):
    """The property: the bytes sent read, in any parser, as what the relay
    read, so a parser that keeps the first duplicate reads the same."""
    raw = ('{"v": ' + _encode(value, spaced) + "}").encode()
    doc = jsonin.parse(raw)
    sent = jsonin.passed_on(raw, doc)

    def first_wins(pairs):
        out = {}
        for k, v in pairs:
            out.setdefault(k, v)
        return out
    assert json.loads(sent, object_pairs_hook=first_wins) == doc
