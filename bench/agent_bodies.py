"""Coding-agent request bodies for bench/agents.py: what Claude Code, Codex
and a Gemini agent send in the middle of a session.

Built, not recorded, but from what the real clients send:
- Claude Code: the system prompt, tools and first message of a real
  request (tests/fixtures/claude_code_requests.json, Claude Code 2.1),
  six more tools of the same kind (18 in all), then a session of tool calls
  and their results with vendor-style ids (`toolu_01` + 22 base62) and
  `cache_control` on the last block: about 98 KB.
- Codex: the tool names and parameters of a real request
  (tests/fixtures/codex_request.json, Codex CLI 0.169) as function tools,
  its freeform `apply_patch`, a developer message of instructions, then
  function calls (`call_` + 24 base62) with their outputs: about 77 KB.
- Gemini: the Claude Code tools as functionDeclarations and the same
  session as functionCall / functionResponse parts: about 80 KB.

Deterministic (a seeded generator), so every run and every tree sends the
same bytes.  Thinking is left out of the replayed turns: an upstream only
accepts thinking signatures it issued itself (the fakes check, as the
vendors do).
"""
from __future__ import annotations

import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# Words for file contents and command output that look like source code.
_WORDS = ("def return self None import from class async await if else for in while "
          "try except raise with as lambda yield value result request response client "
          "server handler config settings record balance quota channel model token "
          "stream chunk buffer parse encode decode write read open close status error "
          "message content usage price group user key cache index query update").split()

EXTRA_CLAUDE_TOOLS = [
    ("Glob", "Fast file pattern matching that works with any codebase size. Supports glob "
             "patterns like \"**/*.js\" or \"src/**/*.ts\". Returns matching file paths sorted by "
             "modification time.", {"pattern": "The glob pattern to match files against",
                                    "path": "The directory to search in."}),
    ("Grep", "A powerful search tool built on ripgrep. Supports full regex syntax, filters files "
             "with the glob or type parameter, and has output modes content, files_with_matches "
             "and count.", {"pattern": "The regular expression pattern to search for",
                            "path": "File or directory to search in", "glob": "Glob filter",
                            "output_mode": "Output mode", "-n": "Show line numbers",
                            "-i": "Case insensitive search", "head_limit": "Limit output"}),
    ("TodoWrite", "Use this tool to create and manage a structured task list for your current "
                  "coding session. This helps you track progress, organize complex tasks, and "
                  "demonstrate thoroughness to the user.", {"todos": "The updated todo list"}),
    ("WebFetch", "Fetches content from a specified URL and processes it using an AI model. "
                 "Takes a URL and a prompt as input, fetches the URL content, converts HTML to "
                 "markdown.", {"url": "The URL to fetch content from",
                               "prompt": "The prompt to run on the fetched content"}),
    ("NotebookEdit", "Completely replaces the contents of a specific cell in a Jupyter notebook "
                     "(.ipynb file) with new source.", {"notebook_path": "Absolute path",
                                                       "cell_id": "The ID of the cell",
                                                       "new_source": "The new source",
                                                       "edit_mode": "replace, insert or delete"}),
    ("BashOutput", "Retrieves output from a running or completed background bash shell. "
                   "Always returns only new output since the last check.",
     {"bash_id": "The ID of the background shell", "filter": "Optional regular expression"}),
]


def _id(rng: random.Random, prefix: str, n: int) -> str:
    return prefix + "".join(rng.choice(_B62) for _ in range(n))


def _code(rng: random.Random, size: int) -> str:
    """Source-like text of about `size` characters, line-numbered like Read's output."""
    out, n, line = [], 0, 1
    while n < size:
        indent = "    " * rng.randint(0, 3)
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 11)))
        s = f"{line:>6}\t{indent}{text}"
        out.append(s)
        n += len(s) + 1
        line += 1
    return "\n".join(out)


def _schema(params: dict) -> dict:
    return {"type": "object", "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
            "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
            "required": list(params)[:1]}


def _steps(rng: random.Random, turns: int, size: int) -> list[dict]:
    """One agent session, format-free: tool, input, output text, a remark."""
    tools = [("Read", lambda: {"file_path": f"/work/app/relay/{rng.choice(_WORDS)}.py"}),
             ("Bash", lambda: {"command": f"grep -rn {rng.choice(_WORDS)} relay/ | head -40",
                               "description": "Search the relay package"}),
             ("Grep", lambda: {"pattern": rng.choice(_WORDS), "path": "relay", "-n": "true"}),
             ("Edit", lambda: {"file_path": f"/work/app/relay/{rng.choice(_WORDS)}.py",
                               "old_string": _code(rng, 300), "new_string": _code(rng, 320)})]
    steps = []
    for _ in range(turns):
        name, make = rng.choice(tools)
        steps.append({"tool": name, "input": make(), "output": _code(rng, size),
                      "remark": "Let me look at " + " ".join(rng.choice(_WORDS) for _ in range(12))})
    return steps


def claude_code(turns: int = 32, output_size: int = 1250, seed: int = 7) -> dict:
    rng = random.Random(seed)
    real = json.load(open(os.path.join(ROOT, "tests", "fixtures", "claude_code_requests.json")))
    base = real["requests"][1]["body"]
    tools = [t for t in base["tools"] if t["name"] != "DeferredToolPlaceholder"]
    tools += [{"name": n, "description": d, "input_schema": _schema(p)}
              for n, d, p in EXTRA_CLAUDE_TOOLS]
    first = next(m for m in base["messages"] if m["role"] == "user")
    messages = [first]
    for step in _steps(rng, turns, output_size):
        tid = _id(rng, "toolu_01", 22)
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": step["remark"]},
            {"type": "tool_use", "id": tid, "name": step["tool"], "input": step["input"]}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": step["output"]}]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {k: v for k, v in base.items() if k not in ("thinking", "messages", "tools")}
    body.update(messages=messages, tools=tools, max_tokens=32000, stream=True)
    return body


CODEX_TOOL_DOCS = {
    "cmd": "The shell command to execute.", "workdir": "The working directory.",
    "justification": "Why the command needs escalated permissions.",
    "yield_time_ms": "How long to wait for output before yielding.",
    "max_output_tokens": "Maximum number of tokens to return.",
    "session_id": "Identifier of the running exec session.",
    "chars": "Bytes to write to stdin.", "path": "Local filesystem path to an image file.",
}


def codex(turns: int = 30, output_size: int = 1150, seed: int = 11) -> dict:
    rng = random.Random(seed)
    real = json.load(open(os.path.join(ROOT, "tests", "fixtures", "codex_request.json")))
    tools = []
    for t in real["tools"]:
        if t["type"] != "function":
            continue  # namespace and web_search: hosted or Codex-only kinds
        tools.append({"type": "function", "name": t["name"], "strict": False,
                      "description": f"Runs {t['name']}. " + " ".join(
                          rng.choice(_WORDS) for _ in range(60)),
                      "parameters": {"type": "object", "additionalProperties": False,
                                     "properties": {p: {"type": "string", "description":
                                                        CODEX_TOOL_DOCS.get(p, p)}
                                                    for p in t["parameters"]},
                                     "required": t["parameters"][:1]}})
    tools.append({"type": "custom", "name": "apply_patch",
                  "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM "
                                 "tool, so do not wrap the patch in JSON.",
                  "format": {"type": "grammar", "syntax": "lark", "definition":
                             'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" '
                             'LF\nend_patch: "*** End Patch" LF?\nhunk: add_hunk | delete_hunk '
                             '| update_hunk\n' + _code(rng, 1200)}})
    items = [{"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "You are Codex, a coding agent.\n" + _code(rng, 9000)}]},
             {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<environment_context>\n  <cwd>/work/app</cwd>\n"
                                               "</environment_context>\nFix the failing test in "
                                               "relay/money and explain the cause."}]}]
    for step in _steps(rng, turns, output_size):
        cid = _id(rng, "call_", 24)
        items.append({"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": step["remark"]}]})
        items.append({"type": "function_call", "name": "exec_command", "call_id": cid,
                      "arguments": json.dumps({"cmd": json.dumps(step["input"]),
                                               "workdir": "/work/app"})})
        items.append({"type": "function_call_output", "call_id": cid, "output": step["output"]})
    return {"model": "gpt-5-codex", "input": items, "tools": tools, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
            "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "019a0000-0000-7000-8000-000000000000"}


def gemini(turns: int = 30, output_size: int = 1250, seed: int = 13) -> dict:
    rng = random.Random(seed)
    cc = claude_code(turns=1)
    decls = [{"name": t["name"], "description": t.get("description", "")[:2000],
              "parameters": {"type": "object", "properties": {
                  k: {"type": "string", "description": str(v.get("description", ""))[:300]}
                  for k, v in (t.get("input_schema") or {}).get("properties", {}).items()}}}
             for t in cc["tools"]]
    contents = [{"role": "user", "parts": [{"text": "Fix the failing test in relay/money."}]}]
    for step in _steps(rng, turns, output_size):
        contents.append({"role": "model", "parts": [
            {"text": step["remark"]},
            {"functionCall": {"name": step["tool"], "args": step["input"]}}]})
        contents.append({"role": "user", "parts": [
            {"functionResponse": {"name": step["tool"], "response": {"output": step["output"]}}}]})
    system = "\n".join(b.get("text", "") for b in cc.get("system") or [] if isinstance(b, dict))
    return {"systemInstruction": {"parts": [{"text": system}]}, "contents": contents,
            "tools": [{"functionDeclarations": decls}],
            "generationConfig": {"maxOutputTokens": 8192, "temperature": 1}}


if __name__ == "__main__":
    for name, make in (("claude_code", claude_code), ("codex", codex), ("gemini", gemini)):
        b = json.dumps(make(), separators=(",", ":"))
        print(f"{name}: {len(b):,} bytes, {b.count('{') + b.count('['):,} brackets")
