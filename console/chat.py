"""The console's built-in chat: the browser asks over the websocket, the
server calls the relay (this server, or a configured base address) with the
user's key, and streams the reply back.

The call goes through the relay like any client's, so it is billed, logged
and rate-limited the same way; the balance events it causes reach the
browser over the same websocket.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from relay.serving.sse import SSEParser
from relay.upstream.client import Cancel

MAX_MESSAGES = 200
MAX_IMAGE_BYTES = 20 * 1024 * 1024
ROLES = ("system", "user", "assistant")
_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp);base64,")


class ChatError(Exception):
    """A problem to show the person; `code` names it for the browser."""

    def __init__(self, message: str, code: str = "bad_request"):
        super().__init__(message)
        self.message = message
        self.code = code


def normalise_base(address: str, kind: str = "chat") -> tuple[str, str]:
    """(root, mode) for an address typed by a person.

    Chat accepts {base}, {base}/v1 and {base}/v1/chat/completions; images
    accept {base} (OpenAI images) and {base}/mj (Midjourney-proxy).  Mode is
    "openai" or "mj".
    """
    url = str(address or "").strip().rstrip("/")
    if not url:
        raise ChatError("Choose a base address.", "bad_base")
    low = url.lower()
    mode = "openai"
    for suffix in ("/v1/chat/completions", "/v1/images/generations", "/v1", "/mj"):
        if low.endswith(suffix):
            if suffix == "/mj":
                if kind != "image":
                    raise ChatError("A /mj address is for image generation; use {base} or "
                                    "{base}/v1 for chat.", "bad_base")
                mode = "mj"
            url = url[:-len(suffix)]
            break
    return url.rstrip("/"), mode


def check_allowed(root: str, allowed: list[str]) -> None:
    """Only this server and its configured base addresses: never an arbitrary host."""
    if root.lower() not in {a.lower().rstrip("/") for a in allowed}:
        raise ChatError("That base address is not one of this server's addresses.",
                        "base_not_allowed")


def clean_messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ChatError("Send at least one message.")
    if len(raw) > MAX_MESSAGES:
        raise ChatError(f"A conversation is limited to {MAX_MESSAGES} messages; start a new one.")
    out = []
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ChatError("Each message needs a role: system, user or assistant.")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise ChatError("A message's content must be text or a list of parts.")
        parts = []
        for p in content:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(p.get("text") or "")})
            elif kind == "image_url":
                url = str((p.get("image_url") or {}).get("url") or "")
                if not _DATA_URL.match(url[:40]):
                    raise ChatError("Images are sent as data: URLs (png, jpeg, gif or webp).")
                if len(url) * 3 // 4 > MAX_IMAGE_BYTES:
                    raise ChatError("An image must be smaller than 20 MB.", "too_large")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                raise ChatError("Message parts are text or image_url.")
        out.append({"role": m["role"], "content": parts})
    return out


@dataclass
class ChatCall:
    """One chat or image request from the browser, ready to send."""
    id: str
    root: str
    mode: str
    key: str
    model: str
    kind: str = "chat"
    messages: list = field(default_factory=list)
    prompt: str = ""
    cancel: Cancel = field(default_factory=Cancel)


Emit = Callable[[dict], None]


def _error_text(body: bytes, status: int) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return f"The relay answered {status}."
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    for k in ("message", "description"):
        if isinstance(doc, dict) and doc.get(k):
            return str(doc[k])
    return f"The relay answered {status}."


async def run_chat(upstream, call: ChatCall, emit: Emit) -> None:
    """Stream one chat completion; emits chat_delta events then chat_done or chat_error."""
    body = {"model": call.model, "messages": call.messages, "stream": True,
            "stream_options": {"include_usage": True}}
    parser = SSEParser()
    usage: dict = {}

    def on_chunk(chunk: bytes) -> None:
        for ev in parser.feed(chunk):
            if ev.data.strip() == "[DONE]":
                continue
            try:
                doc = ev.json()
            except ValueError:
                continue
            if doc.get("usage"):
                usage.update(doc["usage"])
            for choice in doc.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    emit({"type": "chat_delta", "id": call.id, "text": text})

    resp = await upstream.send("POST", call.root + "/v1/chat/completions",
                               {"Authorization": f"Bearer {call.key}",
                                "Content-Type": "application/json"},
                               json.dumps(body).encode(), on_chunk=on_chunk, cancel=call.cancel)
    if call.cancel.cancelled:
        emit({"type": "chat_done", "id": call.id, "usage": usage, "stopped": True})
        return
    if resp.error is not None and not resp.broken:
        raise ChatError(resp.error.message, "upstream")
    if resp.status >= 400:
        raise ChatError(_error_text(resp.body, resp.status), f"http_{resp.status}")
    if resp.broken:
        raise ChatError("The reply broke off before it was complete.", "broken")
    emit({"type": "chat_done", "id": call.id, "usage": usage})


async def run_image(upstream, call: ChatCall, emit: Emit,
                    sleep: Callable[[float], Awaitable] = asyncio.sleep,
                    poll_every: float = 2.0, max_wait: float = 600.0) -> None:
    """Generate one image (OpenAI images, or a Midjourney-proxy task polled to the end)."""
    headers = {"Authorization": f"Bearer {call.key}", "Content-Type": "application/json"}
    if call.mode == "openai":
        body = {"model": call.model, "prompt": call.prompt, "n": 1}
        resp = await upstream.send("POST", call.root + "/v1/images/generations", headers,
                                   json.dumps(body).encode(), cancel=call.cancel)
        if call.cancel.cancelled:
            return emit({"type": "chat_done", "id": call.id, "usage": {}, "stopped": True})
        if resp.error is not None or resp.status >= 400:
            raise ChatError(resp.error.message if resp.error and not resp.body
                            else _error_text(resp.body, resp.status), "upstream")
        doc = json.loads(resp.body or b"{}")
        for item in doc.get("data") or []:
            url = item.get("url") or (f"data:image/png;base64,{item['b64_json']}"
                                      if item.get("b64_json") else "")
            if url:
                emit({"type": "chat_image", "id": call.id, "url": url})
        return emit({"type": "chat_done", "id": call.id, "usage": doc.get("usage") or {}})
    mj_headers = {**headers, "mj-api-secret": call.key}
    resp = await upstream.send("POST", call.root + "/mj/submit/imagine", mj_headers,
                               json.dumps({"prompt": call.prompt}).encode(), cancel=call.cancel)
    if resp.error is not None or resp.status >= 400:
        raise ChatError(_error_text(resp.body, resp.status), "upstream")
    doc = json.loads(resp.body or b"{}")
    if doc.get("code") not in (1, 21, 22) or not doc.get("result"):
        raise ChatError(str(doc.get("description") or "The image task was refused."), "upstream")
    task_id = str(doc["result"])
    emit({"type": "chat_delta", "id": call.id, "text": f"Task {task_id} submitted.\n"})
    deadline = time.monotonic() + max_wait
    last = ""
    while time.monotonic() < deadline:
        if call.cancel.cancelled:
            return emit({"type": "chat_done", "id": call.id, "usage": {}, "stopped": True})
        await sleep(poll_every)
        resp = await upstream.send("GET", f"{call.root}/mj/task/{task_id}/fetch", mj_headers,
                                   None, cancel=call.cancel)
        if resp.error is not None or resp.status >= 400:
            continue
        task = json.loads(resp.body or b"{}")
        progress = str(task.get("progress") or "")
        if progress and progress != last:
            last = progress
            emit({"type": "chat_delta", "id": call.id, "text": f"{progress} "})
        if task.get("status") == "SUCCESS":
            if task.get("imageUrl"):
                emit({"type": "chat_image", "id": call.id, "url": task["imageUrl"]})
            return emit({"type": "chat_done", "id": call.id, "usage": {}})
        if task.get("status") == "FAILURE":
            raise ChatError(str(task.get("failReason") or "The image task failed."), "upstream")
    raise ChatError("The image task did not finish in time.", "timeout")
