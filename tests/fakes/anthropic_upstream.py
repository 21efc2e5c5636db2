"""A faithful fake of Anthropic's Messages API, on a real socket.

Wire format as Anthropic documents it:
- POST /v1/messages (and ?beta=true) with x-api-key (or Authorization:
  Bearer) and anthropic-version; POST /v1/messages/count_tokens answers
  {"input_tokens": fake.count_value}.
- Answers are `message` objects.  Streams are the documented sequence:
  message_start, then per content block content_block_start,
  content_block_delta*, content_block_stop (a `ping` after the first
  block's start), message_delta (stop_reason, usage), message_stop.
  Deltas: text_delta; thinking_delta then signature_delta for thinking;
  input_json_delta for tool_use; a redacted_thinking block comes whole in
  its start event.
- Errors are {"type": "error", "error": {"type", "message"}}; mid-stream
  they are an `error` event.

What it checks, as Anthropic does: max_tokens and messages present; roles
user, assistant or system (SystemMessageParam); with thinking on, a
budget of at least 1024 below max_tokens, no temperature but 1, no top_k,
and a tool loop whose assistant turn starts with a thinking block carrying
a signature this fake issued.

What it answers (tests/fakes/agent_script.py): a tool call while tools
are offered and the last user turn has no tool_result, then text quoting
the tool result; else `fake.text`.  With thinking on, a thinking block
comes first.  With `fake.caching` on, usage counts cache reads and writes
per upstream key as Anthropic does (tests/fakes/prompt_cache.py).  A stop sequence found in the text cuts it there (stop_reason
stop_sequence); max_tokens below the word count cuts it to that many words
(stop_reason max_tokens).  Usage is `fake.usage`, or the body's
`fake_usage` (only a pass-through body keeps that field).

Modes by path prefix `/mode/<name>` (as in FakeOpenAI): ok; slow (a delay
before every event); 429; 500; 529 (overloaded); reset (connection cut
mid-stream); hang (never answers); flaky (every other call 500);
error_event (an `error` event mid-stream); redacted (thinking answers also
carry a redacted_thinking block); no_count_tokens (count_tokens is 404, as
on Anthropic-compatible servers without it).
"""
from __future__ import annotations

import asyncio
import json

import tornado.web
from tornado.iostream import StreamClosedError

from tests.fakes.agent_script import next_turn
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.prompt_cache import PromptCache
from tests.fakes.server import reset_connection

DEFAULT_TEXT = "Hello from the fake Anthropic upstream."
THINKING_TEXT = "The user wants an answer; let me think it through."
SIGNATURE = "sig_fake_EqQBCkYIARgCIkDx"   # what a thinking block's signature_delta carries
REDACTED = "cmVkYWN0ZWQgdGhpbmtpbmcgZmFrZQ=="


def _err(handler, status, type_, message):
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish({"type": "error", "error": {"type": type_, "message": message},
                    "request_id": "req_fake"})


def _sse(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _thinking_on(b: dict) -> bool:
    return (b.get("thinking") or {}).get("type") in ("enabled", "adaptive")


class _Base(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    async def prepare(self):
        self.mode = self.path_kwargs.get("mode") or "ok"
        try:
            self.b = json.loads(self.request.body or b"{}")
        except ValueError:
            self.b = {"_raw": self.request.body[:200].decode(errors="replace")}
        self.rec = self.fake.record(self.request, self.b, self.mode)
        h = self.request.headers
        key = h.get("x-api-key") or (h.get("Authorization", "")[7:]
                                     if h.get("Authorization", "").startswith("Bearer ") else "")
        if self.mode == "hang":
            await asyncio.Event().wait()
        if not key or key == "bad-key":
            return _err(self, 401, "authentication_error", "invalid x-api-key")
        if not h.get("anthropic-version"):
            return _err(self, 400, "invalid_request_error",
                        "anthropic-version: header is required")
        if self.mode == "429":
            return _err(self, 429, "rate_limit_error",
                        "Number of requests has exceeded your rate limit")
        if self.mode == "500":
            return _err(self, 500, "api_error", "Internal server error")
        if self.mode == "529":
            return _err(self, 529, "overloaded_error", "Overloaded")
        if self.mode == "flaky":
            self.fake.flaky_count += 1
            if self.fake.flaky_count % 2 == 1:
                return _err(self, 500, "api_error", "flaky failure")
        self.key = key
        refusal = self.fake.refusal(key, h.get("anthropic-beta") or "", self.b)
        if refusal is not None:
            self.rec["refused"] = True
            self.set_status(400)
            self.set_header("Content-Type", "application/json")
            return self.finish(refusal)

    def signature(self) -> str:
        """What this upstream's signatures start with: with fake.signed_per_key
        one account's signature is refused by another, as Anthropic does."""
        return f"sig_fake_{self.key}" if self.fake.signed_per_key else "sig_fake"

    def problem(self, b: dict, need_max_tokens: bool = True) -> str | None:
        """What Anthropic would refuse in this body (its message), or None."""
        if need_max_tokens and not isinstance(b.get("max_tokens"), int):
            return "max_tokens: Field required"
        if not isinstance(b.get("messages"), list) or not b["messages"]:
            return "messages: Field required"
        for i, m in enumerate(b["messages"]):
            if m.get("role") not in ("user", "assistant", "system"):
                return f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
        if "CONTEXT_TOO_LONG" in json.dumps(b["messages"]):
            return "prompt is too long: 210000 tokens > 200000 maximum"
        if not _thinking_on(b):
            return None
        t = b["thinking"]
        if t["type"] == "enabled":
            if not isinstance(t.get("budget_tokens"), int) or t["budget_tokens"] < 1024:
                return ("thinking.enabled.budget_tokens: Input should be greater than or "
                        "equal to 1024")
            if need_max_tokens and t["budget_tokens"] >= b["max_tokens"]:
                return "`max_tokens` must be greater than `thinking.budget_tokens`"
        if b.get("temperature") not in (None, 1, 1.0):
            return "`temperature` may only be set to 1 when thinking is enabled"
        if b.get("top_k") is not None:
            return "`top_k` is not supported when thinking is enabled"
        for m in b["messages"]:
            for block in m.get("content") if isinstance(m.get("content"), list) else ():
                if block.get("type") == "thinking" and \
                        not str(block.get("signature", "")).startswith(self.signature()):
                    return "Invalid `signature` in `thinking` block"
        last = next((m for m in reversed(b["messages"]) if m.get("role") == "assistant"), None)
        content = last.get("content") if last else None
        if isinstance(content, list) and any(x.get("type") == "tool_use" for x in content) and \
                content[0].get("type") not in ("thinking", "redacted_thinking"):
            return ("messages: Expected `thinking` or `redacted_thinking`, but found "
                    f"`{content[0].get('type')}`. When `thinking` is enabled, a final "
                    "`assistant` message must start with a thinking block.")
        return None


class CountTokensHandler(_Base):
    async def post(self, mode=None):
        if self.mode == "no_count_tokens":
            return _err(self, 404, "not_found_error", "Not Found")
        problem = self.problem(self.b, need_max_tokens=False)
        if problem:
            return _err(self, 400, "invalid_request_error", problem)
        self.finish({"input_tokens": self.fake.count_value})


class MessagesHandler(_Base):
    async def post(self, mode=None):
        problem = self.problem(self.b)
        if problem:
            return _err(self, 400, "invalid_request_error", problem)
        await self.answer(self.b, self.mode)

    def plan(self, b: dict) -> tuple[list[dict], str, str | None]:
        """(content blocks, stop_reason, stop_sequence) for this request."""
        last = b["messages"][-1]
        results = [x for x in last["content"] if x.get("type") == "tool_result"] \
            if last.get("role") == "user" and isinstance(last.get("content"), list) else []
        tools = [t["name"] for t in b.get("tools") or () if t.get("name")]
        turn = next_turn(self.fake, self.fake.text, tools,
                         results[-1].get("content") if results else None, bool(results),
                         (b.get("tool_choice") or {}).get("type") != "none")
        blocks = []
        if _thinking_on(b):
            blocks.append({"type": "thinking", "thinking": THINKING_TEXT,
                           "signature": self.signature() + SIGNATURE[len("sig_fake"):]})
            if self.mode == "redacted":
                blocks.append({"type": "redacted_thinking", "data": REDACTED})
        if turn.kind == "tool":
            return blocks + [{"type": "text", "text": "Let me check."},
                             {"type": "tool_use", "id": "toolu_fake1", "name": turn.tool,
                              "input": turn.input}], "tool_use", None
        text, stop, seq = turn.text, "end_turn", None
        for s in b.get("stop_sequences") or ():
            if s in text:
                text, stop, seq = text[:text.index(s)], "stop_sequence", s
        words = text.split(" ")
        if b["max_tokens"] < len(words):
            text, stop = " ".join(words[:b["max_tokens"]]), "max_tokens"
        return blocks + [{"type": "text", "text": text}], stop, seq

    def block_events(self, i: int, block: dict) -> list[tuple[str, dict]]:
        """One content block as its start, deltas and stop events."""
        def delta(d):
            return ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
        kind = block["type"]
        empty = {"text": {"type": "text", "text": ""},
                 "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "tool_use": dict(block, input={})}.get(kind, block)
        out = [("content_block_start", {"type": "content_block_start", "index": i,
                                        "content_block": empty})]
        if i == 0:
            out.append(("ping", {"type": "ping"}))
        if kind in ("text", "thinking"):
            text = block[kind]
            third = max(1, len(text) // 3)
            for piece in (text[:third], text[third:2 * third], text[2 * third:]):
                if piece:
                    out.append(delta({"type": f"{kind}_delta", kind: piece}))
            if kind == "thinking":
                out.append(delta({"type": "signature_delta", "signature": block["signature"]}))
        elif kind == "tool_use":
            js = json.dumps(block["input"])
            for piece in (js[:5], js[5:]):
                out.append(delta({"type": "input_json_delta", "partial_json": piece}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        return out

    async def answer(self, b: dict, mode: str) -> None:
        blocks, stop, seq = self.plan(b)
        usage = dict(self.fake.usage)
        usage.update(b.get("fake_usage") or {})
        if self.fake.caching:  # tests/fakes/prompt_cache.py: this account's own cache
            usage.update(self.fake.prompt_cache.anthropic(self.key, b))
            self.rec["cache"] = dict(usage)
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
            events += self.block_events(i, block)
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop, "stop_sequence": seq},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        delay = self.fake.slow_delay if mode == "slow" else 0
        for n, (name, data) in enumerate(events):
            if delay:
                await asyncio.sleep(delay)
            if mode == "reset" and n == 4:
                reset_connection(self)
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


def _find(doc, parts: list, at: str = "") -> str | None:
    """Where `parts` ("*" for any list element) is in `doc`, as Anthropic
    names it ("tools.0.custom.input_examples": a tool's union tag is in the
    path), or None."""
    if not parts:
        return at
    part, rest = parts[0], parts[1:]
    if isinstance(doc, list) and part == "*":
        for i, item in enumerate(doc):
            tag = f".{item.get('type', 'custom')}" if isinstance(item, dict) and at.endswith(
                "tools") else ""
            got = _find(item, rest, f"{at}.{i}{tag}")
            if got is not None:
                return got
        return None
    if isinstance(doc, dict) and part in doc:
        return _find(doc[part], rest, f"{at}.{part}" if at else part)
    return None


class FakeAnthropic(FakeOpenAI):
    """Runs in a thread; `url` is its base address (clients add /v1/messages).
    `tool_plan` steers which tool it calls (see agent_script)."""

    def __init__(self, slow_delay: float = 0.5):
        super().__init__(slow_delay)
        self.text = DEFAULT_TEXT
        self.usage = {"input_tokens": 21, "output_tokens": 7, "cache_read_input_tokens": 4,
                      "cache_creation_input_tokens": 0}
        self.count_value = 4242
        self.tool_plan: dict | None = None
        self.signed_per_key = False  # see _Base.signature()
        # Prompt caching accounted per upstream key (tests/fakes/prompt_cache.py).
        self.caching = False
        self.prompt_cache = PromptCache()
        # api key -> {"betas": [...], "fields": [...], "wording": "anthropic" | "bedrock"}:
        # what an upstream behind that key refuses (an older Vertex, Bedrock or a reseller).
        self.refuses: dict[str, dict] = {}

    def refusal(self, key: str, betas: str, body: dict) -> dict | None:
        """The 400 body this key's upstream answers, in the vendor's words, or None."""
        rule = self.refuses.get(key)
        if not rule:
            return None
        sent = [b.strip() for b in betas.split(",") if b.strip()]
        bad = [b for b in sent if b in rule.get("betas", ())]
        bedrock = rule.get("wording") == "bedrock"
        if bad:
            if bedrock:
                return {"message": "invalid beta flag"} if rule.get("unnamed") else {
                    "message": f"Unexpected value(s) {', '.join(f'`{b}`' for b in bad)} for "
                               "the `anthropic-beta` header."}
            return {"type": "error", "error": {"type": "invalid_request_error", "message": (
                f"Unexpected value(s) {', '.join(f'`{b}`' for b in bad)} for the "
                "`anthropic-beta` header. Please consult our documentation at "
                "docs.anthropic.com or try again without the header.")},
                "request_id": "req_vrtx_fake"}
        for path in rule.get("fields", ()):
            where = _find(body, path.split("."))
            if where is None:
                continue
            text = f"{where}: Extra inputs are not permitted"
            if bedrock:
                return {"message": f"The model returned the following errors: {text}"}
            return {"type": "error", "error": {"type": "invalid_request_error", "message": text},
                    "request_id": "req_fake"}
        return None

    def routes(self):
        p = r"(?:/mode/(?P<mode>[a-z0-9_]+))?(?:/v1)?"
        kw = {"fake": self}
        return [(p + r"/messages/count_tokens", CountTokensHandler, kw),
                (p + r"/messages", MessagesHandler, kw)]
