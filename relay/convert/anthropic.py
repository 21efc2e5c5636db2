"""Anthropic Messages <-> OpenAI chat: requests, whole answers and usage.

The streamed events are converted in relay/convert/anthropic_stream.py.
Anything one side cannot express is dropped rather than guessed (thinking
signatures, cache_control, server tools), so a converted request is always
one the other side accepts.
"""
from __future__ import annotations

import json
import time
from typing import Any

from relay.convert.common import new_id, openai_usage, parse_args, split_data_url, text_of
from relay.errors import bad_request
from relay.pricing import Usage

STOP_TO_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop",
                  "model_context_window_exceeded": "length"}
FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                  "function_call": "tool_use", "content_filter": "refusal"}


# ---- usage -----------------------------------------------------------------
def usage_from(u: dict | None) -> Usage | None:
    """Anthropic usage -> ours.  Anthropic's input_tokens excludes the tokens
    read from and written to the cache, which are input all the same: the
    prompt is their sum, cached_tokens the part read, and the writes are
    split by lifetime (`cache_creation`: ephemeral_5m/1h_input_tokens; a
    write without the split is a 5-minute one, the default).  Each token is
    billed once: a write at the write price only, a read at the read price."""
    if not isinstance(u, dict):
        return None

    def n(d, key) -> int:
        v = d.get(key) if isinstance(d, dict) else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0

    read, written = n(u, "cache_read_input_tokens"), n(u, "cache_creation_input_tokens")
    split = u.get("cache_creation")
    w1h = min(n(split, "ephemeral_1h_input_tokens"), written)
    return Usage(prompt_tokens=n(u, "input_tokens") + read + written,
                 completion_tokens=n(u, "output_tokens"), cached_tokens=read,
                 cache_write_5m_tokens=written - w1h, cache_write_1h_tokens=w1h)


def usage_to(prompt: int, completion: int, cached: int = 0) -> dict:
    """Our counts -> an Anthropic usage object."""
    cached = min(cached, prompt)
    return {"input_tokens": prompt - cached, "output_tokens": completion,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def usage_to_from_openai(u: dict | None) -> dict:
    u = u or {}
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return usage_to(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0), cached)


def usage_to_openai(u: dict | None) -> dict:
    got = usage_from(u) or Usage()
    return openai_usage(got.prompt_tokens, got.completion_tokens, got.cached_tokens)


# ---- requests: Anthropic -> OpenAI -----------------------------------------
def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(b.get("text", "") for b in system
                         if isinstance(b, dict) and b.get("type") == "text")
    raise bad_request("'system' must be a string or an array of text blocks.", "invalid_system",
                      "system")


def _image_part(block: dict) -> dict:
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src.get('data', '')}"
    elif src.get("type") == "url":
        url = src.get("url", "")
    else:
        raise bad_request("An image source must be of type 'base64' or 'url'.", "invalid_image")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, dict) and b.get("type") == "text":
                out.append(b.get("text", ""))
            elif isinstance(b, dict) and b.get("type") == "image":
                out.append("[image]")
        return "\n".join(out)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _user_messages(content: Any) -> list[dict]:
    """One Anthropic user turn -> OpenAI messages: tool results become tool
    messages (first, as OpenAI wants them right after the tool calls), the
    rest one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools, parts = [], []
    for b in content:
        kind = b.get("type")
        if kind == "tool_result":
            text = _tool_result_text(b.get("content"))
            if b.get("is_error"):
                text = "Error: " + text
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        elif kind == "image":
            parts.append(_image_part(b))
        elif kind == "document":
            src = b.get("source") or {}
            if src.get("type") == "text":
                parts.append({"type": "text", "text": src.get("data", "")})
    out = list(tools)
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: Any) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for b in content:
        kind = b.get("type")
        if kind == "text":
            texts.append(b.get("text", ""))
        elif kind == "tool_use":
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": b.get("name", ""),
                                       "arguments": json.dumps(b.get("input") or {},
                                                               ensure_ascii=False)}})
    msg: dict = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_choice_to_openai(tc: Any) -> Any:
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": tc.get("name", "")}}
    if kind == "none":
        return "none"
    return "auto"


def validate(doc: dict) -> None:
    """The checks Anthropic itself makes, so a bad call fails here with a
    clear message instead of upstream with a vague one."""
    if not isinstance(doc.get("max_tokens"), int) or isinstance(doc.get("max_tokens"), bool) \
            or doc["max_tokens"] < 1:
        raise bad_request("max_tokens: Field required (a positive integer).", "invalid_max_tokens",
                          "max_tokens")
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages: must be a non-empty array.", "missing_messages", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"messages.{i}.role: must be 'user' or 'assistant'.", "invalid_role",
                              "messages")
        c = m.get("content")
        if not isinstance(c, str) and not (isinstance(c, list) and all(
                isinstance(b, dict) and isinstance(b.get("type"), str) for b in c)):
            raise bad_request(f"messages.{i}.content: must be a string or an array of blocks.",
                              "invalid_content", "messages")
    _system_text(doc.get("system"))


def request_to_openai(doc: dict) -> dict:
    """A validated Anthropic Messages request -> an OpenAI chat request."""
    messages: list[dict] = []
    system = _system_text(doc.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for m in doc["messages"]:
        if m["role"] == "user":
            messages += _user_messages(m["content"])
        else:
            messages.append(_assistant_message(m["content"]))
    body: dict = {"model": doc.get("model"), "messages": messages,
                  "max_tokens": doc["max_tokens"]}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p")):
        if doc.get(src) is not None:
            body[dst] = doc[src]
    if doc.get("stop_sequences"):
        body["stop"] = list(doc["stop_sequences"])
    if doc.get("stream"):
        body["stream"] = True
    tools = [t for t in doc.get("tools") or () if isinstance(t, dict) and "input_schema" in t]
    if tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.get("name", ""), "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
            for t in tools]
        tc = doc.get("tool_choice")
        if tc:
            body["tool_choice"] = _tool_choice_to_openai(tc)
            if tc.get("disable_parallel_tool_use"):
                body["parallel_tool_calls"] = False
    user = (doc.get("metadata") or {}).get("user_id")
    if user:
        body["user"] = str(user)
    return body


# ---- requests: OpenAI -> Anthropic -----------------------------------------
def _blocks_from_openai_content(content: Any) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") in ("text", "input_text"):
            blocks.append({"type": "text", "text": p.get("text", "")})
        elif p.get("type") == "image_url":
            url = (p.get("image_url") or {}).get("url", "")
            parsed = split_data_url(url)
            if parsed:
                blocks.append({"type": "image", "source": {"type": "base64",
                                                           "media_type": parsed[0],
                                                           "data": parsed[1]}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def _append(out: list[dict], role: str, blocks: list[dict]) -> None:
    """Anthropic wants user and assistant turns to alternate: merge runs."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def request_from_openai(body: dict, model: str, default_max_tokens: int = 4096) -> dict:
    """An OpenAI chat request -> an Anthropic Messages request for `model`."""
    system, messages = [], []
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(text_of(m.get("content")))
        elif role == "user":
            _append(messages, "user", _blocks_from_openai_content(m.get("content")))
        elif role == "assistant":
            blocks = _blocks_from_openai_content(m.get("content"))
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                blocks.append({"type": "tool_use", "id": tc.get("id") or new_id("toolu_"),
                               "name": fn.get("name", ""), "input": parse_args(fn.get("arguments"))})
            _append(messages, "assistant", blocks)
        elif role in ("tool", "function"):
            _append(messages, "user", [{"type": "tool_result",
                                        "tool_use_id": m.get("tool_call_id", ""),
                                        "content": text_of(m.get("content"))}])
    out: dict = {"model": model, "messages": messages,
                 "max_tokens": int(body.get("max_completion_tokens") or body.get("max_tokens")
                                   or default_max_tokens)}
    if system:
        out["system"] = "\n".join(s for s in system if s)
    if body.get("temperature") is not None:
        out["temperature"] = min(float(body["temperature"]), 1.0)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("stream"):
        out["stream"] = True
    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("function")]
    if tools:
        out["tools"] = [{"name": t["function"].get("name", ""),
                         "description": t["function"].get("description", ""),
                         "input_schema": t["function"].get("parameters")
                         or {"type": "object", "properties": {}}} for t in tools]
        tc = body.get("tool_choice")
        choice = None
        if tc == "required":
            choice = {"type": "any"}
        elif tc == "none":
            choice = {"type": "none"}
        elif isinstance(tc, dict):
            choice = {"type": "tool", "name": (tc.get("function") or {}).get("name", "")}
        elif tc == "auto" or body.get("parallel_tool_calls") is False:
            choice = {"type": "auto"}
        if choice is not None:
            if body.get("parallel_tool_calls") is False and choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
            out["tool_choice"] = choice
    if body.get("user"):
        out["metadata"] = {"user_id": str(body["user"])}
    return out


# ---- answers ---------------------------------------------------------------
def message_to_openai(msg: dict, model: str | None = None) -> dict:
    """A whole Anthropic message -> an OpenAI chat.completion."""
    texts, calls, thinking = [], [], []
    for b in msg.get("content") or ():
        kind = b.get("type")
        if kind == "text":
            texts.append(b.get("text", ""))
        elif kind == "tool_use":
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": b.get("name", ""),
                                       "arguments": json.dumps(b.get("input") or {},
                                                               ensure_ascii=False)}})
        elif kind == "thinking":
            thinking.append(b.get("thinking", ""))
    message: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return {"id": msg.get("id") or new_id("chatcmpl-"), "object": "chat.completion",
            "created": int(time.time()), "model": model or msg.get("model", ""),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": STOP_TO_FINISH.get(msg.get("stop_reason"), "stop")}],
            "usage": usage_to_openai(msg.get("usage"))}


def message_from_openai(doc: dict, model: str) -> dict:
    """A whole OpenAI chat.completion -> an Anthropic message."""
    choice = (doc.get("choices") or [{}])[0]
    m = choice.get("message") or {}
    content: list[dict] = []
    if m.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
    text = text_of(m.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        content.append({"type": "tool_use", "id": tc.get("id") or new_id("toolu_"),
                        "name": fn.get("name", ""), "input": parse_args(fn.get("arguments"))})
    if not content:
        content.append({"type": "text", "text": ""})
    finish = choice.get("finish_reason")
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": FINISH_TO_STOP.get(finish, "end_turn"),
            "stop_sequence": None, "usage": usage_to_from_openai(doc.get("usage"))}
