"""Reading vendors' refusals (their own words, as their APIs and the
gateways in front of them answer) and taking exactly the named thing out."""
from __future__ import annotations

import json

import pytest

from relay.adaptors.base import UpstreamRequest
from relay.compat import rules, wire
from relay.compat.rules import Fix

BETAS = "claude-code-20250219,context-management-2025-06-27,prompt-caching-scope-2026-01-05"
BODY = {"model": "claude-x", "max_tokens": 32000, "stream": True,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "tools": [{"name": "Read", "input_schema": {"type": "object"},
                   "input_examples": [{"file_path": "/a"}]},
                  {"name": "Bash", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "x",
                    "cache_control": {"type": "ephemeral", "scope": "global"}}],
        "messages": [{"role": "user", "content": "hi"}], "client_metadata": {"a": "b"}}
RAW = json.dumps(BODY).encode()
HEADERS = {"x-api-key": "k", "anthropic-beta": BETAS}


def fixes(body, status=400, headers=HEADERS, sent=RAW):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return rules.refusals(status, raw, headers, sent)


def test_anthropic_and_vertex_name_the_betas():
    got = fixes({"type": "error", "error": {"type": "invalid_request_error", "message": (
        "Unexpected value(s) `prompt-caching-scope-2026-01-05`, `context-management-2025-06-27`"
        " for the `anthropic-beta` header. Please consult our documentation at "
        "docs.anthropic.com or try again without the header.")}})
    assert [(f.kind, f.name) for f in got] == [("beta", "prompt-caching-scope-2026-01-05"),
                                              ("beta", "context-management-2025-06-27")]
    assert "Unexpected value(s)" in got[0].reason


def test_a_gateway_wrapping_the_vendor_error_in_a_string_is_read_too():
    inner = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message":
                        "Unexpected value(s) `context-management-2025-06-27` for the "
                        "`anthropic-beta` header."}})
    got = fixes({"error": {"message": inner + ". Received Model Group=claude", "code": "400"}})
    assert [f.name for f in got] == ["context-management-2025-06-27"]


def test_a_beta_the_request_did_not_send_is_not_a_fix():
    assert fixes({"error": {"message": "Unexpected value(s) `other-beta-2025-01-01` for the "
                                       "`anthropic-beta` header."}}) == []


def test_bedrock_invalid_beta_flag_names_nothing():
    assert fixes({"message": "invalid beta flag"}) == []


@pytest.mark.parametrize("message, name", [
    ("context_management: Extra inputs are not permitted", "context_management"),
    ("The model returned the following errors: context_management: Extra inputs are not "
     "permitted", "context_management"),
    ("tools.0.custom.input_examples: Extra inputs are not permitted",
     "tools.*.custom.input_examples"),
    ("system.0.cache_control.scope: Extra inputs are not permitted",
     "system.*.cache_control.scope"),
    ("Unknown parameter: 'client_metadata'.", "client_metadata"),
    ("Unrecognized request argument supplied: client_metadata", "client_metadata"),
])
def test_fields_named_in_each_vendors_words(message, name):
    got = fixes({"error": {"message": message}})
    assert [(f.kind, f.name) for f in got] == [("field", name)]


def test_fastapi_servers_loc_is_read():
    body = ("{'detail': [{'type': 'extra_forbidden', 'loc': ('body', 'client_metadata'), "
            "'msg': 'Extra inputs are not permitted', 'input': {'a': 'b'}}]}").encode()
    assert [f.name for f in fixes(body)] == ["client_metadata"]


@pytest.mark.parametrize("message", [
    "max_tokens: Extra inputs are not permitted", "model: Extra inputs are not permitted",
    "tools: Extra inputs are not permitted", "messages: Extra inputs are not permitted",
    "Unknown parameter: 'stream'.", "system.0.cache_control: Extra inputs are not permitted",
    "Unsupported parameter: 'service_tier' is not supported with this model.",
])
def test_what_changes_billing_or_safety_is_never_stripped(message):
    assert fixes({"error": {"message": message}}) == []


def test_only_refusals_are_read():
    msg = {"error": {"message": "context_management: Extra inputs are not permitted"}}
    assert fixes(msg, status=500) == [] and fixes(msg, status=429) == []
    # A field the request did not carry: nothing to take out.
    assert fixes({"error": {"message": "foo_bar: Extra inputs are not permitted"}}) == []


def test_apply_takes_out_exactly_the_named_things():
    req = UpstreamRequest("POST", "u", dict(HEADERS), RAW)
    out = rules.apply(req, [Fix("beta", "context-management-2025-06-27"),
                            Fix("field", "context_management"),
                            Fix("field", "tools.*.custom.input_examples"),
                            Fix("field", "system.*.cache_control.scope")])
    assert out.headers["anthropic-beta"] == \
        "claude-code-20250219,prompt-caching-scope-2026-01-05"
    doc = json.loads(out.body)
    assert "context_management" not in doc
    assert all("input_examples" not in t for t in doc["tools"])
    assert [t["name"] for t in doc["tools"]] == ["Read", "Bash"]
    assert doc["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert {k: v for k, v in doc.items() if k not in ("context_management", "tools", "system")} \
        == {k: v for k, v in BODY.items() if k not in ("context_management", "tools", "system")}
    assert req.body == RAW  # the original is not touched


def test_apply_without_anything_to_take_is_the_same_request():
    req = UpstreamRequest("POST", "u", {"x-api-key": "k"}, b'{"model": "m"}')
    assert rules.apply(req, [Fix("beta", "b-2025-01-01"), Fix("field", "absent")]) is req


def test_the_last_beta_taken_drops_the_header():
    req = UpstreamRequest("POST", "u", {"anthropic-beta": "a-2025-01-01"}, b"{}")
    assert "anthropic-beta" not in rules.apply(req, [Fix("beta", "a-2025-01-01")]).headers


def test_gemini_camel_case_is_the_same_field():
    doc = {"generationConfig": {"thinkingConfig": {"thinkingLevel": "high"}, "topK": 3}}
    assert rules.strip(doc, rules.path_of("generation_config.thinking_config"))
    assert doc == {"generationConfig": {"topK": 3}}


@pytest.mark.parametrize("status, body, unknown", [
    (404, b'{"error": {"message": "Invalid URL (POST /v1/responses)"}}', True),
    (404, b'{"detail": "Not Found"}', True),
    (404, b"404 page not found", True),
    (405, b"Method Not Allowed", True),
    (404, b"", True),
    (400, b'{"error": {"message": "Unknown request URL: POST /v1/responses."}}', True),
    (404, b'{"error": {"message": "The model `gpt-9` does not exist or you do not have access '
          b'to it.", "code": "model_not_found"}}', False),
    (404, b'{"error": "model \\"qwen\\" not found, try pulling it first"}', False),
    (404, b'{"error": {"code": "DeploymentNotFound", "message": "The API deployment for this '
          b'resource does not exist."}}', False),
    (400, b'{"error": {"message": "Invalid value for temperature"}}', False),
])
def test_an_unknown_path_is_told_from_an_unknown_model(status, body, unknown):
    assert wire.unknown_endpoint(status, body) is unknown


def test_wire_refusals_follow_the_call_and_respect_the_operator():
    nf = b'{"detail": "Not Found"}'
    assert wire.refusal("responses", "responses", {}, 404, nf).name == "chat"
    assert wire.refusal("responses_compact", "responses", {}, 404, nf).name == "compact"
    assert wire.refusal("chat", "openai", {"wire_api": "both"}, 404, nf).name == "responses"
    assert wire.refusal("responses", "openai", {}, 404, nf) is None  # bridged already
    assert wire.refusal("responses", "responses", {"wire_api": "responses"}, 404, nf) is None


@pytest.mark.parametrize("message", [
    "messages.1.content.0: Invalid `signature` in `thinking` block",
    "messages: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When "
    "`thinking` is enabled, a final `assistant` message must start with a thinking block.",
])
def test_thinking_made_elsewhere_means_this_call_goes_without_thinking(message):
    body = {"model": "m", "max_tokens": 2000, "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"},
                                             {"type": "clear_tool_uses_20250919"}]},
            "messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "t", "signature": "x"},
                             {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result",
                                                       "tool_use_id": "t1", "content": "r"}]}]}
    raw = json.dumps(body).encode()
    got = rules.refusals(400, json.dumps({"type": "error", "error": {
        "type": "invalid_request_error", "message": message}}).encode(), {}, raw)
    assert [(f.kind, f.name) for f in got] == [("thinking", "off")]
    out = json.loads(rules.apply(UpstreamRequest("POST", "u", {}, raw), got).body)
    assert "thinking" not in out
    assert out["context_management"] == {"edits": [{"type": "clear_tool_uses_20250919"}]}
    assert out["messages"][1]["content"] == [body["messages"][1]["content"][1]]
    # A body without thinking is no such case.
    assert rules.refusals(400, message.encode(), {}, b'{"model": "m"}') == []
