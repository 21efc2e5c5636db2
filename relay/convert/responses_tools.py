"""Responses tools <-> chat function tools, for the bridge to chat channels.

Function tools map one to one.  Namespaced tools are flattened to
"<namespace>__<name>".  A custom (freeform) tool, which Codex CLI sends for
apply_patch, takes raw text rather than JSON arguments: a chat channel gets
it as a function with one required string parameter `input`, whose
description carries the tool's grammar so that the model knows what to
write; the model's call is unwrapped back into a custom_tool_call.

What a chat channel cannot run is named in `problems`: tools OpenAI runs on
its own side ("hosted tool ..."), and tool types whose calls only OpenAI's
models make ("OpenAI built-in tool ...").  Offered, they are left out of
the bridged call; forced by tool_choice, they are the client's 400
(relay/adaptors/base.refuse_unbridgeable, with the channel options that
change either).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from relay.convert.common import dumps, new_id
from relay.errors import bad_request

# Tools a client may send (openai-python's ToolParam).
KNOWN_TOOLS = frozenset({
    "function", "namespace", "custom", "file_search", "computer", "computer_use_preview",
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
    "mcp", "code_interpreter", "programmatic_tool_calling", "image_generation", "local_shell",
    "shell", "tool_search", "apply_patch"})
# Run by the client, but only OpenAI's models emit their call items.
BUILT_IN_TOOLS = frozenset({"local_shell", "shell", "apply_patch"})
HOSTED = "hosted tool"
BUILT_IN = "OpenAI built-in tool"
# Problems the channel option drop_hosted_tools drops rather than refuses.
DROPPABLE = (HOSTED, BUILT_IN, "tool_choice")
NS_SEP = "__"  # namespace tools are flattened to "<namespace>__<name>" for chat channels
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# A grammar longer than this is cut in the parameter's description: the
# model needs its shape, and a chat channel bills every character of it.
GRAMMAR_LIMIT = 8000


@dataclasses.dataclass
class ToolNames:
    """How the chat functions of a bridged call map back to Responses tools."""
    namespaced: dict = dataclasses.field(default_factory=dict)  # flat -> (namespace, name)
    custom: set = dataclasses.field(default_factory=set)        # chat names of custom tools


# ---- validation (every channel) --------------------------------------------
def validate_tool(tool: Any, where: str) -> None:
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        raise bad_request(f"Invalid tool '{where}': expected an object with a 'type'.",
                          "invalid_type", where)
    kind = tool["type"]
    if kind not in KNOWN_TOOLS:
        raise bad_request(f"Invalid value: {kind!r}. '{where}.type' is not a known tool type.",
                          "invalid_value", f"{where}.type")
    if kind == "namespace":
        if not isinstance(tool.get("tools"), list):
            raise bad_request(f"'{where}.tools' must be an array.", "invalid_type", where)
        for j, inner in enumerate(tool["tools"]):
            validate_tool(inner, f"{where}.tools[{j}]")
    if kind not in ("function", "custom", "namespace"):
        return
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"Invalid '{where}.name': {name!r}. A tool name is 1 to 128 letters, "
                          "digits, '_', '-', '.' or ':'.", "invalid_value", f"{where}.name")
    params = tool.get("parameters")
    if kind == "function" and params is not None and (
            not isinstance(params, dict) or params.get("type", "object") != "object"):
        raise bad_request(f"Invalid schema for function '{name}': the parameters must be a "
                          "JSON Schema of type 'object'.", "invalid_function_parameters",
                          f"{where}.parameters")
    if kind == "custom" and tool.get("format") is not None and not isinstance(
            tool["format"], dict):
        raise bad_request(f"Invalid type for '{where}.format': expected an object.",
                          "invalid_type", f"{where}.format")


# ---- requests: Responses tools -> chat functions ---------------------------
def tools_to_chat(tools: list, problems: list) -> tuple[list[dict], ToolNames]:
    out: list[dict] = []
    names = ToolNames()
    for t in tools:
        kind = t.get("type")
        if kind in ("function", "custom"):
            out.append(_one(t, t.get("name", ""), names))
        elif kind == "namespace":
            for inner in t.get("tools") or ():
                if inner.get("type") not in ("function", "custom"):
                    problems.append(f"tool '{inner.get('type')}' in namespace '{t.get('name')}'")
                    continue
                flat = f"{t.get('name')}{NS_SEP}{inner.get('name')}"
                names.namespaced[flat] = (t.get("name"), inner.get("name"))
                out.append(_one(inner, flat, names))
        elif kind in BUILT_IN_TOOLS or (kind == "tool_search" and t.get("execution") == "client"):
            problems.append(f"{BUILT_IN} '{kind}'")
        else:
            problems.append(f"{HOSTED} '{kind}'")
    return out, names


def _one(t: dict, name: str, names: ToolNames) -> dict:
    if t.get("type") == "custom":
        names.custom.add(name)
        params = {"type": "object", "properties": {"input": {
            "type": "string", "description": _input_hint(t.get("format"))}},
            "required": ["input"], "additionalProperties": False}
    else:
        params = t.get("parameters") or {"type": "object", "properties": {}}
    fn = {"name": name, "parameters": params}
    if t.get("description"):
        fn["description"] = t["description"]
    if t.get("strict") is not None:
        fn["strict"] = bool(t["strict"])
    return {"type": "function", "function": fn}


def _input_hint(fmt: Any) -> str:
    """What the model must put in `input`.  It goes in the parameter, not in
    the function's description, which some chat upstreams cap at 1024
    characters."""
    hint = ("The tool's whole input as one string: the raw text itself (for example a patch), "
            "exactly as the tool reads it, with no further wrapping.")
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return hint
    definition = str(fmt.get("definition") or "")
    if len(definition) > GRAMMAR_LIMIT:
        definition = (definition[:GRAMMAR_LIMIT]
                      + f"\n... (grammar truncated: {len(definition) - GRAMMAR_LIMIT} more "
                        "characters)")
    return f"{hint} It must match this {fmt.get('syntax') or 'lark'} grammar:\n{definition}"


def tool_choice_to_chat(tc: Any, problems: list, body: dict) -> Any:
    if tc is None or isinstance(tc, str):
        return tc
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind in ("function", "custom"):
        return {"type": "function", "function": {"name": tc.get("name", "")}}
    if kind == "allowed_tools":
        allowed = {t.get("name") for t in tc.get("tools") or () if isinstance(t, dict)}
        body["tools"] = [t for t in body.get("tools") or ()
                         if t["function"]["name"] in allowed]
        return "required" if tc.get("mode") == "required" else "auto"
    problems.append(f"tool_choice '{kind}'")
    return None


def call_to_chat(item: dict) -> dict:
    """A function_call or custom_tool_call input item -> a chat tool call."""
    name = item.get("name", "")
    if item.get("namespace"):
        name = f"{item['namespace']}{NS_SEP}{name}"
    if item.get("type") == "custom_tool_call":
        arguments = dumps({"input": item.get("input") or ""})
    else:
        arguments = item.get("arguments") or "{}"
    return {"id": item.get("call_id") or item.get("id") or new_id("call_"), "type": "function",
            "function": {"name": name, "arguments": arguments}}


# ---- answers: chat tool calls -> Responses items ---------------------------
def custom_input(arguments: str) -> str:
    """A custom tool's raw input from the chat call's arguments: the `input`
    member of the JSON object the model was asked for; the raw text when the
    model wrote something else."""
    try:
        doc = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    if isinstance(doc, dict) and "input" in doc:
        value = doc["input"]
        return value if isinstance(value, str) else dumps(value)
    if doc == {}:
        return ""
    return doc if isinstance(doc, str) else arguments


def call_item(call_id: str, name: str, arguments: str, names: ToolNames,
              item_id: str | None = None, status: str = "completed") -> dict:
    """A chat tool call -> a function_call item, or a custom_tool_call item
    (its input unwrapped) when the function stands for a custom tool."""
    if name in names.custom:
        item = {"id": item_id or new_id("ctc_"), "type": "custom_tool_call", "status": status,
                "call_id": call_id, "name": name, "input": custom_input(arguments)}
    else:
        item = {"id": item_id or new_id("fc_"), "type": "function_call", "status": status,
                "arguments": arguments, "call_id": call_id, "name": name}
    if name in names.namespaced:
        item["namespace"], item["name"] = names.namespaced[name]
    return item
