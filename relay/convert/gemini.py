"""Gemini generateContent <-> OpenAI chat: requests and whole answers.

Usage is read in relay/convert/gemini_usage.py, streams are in
relay/convert/gemini_stream.py, embeddings in relay/convert/gemini_embed.py.
Gemini has no tool-call ids (newer models may send one); calls get ids
here and results are matched back by name.
"""
from __future__ import annotations

import time
from typing import Any

from relay.convert.common import dumps, new_id, parse_args, split_data_url, text_of
from relay.convert.gemini_config import (effort_from_thinking, schema_from_openai,  # noqa: F401
                                         schema_to_openai, thinking_config,
                                         tool_schema, uses_thought_signatures)
from relay.convert.gemini_usage import (grounding_calls, usage_from, usage_meta,  # noqa: F401
                                        usage_to_openai)
from relay.errors import bad_request

FINISH_FROM_GEMINI = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter",
                      "RECITATION": "content_filter", "BLOCKLIST": "content_filter",
                      "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
                      "IMAGE_SAFETY": "content_filter"}
FINISH_TO_GEMINI = {"stop": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY",
                    "tool_calls": "STOP", "function_call": "STOP"}
# Clients that ask for `enum-encoding=int` also send FunctionCallingConfig.Mode as a number.
_MODE_NAMES = {1: "AUTO", 2: "ANY", 3: "NONE", 4: "VALIDATED"}
# Google's documented stand-in for a thought signature we do not have (a
# conversation that came through another format carries none).
NO_SIGNATURE = "skip_thought_signature_validator"


# ---- requests: Gemini -> OpenAI --------------------------------------------
# Gemini answers at most this many candidates a call.
MAX_CANDIDATES = 8


def validate(doc: dict) -> None:
    contents = doc.get("contents")
    if not isinstance(contents, list) or not contents:
        raise bad_request("* GenerateContentRequest.contents: contents is not specified",
                          "missing_contents", "contents")
    for i, c in enumerate(contents):
        if not isinstance(c, dict) or not isinstance(c.get("parts"), list):
            raise bad_request(f"* GenerateContentRequest.contents[{i}].parts: must be an array.",
                              "invalid_contents", "contents")
        if c.get("role", "user") not in ("user", "model", "function", "tool"):
            raise bad_request(f"* GenerateContentRequest.contents[{i}].role: must be 'user' or "
                              "'model'.", "invalid_role", "contents")
    cfg = doc.get("generationConfig") or doc.get("generation_config")
    if isinstance(cfg, dict):
        for key in ("candidateCount", "candidate_count"):
            n = cfg.get(key)
            # Gemini's own bound; each candidate is billed, so it bounds the reservation.
            if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                                  or not 1 <= n <= MAX_CANDIDATES):
                raise bad_request(f"* GenerateContentRequest.generation_config.candidate_count: "
                                  f"must be a whole number from 1 to {MAX_CANDIDATES}.",
                                  "invalid_value", f"generationConfig.{key}")


def _media_part(part: dict) -> dict | None:
    if "inlineData" in part or "inline_data" in part:
        d = part.get("inlineData") or part.get("inline_data") or {}
        mime = d.get("mimeType") or d.get("mime_type") or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{d.get('data', '')}"}}
    if "fileData" in part or "file_data" in part:
        d = part.get("fileData") or part.get("file_data") or {}
        return {"type": "image_url", "image_url": {"url": d.get("fileUri") or d.get("file_uri", "")}}
    return None


def request_to_openai(doc: dict, model: str) -> dict:
    """A validated Gemini generateContent request -> an OpenAI chat request."""
    messages: list[dict] = []
    sys_inst = doc.get("systemInstruction") or doc.get("system_instruction")
    if isinstance(sys_inst, dict):
        text = "\n".join(p.get("text", "") for p in sys_inst.get("parts") or () if "text" in p)
        if text:
            messages.append({"role": "system", "content": text})
    elif isinstance(sys_inst, str) and sys_inst:
        messages.append({"role": "system", "content": sys_inst})
    pending: dict[str, list[str]] = {}   # function name -> call ids awaiting a result
    for turn in doc["contents"]:
        role = turn.get("role") or "user"
        parts, calls, results = [], [], []
        for p in turn["parts"]:
            if not isinstance(p, dict):
                continue
            if "functionCall" in p or "function_call" in p:
                fc = p.get("functionCall") or p.get("function_call") or {}
                cid = fc.get("id") or new_id("call_")
                pending.setdefault(fc.get("name", ""), []).append(cid)
                calls.append({"id": cid, "type": "function", "function": {
                    "name": fc.get("name", ""),
                    "arguments": dumps(fc.get("args") or {})}})
            elif "functionResponse" in p or "function_response" in p:
                fr = p.get("functionResponse") or p.get("function_response") or {}
                name = fr.get("name", "")
                queue = pending.get(name) or []
                cid = fr.get("id") or (queue.pop(0) if queue else new_id("call_"))
                if fr.get("id") and fr["id"] in queue:
                    queue.remove(fr["id"])
                results.append({"role": "tool", "tool_call_id": cid,
                                "content": dumps(fr.get("response") or {})})
            elif "text" in p and not p.get("thought"):
                parts.append({"type": "text", "text": p.get("text") or ""})
            else:
                media = _media_part(p)
                if media:
                    parts.append(media)
        messages += results
        if role == "model":
            msg: dict = {"role": "assistant", "content": text_of(parts) if parts else None}
            if calls:
                msg["tool_calls"] = calls
            if parts or calls:
                messages.append(msg)
        elif parts:
            content: Any = parts
            if all(x["type"] == "text" for x in parts):
                content = "".join(x["text"] for x in parts)
            messages.append({"role": "user", "content": content})
    body: dict = {"model": model, "messages": messages}
    cfg = doc.get("generationConfig") or doc.get("generation_config") or {}
    for src, snake, dst in (("temperature", "temperature", "temperature"),
                            ("topP", "top_p", "top_p"),
                            ("maxOutputTokens", "max_output_tokens", "max_tokens"),
                            ("candidateCount", "candidate_count", "n"), ("seed", "seed", "seed"),
                            ("presencePenalty", "presence_penalty", "presence_penalty"),
                            ("frequencyPenalty", "frequency_penalty", "frequency_penalty")):
        # Gemini reads either spelling, as its JSON mapping of protobuf does.
        value = cfg.get(src) if cfg.get(src) is not None else cfg.get(snake)
        if value is not None:
            body[dst] = value
    if cfg.get("stopSequences"):
        body["stop"] = list(cfg["stopSequences"])
    effort = effort_from_thinking(cfg.get("thinkingConfig") or cfg.get("thinking_config"))
    if effort:
        body["reasoning_effort"] = effort
    if cfg.get("responseMimeType") == "application/json":
        schema = cfg.get("responseJsonSchema") or cfg.get("responseSchema")
        body["response_format"] = ({"type": "json_schema", "json_schema": {
            "name": "response", "schema": schema_to_openai(schema)}} if schema
            else {"type": "json_object"})
    decls = [d for t in doc.get("tools") or () if isinstance(t, dict)
             for d in t.get("functionDeclarations") or t.get("function_declarations") or ()]
    if decls:
        body["tools"] = [{"type": "function", "function": {
            "name": d.get("name", ""), "description": d.get("description", ""),
            "parameters": d.get("parametersJsonSchema")
            or tool_schema(schema_to_openai,
                           d.get("parameters") or {"type": "OBJECT", "properties": {}})}}
            for d in decls]
        fcc = (doc.get("toolConfig") or {}).get("functionCallingConfig") or {}
        mode = fcc.get("mode")
        mode = _MODE_NAMES.get(mode, mode) if isinstance(mode, int) else mode
        allowed = fcc.get("allowedFunctionNames") or []
        if mode == "ANY" and len(allowed) == 1:
            body["tool_choice"] = {"type": "function", "function": {"name": allowed[0]}}
        elif mode in ("ANY", "NONE", "AUTO"):
            body["tool_choice"] = {"ANY": "required", "NONE": "none", "AUTO": "auto"}[mode]
    return body


# ---- requests: OpenAI -> Gemini --------------------------------------------
def _parts_from_openai(content: Any) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") in ("text", "input_text"):
            parts.append({"text": p.get("text", "")})
        elif p.get("type") == "image_url":
            url = (p.get("image_url") or {}).get("url", "")
            parsed = split_data_url(url)
            if parsed:
                parts.append({"inlineData": {"mimeType": parsed[0], "data": parsed[1]}})
            else:
                mime = "image/png" if url.lower().endswith(".png") else "image/jpeg"
                parts.append({"fileData": {"mimeType": mime, "fileUri": url}})
        elif p.get("type") == "file":
            parsed = split_data_url((p.get("file") or {}).get("file_data", ""))
            if parsed:
                parts.append({"inlineData": {"mimeType": parsed[0], "data": parsed[1]}})
    return parts


def _add(contents: list[dict], role: str, parts: list[dict]) -> None:
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def request_from_openai(body: dict, model: str = "") -> dict:
    """An OpenAI chat request -> a Gemini generateContent request for the
    upstream `model` (which travels in the URL; it picks the thinking
    settings' shape)."""
    system, contents = [], []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(text_of(m.get("content")))
        elif role == "user":
            _add(contents, "user", _parts_from_openai(m.get("content")))
        elif role == "assistant":
            parts = _parts_from_openai(m.get("content"))
            for n, tc in enumerate(m.get("tool_calls") or ()):
                fn = tc.get("function") or {}
                names[tc.get("id", "")] = fn.get("name", "")
                part: dict = {"functionCall": {"name": fn.get("name", ""),
                                               "args": parse_args(fn.get("arguments"))}}
                if n == 0 and uses_thought_signatures(model):
                    part["thoughtSignature"] = NO_SIGNATURE  # the first call of a step carries it
                parts.append(part)
            _add(contents, "model", parts)
        elif role in ("tool", "function"):
            text = text_of(m.get("content"))
            parsed = parse_args(text)
            response = parsed if "_raw" not in parsed else {"content": text}
            _add(contents, "user", [{"functionResponse": {
                "name": names.get(m.get("tool_call_id", ""), m.get("name", "")),
                "response": response}}])
    out: dict = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": [{"text": "\n".join(s for s in system if s)}]}
    cfg: dict = {}
    for src, dst in (("temperature", "temperature"), ("top_p", "topP"), ("n", "candidateCount"),
                     ("seed", "seed"), ("presence_penalty", "presencePenalty"),
                     ("frequency_penalty", "frequencyPenalty")):
        if body.get(src) is not None:
            cfg[dst] = body[src]
    mt = body.get("max_completion_tokens") or body.get("max_tokens")
    if mt:
        cfg["maxOutputTokens"] = int(mt)
    stop = body.get("stop")
    if stop:
        cfg["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    rf = body.get("response_format") or {}
    if rf.get("type") in ("json_object", "json_schema"):
        cfg["responseMimeType"] = "application/json"
        schema = (rf.get("json_schema") or {}).get("schema")
        if schema:
            cfg["responseSchema"] = schema_from_openai(schema)
    thinking = thinking_config(body.get("reasoning_effort"), model)
    if thinking:
        cfg["thinkingConfig"] = thinking
    if cfg:
        out["generationConfig"] = cfg
    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("function")]
    if tools:
        out["tools"] = [{"functionDeclarations": [{
            "name": t["function"].get("name", ""),
            "description": t["function"].get("description", ""),
            "parameters": tool_schema(schema_from_openai, t["function"].get("parameters")
                                      or {"type": "object", "properties": {}})}
            for t in tools]}]
        tc = body.get("tool_choice")
        if tc == "required":
            out["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}
        elif tc == "none":
            out["toolConfig"] = {"functionCallingConfig": {"mode": "NONE"}}
        elif isinstance(tc, dict):
            out["toolConfig"] = {"functionCallingConfig": {
                "mode": "ANY", "allowedFunctionNames": [(tc.get("function") or {}).get("name", "")]}}
    return out


# ---- answers ---------------------------------------------------------------
def finish_from(reason: str | None, had_calls: bool) -> str | None:
    if not reason:
        return None
    if had_calls and reason == "STOP":
        return "tool_calls"
    return FINISH_FROM_GEMINI.get(reason, "stop")


def response_to_openai(resp: dict, model: str) -> dict:
    """A whole generateContent answer -> an OpenAI chat.completion."""
    choices = []
    for i, cand in enumerate(resp.get("candidates") or ()):
        texts, thoughts, calls = [], [], []
        for p in (cand.get("content") or {}).get("parts") or ():
            if "functionCall" in p:
                fc = p["functionCall"]
                calls.append({"id": fc.get("id") or new_id("call_"), "type": "function",
                              "function": {"name": fc.get("name", ""),
                                           "arguments": dumps(fc.get("args") or {})}})
            elif p.get("thought"):
                thoughts.append(p.get("text", ""))
            elif "text" in p:
                texts.append(p["text"])
        msg: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
        if calls:
            msg["tool_calls"] = calls
        if thoughts:
            msg["reasoning_content"] = "".join(thoughts)
        choices.append({"index": cand.get("index", i), "message": msg,
                        "finish_reason": finish_from(cand.get("finishReason") or "STOP",
                                                     bool(calls))})
    if not choices:  # the prompt itself was blocked
        choices.append({"index": 0, "message": {"role": "assistant", "content": ""},
                        "finish_reason": "content_filter"})
    return {"id": resp.get("responseId") or new_id("chatcmpl-"), "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage_to_openai(resp.get("usageMetadata"))}


def response_from_openai(doc: dict, model: str) -> dict:
    """A whole OpenAI chat.completion -> a generateContent answer."""
    cands = []
    for i, choice in enumerate(doc.get("choices") or ()):
        m = choice.get("message") or {}
        parts: list[dict] = []
        if m.get("reasoning_content"):
            parts.append({"text": m["reasoning_content"], "thought": True})
        text = text_of(m.get("content"))
        if text or not m.get("tool_calls"):
            parts.append({"text": text})
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") or {}
            parts.append({"functionCall": {"name": fn.get("name", ""),
                                           "args": parse_args(fn.get("arguments"))}})
        cands.append({"content": {"role": "model", "parts": parts},
                      "finishReason": FINISH_TO_GEMINI.get(choice.get("finish_reason"), "STOP"),
                      "index": choice.get("index", i)})
    return {"candidates": cands, "usageMetadata": usage_meta(doc.get("usage")),
            "modelVersion": model, "responseId": doc.get("id") or new_id("")}
