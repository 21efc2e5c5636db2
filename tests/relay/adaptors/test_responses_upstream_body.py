"""What a Responses channel is sent for a Responses client's call
(openai_responses.upstream_body): the client's own bytes, with a mapped
model renamed in place where the member is plainly the body's own, and a
re-encoding of the parsed body wherever that cannot be told at a glance.
And the upstream's lifecycle events on the way back, renamed alike."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from relay.adaptors.openai_responses import rename_model, upstream_body
from relay.convert.common import renamed_member
from relay.faces import responses as responses_face
from relay.serving import jsonin


def _call(raw: bytes, upstream: str = "gpt-5"):
    call = responses_face.parse_create("r", raw)
    call.upstream_model = upstream
    return call


def test_unmapped_the_clients_bytes_go():
    raw = b'{"model": "gpt-5",  "input": "hi"}'
    call = _call(raw, upstream="gpt-5")
    assert upstream_body(call) is call.raw


def test_a_leading_model_is_renamed_in_place_every_other_byte_kept():
    raw = (b'{ "model" :"gpt-public", "instructions": "say \\"model\\": \\"gpt-public\\"",'
           b' "input": [{"type": "message", "role": "user", "content": "caf\xc3\xa9"}],'
           b'\n "stream": true}')
    call = _call(raw)
    out = upstream_body(call)
    assert out == raw.replace(b'"gpt-public",', b'"gpt-5",', 1)
    assert jsonin.parse(out) == dict(json.loads(raw), model="gpt-5")


def test_a_model_further_on_is_re_encoded():
    inner = {"type": "function", "name": "pick", "parameters": {"type": "object", "properties": {
        "model": {"type": "string"}}}, "strict": False, "description": "x" * 5000}
    doc = {"input": [{"type": "message", "role": "user", "content": "y" * 5000}],
           "tools": [inner], "model": "gpt-public"}
    call = _call(json.dumps(doc).encode())
    assert json.loads(upstream_body(call)) == dict(doc, model="gpt-5")


def test_a_nested_member_named_alike_before_the_bodys_own_is_left_alone():
    doc = {"metadata": {"note": "x"}, "tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {}, "model": "gpt-public"}}],
        "model": "gpt-public", "input": "hi"}
    call = _call(json.dumps(doc).encode())
    got = json.loads(upstream_body(call))
    assert got == dict(doc, model="gpt-5")
    assert got["tools"][0]["parameters"]["model"] == "gpt-public"


def test_an_escaped_model_name_is_re_encoded():
    raw = b'{"model": "gpt\\u002dpublic", "input": "hi"}'
    call = _call(raw)
    assert call.model == "gpt-public"
    assert json.loads(upstream_body(call)) == {"model": "gpt-5", "input": "hi"}


# ---- lifecycle events on the way back (rename_model) -----------------------------

def _event(doc: dict, *, spaced: bool = False, ascii_only: bool = True) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only, separators=None if spaced else (",", ":"))
    return b"event: " + doc["type"].encode() + b"\ndata: " + text.encode() + b"\n\n"


def _created(model: str, before: str | None = None) -> dict:
    """A response.created event; `before`: a member named alike ahead of the
    response's own (metadata the client set, echoed)."""
    resp = {"id": "resp_1", "object": "response", "status": "in_progress",
            "instructions": 'say "model": "' + model + '" \u2028 caf\u00e9'}
    if before is not None:
        resp["metadata"] = {"model": before}
    resp.update(model=model, usage=None, tools=[
        {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}])
    return {"type": "response.created", "sequence_number": 0, "response": resp}


def _data(raw: bytes) -> dict:
    return json.loads(raw.split(b"data: ", 1)[1])


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("ascii_only", [False, True])
def test_a_lifecycle_event_is_renamed_in_its_own_bytes(spaced, ascii_only):
    raw = _event(_created("gpt-5-2025-08-07"), spaced=spaced, ascii_only=ascii_only)
    out = rename_model(raw, _data(raw), "gpt-5")
    sep = b'": "' if spaced else b'":"'
    assert out == raw.replace(b'"model' + sep + b'gpt-5-2025-08-07"',
                              b'"model' + sep + b'gpt-5"', 1)
    assert _data(out) == dict(_created("gpt-5-2025-08-07"), response=dict(
        _created("gpt-5-2025-08-07")["response"], model="gpt-5"))


@pytest.mark.parametrize("raw_of", [
    # The same name on another member: which is the response's cannot be told.
    lambda: _event(_created("gpt-5-2025-08-07", before="gpt-5-2025-08-07")),
    # Slashes escaped (PHP's default) in the response's name, and an echoed
    # member spliced in as another encoder wrote it: not found for certain.
    lambda: _event(_created("org/model-1", before="org/model-1")).replace(
        b'"model":"org/model-1","usage"', b'"model":"org\\/model-1","usage"'),
    # A name some encoders escape.
    lambda: _event(_created("a<b&c>")),
])
def test_what_cannot_be_told_for_certain_is_re_encoded(raw_of):
    raw = raw_of()
    data = _data(raw)
    out = rename_model(raw, data, "public")
    got = _data(out)
    assert got["response"]["model"] == "public"
    assert got == dict(data, response=dict(data["response"], model="public"))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-_:/@+<>&\\\"é ", min_size=1,
               max_size=12),
       st.text(max_size=30), st.booleans(), st.booleans())
def test_whatever_the_names_the_response_alone_is_renamed(name, text, spaced, ascii_only):
    doc = _created(name)
    doc["response"]["instructions"] = text
    raw = _event(doc, spaced=spaced, ascii_only=ascii_only)
    out = rename_model(raw, _data(raw), "public")
    assert _data(out) == dict(doc, response=dict(doc["response"], model="public"))
    if renamed_member(raw, name, "public") is not None:
        assert len(out) - len(raw) == len(json.dumps("public")) - len(json.dumps(name))


def test_a_key_ending_in_an_escaped_quote_and_model_is_not_the_member():
    # The bytes `"model"` also stand inside the key `a"model` (`"a\"model"`): a
    # match there is inside a string, and renaming it would send the client's
    # model name to the upstream while billing the mapped one's.
    doc = {'a"model': "gpt-public", "model": "gpt-public", "input": "hi"}
    raw = b'{"a\\"model": "gpt-public", "model": "gpt-public", "input": "hi"}'
    assert json.loads(raw) == doc
    got = json.loads(upstream_body(_call(raw)))
    assert got == dict(doc, model="gpt-5")
    event = (b'event: response.created\ndata: {"type":"response.created","response":'
             b'{"metadata":{"a\\"model":"gpt-5"},"model":"gpt\\u002d5"}}\n\n')
    out = rename_model(event, _data(event), "public")
    assert _data(out)["response"] == {"metadata": {'a"model': "gpt-5"}, "model": "public"}


def test_a_messages_body_is_renamed_at_its_own_member_alike():
    from models.records import Channel
    from relay import registry
    from relay.faces import anthropic as anthropic_face
    raw = (b'{"x\\"model": "claude-public", "model": "claude-public", "max_tokens": 5,'
           b' "messages": [{"role": "user", "content": "hi"}]}')
    call = anthropic_face.parse_messages("r", raw)
    call.upstream_model = "claude-sonnet-4-5"
    channel = Channel(id=1, name="c", type="anthropic", base_url="http://127.0.0.1:9", key="k",
                      models=("claude-public",), groups=("default",), priority=0, weight=1,
                      model_mapping={"claude-public": "claude-sonnet-4-5"})
    sent = json.loads(registry.adaptor_for("anthropic").prepare(call, channel).body)
    assert sent == dict(json.loads(raw), model="claude-sonnet-4-5")
