"""The scripted model every chat fake plays (Anthropic, OpenAI chat,
Gemini), so that a coding CLI can drive a whole tool round trip through any
channel type.  Each fake reads its own wire format and asks `next_turn`.

The script, one turn at a time:
- the last user turn carries a tool result: answer with text that quotes
  it, "The tool returned: <result>" (the CLI's final answer);
- else, when the request offers tools (and does not forbid calling them):
  call one.  `fake.tool_plan = {"name": ..., "input": {...}}` picks the
  tool when the request offers one of that name (a CLI's Read or Bash,
  with a path in its temp workspace); otherwise the first tool offered,
  with {"city": "Paris"} (what the older tests expect);
- else the fake's plain text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_INPUT = {"city": "Paris"}
QUOTE = "The tool returned: "


@dataclass
class Turn:
    kind: str                    # "text" or "tool"
    text: str = ""
    tool: str = ""
    input: dict | None = None


def result_text(content: Any) -> str:
    """A tool result's text, whatever the format put around it."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(result_text(b.get("text", b.get("content", "")))
                         if isinstance(b, dict) else str(b) for b in content)
    if isinstance(content, dict):
        if isinstance(content.get("content"), str) and len(content) == 1:
            return content["content"]
        return json.dumps(content, ensure_ascii=False)
    return "" if content is None else str(content)


def next_turn(fake, text: str, tools: list[str], result: Any = None, has_result: bool = False,
              may_call: bool = True) -> Turn:
    """What the model says next.  `text`: the fake's plain answer; `tools`:
    the names offered; `result`: the last user turn's tool result, when
    `has_result`; `may_call` False when the request forbids tool calls."""
    if has_result:
        return Turn("text", text=QUOTE + result_text(result))
    if tools and may_call:
        plan = getattr(fake, "tool_plan", None) or {}
        if plan.get("name") in tools:
            return Turn("tool", tool=plan["name"], input=dict(plan.get("input") or {}))
        return Turn("tool", tool=tools[0], input=dict(DEFAULT_INPUT))
    return Turn("text", text=text)
