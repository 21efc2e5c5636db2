"""Responses calls bridged to Anthropic, Gemini and chat-only OpenAI
channels, with what a coding agent sends (Codex's shape: instructions and a
developer message, function tools, reasoning with a summary, encrypted
reasoning asked for, store off, streamed): system text merged into the
target's one system instruction, `reasoning.effort` as Anthropic thinking,
Gemini's thinkingConfig or reasoning_effort only where the model takes it,
the channel's output cap, and a tool round trip that replays the reasoning
item, billed to the unit.  Official openai SDK against the relay; the fakes
refuse what their vendors refuse."""
from __future__ import annotations

import json

import openai
import pytest

from tests.fakes import gemini_upstream as fg
from tests.vendor_env import Env

SHELL = [{"type": "function", "name": "exec_command", "description": "Run a shell command",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                         "required": ["cmd"]}}]
SECRET = "SECRET-7f3a"
INSTRUCTIONS = "You are a coding agent."
DEVELOPER = "Sandbox: none. Approval: never."


@pytest.fixture(scope="module")
def env(relay, admin):
    e = Env(relay, admin)
    e.channel("anthropic", "r-claude", upstream="claude-sonnet-4-5",
              options={"max_output_tokens": 8000})
    e.channel("gemini", "r-gemini25", upstream="gemini-2.5-pro")
    e.channel("gemini", "r-gemini3", upstream="gemini-3-pro-preview")
    e.channel("openai", "r-gpt4o", mode="chatonly", upstream="gpt-4o",
              options={"wire_api": "chat", "max_output_tokens": 16384})
    e.channel("openai", "r-o4", mode="chatonly", upstream="o4-mini",
              options={"wire_api": "chat"})
    yield e
    e.stop()


def client(env, tok) -> openai.OpenAI:
    return openai.OpenAI(api_key=tok["key"], base_url=env.relay.url + "/v1", max_retries=0)


def codex_turn(oc, model: str, items: list, effort: str = "high", **extra):
    """One streamed Codex-style turn -> (event types, final response)."""
    with oc.responses.stream(
            model=model, instructions=INSTRUCTIONS, input=items, tools=SHELL,
            tool_choice="auto", parallel_tool_calls=True, store=False,
            include=["reasoning.encrypted_content"],
            reasoning={"effort": effort, "summary": "auto"}, **extra) as s:
        kinds = [e.type for e in s]
        return kinds, s.get_final_response()


def first_items() -> list:
    return [{"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": DEVELOPER}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Print secret.txt."}]}]


def replay(items: list, final) -> list:
    """The next turn's input as Codex builds it: everything so far, the
    model's output items (reasoning included) and the tool's output."""
    out = [o.model_dump(exclude_none=True) for o in final.output]
    call = next(o for o in final.output if o.type == "function_call")
    return items + out + [{"type": "function_call_output", "call_id": call.call_id,
                           "output": SECRET}]


def test_codex_turn_with_reasoning_through_anthropic(env):
    tok = env.token()
    oc = client(env, tok)
    since = len(env.anthropic.requests)
    items = first_items()
    kinds, final = codex_turn(oc, "r-claude", items, max_output_tokens=64000)
    sent = env.anthropic.requests[since]["body"]
    # System text merged in order; effort as a thinking budget under the cap.
    assert sent["system"] == f"{INSTRUCTIONS}\n{DEVELOPER}"
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert sent["max_tokens"] == 8000
    assert sent["thinking"]["type"] == "enabled"
    assert 1024 <= sent["thinking"]["budget_tokens"] < sent["max_tokens"]
    assert "temperature" not in sent
    # The thinking comes back as a reasoning item with its summary streamed.
    assert "response.reasoning_summary_text.delta" in kinds
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    call = final.output[-1]
    assert call.name == "exec_command" and json.loads(call.arguments) == {"cmd": "cat secret.txt"}

    kinds, final = codex_turn(oc, "r-claude", replay(items, final))
    sent = env.anthropic.requests[-1]["body"]
    # A tool loop without a signed thinking block to replay: no thinking now
    # (Anthropic would refuse it), the tool's output as a tool_result.
    assert "thinking" not in sent
    assert sent["messages"][-1]["content"][-1] == {
        "type": "tool_result", "tool_use_id": call.call_id, "content": SECRET}
    assert final.output_text == f"The tool returned: {SECRET}"
    assert kinds[-1] == "response.completed"
    logs = env.logs(tok["id"], 2)
    assert [r["endpoint"] for r in logs] == ["responses", "responses"]
    env.check_billed(tok, 25, 7, 4, n=2)


@pytest.mark.parametrize("model,config", [
    ("r-gemini25", {"thinkingBudget": 1024, "includeThoughts": True}),
    ("r-gemini3", {"thinkingLevel": "low", "includeThoughts": True})])
def test_codex_turn_with_reasoning_through_gemini(env, model, config):
    tok = env.token()
    oc = client(env, tok)
    since = len(env.gemini.requests)
    items = first_items()
    kinds, final = codex_turn(oc, model, items, effort="low", max_output_tokens=2000)
    sent = env.gemini.requests[since]["body"]
    assert sent["systemInstruction"] == {"parts": [{"text": f"{INSTRUCTIONS}\n{DEVELOPER}"}]}
    assert [c["role"] for c in sent["contents"]] == ["user"]
    assert sent["generationConfig"]["thinkingConfig"] == config
    assert sent["generationConfig"]["maxOutputTokens"] == 2000
    assert "response.reasoning_summary_text.delta" in kinds
    call = next(o for o in final.output if o.type == "function_call")
    assert call.name == "exec_command"

    _, final = codex_turn(oc, model, replay(items, final), effort="low")
    sent = env.gemini.requests[-1]["body"]
    replayed = [p for c in sent["contents"] for p in c["parts"] if "functionCall" in p]
    if model == "r-gemini3":  # Gemini 3 refuses a replayed call without a signature
        assert "thoughtSignature" in replayed[0]
    assert final.output_text == f"The tool returned: {SECRET}"
    env.check_billed(tok, 12, 5 + fg.THOUGHT_TOKENS, 3, n=2)


def test_reasoning_only_where_the_openai_model_takes_it(env):
    """A chat-only channel: reasoning_effort to o4-mini, none to gpt-4o
    (OpenAI refuses it there), and gpt-4o's output limit capped by the
    channel option (OpenAI refuses over 16384)."""
    tok = env.token()
    oc = client(env, tok)
    _, final = codex_turn(oc, "r-o4", first_items(), effort="medium")
    sent = env.openai.requests[-1]["body"]
    assert sent["reasoning_effort"] == "medium" and sent["model"] == "o4-mini"
    assert [m["role"] for m in sent["messages"][:2]] == ["system", "system"]
    assert final.output[-1].type == "function_call"
    _, final = codex_turn(oc, "r-gpt4o", first_items(), max_output_tokens=100000)
    sent = env.openai.requests[-1]["body"]
    assert "reasoning_effort" not in sent and sent["max_tokens"] == 16384
    assert final.status == "completed" and final.output[-1].type == "function_call"
    env.check_billed(tok, 10, 3, 0, n=2)
