"""A faithful fake of Anthropic's Messages API, on a real socket.

Wire format as Anthropic serves it: POST /v1/messages with x-api-key (or
Authorization: Bearer) and anthropic-version; answers are `message`
objects; streams are the event sequence message_start, content_block_start,
ping, content_block_delta*, content_block_stop, message_delta, message_stop;
errors are {"type": "error", "error": {"type", "message"}}.

Failure modes by path prefix `/mode/<name>` (as in FakeOpenAI): ok, slow,
429, 500, 529 (overloaded), reset (connection cut mid-stream), hang,
flaky (every other call 500), error_event (an `error` event mid-stream).

The answer: with tools (and no tool_result in the last turn) a short text
block then one tool_use block calling the first tool with {"city": "Paris"};
otherwise `fake.text`.  A stop sequence found in the text cuts it there
(stop_reason stop_sequence); max_tokens below the word count cuts it to
that many words (stop_reason max_tokens).  Usage is `fake.usage`, or the
body's `fake_usage` (only a pass-through body keeps that field).
"""
from __future__ import annotations

import asyncio
import json
import socket
import struct

import tornado.web
from tornado.iostream import StreamClosedError

from tests.fakes.openai_upstream import FakeOpenAI

DEFAULT_TEXT = "Hello from the fake Anthropic upstream."


def _err(handler, status, type_, message):
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish({"type": "error", "error": {"type": type_, "message": message},
                    "request_id": "req_fake"})


def _sse(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


class MessagesHandler(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    async def post(self, mode=None):
        mode = mode or "ok"
        try:
            b = json.loads(self.request.body or b"{}")
        except ValueError:
            b = {"_raw": self.request.body[:200].decode(errors="replace")}
        self.rec = self.fake.record(self.request, b, mode)
        h = self.request.headers
        key = h.get("x-api-key") or (h.get("Authorization", "")[7:]
                                     if h.get("Authorization", "").startswith("Bearer ") else "")
        if mode == "hang":
            await asyncio.Event().wait()
        if not key or key == "bad-key":
            return _err(self, 401, "authentication_error", "invalid x-api-key")
        if not h.get("anthropic-version"):
            return _err(self, 400, "invalid_request_error",
                        "anthropic-version: header is required")
        if mode == "429":
            return _err(self, 429, "rate_limit_error", "Number of requests has exceeded your rate limit")
        if mode == "500":
            return _err(self, 500, "api_error", "Internal server error")
        if mode == "529":
            return _err(self, 529, "overloaded_error", "Overloaded")
        if mode == "flaky":
            self.fake.flaky_count += 1
            if self.fake.flaky_count % 2 == 1:
                return _err(self, 500, "api_error", "flaky failure")
        if not isinstance(b.get("max_tokens"), int):
            return _err(self, 400, "invalid_request_error", "max_tokens: Field required")
        if not isinstance(b.get("messages"), list) or not b["messages"]:
            return _err(self, 400, "invalid_request_error", "messages: Field required")
        for i, m in enumerate(b["messages"]):
            if m.get("role") not in ("user", "assistant"):
                return _err(self, 400, "invalid_request_error",
                            f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "CONTEXT_TOO_LONG" in json.dumps(b["messages"]):
            return _err(self, 400, "invalid_request_error",
                        "prompt is too long: 210000 tokens > 200000 maximum")
        await self.answer(b, mode)

    def plan(self, b: dict) -> tuple[list[dict], str, str | None]:
        """(content blocks, stop_reason, stop_sequence) for this request."""
        last = b["messages"][-1]
        had_result = isinstance(last.get("content"), list) and any(
            x.get("type") == "tool_result" for x in last["content"])
        tc = (b.get("tool_choice") or {}).get("type")
        if b.get("tools") and not had_result and tc != "none":
            tool = b["tools"][0]
            return ([{"type": "text", "text": "Let me check."},
                     {"type": "tool_use", "id": "toolu_fake1", "name": tool["name"],
                      "input": {"city": "Paris"}}], "tool_use", None)
        text = self.fake.text
        stop, seq = "end_turn", None
        for s in b.get("stop_sequences") or ():
            if s in text:
                text, stop, seq = text[:text.index(s)], "stop_sequence", s
        words = text.split(" ")
        if b["max_tokens"] < len(words):
            text, stop = " ".join(words[:b["max_tokens"]]), "max_tokens"
        return [{"type": "text", "text": text}], stop, seq

    async def answer(self, b: dict, mode: str) -> None:
        blocks, stop, seq = self.plan(b)
        usage = dict(self.fake.usage)
        usage.update(b.get("fake_usage") or {})
        model = b.get("model", "")
        if not b.get("stream"):
            self.set_header("Content-Type", "application/json")
            return self.finish({"id": "msg_fake01", "type": "message", "role": "assistant",
                                "model": model, "content": blocks, "stop_reason": stop,
                                "stop_sequence": seq, "usage": usage})
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        start_usage = {k: v for k, v in usage.items() if k != "output_tokens"}
        start_usage["output_tokens"] = 1
        events = [("message_start", {"type": "message_start", "message": {
            "id": "msg_fake01", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}})]
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                if i == 0:
                    events.append(("ping", {"type": "ping"}))
                text = block["text"]
                third = max(1, len(text) // 3)
                for piece in (text[:third], text[third:2 * third], text[2 * third:]):
                    if piece:
                        events.append(("content_block_delta", {
                            "type": "content_block_delta", "index": i,
                            "delta": {"type": "text_delta", "text": piece}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": dict(block, input={})}))
                js = json.dumps(block["input"])
                for piece in (js[:5], js[5:]):
                    events.append(("content_block_delta", {
                        "type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop, "stop_sequence": seq},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        delay = self.fake.slow_delay if mode == "slow" else 0
        for n, (name, data) in enumerate(events):
            if delay:
                await asyncio.sleep(delay)
            if mode == "reset" and n == 4:
                self.request.connection.stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.request.connection.stream.close()
                return
            if mode == "error_event" and n == 4:
                self.write(_sse("error", {"type": "error", "error": {
                    "type": "overloaded_error", "message": "Overloaded"}}))
                return self.finish()
            self.write(_sse(name, data))
            try:
                await self.flush()
            except StreamClosedError:  # the relay cancelled us
                self.rec["aborted"] = True
                return
        self.finish()


class FakeAnthropic(FakeOpenAI):
    """Runs in a thread; `url` is its base address (clients add /v1/messages)."""

    def __init__(self, slow_delay: float = 0.5):
        super().__init__(slow_delay)
        self.text = DEFAULT_TEXT
        self.usage = {"input_tokens": 21, "output_tokens": 7, "cache_read_input_tokens": 4,
                      "cache_creation_input_tokens": 0}

    def routes(self):
        p = r"(?:/mode/(?P<mode>[a-z0-9_]+))?(?:/v1)?"
        return [(p + r"/messages", MessagesHandler, {"fake": self})]
