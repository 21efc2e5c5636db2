"""The scripted model turn the fakes play for coding agents.

When a coding agent offers its shell tool (Codex: `exec_command` with a
`cmd`; older Codex: `shell` with a `command` array) and no tool result has
come back yet, the model asks it to print secret.txt from its workspace;
once the result is back it answers with what the tool printed, so a test
can see the secret make the whole round trip.  Any other function tool is
called once with {"city": "Paris"} (the fakes' usual weather call).

Each fake format has a small adapter here, so the fakes themselves keep
their own shapes: Responses items, chat messages, Anthropic blocks, Gemini
parts.
"""
from __future__ import annotations

SECRET_FILE = "secret.txt"
SHELL_CALLS = {"exec_command": {"cmd": f"cat {SECRET_FILE}"},
               "shell": {"command": ["cat", SECRET_FILE]}}


def choose(names: list[str], had_result: bool, choice_none: bool):
    """(tool name, arguments) to call, or None to answer in text."""
    if had_result or choice_none or not names:
        return None
    for name, args in SHELL_CALLS.items():
        if name in names:
            return name, args
    return names[0], {"city": "Paris"}


def answer(result: str) -> str:
    return f"The tool said: {result}"


# ---- Responses items ---------------------------------------------------------
def plan_call(tools: list, items: list, tool_choice=None):
    names = [t.get("name") for t in tools if isinstance(t, dict) and t.get("type") == "function"]
    last_user = max((i for i, it in enumerate(items) if isinstance(it, dict)
                     and it.get("type", "message") == "message" and it.get("role") == "user"),
                    default=-1)
    had = any(isinstance(it, dict) and it.get("type") == "function_call_output"
              for it in items[last_user + 1:])
    return choose(names, had, tool_choice == "none")


# ---- chat messages (OpenAI chat fake) ----------------------------------------
def chat_plan(body: dict):
    names = [(t.get("function") or {}).get("name") for t in body.get("tools") or ()]
    msgs = body.get("messages") or []
    had = bool(msgs) and msgs[-1].get("role") == "tool"
    return choose(names, had, body.get("tool_choice") == "none")


def chat_result(body: dict) -> str | None:
    msgs = body.get("messages") or []
    if msgs and msgs[-1].get("role") == "tool":
        c = msgs[-1].get("content")
        return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or ())
    return None


# ---- Anthropic blocks ---------------------------------------------------------
def anthropic_plan(body: dict):
    """(content blocks, stop_reason) for a Codex-style shell turn, or None."""
    names = [t.get("name") for t in body.get("tools") or ()]
    if not any(n in SHELL_CALLS for n in names):
        return None
    last = (body.get("messages") or [{}])[-1]
    results = [b for b in last.get("content") or () if isinstance(last.get("content"), list)
               and isinstance(b, dict) and b.get("type") == "tool_result"]
    if results:
        c = results[-1].get("content")
        text = c if isinstance(c, str) else "".join(b.get("text", "") for b in c or ())
        return [{"type": "text", "text": answer(text)}], "end_turn"
    name, args = choose(names, False, False)
    return [{"type": "text", "text": "Reading the file."},
            {"type": "tool_use", "id": "toolu_script1", "name": name, "input": args}], "tool_use"


# ---- Gemini parts ------------------------------------------------------------
def gemini_plan(body: dict):
    """(parts, finishReason) for a Codex-style shell turn, or None."""
    decls = [d.get("name") for t in body.get("tools") or ()
             for d in t.get("functionDeclarations") or ()]
    if not any(n in SHELL_CALLS for n in decls):
        return None
    last = (body.get("contents") or [{}])[-1]
    results = [p["functionResponse"] for p in last.get("parts") or () if "functionResponse" in p]
    if results:
        resp = results[-1].get("response") or {}
        text = resp.get("content") or resp.get("output") or resp.get("result") or str(resp)
        return [{"text": answer(str(text))}], "STOP"
    name, args = choose(decls, False, False)
    return [{"functionCall": {"name": name, "args": args}}], "STOP"


def offers_shell(body: dict) -> bool:
    """A chat request from a coding agent (its shell tool is offered)."""
    return any((t.get("function") or {}).get("name") in SHELL_CALLS
               for t in body.get("tools") or () if isinstance(t, dict))
