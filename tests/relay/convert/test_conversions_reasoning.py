"""Pure tests (no sockets) of reasoning across formats and of what the
Anthropic adaptor sends upstream: Anthropic thinking and effort, OpenAI
reasoning_effort, Gemini thinkingConfig; version, beta and query
pass-through."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from relay.adaptors.anthropic import AnthropicAdaptor
from relay.adaptors.base import Call
from relay.adaptors.openai import prepare_chat_body
from relay.convert import anthropic as ac
from relay.convert import gemini as gc
from relay.convert.anthropic_request import effort_of
from relay.convert.common import canonical_effort, effort_from_budget


def _doc(**kw) -> dict:
    return dict({"model": "m", "max_tokens": 20000,
                 "messages": [{"role": "user", "content": "hi"}]}, **kw)


# ---- the canonical scale ------------------------------------------------------------
@pytest.mark.parametrize("value, want", [("low", "low"), ("MEDIUM", "medium"), ("xhigh", "high"),
                                         ("max", "high"), ("none", "minimal"), ("huge", None),
                                         (3, None), (None, None)])
def test_canonical_effort(value, want):
    assert canonical_effort(value) == want


def test_every_effort_survives_a_budget_round_trip():
    for effort, budget in ac.BUDGET_FOR_EFFORT.items():  # Anthropic's budgets
        assert effort_from_budget(budget) == effort
    for effort in ("minimal", "low", "medium", "high"):  # Gemini 2.5's budgets
        budget = gc.thinking_config(effort, "gemini-2.5-flash")["thinkingBudget"]
        assert effort_from_budget(budget) == effort
    assert effort_from_budget(-1) is None and effort_from_budget(True) is None
    assert effort_from_budget(0) == "minimal" and effort_from_budget(31999) == "high"


# ---- Anthropic -> canonical -----------------------------------------------------------
@pytest.mark.parametrize("extra, want", [
    ({}, None),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
    ({"thinking": {"type": "adaptive"}}, None),  # the model decides: the target's default
    ({"thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "low"}},
     "low"),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "max"}}, None),
    ({"output_config": {"effort": "xhigh"}}, "high"),
    # A per-turn effort on a system message is the latest word.
    ({"output_config": {"effort": "high"}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "output_config": {"effort": "low"}}]}, "low"),
])
def test_effort_of_an_anthropic_request(extra, want):
    doc = _doc(**extra)
    ac.validate(doc)
    assert effort_of(doc) == want
    assert ac.request_to_openai(doc).get("reasoning_effort") == want


def test_anthropic_structured_output_becomes_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = ac.request_to_openai(_doc(output_config={"format": {"type": "json_schema",
                                                               "schema": schema}}))
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema}}


# ---- canonical -> Anthropic thinking ---------------------------------------------------
def _to_anthropic(**body) -> dict:
    return ac.request_from_openai(dict({"messages": [{"role": "user", "content": "hi"}]}, **body),
                                  "claude-x")


def test_reasoning_effort_becomes_a_budget_under_max_tokens():
    out = _to_anthropic(reasoning_effort="high", max_completion_tokens=20000, temperature=0.2,
                        top_p=0.97)
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 16384}
    assert "temperature" not in out and out["top_p"] == 0.97
    # The budget shrinks below max_tokens ...
    assert _to_anthropic(reasoning_effort="high", max_tokens=5000)["thinking"][
        "budget_tokens"] == 4999
    # ... and thinking is left off where Anthropic would refuse it.
    assert "thinking" not in _to_anthropic(reasoning_effort="low", max_tokens=1024)
    assert "thinking" not in _to_anthropic(reasoning_effort="minimal", max_tokens=9000)
    assert "thinking" not in _to_anthropic(
        reasoning_effort="high", max_tokens=9000, tool_choice="required",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert "thinking" not in _to_anthropic(reasoning_effort="high", max_tokens=9000, messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [{"id": "t", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t", "content": "r"}])


# ---- canonical <-> Gemini ----------------------------------------------------------
def test_gemini_thinking_config_by_model_generation():
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "medium"}
    assert gc.request_from_openai(body, "gemini-2.5-pro")["generationConfig"][
        "thinkingConfig"] == {"thinkingBudget": 8192, "includeThoughts": True}
    assert gc.request_from_openai(body, "gemini-3-pro-preview")["generationConfig"][
        "thinkingConfig"] == {"thinkingLevel": "high", "includeThoughts": True}
    assert "generationConfig" not in gc.request_from_openai(
        {"messages": [{"role": "user", "content": "hi"}]}, "gemini-2.5-pro")


@pytest.mark.parametrize("cfg, want", [({"thinkingBudget": 0}, "minimal"),
                                       ({"thinkingBudget": -1}, None),
                                       ({"thinking_budget": 24576}, "high"),
                                       ({"thinkingLevel": "LOW"}, "low"),
                                       ({"includeThoughts": True}, None)])
def test_gemini_client_thinking_becomes_reasoning_effort(cfg, want):
    doc = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
           "generationConfig": {"thinkingConfig": cfg}}
    assert gc.request_to_openai(doc, "m").get("reasoning_effort") == want


def test_gemini3_replayed_calls_carry_a_signature():
    body = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"}]}
    parts = gc.request_from_openai(body, "gemini-3-flash")["contents"][1]["parts"]
    # Only the first call of a step carries one, as Gemini 3 itself sends them.
    assert [p.get("thoughtSignature") for p in parts] == [gc.NO_SIGNATURE, None]
    parts = gc.request_from_openai(body, "gemini-2.5-flash")["contents"][1]["parts"]
    assert all("thoughtSignature" not in p for p in parts)


# ---- the OpenAI adaptor's reasoning pass ---------------------------------------------
@pytest.mark.parametrize("model, mode, converted, want", [
    ("o3-mini", "auto", True, "high"),
    ("gpt-5-mini", "auto", True, "high"),
    ("gpt-4o", "auto", True, None),          # converted: dropped where the model takes none
    ("gpt-4o", "auto", False, "high"),       # the client's own: passed as sent
    ("deepseek-r1", "always", True, "high"),
    ("o3-mini", "never", False, None),
])
def test_openai_reasoning_effort_rules(model, mode, converted, want):
    body = prepare_chat_body({"messages": [], "reasoning_effort": "high"}, model,
                             {"reasoning_effort": mode}, converted=converted)
    assert body.get("reasoning_effort") == want


def test_output_limit_cap_applies_to_converted_calls_only():
    body = {"messages": [], "max_tokens": 128000}
    opts = {"max_output_tokens": 16384}
    assert prepare_chat_body(body, "gpt-4o", opts, converted=True)["max_tokens"] == 16384
    assert prepare_chat_body(body, "gpt-4o", opts)["max_tokens"] == 128000
    assert prepare_chat_body(body, "o3", opts, converted=True)["max_completion_tokens"] == 16384
    assert body["max_tokens"] == 128000  # the call's own body is left alone


def test_o_series_get_low_for_minimal():
    body = {"messages": [], "reasoning_effort": "minimal"}
    assert prepare_chat_body(body, "o4-mini", {}, converted=True)["reasoning_effort"] == "low"
    assert prepare_chat_body(body, "gpt-5", {}, converted=True)["reasoning_effort"] == "minimal"


# ---- what the Anthropic adaptor sends -------------------------------------------------
def _channel(**options):
    return SimpleNamespace(key="ck", base_url="http://up.test/v1", options=options)


def _call(face="anthropic", **extra) -> Call:
    doc = _doc()
    call = Call(request_id="r", endpoint="chat", face=face, model="m",
                body=ac.request_to_openai(doc), raw=b'{"raw": 1}', native_body=doc)
    call.upstream_model = "m"
    call.extra.update(extra)
    return call


def test_anthropic_headers_and_query_pass_through():
    a = AnthropicAdaptor()
    call = _call(anthropic_version="2026-10-21", anthropic_beta="b1,b2",
                 anthropic_query="beta=true")
    req = a.request(call, _channel(anthropic_beta="b2, b3", anthropic_version="2023-06-01"))
    assert req.url == "http://up.test/v1/messages?beta=true" and req.body == b'{"raw": 1}'
    assert req.headers["anthropic-version"] == "2026-10-21"  # the client's wins
    assert req.headers["anthropic-beta"] == "b1,b2,b3"       # the channel's added, once
    req = a.count_tokens_request(call, _channel())
    assert req.url == "http://up.test/v1/messages/count_tokens?beta=true"
    assert req.headers["anthropic-beta"] == "b1,b2"
    # Another format's call: the channel's settings only, no client query.
    req = a.request(_call(face="openai", anthropic_query="beta=true"),
                    _channel(anthropic_beta="b3", anthropic_version="2023-06-01"))
    assert req.url == "http://up.test/v1/messages"
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert req.headers["anthropic-beta"] == "b3"
    assert "anthropic-beta" not in a.request(_call(face="openai"), _channel()).headers
