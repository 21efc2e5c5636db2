"""OpenAI Responses <-> the canonical chat shape: requests, whole answers, usage.

Used both ways: the Responses face bridges to channels that speak only
chat (anthropic, gemini, chat-only OpenAI-compatible upstreams), and the
OpenAI adaptor sends chat calls to channels that speak only Responses
(relay/convert/responses_upstream.py).  The streamed events are converted
in relay/convert/responses_stream.py.

What a chat channel cannot carry is named, not guessed: `Bridge.problems`
lists hosted tools and items a converted call would lose, and the adaptor
turns them into a 400 only when it actually has to bridge (a channel that
speaks Responses takes the client's body as it is).  Tools, custom
(freeform) ones included, are mapped in relay/convert/responses_tools.py.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import time
from typing import Any

from relay.convert import openai_usage
from relay.convert.common import dumps, new_id, text_of
from relay.convert.responses_tools import (ToolNames, call_item, call_to_chat, tool_choice_to_chat,
                                           tools_to_chat, validate_tool)
from relay.errors import bad_request
from relay.money.pricing import Usage

# Input item types the Responses API documents (openai-python's
# ResponseInputItemParam); anything else is the caller's 400.
KNOWN_ITEMS = frozenset({
    "message", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "function_call", "function_call_output", "tool_search_call", "tool_search_output",
    "additional_tools", "configuration_update", "reasoning", "compaction", "image_generation_call",
    "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "mcp_call", "custom_tool_call_output",
    "custom_tool_call", "compaction_trigger", "item_reference", "program", "program_output"})
ROLES = ("user", "assistant", "system", "developer")
# A compaction made on the bridge carries its summary readably, behind this
# mark, in the item's encrypted_content (OpenAI's own are opaque).
SUMMARY_MARK = "relay-summary:"


# ---- compactions on the bridge --------------------------------------------
def compaction_item(summary: str) -> dict:
    """The one output item of a compaction made on the bridge."""
    return {"id": new_id("cmp_"), "type": "compaction",
            "encrypted_content": SUMMARY_MARK + base64.b64encode(summary.encode()).decode()}


def summary_of(item: dict) -> str | None:
    """The summary in a compaction item made on the bridge; None for another's."""
    sealed = item.get("encrypted_content")
    if not isinstance(sealed, str) or not sealed.startswith(SUMMARY_MARK):
        return None
    try:
        return base64.b64decode(sealed[len(SUMMARY_MARK):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def wants_compaction(doc: dict) -> bool:
    """A call whose last input item is a compaction_trigger (Codex's newer
    compaction: an ordinary /v1/responses call answered by one compaction item)."""
    items = items_of(doc)
    return bool(items) and isinstance(items[-1], dict) and \
        items[-1].get("type") == "compaction_trigger"


# ---- usage -----------------------------------------------------------------
def usage_from(u: Any) -> Usage | None:
    """The Responses usage object (response.completed, .incomplete, .failed,
    a whole response, a compaction) -> ours, every component read by the
    one OpenAI usage reader."""
    return openai_usage.usage_from(u) if isinstance(u, dict) else None




# Output items of tools OpenAI runs and bills per call, and the Usage field of each.
_TOOL_ITEMS = {"web_search_call": "web_search_calls", "file_search_call": "file_search_calls"}


def billed_usage(resp: Any) -> Usage | None:
    """A whole Response's usage with what else it is billed by: its hosted
    tool calls (web and file searches per call; code interpreter per
    container) and the service tier it ran in."""
    if not isinstance(resp, dict):
        return None
    u = usage_from(resp.get("usage"))
    if u is None:
        return None
    containers = set()
    for item in resp.get("output") or ():
        if not isinstance(item, dict):
            continue
        field = _TOOL_ITEMS.get(item.get("type"))
        if field:
            setattr(u, field, getattr(u, field) + 1)
        elif item.get("type") == "code_interpreter_call":
            containers.add(item.get("container_id") or item.get("id"))
    u.code_execution_calls = len(containers)
    u.service_tier = str(resp.get("service_tier") or "")
    return u


def usage_doc(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


def usage_doc_from_chat(u: dict | None) -> dict | None:
    if not isinstance(u, dict):
        return None
    return usage_doc(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0),
                     int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                     int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0))


def chat_usage_from_doc(u: dict | None) -> dict | None:
    if not isinstance(u, dict):
        return None
    got = usage_from(u)
    return {"prompt_tokens": got.prompt_tokens, "completion_tokens": got.completion_tokens,
            "total_tokens": got.prompt_tokens + got.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": got.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": int(
                (u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)}}


# ---- validation (every channel) --------------------------------------------
def items_of(doc: dict) -> list:
    inp = doc.get("input")
    if inp is None:
        return []
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": inp}]
    return inp


_JSON_TYPES = {dict: "an object", bool: "a boolean", int: "a number", float: "a number"}


def validate(doc: dict) -> None:
    """The frame checks OpenAI makes, so that a bad call fails the same way
    on every channel type."""
    inp = doc.get("input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise bad_request("'input' must be a string or an array of input items.",
                          "invalid_type", "input")
    for i, item in enumerate(items_of(doc)):
        if not isinstance(item, dict):
            raise bad_request(f"Invalid type for 'input[{i}]': expected an object.",
                              "invalid_type", f"input[{i}]")
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in KNOWN_ITEMS:
            raise bad_request(f"Invalid value: {kind!r}. 'input[{i}].type' must be one of the "
                              f"documented input item types, e.g. 'message', 'function_call', "
                              f"'function_call_output', 'reasoning'.", "invalid_value",
                              f"input[{i}].type")
        if kind == "message" and item.get("role") not in ROLES:
            raise bad_request(f"Invalid value: {item.get('role')!r}. 'input[{i}].role' must be "
                              f"one of {', '.join(ROLES)}.", "invalid_value", f"input[{i}].role")
        content = item.get("content")
        if kind == "message" and content is not None and not isinstance(content, (str, list)):
            # The bridge would read an object's keys as its parts: an empty turn.
            raise bad_request(f"Invalid type for 'input[{i}].content': expected one of a string "
                              f"or an array of content parts, but got "
                              f"{_JSON_TYPES.get(type(content), 'a value')} instead.",
                              "invalid_type", f"input[{i}].content")
        if kind in ("function_call_output", "custom_tool_call_output") and not isinstance(
                item.get("call_id"), str):
            raise bad_request(f"Missing required parameter: 'input[{i}].call_id'.",
                              "missing_required_parameter", f"input[{i}].call_id")
        if kind == "custom_tool_call":
            _validate_custom_call(item, f"input[{i}]")
    tools = doc.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array.", "invalid_type", "tools")
    for i, tool in enumerate(tools or ()):
        validate_tool(tool, f"tools[{i}]")
    fmt = (doc.get("text") or {}).get("format") if isinstance(doc.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict) or not isinstance(fmt.get("name"), str):
            raise bad_request("'text.format' of type json_schema needs a 'name' and a 'schema' "
                              "object.", "invalid_value", "text.format")
    mot = doc.get("max_output_tokens")
    if mot is not None and (not isinstance(mot, int) or isinstance(mot, bool) or mot < 1):
        raise bad_request("'max_output_tokens' must be a positive integer.", "invalid_value",
                          "max_output_tokens")


def _validate_custom_call(item: dict, where: str) -> None:
    for key in ("call_id", "name", "input"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"Invalid or missing '{where}.{key}': expected a string.",
                              "invalid_type" if key in item else "missing_required_parameter",
                              f"{where}.{key}")


# ---- requests: Responses -> canonical chat ---------------------------------
@dataclasses.dataclass
class Bridge:
    """A Responses request converted for a chat channel, and what it lost."""
    body: dict
    problems: list    # human-readable names of what a chat channel cannot carry
    names: ToolNames  # how the chat functions map back to Responses tools


def _content_parts(content: Any, problems: list) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for p in content:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            parts.append({"type": "text", "text": str(p.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(p.get("refusal", ""))})
        elif kind == "input_image":
            url = p.get("image_url")
            if not url:
                problems.append("input_image by file_id")
                continue
            image = {"url": url}
            if p.get("detail") in ("low", "high", "auto"):
                image["detail"] = p["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            if p.get("file_data"):
                parts.append({"type": "file", "file": {"file_data": p["file_data"],
                                                       "filename": p.get("filename") or "file"}})
            else:
                problems.append("input_file by file_id or file_url")
        else:
            problems.append(f"content part '{kind}'")
    if parts and all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_output(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output
                       if isinstance(p, dict) and p.get("type") in ("input_text", "output_text"))
    return dumps(output)


def _messages(items: list, problems: list) -> list[dict]:
    out: list[dict] = []

    def assistant() -> dict:
        # Consecutive assistant text and function calls are one chat turn.
        if out and out[-1]["role"] == "assistant":
            return out[-1]
        msg = {"role": "assistant", "content": None}
        out.append(msg)
        return msg

    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = _content_parts(item.get("content"), problems)
            if role == "assistant":
                msg = assistant()
                if msg.get("tool_calls"):  # text after calls starts a new turn
                    msg = {"role": "assistant", "content": None}
                    out.append(msg)
                msg["content"] = (msg["content"] or "") + text_of(content)
            else:
                out.append({"role": "system" if role == "developer" else role,
                            "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            assistant().setdefault("tool_calls", []).append(call_to_chat(item))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                        "content": _tool_output(item.get("output"))})
        elif kind == "reasoning":
            continue  # opaque to other vendors (encrypted or summarised); dropped
        elif kind == "compaction_trigger":
            continue  # the call is a compaction (relay/faces/responses.continue_from)
        elif kind == "compaction" and summary_of(item) is not None:
            out.append({"role": "user", "content": summary_of(item)})
        else:
            problems.append(f"input item '{kind}'")
    return out


def request_to_chat(doc: dict, history: list | None = None) -> Bridge:
    """A validated Responses request (plus the items of the conversation it
    continues, if any) -> a canonical chat request."""
    problems: list[str] = []
    messages: list[dict] = []
    instr = doc.get("instructions")
    if isinstance(instr, str) and instr:
        messages.append({"role": "system", "content": instr})
    elif isinstance(instr, list):
        messages += _messages(instr, problems)
    messages += _messages(list(history or ()) + items_of(doc), problems)
    body: dict = {"model": doc.get("model"), "messages": messages}
    if doc.get("stream"):
        body["stream"] = True
    if doc.get("max_output_tokens"):
        body["max_tokens"] = doc["max_output_tokens"]
    for key in ("temperature", "top_p", "parallel_tool_calls", "service_tier"):
        if doc.get(key) is not None:
            body[key] = doc[key]
    user = doc.get("safety_identifier") or doc.get("user")
    if user:
        body["user"] = str(user)
    effort = (doc.get("reasoning") or {}).get("effort") if isinstance(doc.get("reasoning"),
                                                                      dict) else None
    if effort:
        body["reasoning_effort"] = effort
    tools, names = tools_to_chat(doc.get("tools") or [], problems)
    if tools:
        body["tools"] = tools
    else:  # OpenAI refuses parallel_tool_calls without tools
        body.pop("parallel_tool_calls", None)
    choice = tool_choice_to_chat(doc.get("tool_choice"), problems, body)
    if choice is not None and body.get("tools"):
        body["tool_choice"] = choice
    fmt = ((doc.get("text") or {}).get("format") or {}) if isinstance(doc.get("text"), dict) else {}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name"), "schema": fmt.get("schema")}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    return Bridge(body, problems, names)


# ---- answers: canonical chat -> a Responses object -------------------------
def response_shell(doc: dict, rid: str, model: str, created: int | None = None) -> dict:
    """A Response object echoing the request, before any output."""
    reasoning = doc.get("reasoning") if isinstance(doc.get("reasoning"), dict) else {}
    return {"id": rid, "object": "response", "created_at": created or int(time.time()),
            "status": "in_progress", "background": False, "error": None,
            "incomplete_details": None, "instructions": doc.get("instructions"),
            "max_output_tokens": doc.get("max_output_tokens"), "max_tool_calls": None,
            "model": model, "output": [], "parallel_tool_calls": doc.get("parallel_tool_calls",
                                                                           True),
            "previous_response_id": doc.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default", "store": doc.get("store") is not False,
            "temperature": doc.get("temperature", 1.0),
            "text": doc.get("text") if isinstance(doc.get("text"), dict)
            else {"format": {"type": "text"}},
            "tool_choice": doc.get("tool_choice", "auto"), "tools": doc.get("tools") or [],
            "top_p": doc.get("top_p", 1.0), "truncation": doc.get("truncation", "disabled"),
            "usage": None, "user": doc.get("user"), "metadata": doc.get("metadata") or {}}


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"id": item_id or new_id("msg_"), "type": "message", "status": status,
            "role": "assistant", "content": [output_text(text)] if status == "completed" else []}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(text: str, item_id: str | None = None) -> dict:
    return {"id": item_id or new_id("rs_"), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if text else []}


def finish_status(finish: str | None) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_from_chat(completion: dict, shell: dict, names: ToolNames) -> dict:
    """A whole canonical chat.completion -> the finished Response object."""
    choice = (completion.get("choices") or [{}])[0]
    m = choice.get("message") or {}
    output = []
    if m.get("reasoning_content"):
        output.append(reasoning_item(m["reasoning_content"]))
    text = text_of(m.get("content"))
    if text or not m.get("tool_calls"):
        output.append(message_item(text))
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        output.append(call_item(tc.get("id") or new_id("call_"), fn.get("name", ""),
                                fn.get("arguments") or "{}", names))
    status, details = finish_status(choice.get("finish_reason"))
    return dict(shell, status=status, incomplete_details=details, output=output,
                usage=usage_doc_from_chat(completion.get("usage")),
                completed_at=int(time.time()) if status == "completed" else None)
