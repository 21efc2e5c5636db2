"""The scripted model every chat-like fake plays (Anthropic, OpenAI chat,
OpenAI Responses, Gemini), so that a coding CLI (Claude Code, Codex) can
drive a whole tool round trip through any channel type.  Each fake reads
its own wire format (blocks, messages, items, parts) and asks `next_turn`.

The script, one turn at a time:
- the latest user turn carries a tool result: answer with text that quotes
  it, "The tool returned: <result>" (the CLI's final answer);
- else, when the request offers tools (and does not forbid calling them),
  call one:
  - `fake.tool_plan = {"name": ..., "input": {...}}` picks the tool when the
    request offers one of that name (Claude Code's Read, with a path in its
    temp workspace);
  - else a coding agent's shell tool when offered (Codex: `exec_command`
    with a `cmd`; older Codex: `shell` with a `command` array), asked to
    print secret.txt from the agent's workspace;
  - else the first tool offered, with {"city": "Paris"} (what the older
    tests expect);
- else the fake's plain text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_INPUT = {"city": "Paris"}
QUOTE = "The tool returned: "
SECRET_FILE = "secret.txt"
SHELL_CALLS = {"exec_command": {"cmd": f"cat {SECRET_FILE}"},
               "shell": {"command": ["cat", SECRET_FILE]}}


@dataclass
class Turn:
    kind: str                    # "text" or "tool"
    text: str = ""
    tool: str = ""
    input: dict | None = None


def result_text(content: Any) -> str:
    """A tool result's text, whatever the format put around it (a string,
    blocks or parts, or an object holding only its output: what a converter
    wraps a plain-text result in)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(result_text(b.get("text", b.get("content", "")))
                         if isinstance(b, dict) else str(b) for b in content)
    if isinstance(content, dict):
        wrapped = [v for k, v in content.items() if k in ("content", "output", "result")]
        if len(content) == 1 and wrapped and isinstance(wrapped[0], str):
            return wrapped[0]
        return json.dumps(content, ensure_ascii=False)
    return "" if content is None else str(content)


def pick_tool(fake, tools: list[str]) -> tuple[str, dict]:
    """(tool name, input) for a turn that calls one of `tools`."""
    plan = getattr(fake, "tool_plan", None) or {}
    if plan.get("name") in tools:
        return plan["name"], dict(plan.get("input") or {})
    for name, args in SHELL_CALLS.items():
        if name in tools:
            return name, dict(args)
    return tools[0], dict(DEFAULT_INPUT)


def next_turn(fake, text: str, tools: list[str], result: Any = None, has_result: bool = False,
              may_call: bool = True) -> Turn:
    """What the model says next.  `text`: the fake's plain answer; `tools`:
    the names offered; `result`: the latest user turn's tool result, when
    `has_result`; `may_call` False when the request forbids tool calls."""
    if has_result:
        return Turn("text", text=QUOTE + result_text(result))
    if tools and may_call:
        name, args = pick_tool(fake, tools)
        return Turn("tool", tool=name, input=args)
    return Turn("text", text=text)
