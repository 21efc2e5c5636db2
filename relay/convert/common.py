"""Small helpers shared by the format converters."""
from __future__ import annotations

import json
import secrets
import time
from typing import Any

from relay import sse


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def chunk(cid: str, model: str, delta: dict | None = None, finish: str | None = None,
          created: int | None = None) -> dict:
    """One OpenAI chat.completion.chunk with a single choice."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created or int(time.time()),
            "model": model, "choices": [{"index": 0, "delta": delta or {},
                                         "finish_reason": finish}]}


def usage_chunk(cid: str, model: str, usage: dict, created: int | None = None) -> dict:
    """The trailing OpenAI chunk that carries only usage (choices empty)."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created or int(time.time()),
            "model": model, "choices": [], "usage": usage}


def openai_usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def text_of(content: Any) -> str:
    """The plain text of OpenAI message content (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") in ("text", "input_text"))
    return str(content)


def parse_args(arguments: Any) -> Any:
    """Tool-call arguments as an object; OpenAI sends a JSON string that may be
    empty or (from weak models) not JSON at all."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return {"_raw": str(arguments)}
    return value if isinstance(value, dict) else {"value": value}


def split_data_url(url: str) -> tuple[str, str] | None:
    """'data:image/png;base64,AAAA' -> ('image/png', 'AAAA'); None if not one."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return (head or "application/octet-stream"), data


def dumps(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def frame(ev: sse.Event) -> bytes:
    """A parsed event back on the wire, its data lines as they were."""
    head = f"event: {ev.event}\n" if ev.event else ""
    return (head + "".join(f"data: {line}\n" for line in ev.data.split("\n")) + "\n").encode()


def sse_payload(raw: bytes) -> bytes:
    """The data of one framed event (what `frame` wrote)."""
    out = []
    for ln in raw.split(b"\n"):
        if ln.startswith(b"data:"):
            ln = ln[5:]
            out.append(ln[1:] if ln.startswith(b" ") else ln)
    return b"\n".join(out)
