"""Streamed Gemini answers <-> OpenAI chat.completion.chunks.

Gemini streams whole GenerateContentResponse objects, each holding the new
parts; function calls arrive complete (never split), usageMetadata is a
running total repeated on the chunks and final on the last one.
"""
from __future__ import annotations


from relay.convert.common import chunk, dumps, error_chunk, new_id, parse_args, usage_chunk
from relay.convert.gemini import FINISH_TO_GEMINI, finish_from, usage_from, usage_meta
from relay.money.pricing import Usage


class StreamToChunks:
    """Gemini stream responses -> OpenAI chunks, collecting usage."""

    def __init__(self, model: str, build: bool = True):
        self.model = model
        self.id = new_id("chatcmpl-")
        self.started = False
        self.meta: dict | None = None
        self.calls = 0
        self.text_parts: list[str] = []
        # False on pass-through: the usage and the text are noted, no chunk made
        self.build = build

    @property
    def usage(self) -> Usage | None:
        return usage_from(self.meta)

    def _chunk(self, delta: dict, finish: str | None = None) -> dict | None:
        return chunk(self.id, self.model, delta, finish) if self.build else None

    def feed(self, doc: dict) -> list[dict]:
        """One streamed response -> 0..n chunks.  An error object in the
        stream becomes an error chunk (see common.error_chunk)."""
        if isinstance(doc.get("error"), dict):
            if not self.build:
                return []
            err = doc["error"]
            return [error_chunk(f"The upstream failed mid-stream: {err.get('message')}",
                                "upstream_error", err.get("status"))]
        out = []
        if not self.started:
            self.started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        if doc.get("usageMetadata"):
            self.meta = doc["usageMetadata"]
        for cand in (doc.get("candidates") or ())[:1]:
            for p in (cand.get("content") or {}).get("parts") or ():
                if "functionCall" in p:
                    fc = p["functionCall"]
                    args = dumps(fc.get("args") or {})
                    self.text_parts += [fc.get("name", ""), args]
                    out.append(self._chunk({"tool_calls": [{
                        "index": self.calls, "id": fc.get("id") or new_id("call_"),
                        "type": "function", "function": {"name": fc.get("name", ""),
                                                         "arguments": args}}]}))
                    self.calls += 1
                elif p.get("text"):
                    self.text_parts.append(p["text"])
                    key = "reasoning_content" if p.get("thought") else "content"
                    out.append(self._chunk({key: p["text"]}))
            finish = finish_from(cand.get("finishReason"), self.calls > 0)
            if finish:
                out.append(self._chunk({}, finish))
        return out if self.build else []

    def finish(self) -> list[dict]:
        """At the clean end of the stream: the usage chunk."""
        u = self.usage
        if u is None:
            return []
        return [usage_chunk(self.id, self.model, {
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}})]


class ChunksToStream:
    """OpenAI chunks -> Gemini stream responses.  Text goes out as it comes;
    tool calls are held until complete, since Gemini sends whole calls."""

    def __init__(self, model: str):
        self.model = model
        self.id = new_id("")
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.failed = False

    def _resp(self, parts: list[dict], finish: str | None = None) -> dict:
        cand: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            cand["finishReason"] = finish
        return {"candidates": [cand], "modelVersion": self.model, "responseId": self.id}

    def feed(self, doc: dict) -> list[dict]:
        """One OpenAI chunk -> 0..n responses; an error chunk becomes
        Gemini's error object, and the stream ends there."""
        if self.failed:
            return []
        if isinstance(doc.get("error"), dict):
            self.failed = True
            msg = str(doc["error"].get("message") or "The upstream failed.")
            return [{"error": {"code": 502, "message": msg, "status": "UNAVAILABLE"}}]
        if doc.get("usage"):
            self.usage = doc["usage"]
        parts = []
        for choice in (doc.get("choices") or ())[:1]:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                parts.append({"text": delta["reasoning_content"], "thought": True})
            if delta.get("content"):
                parts.append({"text": delta["content"]})
            for tc in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(tc.get("index", 0), {"name": "", "args": ""})
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["args"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return [self._resp(parts)] if parts else []

    def finish(self) -> list[dict]:
        if self.failed:
            return []
        parts = [{"functionCall": {"name": c["name"], "args": parse_args(c["args"])}}
                 for _, c in sorted(self.calls.items())]
        last = self._resp(parts or [{"text": ""}],
                          FINISH_TO_GEMINI.get(self.finish_reason or "stop", "STOP"))
        last["usageMetadata"] = usage_meta(self.usage)
        return [last]
