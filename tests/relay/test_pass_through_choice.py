"""Before reserving, the service makes a conversion the face deferred
(Call.canonical) only when the call's first channel will not be sent the
client's own body (registry.passes_through): a body the conversion cannot
read is a 400 before anything is reserved, and a body that passes through
is never converted.  The choice must agree with what the adaptor then
sends, for every face that defers and every kind of channel: a Codex
Responses call on a channel that speaks Responses was converted to chat
for nothing (a fifth of the call's CPU)."""
from __future__ import annotations

import json

import pytest

from models.records import Channel
from relay import registry
from relay.faces import anthropic as anthropic_face
from relay.faces import gemini as gemini_face
from relay.faces import responses as responses_face

MESSAGES = {"model": "m", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
RESPONSES = {"model": "m", "stream": True, "instructions": "be brief", "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "done"}],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}


def _calls():
    yield "messages", anthropic_face.parse_messages("r", json.dumps(MESSAGES).encode())
    yield "gemini", gemini_face.parse("r", json.dumps(GEMINI).encode(), "m",
                                      "streamGenerateContent", True)
    yield "responses", responses_face.parse_create("r", json.dumps(RESPONSES).encode())
    compact = dict(RESPONSES, stream=False)
    yield "compact", responses_face.parse_create("r", json.dumps(compact).encode(), compact=True)


CHANNELS = [("openai", {}), ("openai", {"wire_api": "chat"}),
            ("openai", {"wire_api": "responses"}), ("openai", {"compact_api": "chat"}),
            ("azure", {"api_version": "2025-04-01-preview"}), ("anthropic", {}), ("gemini", {})]


@pytest.mark.parametrize("kind,options", CHANNELS)
@pytest.mark.parametrize("face", ["messages", "gemini", "responses", "compact"])
def test_the_choice_agrees_with_what_the_adaptor_sends(face, kind, options):
    call = dict(_calls())[face]
    channel = Channel(id=1, name="c", type=kind, base_url="http://127.0.0.1:9", key="k",
                      models=("m",), groups=("default",), priority=0, weight=1,
                      model_mapping={}, options=dict(options))
    call.upstream_model = call.model
    made = []
    canonical = call.canonical
    call.canonical = lambda native: made.append(1) or canonical(native)
    passes = registry.passes_through(call, channel)
    req = registry.adaptor_for(kind).prepare(call, channel)
    assert req.body
    assert passes == (call.extra["wire"] == call.face)
    assert bool(made) == (not passes)
    if passes:
        assert json.loads(req.body) == json.loads(call.raw) or face == "gemini"
