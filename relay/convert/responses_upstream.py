"""A chat call sent to a channel that speaks only the Responses API
(`wire_api: "responses"`): the canonical chat request -> a Responses
request, and a whole Response -> a canonical chat.completion.  The events
are converted by relay/convert/responses_stream.py (EventsToChunks).
"""
from __future__ import annotations

import time
from typing import Any

from relay.convert.common import new_id, text_of
from relay.convert.responses import chat_usage_from_doc


def _parts_to_input(content: Any, role: str) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    kind = "output_text" if role == "assistant" else "input_text"
    out = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") in ("text", "input_text"):
            out.append({"type": kind, "text": p.get("text", "")})
        elif p.get("type") == "image_url":
            img = p.get("image_url") or {}
            out.append({"type": "input_image", "image_url": img.get("url", ""),
                        "detail": img.get("detail", "auto")})
        elif p.get("type") == "file":
            f = p.get("file") or {}
            out.append({"type": "input_file", "file_data": f.get("file_data", ""),
                        "filename": f.get("filename", "file")})
    return out


def request_from_chat(body: dict, model: str) -> dict:
    """A canonical chat request -> a Responses request for `model` (store
    off: a chat client keeps its own history)."""
    instructions, items = [], []
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer") and not items:
            instructions.append(text_of(m.get("content")))
        elif role in ("system", "developer", "user"):
            items.append({"type": "message", "role": "developer" if role == "system" else role,
                          "content": _parts_to_input(m.get("content"), role)})
        elif role == "assistant":
            text = text_of(m.get("content"))
            if text:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                items.append({"type": "function_call", "call_id": tc.get("id", ""),
                              "name": fn.get("name", ""), "arguments": fn.get("arguments") or ""})
        elif role in ("tool", "function"):
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                          "output": text_of(m.get("content"))})
    out: dict = {"model": model, "input": items, "store": False}
    if instructions:
        out["instructions"] = "\n".join(instructions)
    if body.get("stream"):
        out["stream"] = True
    mt = body.get("max_completion_tokens") or body.get("max_tokens")
    if mt:
        out["max_output_tokens"] = mt
    for key in ("temperature", "top_p", "parallel_tool_calls", "user", "service_tier",
                "metadata"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("reasoning_effort"):
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    tools = [t["function"] for t in body.get("tools") or ()
             if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if tools:
        out["tools"] = [dict({"type": "function", "name": f.get("name", ""),
                              "parameters": f.get("parameters") or {"type": "object",
                                                                    "properties": {}}},
                             **({"description": f["description"]} if f.get("description") else {}),
                             **({"strict": f["strict"]} if f.get("strict") is not None else {}))
                        for f in tools]
        tc = body.get("tool_choice")
        if isinstance(tc, dict):
            out["tool_choice"] = {"type": "function",
                                  "name": (tc.get("function") or {}).get("name", "")}
        elif tc:
            out["tool_choice"] = tc
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        js = rf.get("json_schema") or {}
        out["text"] = {"format": dict({"type": "json_schema"}, **js)}
    elif rf.get("type") == "json_object":
        out["text"] = {"format": {"type": "json_object"}}
    return out


def response_to_chat(resp: dict, model: str) -> dict:
    """A whole Response object -> a canonical chat.completion."""
    texts, calls, thinking = [], [], []
    for item in resp.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            texts += [p.get("text") or p.get("refusal") or "" for p in item.get("content") or ()]
        elif kind == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name", ""),
                                       "arguments": item.get("arguments") or ""}})
        elif kind == "reasoning":
            thinking += [s.get("text", "") for s in (item.get("summary") or [])
                         + (item.get("content") or [])]
    message: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls
                     else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return {"id": resp.get("id") or new_id("chatcmpl-"), "object": "chat.completion",
            "created": int(resp.get("created_at") or time.time()), "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": chat_finish(resp, bool(calls))}],
            "usage": chat_usage_from_doc(resp.get("usage"))}


def chat_finish(resp: dict, called: bool) -> str:
    reason = (resp.get("incomplete_details") or {}).get("reason")
    if reason == "max_output_tokens":
        return "length"
    if reason == "content_filter":
        return "content_filter"
    return "tool_calls" if called else "stop"
