"""Streamed Anthropic Messages events <-> OpenAI chat.completion.chunks.

Both converters are stateful (one per call) and fed one event or chunk at a
time; neither buffers more than the tool-call bookkeeping.
"""
from __future__ import annotations

from relay.convert.anthropic import FINISH_TO_STOP, STOP_TO_FINISH, usage_from, usage_to_from_openai
from relay.convert.common import chunk, error_chunk, new_id, usage_chunk
from relay.money.pricing import Usage


# OpenAI-style error types -> Anthropic's (Anthropic's own pass as they are).
ERROR_TYPES = {"overloaded_error": "overloaded_error", "rate_limit_error": "rate_limit_error",
               "api_error": "api_error", "invalid_request_error": "invalid_request_error",
               "upstream_error": "api_error", "server_error": "api_error"}


class EventsToChunks:
    """Anthropic stream events -> OpenAI chunks, collecting usage.

    Usage counts in message_delta are cumulative totals that replace those
    of message_start when present (that is how Anthropic reports them)."""

    def __init__(self, model: str, build: bool = True):
        self.model = model
        self.id = new_id("chatcmpl-")
        self.usage_doc: dict = {}
        self.tool_index: dict[int, int] = {}
        self.text_parts: list[str] = []
        self.final = False  # message_delta (with the final output count) seen
        # False on pass-through: the events are written as they came, and
        # only the usage and the text are noted (no chunk is made: a real
        # answer streams hundreds of deltas)
        self.build = build

    @property
    def usage(self) -> Usage | None:
        return usage_from(self.usage_doc) if self.usage_doc else None

    def _chunk(self, delta=None, finish=None) -> dict | None:
        return chunk(self.id, self.model, delta, finish) if self.build else None

    def feed(self, name: str, data: dict) -> list[dict]:
        """One event (its `event:` name and parsed data) -> 0..n chunks.
        An `error` event becomes an error chunk (see common.error_chunk)."""
        kind = data.get("type") or name
        if kind == "message_start":
            msg = data.get("message") or {}
            self.usage_doc.update({k: v for k, v in (msg.get("usage") or {}).items()
                                   if v is not None})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                n = self.tool_index[data.get("index", 0)] = len(self.tool_index)
                self.text_parts.append(block.get("name", ""))
                return [self._chunk({"tool_calls": [{
                    "index": n, "id": block.get("id") or new_id("call_"), "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": ""}}]})]
            if block.get("type") == "text" and block.get("text"):
                self.text_parts.append(block["text"])
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            dt = delta.get("type")
            if dt == "text_delta" and delta.get("text"):
                self.text_parts.append(delta["text"])
                return [self._chunk({"content": delta["text"]})]
            if dt == "input_json_delta" and delta.get("partial_json"):
                n = self.tool_index.get(data.get("index", 0))
                if n is None:
                    return []
                self.text_parts.append(delta["partial_json"])
                return [self._chunk({"tool_calls": [{"index": n, "function": {
                    "arguments": delta["partial_json"]}}]})]
            if dt == "thinking_delta" and delta.get("thinking"):
                self.text_parts.append(delta["thinking"])
                return [self._chunk({"reasoning_content": delta["thinking"]})]
            return []
        if kind == "message_delta":
            self.final = True
            self.usage_doc.update({k: v for k, v in (data.get("usage") or {}).items()
                                   if v is not None})
            stop = (data.get("delta") or {}).get("stop_reason")
            if stop:
                return [self._chunk({}, STOP_TO_FINISH.get(stop, "stop"))]
            return []
        if not self.build:
            return []
        if kind == "message_stop":
            u = self.usage or Usage()
            return [usage_chunk(self.id, self.model, {
                "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens}})]
        if kind == "error":
            err = data.get("error") or {}
            return [error_chunk(f"The upstream failed mid-stream: {err.get('message')}",
                                err.get("type") or "api_error")]
        return []  # ping and event types we do not know


class ChunksToEvents:
    """OpenAI chunks -> the exact Anthropic event sequence:
    message_start, ping, (content_block_start, content_block_delta*,
    content_block_stop)*, message_delta (stop_reason, usage), message_stop."""

    def __init__(self, model: str, input_tokens: int = 0):
        self.model = model
        self.input_tokens = input_tokens
        self.started = False
        self.index = -1
        self.open: tuple | None = None      # ("text",) / ("thinking",) / ("tool", openai index)
        self.tools: dict[int, int] = {}      # OpenAI tool index -> block index
        self.stop: str | None = None
        self.usage: dict | None = None
        self.failed = False

    def _start(self) -> list[tuple[str, dict]]:
        self.started = True
        msg = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": self.model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": self.input_tokens, "output_tokens": 1,
                         "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": msg}),
                ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _open(self, key: tuple, block: dict) -> list[tuple[str, dict]]:
        out = self._close()
        self.index += 1
        self.open = key
        return out + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": block})]

    def feed(self, doc: dict) -> list[tuple[str, dict]]:
        """One OpenAI chunk -> 0..n (event name, data) pairs.  An error chunk
        becomes Anthropic's `error` event, and the stream ends there."""
        if self.failed:
            return []
        out = [] if self.started else self._start()
        if isinstance(doc.get("error"), dict):
            self.failed = True
            err = doc["error"]
            return out + [("error", {"type": "error", "error": {
                "type": ERROR_TYPES.get(err.get("type"), "api_error"),
                "message": str(err.get("message") or "The upstream failed.")}})]
        if doc.get("usage"):
            self.usage = doc["usage"]
        for choice in doc.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.open != ("thinking",):
                    out += self._open(("thinking",), {"type": "thinking", "thinking": "",
                                                      "signature": ""})
                out.append(self._delta({"type": "thinking_delta",
                                        "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                if self.open != ("text",):
                    out += self._open(("text",), {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for tc in delta.get("tool_calls") or ():
                i = tc.get("index", 0)
                fn = tc.get("function") or {}
                if i not in self.tools:
                    out += self._open(("tool", i), {"type": "tool_use",
                                                    "id": tc.get("id") or new_id("toolu_"),
                                                    "name": fn.get("name", ""), "input": {}})
                    self.tools[i] = self.index
                if fn.get("arguments") and self.open == ("tool", i):
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": fn["arguments"]}))
            if choice.get("finish_reason"):
                self.stop = FINISH_TO_STOP.get(choice["finish_reason"], "end_turn")
        return out

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                        "delta": delta})

    def finish(self) -> list[tuple[str, dict]]:
        """The closing events, once the upstream ended cleanly."""
        if self.failed:
            return []
        out = [] if self.started else self._start()
        out += self._close()
        usage = usage_to_from_openai(self.usage) if self.usage else {
            "input_tokens": self.input_tokens, "output_tokens": 0}
        out.append(("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": self.stop or "end_turn",
                                                "stop_sequence": None},
                                      "usage": usage}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out
