"""OpenAI's Responses API on the fake OpenAI upstream (routes added by
tests/fakes/openai_upstream.py), built from the documented wire format:
openai-python's types/responses (Response, ResponseStreamEvent and the
create/compact/input_tokens params) and the API reference.

    POST   /v1/responses                   create, streamed (SSE, named events with
                                           sequence_number) or not
    GET    /v1/responses/{id}              stored responses (store not false)
    DELETE /v1/responses/{id}
    POST   /v1/responses/{id}/cancel       background responses only
    GET    /v1/responses/{id}/input_items
    POST   /v1/responses/input_tokens
    POST   /v1/responses/compact           -> response.compaction with a compaction item

Like OpenAI it refuses unknown top-level parameters, unknown input item
types and an unknown previous_response_id (400), `reasoning.effort` on a
model that does not reason and, on gpt-4o, `max_output_tokens` over 16384
(model_refuses, shared with the chat fake), and 404s unknown ids.

The answer follows tests/fakes/agent_script.py: a function call while
function tools are offered and no function_call_output follows the last
user message (`fake.tool_plan` picks it; else Codex's exec_command reads the
secret file, else the first tool), then text quoting the output; a call whose last input item is a
compaction_trigger gets one compaction item; otherwise
text (`fake_text` in metadata, else the default).  A custom (freeform) tool
is called with a custom_tool_call whose input is the plan's "input" string,
streamed as response.custom_tool_call_input.delta pieces and .done.  A reasoning item comes
first when metadata `fake_reasoning` is set.  Usage: input 30 (10 cached), output 6 (2 of them
reasoning when there is a reasoning item), or metadata `fake_usage`
"input,cached,output,reasoning".

Failure modes, by path prefix `/mode/<name>` (FakeOpenAI's: 429, 500, hang,
flaky, slow, reset = cut mid-stream) or by metadata `fake_fail`:
    incomplete    status incomplete (max_output_tokens), response.incomplete
    failed        response.failed with an error and partial usage
    cut           the connection reset after two deltas (no final event)
    error_event   an `error` event mid-stream, then the stream ends
    chatonly      (path mode) this upstream has no /v1/responses: 404
"""
from __future__ import annotations

import asyncio
import json
import re
import secrets
import time

from tornado.iostream import StreamClosedError

from tests.fakes.agent_script import next_turn
from tests.fakes.server import reset_connection

DEFAULT_TEXT = "Hello from the fake Responses upstream."
# o1, o3, o4-mini, gpt-5...: the models that take a reasoning effort.
REASONING_MODELS = re.compile(r"^(o\d|gpt-5)")
# Their most completion tokens, for the models whose limit the fakes know.
OUTPUT_LIMITS = {"gpt-4o": 16384}
# ResponseCreateParams, plus the fields Codex CLI adds.
CREATE_PARAMS = frozenset({
    "access_programs", "background", "background_options", "context_management", "conversation",
    "image", "include", "input", "instructions", "max_output_tokens", "max_tool_calls",
    "metadata", "model", "moderation", "parallel_tool_calls", "previous_response_id", "prompt",
    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning",
    "safety_identifier", "service_tier", "store", "stream", "stream_options", "temperature",
    "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    "client_metadata"})
ITEM_TYPES = frozenset({
    "message", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "function_call", "function_call_output", "tool_search_call", "tool_search_output",
    "additional_tools", "configuration_update", "reasoning", "compaction",
    "image_generation_call", "code_interpreter_call", "local_shell_call",
    "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
    "mcp_call", "custom_tool_call_output", "custom_tool_call", "compaction_trigger",
    "item_reference", "program", "program_output"})


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(10)


def _error(handler, status, message, param=None, code=None, type_="invalid_request_error"):
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish({"error": {"message": message, "type": type_, "param": param, "code": code}})


def _items(doc: dict) -> list:
    inp = doc.get("input")
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                 "text": inp}]}]
    return list(inp or [])


def model_refuses(model: str, effort_field, limit) -> tuple[str, str, str] | None:
    """(message, type, code) of OpenAI's 400 for what `model` does not take:
    a reasoning effort (`effort_field` names it, when sent) on a model that
    does not reason, or an output limit over the model's; else None."""
    if effort_field and not REASONING_MODELS.match(model):
        return (f"Unsupported parameter: '{effort_field}' is not supported with this model.",
                "invalid_request_error", "unsupported_parameter")
    most = next((n for prefix, n in OUTPUT_LIMITS.items() if model.startswith(prefix)), None)
    if most and isinstance(limit, int) and limit > most:
        return (f"max_tokens is too large: {limit}. This model supports at most {most} "
                f"completion tokens, whereas you provided {limit}.", "invalid_request_error",
                "invalid_value")
    return None


def check_create(handler, doc: dict, fake) -> bool:
    """OpenAI's own request checks; False once an error was written."""
    for key in doc:
        if key not in CREATE_PARAMS and not key.startswith("fake_"):
            _error(handler, 400, f"Unknown parameter: '{key}'.", key, "unknown_parameter")
            return False
    if not isinstance(doc.get("model"), str):
        _error(handler, 400, "Missing required parameter: 'model'.", "model",
               "missing_required_parameter")
        return False
    for i, item in enumerate(_items(doc)):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind not in ITEM_TYPES:
            _error(handler, 400, f"Invalid value: '{kind}'. Supported values are: 'message', "
                                 "'function_call', 'function_call_output', 'reasoning', ...",
                   f"input[{i}].type", "invalid_value")
            return False
    effort = (doc.get("reasoning") or {}).get("effort") is not None
    refused = model_refuses(doc["model"], effort and "reasoning.effort",
                            doc.get("max_output_tokens"))
    if refused:
        message, _, code = refused
        _error(handler, 400, message, "reasoning.effort" if code == "unsupported_parameter"
               else "max_output_tokens", code)
        return False
    prev = doc.get("previous_response_id")
    if prev is not None and prev not in fake.stored:
        _error(handler, 400, f"Previous response with id '{prev}' not found.",
               "previous_response_id", "previous_response_not_found")
        return False
    return True


def history(doc: dict, fake) -> list:
    """The whole conversation the request continues, then its own input."""
    out, prev = [], doc.get("previous_response_id")
    chain = []
    while prev and prev in fake.stored:
        chain.append(fake.stored[prev])
        prev = chain[-1]["request"].get("previous_response_id")
    for stored in reversed(chain):
        out += _items(stored["request"]) + stored["response"]["output"]
    return out + _items(doc)


def usage(doc: dict, reasoning: bool) -> dict:
    meta = doc.get("metadata") or {}
    if meta.get("fake_usage"):
        i, c, o, r = (int(x) for x in meta["fake_usage"].split(","))
    else:
        i, c, o, r = 30, 10, 6, 2 if reasoning else 0
    return {"input_tokens": i, "input_tokens_details": {"cached_tokens": c}, "output_tokens": o,
            "output_tokens_details": {"reasoning_tokens": r}, "total_tokens": i + o}


def plan(doc: dict, fake) -> list[dict]:
    """The output items of this turn (finished)."""
    meta = doc.get("metadata") or {}
    items = history(doc, fake)
    if items and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger":
        # Codex's newer compaction: the answer is one opaque compaction item.
        return [{"id": _id("cmp_"), "type": "compaction", "encrypted_content": "gAAAAcompacted"}]
    out = []
    if meta.get("fake_reasoning"):
        out.append({"id": _id("rs_"), "type": "reasoning", "summary": [
            {"type": "summary_text", "text": "Thinking about it."}],
            "encrypted_content": "gAAAAfake"})
    names = [t.get("name") for t in doc.get("tools") or ()
             if isinstance(t, dict) and t.get("type") in ("function", "custom")]
    custom = {t.get("name") for t in doc.get("tools") or ()
              if isinstance(t, dict) and t.get("type") == "custom"}
    last_user = max((i for i, it in enumerate(items) if isinstance(it, dict)
                     and it.get("type", "message") == "message" and it.get("role") == "user"),
                    default=-1)
    outputs = [it.get("output") for it in items[last_user + 1:] if isinstance(it, dict)
               and it.get("type") in ("function_call_output", "custom_tool_call_output")]
    turn = next_turn(fake, meta.get("fake_text") or DEFAULT_TEXT, names,
                     outputs[-1] if outputs else None, bool(outputs),
                     doc.get("tool_choice") != "none")
    if turn.kind == "tool" and turn.tool in custom:
        raw = (turn.input or {}).get("input")
        out.append({"id": _id("ctc_"), "type": "custom_tool_call", "status": "completed",
                    "call_id": _id("call_"), "name": turn.tool,
                    "input": raw if isinstance(raw, str) else json.dumps(turn.input)})
        return out
    if turn.kind == "tool":
        out.append({"id": _id("fc_"), "type": "function_call", "status": "completed",
                    "arguments": json.dumps(turn.input), "call_id": _id("call_"),
                    "name": turn.tool})
        return out
    text = turn.text
    if doc.get("previous_response_id"):
        text += f" (continuing {doc['previous_response_id']})"
    out.append({"id": _id("msg_"), "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [],
                             "logprobs": []}]})
    return out


def response_obj(doc: dict, rid: str, status: str, output: list, use: dict | None) -> dict:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "background": bool(doc.get("background")), "error": None,
            "incomplete_details": None, "instructions": doc.get("instructions"),
            "max_output_tokens": doc.get("max_output_tokens"), "max_tool_calls": None,
            "model": doc["model"], "output": output,
            "parallel_tool_calls": doc.get("parallel_tool_calls", True),
            "previous_response_id": doc.get("previous_response_id"),
            "reasoning": {"effort": (doc.get("reasoning") or {}).get("effort"), "summary": None},
            "service_tier": "default", "store": doc.get("store") is not False,
            "temperature": doc.get("temperature", 1.0),
            "text": doc.get("text") or {"format": {"type": "text"}},
            "tool_choice": doc.get("tool_choice", "auto"), "tools": doc.get("tools") or [],
            "top_p": doc.get("top_p", 1.0), "truncation": "disabled", "usage": use,
            "user": None, "metadata": doc.get("metadata") or {}}


def finished(doc: dict, rid: str, output: list, fail: str) -> dict:
    has_reasoning = any(i["type"] == "reasoning" for i in output)
    resp = response_obj(doc, rid, "completed", output, usage(doc, has_reasoning))
    if fail == "incomplete":
        resp.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    elif fail == "failed":
        resp.update(status="failed", error={"code": "server_error",
                                            "message": "The model failed to finish."})
    else:
        resp["completed_at"] = resp["created_at"]
    return resp


def events(doc: dict, resp: dict) -> list[tuple[str, dict]]:
    """The documented event sequence for one finished response."""
    seq = iter(range(10 ** 6))
    start = dict(resp, status="in_progress", output=[], usage=None, error=None,
                 incomplete_details=None)
    start.pop("completed_at", None)
    evs = [("response.created", {"response": start}), ("response.in_progress",
                                                       {"response": start})]
    for n, item in enumerate(resp["output"]):
        base = {"item_id": item["id"], "output_index": n}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            evs.append(("response.output_item.added", {"output_index": n, "item": dict(
                item, status="in_progress", content=[])}))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            evs.append(("response.content_part.added", dict(base, content_index=0, part=part)))
            third = max(1, len(text) // 3)
            for piece in (text[:third], text[third:2 * third], text[2 * third:]):
                if piece:
                    evs.append(("response.output_text.delta", dict(
                        base, content_index=0, delta=piece, logprobs=[])))
            evs.append(("response.output_text.done", dict(base, content_index=0, text=text,
                                                          logprobs=[])))
            evs.append(("response.content_part.done", dict(base, content_index=0,
                                                           part=dict(part, text=text))))
        elif item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            evs.append(("response.output_item.added", {"output_index": n, "item": dict(
                item, summary=[], encrypted_content=None)}))
            part = {"type": "summary_text", "text": ""}
            evs.append(("response.reasoning_summary_part.added", dict(base, summary_index=0,
                                                                      part=part)))
            evs.append(("response.reasoning_summary_text.delta", dict(base, summary_index=0,
                                                                      delta=text)))
            evs.append(("response.reasoning_summary_text.done", dict(base, summary_index=0,
                                                                     text=text)))
            evs.append(("response.reasoning_summary_part.done", dict(
                base, summary_index=0, part=dict(part, text=text))))
        elif item["type"] == "compaction":
            evs.append(("response.output_item.added", {"output_index": n, "item": item}))
        elif item["type"] == "custom_tool_call":
            raw = item["input"]
            evs.append(("response.output_item.added", {"output_index": n, "item": dict(
                item, status="in_progress", input="")}))
            for piece in (raw[:10], raw[10:]):
                if piece:
                    evs.append(("response.custom_tool_call_input.delta", dict(base,
                                                                              delta=piece)))
            evs.append(("response.custom_tool_call_input.done", dict(base, input=raw)))
        else:
            args = item["arguments"]
            evs.append(("response.output_item.added", {"output_index": n, "item": dict(
                item, status="in_progress", arguments="")}))
            for piece in (args[:4], args[4:]):
                if piece:
                    evs.append(("response.function_call_arguments.delta", dict(base,
                                                                               delta=piece)))
            evs.append(("response.function_call_arguments.done", dict(
                base, name=item["name"], arguments=args)))
        evs.append(("response.output_item.done", {"output_index": n, "item": item}))
    final = {"completed": "response.completed", "incomplete": "response.incomplete",
             "failed": "response.failed"}[resp["status"]]
    evs.append((final, {"response": resp}))
    return [(name, dict({"type": name}, **data, sequence_number=next(seq)))
            for name, data in evs]


async def create(handler, doc: dict, fake, mode: str) -> None:
    if not check_create(handler, doc, fake):
        return
    fail = (doc.get("metadata") or {}).get("fake_fail") or ""
    rid = _id("resp_")
    output = plan(doc, fake)
    resp = finished(doc, rid, output, fail)
    if doc.get("background"):
        resp = response_obj(doc, rid, "queued", [], None)
    if doc.get("store") is not False:
        fake.stored[rid] = {"request": doc, "response": resp}
    if not doc.get("stream"):
        handler.set_header("Content-Type", "application/json")
        return handler.finish(resp)
    handler.set_header("Content-Type", "text/event-stream; charset=utf-8")
    delay = fake.slow_delay if mode == "slow" else 0
    deltas = 0
    for name, data in events(doc, resp):
        if delay:
            await asyncio.sleep(delay)
        if name.endswith(".delta"):
            deltas += 1
        if (fail == "cut" or mode == "reset") and deltas == 3:
            # Let the relay read what was sent: a reset discards unread data.
            await asyncio.sleep(0.2)
            reset_connection(handler)
            return
        if fail == "error_event" and deltas == 3:
            handler.write(f"event: error\ndata: {json.dumps({'type': 'error', 'code': 'server_error', 'message': 'The server had an error.', 'param': None, 'sequence_number': data['sequence_number']})}\n\n")
            return handler.finish()
        handler.write(f"event: {name}\ndata: {json.dumps(data)}\n\n")
        try:
            await handler.flush()
        except StreamClosedError:  # the relay cancelled us
            handler.rec["aborted"] = True
            return
    handler.finish()


def stored_or_404(handler, fake, rid: str):
    got = fake.stored.get(rid)
    if got is None:
        _error(handler, 404, f"Response with id '{rid}' not found.")
    return got


def compact(handler, doc: dict, fake) -> None:
    if not isinstance(doc.get("model"), str):
        return _error(handler, 400, "Missing required parameter: 'model'.", "model",
                      "missing_required_parameter")
    kept = [dict(i, id=i.get("id") or _id("msg_")) for i in history(doc, fake)
            if i.get("type", "message") == "message" and i.get("role") == "user"]
    kept.append({"id": _id("cmp_"), "type": "compaction", "encrypted_content": "gAAAAcompacted"})
    handler.finish({"id": _id("resp_"), "object": "response.compaction",
                    "created_at": int(time.time()), "output": kept,
                    "usage": usage(doc, False)})


def input_tokens(handler, doc: dict) -> None:
    n = max(1, len(json.dumps([doc.get("instructions"), doc.get("input"),
                               doc.get("tools")])) // 4)
    handler.finish({"object": "response.input_tokens", "input_tokens": n})
