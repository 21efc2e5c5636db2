"""What a Responses channel is sent for a Responses client's call
(openai_responses.upstream_body): the client's own bytes, with a mapped
model renamed in place where the member is plainly the body's own, and a
re-encoding of the parsed body wherever that cannot be told at a glance."""
from __future__ import annotations

import json

from relay.adaptors.openai_responses import upstream_body
from relay.faces import responses as responses_face
from relay.serving import jsonin


def _call(raw: bytes, public: str = "gpt-public", upstream: str = "gpt-5"):
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
    call = _call(raw, public="gpt-public")
    assert call.model == "gpt-public"
    assert json.loads(upstream_body(call)) == {"model": "gpt-5", "input": "hi"}
