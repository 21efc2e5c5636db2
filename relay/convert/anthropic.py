"""Anthropic Messages <-> OpenAI chat: OpenAI requests for Anthropic,
whole answers and usage.

Anthropic requests (validation, conversion to OpenAI) are in
relay/convert/anthropic_request.py, re-exported here; streamed events in
relay/convert/anthropic_stream.py.
Anything one side cannot express is dropped rather than guessed (thinking
signatures, cache_control, server tools), so a converted request is always
one the other side accepts.
"""
from __future__ import annotations

import time
from typing import Any

from relay.convert.anthropic_request import request_to_openai, tool_call, validate  # noqa: F401
from relay.convert.common import (canonical_effort, new_id, openai_usage, parse_args,
                                  split_data_url, text_of)
from relay.money.pricing import Usage

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
    # Server tools Anthropic runs and bills per call (web fetches are billed
    # as tokens only).
    tools = u.get("server_tool_use")
    return Usage(prompt_tokens=n(u, "input_tokens") + read + written,
                 completion_tokens=n(u, "output_tokens"), cached_tokens=read,
                 cache_write_5m_tokens=written - w1h, cache_write_1h_tokens=w1h,
                 web_search_calls=n(tools, "web_search_requests"),
                 code_execution_calls=n(tools, "code_execution_requests"),
                 service_tier=str(u.get("service_tier") or ""))


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


# ---- requests: OpenAI -> Anthropic -------------------------------------------
# Anthropic's thinking budget for each canonical effort (1024 is its
# minimum; "minimal" means no thinking at all there).
BUDGET_FOR_EFFORT = {"low": 1024, "medium": 4096, "high": 16384}
MIN_BUDGET = 1024


def _blocks_from_openai_content(content: Any) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for p in content:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind in ("text", "input_text"):
            blocks.append({"type": "text", "text": p.get("text", "")})
        elif kind == "image_url":
            url = (p.get("image_url") or {}).get("url", "")
            parsed = split_data_url(url)
            if parsed:
                blocks.append({"type": "image", "source": {"type": "base64",
                                                           "media_type": parsed[0],
                                                           "data": parsed[1]}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
        elif kind == "file":
            parsed = split_data_url((p.get("file") or {}).get("file_data", ""))
            if parsed:
                blocks.append({"type": "document", "source": {
                    "type": "base64", "media_type": parsed[0], "data": parsed[1]}})
    return blocks


def _append(out: list[dict], role: str, blocks: list[dict]) -> None:
    """Anthropic wants user and assistant turns to alternate: merge runs."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _add_thinking(out: dict, effort: str | None) -> None:
    """Canonical reasoning_effort -> Anthropic extended thinking, where
    Anthropic's rules allow it: a budget of at least 1024 tokens below
    max_tokens, no forced tool, and no tool loop in progress (its
    assistant turn would have to start with a signed thinking block, which
    a converted conversation does not have).  Thinking also fixes
    temperature at 1 and rules out top_k and a top_p under 0.95."""
    budget = BUDGET_FOR_EFFORT.get(effort or "")
    if budget is None:
        return
    budget = min(budget, out["max_tokens"] - 1)
    if budget < MIN_BUDGET or (out.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return
    last = next((m for m in reversed(out["messages"]) if m["role"] == "assistant"), None)
    if last and any(b.get("type") == "tool_use" for b in last["content"]):
        return
    out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    out.pop("temperature", None)
    if out.get("top_p") is not None and not 0.95 <= out["top_p"] <= 1:
        out.pop("top_p")


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
    _add_thinking(out, canonical_effort(body.get("reasoning_effort")))
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
            calls.append(tool_call(b))
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
