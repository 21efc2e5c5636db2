"""Anthropic Messages requests: the checks a body must pass, and the
conversion to the canonical OpenAI chat request (the way back is in
relay/convert/anthropic.py).

The shapes are those of the current SDKs (anthropic 2.x MessageCreateParams
and its beta twin, the TypeScript SDK 1.x).  `messages` may hold system-role
messages (SystemMessageParam: Claude Code puts its environment block there,
sometimes with a per-turn `output_config`); blocks are text, image,
document, search_result, thinking, redacted_thinking, tool_use, tool_result,
the server-tool blocks and more, any of them with cache_control.

Validation checks only what the conversion relies on, so that anything a
real SDK sends passes (an Anthropic channel gets the body untouched and
judges the rest itself).  The conversion drops what the OpenAI shape cannot
carry (signatures, cache_control, server-tool blocks, betas) rather than
failing, and maps thinking to `reasoning_effort` and back.
"""
from __future__ import annotations

from typing import Any

from relay.convert.common import canonical_effort, dumps, effort_from_budget
from relay.errors import bad_request

ROLES = ("user", "assistant", "system")
# Fields each block type must carry for the conversion (the SDKs require
# them too); other block types pass unchecked.
_BLOCK_FIELDS = {
    "text": (("text", str),),
    "image": (("source", dict),),
    "document": (("source", dict),),
    "tool_use": (("id", str), ("name", str), ("input", dict)),
    "tool_result": (("tool_use_id", str),),
    "thinking": (("thinking", str),),
    "redacted_thinking": (("data", str),),
}
_TYPE_NAMES = {str: "a string", dict: "an object", list: "an array", int: "an integer"}


# ---- validation --------------------------------------------------------------
def _fail(field: str, message: str, code: str = "invalid_request") -> None:
    raise bad_request(f"{field}: {message}", code, field.split(".")[0])


def _block_problem(block: Any, refs: list) -> tuple[str, str] | None:
    """(where under the block, what) of a block the conversion cannot read,
    or None.  The path is only written for a block that fails: an agent's
    body has hundreds of blocks, and formatting a path for each was most of
    validating it.  refs[0] counts the blocks met that the upstream fetches
    by reference (references_in)."""
    if not isinstance(block, dict):
        return "", "must be an object with a string 'type'."
    kind = block.get("type")
    if not isinstance(kind, str):
        return "", "must be an object with a string 'type'."
    fields = _BLOCK_FIELDS.get(kind)
    if fields is None:
        return None
    for name, want in fields:
        if not isinstance(block.get(name), want):
            return f".{name}", f"Field required ({_TYPE_NAMES[want]})."
    if kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, list):
            for k, b in enumerate(inner):
                found = _block_problem(b, refs)
                if found is not None:
                    return f".content.{k}{found[0]}", found[1]
        elif inner is not None and not isinstance(inner, str):
            return ".content", "must be a string or an array of blocks."
    elif kind == "image" or kind == "document":
        refs[0] += _source_refs(block["source"])
    return None


def _source_refs(src: dict) -> int:
    via = src.get("type")
    if via == "file" or via == "url":
        return 1
    return references_in(src.get("content")) if via == "content" else 0


def references_in(content: Any) -> int:
    """Images and documents the upstream fetches by reference (a URL, a file
    id) in a message's content, wherever a block may hold them (a tool
    result, a document's own content): their size is not in the body
    (relay/bounds.py).  validate() counts those of a valid body's messages
    on its own walk; this reads content it does not check."""
    n = 0
    todo = [content]
    while todo:
        content = todo.pop()
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_result":
                todo.append(block.get("content"))
            elif kind in ("image", "document"):
                src = block.get("source")
                if isinstance(src, dict):
                    n += _source_refs(src)
    return n


def validate(doc: dict) -> int:
    """The checks Anthropic itself makes that the conversion relies on, so
    a bad call fails here with a message naming the field.  Raises
    RelayError(400).  Returns how many blocks of the messages the upstream
    fetches by reference (references_in), counted on the same walk: a
    second walk of an agent's hundred blocks cost a quarter of this one."""
    mt = doc.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 0:
        # 0 is valid: it warms the prompt cache without generating.
        _fail("max_tokens", "Field required (a non-negative integer).", "invalid_max_tokens")
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        _fail("messages", "must be a non-empty array.", "missing_messages")
    refs = [0]
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            _fail(f"messages.{i}.role", "Input should be 'user', 'assistant' or 'system'.",
                  "invalid_role")
        if m["role"] == "system" and "content" not in m:
            # A system message may carry only a per-turn output_config.
            if not isinstance(m.get("output_config"), dict):
                _fail(f"messages.{i}.content", "Field required (or an output_config).",
                      "invalid_content")
            continue
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            _fail(f"messages.{i}.content", "must be a string or an array of blocks.",
                  "invalid_content")
        for j, block in enumerate(content):
            found = _block_problem(block, refs)
            if found is not None:
                _fail(f"messages.{i}.content.{j}{found[0]}", found[1], "invalid_content")
    system = doc.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            _fail("system", "must be a string or an array of text blocks.", "invalid_system")
        for j, block in enumerate(system):
            found = _block_problem(block, [0])
            if found is not None:
                _fail(f"system.{j}{found[0]}", found[1], "invalid_content")
    tools = doc.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            _fail("tools", "must be an array.", "invalid_tools")
        for i, t in enumerate(tools):
            if not isinstance(t, dict):
                _fail(f"tools.{i}", "must be an object.", "invalid_tools")
            if t.get("type") in (None, "custom"):
                if not isinstance(t.get("name"), str) or not t["name"]:
                    _fail(f"tools.{i}.name", "Field required.", "invalid_tools")
                if not isinstance(t.get("input_schema"), dict):
                    _fail(f"tools.{i}.input_schema", "Field required (an object).",
                          "invalid_tools")
    for name in ("thinking", "tool_choice", "output_config", "metadata"):
        value = doc.get(name)
        if value is not None and not isinstance(value, dict):
            _fail(name, "must be an object.", f"invalid_{name}")
    thinking = doc.get("thinking") or {}
    if thinking.get("type") == "enabled" and (
            not isinstance(thinking.get("budget_tokens"), int)
            or isinstance(thinking.get("budget_tokens"), bool)):
        _fail("thinking.budget_tokens", "Field required (an integer).", "invalid_thinking")
    stops = doc.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str)
                                                                  for s in stops)):
        _fail("stop_sequences", "must be an array of strings.", "invalid_stop_sequences")
    return refs[0]


# ---- Anthropic -> OpenAI ---------------------------------------------------------
def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(b.get("text", "") for b in system
                         if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _image_part(source: dict) -> dict | None:
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        return None  # a Files API id: only Anthropic can resolve it
    return {"type": "image_url", "image_url": {"url": url}}


def _document_parts(block: dict) -> list[dict]:
    """A document block -> OpenAI parts: PDFs as a file part, text as text."""
    src = block.get("source") or {}
    kind = src.get("type")
    title = block.get("title") or "document"
    if kind == "text":
        return [{"type": "text", "text": src.get("data", "")}]
    if kind == "content":
        inner = src.get("content")
        if isinstance(inner, str):
            return [{"type": "text", "text": inner}]
        return [p for b in inner or () if isinstance(b, dict)
                for p in _block_parts(b)]
    if kind == "base64":
        mime = src.get("media_type") or "application/pdf"
        return [{"type": "file", "file": {
            "filename": title if "." in title else title + ".pdf",
            "file_data": f"data:{mime};base64,{src.get('data', '')}"}}]
    if kind == "url":
        return [{"type": "text", "text": f"[{title}: {src.get('url', '')}]"}]
    return []


def _block_parts(b: dict) -> list[dict]:
    """One user-side content block -> OpenAI content parts ([] to drop it)."""
    kind = b.get("type")
    if kind == "text":
        return [{"type": "text", "text": b.get("text", "")}]
    if kind == "image":
        part = _image_part(b.get("source") or {})
        return [part] if part else [{"type": "text", "text": "[image]"}]
    if kind == "document":
        return _document_parts(b)
    if kind == "search_result":
        texts = [c.get("text", "") for c in b.get("content") or () if isinstance(c, dict)]
        return [{"type": "text", "text": "\n".join([f"{b.get('title', '')} ({b.get('source', '')})"]
                                                   + texts)}]
    # thinking, server-tool results, container uploads, tool references:
    # nothing another vendor's model can read.
    return []


def _tool_result(b: dict) -> tuple[dict, list[dict]]:
    """A tool_result block -> (the OpenAI tool message, non-text parts such
    as images, which a tool message cannot hold: they follow in the next
    user message)."""
    content = b.get("content")
    texts, media = [], []
    if isinstance(content, str):
        texts.append(content)
    else:
        for inner in content or ():
            for p in _block_parts(inner):
                if p["type"] == "text":
                    texts.append(p["text"])
                else:
                    media.append(p)
    text = "\n".join(texts)
    if b.get("is_error"):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": text}, media


def _user_messages(content: Any) -> list[dict]:
    """One Anthropic user turn -> OpenAI messages: tool results become tool
    messages (first, as OpenAI wants them right after the tool calls), the
    rest one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools, parts = [], []
    for b in content:
        if b.get("type") == "tool_result":
            msg, media = _tool_result(b)
            tools.append(msg)
            parts += media
        else:
            parts += _block_parts(b)
    out = list(tools)
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def tool_call(block: dict) -> dict:
    """A tool_use block -> an OpenAI tool call."""
    return {"id": block.get("id", ""), "type": "function",
            "function": {"name": block.get("name", ""),
                         "arguments": dumps(block.get("input") or {})}}


def _assistant_message(content: Any) -> dict | None:
    """An assistant turn -> one OpenAI message, or None when nothing in it
    is readable elsewhere (only thinking or server-tool blocks)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for b in content:
        kind = b.get("type")
        if kind == "text":
            texts.append(b.get("text", ""))
        elif kind == "tool_use":
            calls.append(tool_call(b))
    if not texts and not calls:
        return None
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


def effort_of(doc: dict) -> str | None:
    """The canonical reasoning effort a Messages request asks for: the
    latest output_config.effort (top level, then per-turn on system
    messages), else the thinking budget; None when thinking is off or
    the model is left to decide."""
    thinking = doc.get("thinking") or {}
    if thinking.get("type") == "disabled":
        return None
    effort = (doc.get("output_config") or {}).get("effort")
    for m in doc["messages"]:
        if m.get("role") == "system" and isinstance(m.get("output_config"), dict):
            effort = m["output_config"].get("effort") or effort
    if canonical_effort(effort):
        return canonical_effort(effort)
    if thinking.get("type") == "enabled":
        return effort_from_budget(thinking.get("budget_tokens"))
    return None


def request_to_openai(doc: dict) -> dict:
    """A validated Anthropic Messages request -> an OpenAI chat request.
    System text (top level, then system-role messages in order) becomes
    one leading system message: every target has one system instruction."""
    system = [_system_text(doc.get("system"))]
    messages: list[dict] = []
    for m in doc["messages"]:
        if m["role"] == "system":
            system.append(_system_text(m.get("content")))
        elif m["role"] == "user":
            messages += _user_messages(m["content"])
        elif (msg := _assistant_message(m["content"])) is not None:
            messages.append(msg)
    text = "\n\n".join(s for s in system if s)
    if text:
        messages.insert(0, {"role": "system", "content": text})
    body: dict = {"model": doc.get("model"), "messages": messages,
                  "max_tokens": doc["max_tokens"]}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p")):
        if doc.get(src) is not None:
            body[dst] = doc[src]
    if doc.get("stop_sequences"):
        body["stop"] = list(doc["stop_sequences"])
    if doc.get("stream"):
        body["stream"] = True
    effort = effort_of(doc)
    if effort:
        body["reasoning_effort"] = effort
    fmt = (doc.get("output_config") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and fmt.get("schema"):
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt["schema"]}}
    # Custom tools only: server tools (web search, code execution, ...) have
    # no input_schema and nothing elsewhere can run them.
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
    # OpenAI caps `user` at 64 characters; Claude Code's JSON id is longer.
    if user and len(str(user)) <= 64:
        body["user"] = str(user)
    return body
