"""A faithful fake of an OpenAI-format upstream, on a real socket.

Failure modes are named and chosen by path prefix, so one fake serves
channels that behave differently: a channel whose base_url is
`{fake.url}/mode/429` always rate-limits.  Modes:

    ok       answer normally (also the bare `{fake.url}`)
    slow     wait `slow_delay` seconds before every chunk
    429      HTTP 429 rate limit
    500      HTTP 500
    reset    start a stream, send two chunks, then reset the connection
    hang     accept and never answer
    flaky    fail with 500 every other request
    429org   HTTP 429 naming the organisation and the project, as OpenAI's do
    400key   HTTP 400 echoing a fragment of the key it was sent, as some aggregators do
    chatonly       no /v1/responses (404), like a chat-only compatible server
    chatonly405    the same, answered 405 Method Not Allowed (FastAPI servers)
    responsesonly  no /v1/chat/completions (404)
    nocompact      /v1/responses but no /v1/responses/compact (404), like vLLM

/v1/responses and its sub-routes are tests/fakes/openai_responses.py.

The request body may steer the answer (the relay passes unknown fields on):
    fake_usage   {"prompt_tokens", "completion_tokens", "cached_tokens"}
    fake_usage_doc  the usage object to answer with, as it is (every detail field)
    fake_chunks  how many content chunks to stream (default 3)
    fake_delay   seconds between chunks (default 0)
    fake_text    the reply text (default "Hello from the fake upstream.")
`n` choices are answered (whole answers; a stream carries index 0), each
counted in the usage, and n over 128 is refused with 400, as OpenAI does.
Answers carry `service_tier`: flex or priority as asked, else default
(fake_service_tier: another, as when flex capacity runs out).
A model named missing-... is a 404 model_not_found, as OpenAI answers for
a model the account does not have.  Models named o1, o1-mini, o1-preview reject a system message with 400, as
OpenAI does; `reasoning_effort` is refused with 400 by models that are not
reasoning models (o-series, gpt-5), as OpenAI does, and gpt-4o models refuse an
output limit over 16384 tokens (openai_responses.model_refuses); a message containing CONTEXT_TOO_LONG gets
the 400 context_length_exceeded error.

With `fake.caching` on, chat usage counts cached prompt tokens per upstream
key as OpenAI's automatic caching does (tests/fakes/prompt_cache.py).

Tools follow the script in tests/fakes/agent_script.py: a tool call while
tools are offered and the last message is not a tool result, then text
quoting the result (`fake.tool_plan` picks the tool).
"""
from __future__ import annotations

import asyncio
import base64
import json
import struct
import time

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError

from tests.fakes import openai_responses as responses
from tests.fakes.agent_script import next_turn
from tests.fakes.prompt_cache import PromptCache
from tests.fakes.server import ThreadedServer, reset_connection

DEFAULT_TEXT = "Hello from the fake upstream."


def _err(handler, status, message, type_="invalid_request_error", code=None):
    handler.set_status(status)
    handler.finish({"error": {"message": message, "type": type_, "param": None, "code": code}})


class _Base(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    async def prepare(self):
        mode = self.path_kwargs.get("mode") or "ok"
        self.mode = mode
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = {"_raw": self.request.body[:200].decode(errors="replace")}
        self.rec = self.fake.record(self.request, body, mode)
        self.body = body
        if mode == "hang":
            await asyncio.Event().wait()
        if mode == "429":
            return _err(self, 429, "Rate limit reached for requests", "requests", "rate_limit_exceeded")
        if mode == "500":
            return _err(self, 500, "The server had an error while processing your request.",
                        "server_error")
        if mode == "429org":
            return _err(self, 429, "Rate limit reached for gpt-4o-mini in organization "
                        "org-AbCdEf0123456789wxyz on tokens per min (TPM): Limit 30000, Used "
                        "29000, Requested 1500. Visit https://platform.openai.com/account/"
                        "rate-limits (project proj_Zx9Yw8Vu7Ts6Rq5Po4).", "tokens",
                        "rate_limit_exceeded")
        if mode == "400key":
            return _err(self, 400, "Invalid request for key sk-live-9fQ2xB7kLm4Np8Rt1Vw3Yz: "
                        "the account AKIAQ3EGUSPT7Z2XWKMB has no access to this model "
                        "(key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStU).",
                        "invalid_request_error", "model_not_permitted")
        if mode == "flaky":
            self.fake.flaky_count += 1
            if self.fake.flaky_count % 2 == 1:
                return _err(self, 500, "flaky failure", "server_error")
        if self.request.headers.get("Authorization", "") == "Bearer bad-key":
            return _err(self, 401, "Incorrect API key provided.", "invalid_request_error",
                        "invalid_api_key")
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model.startswith("missing-"):
            return _err(self, 404, f"The model `{model}` does not exist or you do not have "
                                   "access to it.", "invalid_request_error", "model_not_found")
        key = self.request.headers.get("Authorization", "")[7:]
        for field in (self.fake.refuses.get(key) or {}).get("fields", ()):
            if isinstance(body, dict) and field in body:
                rec = self.rec
                rec["refused"] = True
                if self.request.path.endswith("/chat/completions"):
                    return _err(self, 400, f"Unrecognized request argument supplied: {field}")
                self.set_status(400)
                return self.finish({"error": {"message": f"Unknown parameter: '{field}'.",
                                              "type": "invalid_request_error", "param": field,
                                              "code": "unknown_parameter"}})


class ChatHandler(_Base):
    async def post(self, mode=None):
        if self.mode == "responsesonly":
            return _err(self, 404, "Invalid URL (POST /v1/chat/completions)")
        b = self.body
        model = b.get("model", "")
        msgs = b.get("messages") or []
        if model in ("o1", "o1-mini", "o1-preview") and any(
                isinstance(m, dict) and m.get("role") == "system" for m in msgs):
            return _err(self, 400, "Unsupported value: 'messages[0].role' does not support "
                                   "'system' with this model.", "invalid_request_error",
                        "unsupported_value")
        if "CONTEXT_TOO_LONG" in json.dumps(msgs):
            return _err(self, 400, "This model's maximum context length is 8192 tokens. However, "
                                   "your messages resulted in 9000 tokens.",
                        "invalid_request_error", "context_length_exceeded")
        refused = responses.model_refuses(model, "reasoning_effort" in b and "reasoning_effort",
                                          b.get("max_completion_tokens") or b.get("max_tokens"))
        if refused:
            return _err(self, 400, *refused)
        last = msgs[-1] if msgs and isinstance(msgs[-1], dict) else {}
        turn = next_turn(self.fake, b.get("fake_text", self.fake.text or DEFAULT_TEXT),
                         [(t.get("function") or {}).get("name", "f") for t in b.get("tools") or ()],
                         last.get("content"), last.get("role") == "tool",
                         b.get("tool_choice") != "none")
        text = turn.text
        nchunks = max(1, int(b.get("fake_chunks", 3)))
        n = b.get("n") if isinstance(b.get("n"), int) and b.get("n") > 0 else 1
        if n > 128:
            return _err(self, 400, f"Invalid 'n': integer above maximum value. Expected a value "
                                   f"<= 128, but got {n} instead.", "invalid_request_error",
                        "integer_above_max_value")
        # Every choice is generated and billed: the usage counts them all.
        usage = dict(prompt_tokens=10, completion_tokens=nchunks * n, cached_tokens=0)
        usage.update(b.get("fake_usage") or {})
        if self.fake.caching:  # tests/fakes/prompt_cache.py: this account's own cache
            key = self.request.headers.get("Authorization", "")[7:]
            usage["prompt_tokens"], usage["cached_tokens"] = self.fake.prompt_cache.openai(key, msgs)
            self.rec["cache"] = dict(usage)
        usage_doc = {"prompt_tokens": usage["prompt_tokens"],
                     "completion_tokens": usage["completion_tokens"],
                     "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
                     "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]}}
        if isinstance(b.get("fake_usage_doc"), dict):  # a whole usage object, details and all
            usage_doc = b["fake_usage_doc"]
        cid = f"chatcmpl-fake{int(time.time() * 1000)}"
        # The tier the call ran in, as OpenAI answers it ("auto" and none run as default).
        tier = b.get("fake_service_tier") or (
            b.get("service_tier") if b.get("service_tier") in ("flex", "priority") else "default")
        tool_call = None
        if turn.kind == "tool":
            tool_call = {"id": "call_fake1", "type": "function",
                         "function": {"name": turn.tool, "arguments": json.dumps(turn.input)}}
        if not b.get("stream"):
            message = {"role": "assistant", "content": None if tool_call else text}
            if tool_call:
                message["tool_calls"] = [tool_call]
            return self.finish({
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": i, "message": message,
                             "finish_reason": "tool_calls" if tool_call else "stop"}
                            for i in range(n)],
                "usage": usage_doc, "service_tier": tier})
        self.set_header("Content-Type", "text/event-stream")
        delay = float(b.get("fake_delay", 0)) + (self.fake.slow_delay if self.mode == "slow" else 0)
        pieces = _split(text, nchunks)

        def chunk(delta, finish=None):
            return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        events = [chunk({"role": "assistant", "content": ""})]
        if tool_call:
            events.append(chunk({"tool_calls": [{"index": 0, "id": tool_call["id"], "type": "function",
                                                 "function": {"name": tool_call["function"]["name"],
                                                              "arguments": ""}}]}))
            events.append(chunk({"tool_calls": [{"index": 0, "function": {
                "arguments": tool_call["function"]["arguments"]}}]}))
            events.append(chunk({}, "tool_calls"))
        else:
            events += [chunk({"content": p}) for p in pieces]
            events.append(chunk({}, "stop"))
        for i, ev in enumerate(events):
            if delay:
                await asyncio.sleep(delay)
            if self.mode == "reset" and i == 3:
                reset_connection(self)
                return
            raw = b.get("fake_raw_utf8") or self.fake.raw_utf8
            self.write(f"data: {json.dumps(ev, ensure_ascii=not raw)}\n\n")
            try:
                await self.flush()
            except StreamClosedError:  # the relay cancelled us
                self.rec["aborted"] = True
                self.rec["sent_events"] = i
                return
            self.rec["flushed_events"] = i + 1  # how far the relay has taken the stream
        if (b.get("stream_options") or {}).get("include_usage"):
            self.write(f"data: {json.dumps({'id': cid, 'object': 'chat.completion.chunk', 'created': int(time.time()), 'model': model, 'choices': [], 'usage': usage_doc, 'service_tier': tier})}\n\n")
        self.write("data: [DONE]\n\n")
        self.finish()


def _split(text: str, n: int) -> list[str]:
    if n <= 1:
        return [text]
    size = max(1, -(-len(text) // n))
    parts = [text[i:i + size] for i in range(0, len(text), size)]
    while len(parts) < n:
        parts.append("")
    return parts[:n - 1] + ["".join(parts[n - 1:])]


class EmbeddingsHandler(_Base):
    def post(self, mode=None):
        b = self.body
        inp = b.get("input")
        items = inp if isinstance(inp, list) and inp and not isinstance(inp[0], int) else [inp]
        data = []
        for i, _ in enumerate(items):
            vec = [round(0.1 * (i + 1) + 0.01 * j, 4) for j in range(8)]
            if b.get("encoding_format") == "base64":
                emb = base64.b64encode(struct.pack("<8f", *vec)).decode()
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        usage = {"prompt_tokens": 5 * len(items), "total_tokens": 5 * len(items)}
        usage.update(b.get("fake_usage") or {})
        self.finish({"object": "list", "data": data, "model": b.get("model"), "usage": usage})


class _ResponsesBase(_Base):
    async def prepare(self):
        await super().prepare()
        if not self._finished and self.mode == "chatonly":
            _err(self, 404, f"Invalid URL ({self.request.method} {self.request.path})")
        elif not self._finished and self.mode == "chatonly405":
            self.set_status(405)
            self.finish({"detail": "Method Not Allowed"})


class ResponsesHandler(_ResponsesBase):
    async def post(self, mode=None):
        await responses.create(self, self.body, self.fake, self.mode)


class ResponseHandler(_ResponsesBase):
    def get(self, mode=None, rid=None):
        got = responses.stored_or_404(self, self.fake, rid)
        if got is not None:
            self.finish(got["response"])

    def delete(self, mode=None, rid=None):
        if responses.stored_or_404(self, self.fake, rid) is not None:
            del self.fake.stored[rid]
            self.finish({"id": rid, "object": "response.deleted", "deleted": True})


class ResponseCancelHandler(_ResponsesBase):
    def post(self, mode=None, rid=None):
        got = responses.stored_or_404(self, self.fake, rid)
        if got is None:
            return
        if not got["response"]["background"]:
            return _err(self, 400, "Cannot cancel a synchronous response.")
        got["response"] = dict(got["response"], status="cancelled")
        self.finish(got["response"])


class ResponseInputItemsHandler(_ResponsesBase):
    def get(self, mode=None, rid=None):
        got = responses.stored_or_404(self, self.fake, rid)
        if got is not None:
            items = [dict(i, id=i.get("id") or f"msg_in{n}")
                     for n, i in enumerate(responses._items(got["request"]))]
            self.finish({"object": "list", "data": items[::-1], "has_more": False,
                         "first_id": items[-1]["id"] if items else None,
                         "last_id": items[0]["id"] if items else None})


class ResponsesCompactHandler(_ResponsesBase):
    def post(self, mode=None):
        if self.mode == "nocompact":
            self.set_status(404)
            return self.finish({"detail": "Not Found"})
        responses.compact(self, self.body, self.fake)


class ResponsesInputTokensHandler(_ResponsesBase):
    def post(self, mode=None):
        responses.input_tokens(self, self.body)


class ModelsHandler(_Base):
    def get(self, mode=None):
        self.finish({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})


class FakeOpenAI(ThreadedServer):
    """Runs in a thread with its own IOLoop; `url` is its base address."""

    def __init__(self, slow_delay: float = 0.5, record: bool = True):
        self.slow_delay = slow_delay
        # Off for benchmarks: a recorded request per call would grow memory.
        self.recording = record
        self.requests: list[dict] = []
        self.flaky_count = 0
        self.extra_handlers: list = []
        self.stored: dict[str, dict] = {}  # Responses kept with store (see openai_responses.py)
        self.tool_plan: dict | None = None  # which tool the script calls (agent_script)
        # Automatic prompt caching accounted per upstream key (tests/fakes/prompt_cache.py).
        self.caching = False
        self.prompt_cache = PromptCache()
        # Streams' JSON with characters past ASCII as they are (as serde_json,
        # Go and orjson write them), not \u escapes; and the plain answer's
        # text, for calls converted from another format (which cannot carry
        # fake_raw_utf8 and fake_text in their body).
        self.raw_utf8 = False
        self.text = None
        # api key -> {"fields": [...]}: top-level fields the upstream behind that key refuses.
        self.refuses: dict[str, dict] = {}


    def mode_url(self, mode: str) -> str:
        return f"{self.url}/mode/{mode}"

    def record(self, request, body, mode):
        rec = {"method": request.method, "path": request.path, "query": request.query,
               "mode": mode, "headers": dict(request.headers), "body": body,
               "raw": request.body, "aborted": False}
        if self.recording:
            self.requests.append(rec)
        return rec

    def routes(self):
        kw = {"fake": self}
        p = r"(?:/mode/(?P<mode>[a-z0-9_]+))?(?:/v1)?"
        r = p + r"/responses"
        return [(p + r"/chat/completions", ChatHandler, kw),
                (r, ResponsesHandler, kw),
                (r + r"/compact", ResponsesCompactHandler, kw),
                (r + r"/input_tokens", ResponsesInputTokensHandler, kw),
                (r + r"/(?P<rid>[^/]+)/cancel", ResponseCancelHandler, kw),
                (r + r"/(?P<rid>[^/]+)/input_items", ResponseInputItemsHandler, kw),
                (r + r"/(?P<rid>[^/]+)", ResponseHandler, kw),
                (p + r"/embeddings", EmbeddingsHandler, kw),
                (p + r"/models", ModelsHandler, kw)] + [
                    (p + pat, h, kw) for pat, h in self.extra_handlers]


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-record", action="store_true",
                    help="keep no copy of the requests (for benchmarks: memory stays flat)")
    args = ap.parse_args()
    fake = FakeOpenAI(record=not args.no_record)
    app = tornado.web.Application(fake.routes())
    server = HTTPServer(app)
    server.listen(args.port, "127.0.0.1")
    print(f"fake upstream on 127.0.0.1:{args.port}", flush=True)
    IOLoop.current().start()


if __name__ == "__main__":
    main()
