"""A faithful fake of the Gemini API (generativelanguage), on a real socket.

Routes as Google serves them, under /v1beta and /v1:
    POST /models/{model}:generateContent
    POST /models/{model}:streamGenerateContent   (?alt=sse: SSE; else a JSON array)
    POST /models/{model}:countTokens | :embedContent | :batchEmbedContents
    GET  /models
Key from x-goog-api-key or ?key=; a wrong key gets Google's 400
API_KEY_INVALID.  Errors are {"error": {"code", "message", "status"}}.

Failure modes by path prefix `/mode/<name>`: ok, slow, 429, 500, reset,
hang, flaky (every other call 500), error_chunk (an error object mid-stream).

The answer follows tests/fakes/agent_script.py: a functionCall while
functionDeclarations are offered and the last turn holds no
functionResponse (agent_script picks which: `fake.tool_plan`, a coding
agent's shell tool, else the first), then text quoting the functionResponse;
otherwise `fake.text`.  usageMetadata is `fake.usage` (running totals on every
streamed chunk, final on the last), stop sequences cut the text.

Thinking, as Google documents it: generationConfig.thinkingConfig takes
thinkingBudget or (Gemini 3 and later) thinkingLevel, never both (400);
with includeThoughts a thought part ({"text", "thought": true}) comes
first and thoughtsTokenCount joins the usage.  Gemini 3 models sign their
function calls (thoughtSignature) and refuse a replayed call whose step
lost its signature (400), as the real ones do.
"""
from __future__ import annotations

import asyncio
import json

import re

import tornado.web

from tests.fakes.agent_script import next_turn
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.server import reset_connection

DEFAULT_TEXT = "Hello from the fake Gemini upstream."
THOUGHT = "Thinking about what the user asked."
THOUGHT_TOKENS = 4
SIGNATURE = "c2lnX2Zha2VfZ2VtaW5p"
_SIGNING = re.compile(r"^gemini-(?:[3-9]|\d\d)")
_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED",
           500: "INTERNAL", 503: "UNAVAILABLE"}


def _err(handler, code, message, reason=None):
    handler.set_status(code)
    handler.set_header("Content-Type", "application/json; charset=UTF-8")
    err = {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN")}
    if reason:
        err["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                           "domain": "googleapis.com"}]
    handler.finish({"error": err})


class _Base(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    async def prepare(self):
        self.mode = self.path_kwargs.get("mode") or "ok"
        try:
            self.body = json.loads(self.request.body or b"{}")
        except ValueError:
            self.body = {"_raw": self.request.body[:200].decode(errors="replace")}
        self.fake.record(self.request, self.body, self.mode)
        key = self.request.headers.get("x-goog-api-key") or self.get_query_argument("key", "")
        if self.mode == "hang":
            await asyncio.Event().wait()
        if not key:
            return _err(self, 403, "Method doesn't allow unregistered callers.")
        if key == "bad-key":
            return _err(self, 400, "API key not valid. Please pass a valid API key.",
                        "API_KEY_INVALID")
        if self.mode == "429":
            return _err(self, 429, "Resource has been exhausted (e.g. check quota).")
        if self.mode == "500":
            return _err(self, 500, "An internal error has occurred.")
        if self.mode == "flaky":
            self.fake.flaky_count += 1
            if self.fake.flaky_count % 2 == 1:
                return _err(self, 500, "flaky failure")


class ModelHandler(_Base):
    async def post(self, mode=None, version=None, model=None, method=None):
        if method in ("generateContent", "streamGenerateContent", "countTokens"):
            contents = self.body.get("contents")
            if not isinstance(contents, list) or not contents:
                return _err(self, 400, "* GenerateContentRequest.contents: contents is not specified")
            problem = self.problem(model)
            if problem:
                return _err(self, 400, problem)
        if method == "countTokens":
            return self.finish({"totalTokens": 7})
        if method == "embedContent":
            return self.finish({"embedding": {"values": self.vector(0)}})
        if method == "batchEmbedContents":
            reqs = self.body.get("requests") or []
            for r in reqs:
                if r.get("model") != f"models/{model}":
                    return _err(self, 400, f"Model in request ({r.get('model')}) does not match "
                                           f"the URL (models/{model}).")
            return self.finish({"embeddings": [{"values": self.vector(i)}
                                               for i in range(len(reqs))]})
        if method == "generateContent":
            return self.finish(self.whole(model))
        if method == "streamGenerateContent":
            return await self.stream(model)
        return _err(self, 404, f"Method {method} not found.")

    def vector(self, i: int) -> list:
        dims = int(((self.body.get("requests") or [self.body])[0]).get("outputDimensionality") or 8)
        return [round(0.1 * (i + 1) + 0.01 * j, 4) for j in range(dims)]

    def thinking(self) -> dict:
        return (self.body.get("generationConfig") or {}).get("thinkingConfig") or {}

    def problem(self, model: str) -> str | None:
        """What Gemini would refuse in this body, or None."""
        cfg = self.thinking()
        if "thinkingBudget" in cfg and "thinkingLevel" in cfg:
            return "You can only set one of thinking budget and thinking level."
        if "thinkingLevel" in cfg and not _SIGNING.match(model):
            return "Thinking level is not supported for this model."
        if _SIGNING.match(model):
            for i, c in enumerate(self.body["contents"]):
                calls = [p for p in c.get("parts") or () if "functionCall" in p]
                if c.get("role") == "model" and calls and "thoughtSignature" not in calls[0]:
                    return (f"Function call is missing a thought_signature in functionCall "
                            f"parts. Content block {i}.")
        return None

    def plan(self) -> tuple[list[dict], str]:
        b = self.body
        last = b["contents"][-1]
        results = [p["functionResponse"] for p in last.get("parts") or ()
                   if "functionResponse" in p]
        mode = ((b.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
        decls = [d for t in b.get("tools") or () for d in t.get("functionDeclarations") or ()]
        turn = next_turn(self.fake, self.fake.text, [d.get("name") for d in decls],
                         results[-1].get("response") if results else None, bool(results),
                         mode != "NONE")
        thought = [{"text": THOUGHT, "thought": True}] if self.thinking().get(
            "includeThoughts") else []
        if turn.kind == "tool":
            call = {"functionCall": {"name": turn.tool, "args": turn.input}}
            if _SIGNING.match(self.path_kwargs.get("model") or ""):
                call["thoughtSignature"] = SIGNATURE
            return thought + [call], "STOP"
        text = turn.text
        finish = "STOP"
        for s in (b.get("generationConfig") or {}).get("stopSequences") or ():
            if s in text:
                text = text[:text.index(s)]
        limit = (b.get("generationConfig") or {}).get("maxOutputTokens")
        if limit and limit < len(text.split(" ")):
            text, finish = " ".join(text.split(" ")[:limit]), "MAX_TOKENS"
        return thought + [{"text": text}], finish

    def meta(self, done: bool = True) -> dict:
        u = dict(self.fake.usage)
        if self.thinking().get("includeThoughts"):
            u["thoughtsTokenCount"] = THOUGHT_TOKENS
        if not done:
            u["candidatesTokenCount"] = 1
        u["totalTokenCount"] = (u.get("promptTokenCount", 0) + u.get("candidatesTokenCount", 0)
                                + u.get("thoughtsTokenCount", 0))
        return u

    def whole(self, model: str) -> dict:
        parts, finish = self.plan()
        return {"candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": finish, "index": 0}],
                "usageMetadata": self.meta(), "modelVersion": model, "responseId": "fakeresp1"}

    async def stream(self, model: str) -> None:
        parts, finish = self.plan()
        thought = [p for p in parts if p.get("thought")]
        parts = [p for p in parts if not p.get("thought")]
        chunks = [thought] if thought else []
        if "text" in parts[0]:
            text = parts[0]["text"]
            third = max(1, len(text) // 3)
            pieces = [p for p in (text[:third], text[third:2 * third], text[2 * third:]) if p]
            chunks += [[{"text": p}] for p in pieces] or [[{"text": ""}]]
        else:
            chunks.append(parts)
        docs = []
        for i, ps in enumerate(chunks):
            last = i == len(chunks) - 1
            cand = {"content": {"role": "model", "parts": ps}, "index": 0}
            if last:
                cand["finishReason"] = finish
            docs.append({"candidates": [cand], "usageMetadata": self.meta(last),
                         "modelVersion": model, "responseId": "fakeresp1"})
        sse = self.get_query_argument("alt", "") == "sse"
        self.set_header("Content-Type", "text/event-stream" if sse else "application/json")
        delay = self.fake.slow_delay if self.mode == "slow" else 0
        for i, doc in enumerate(docs):
            if delay:
                await asyncio.sleep(delay)
            if self.mode == "reset" and i == 1:
                reset_connection(self)
                return
            if self.mode == "error_chunk" and i == 1:
                doc = {"error": {"code": 503, "message": "The model is overloaded.",
                                 "status": "UNAVAILABLE"}}
            data = json.dumps(doc)
            if sse:
                self.write(f"data: {data}\r\n\r\n")
            else:
                self.write(("[" if i == 0 else ",\r\n") + data)
            await self.flush()
            if self.mode == "error_chunk" and i == 1:
                break
        if not sse:
            self.write("]")
        self.finish()


class ListHandler(_Base):
    def get(self, mode=None, version=None):
        self.finish({"models": [{"name": "models/gemini-2.0-flash", "version": "001",
                                 "displayName": "Gemini 2.0 Flash",
                                 "supportedGenerationMethods": ["generateContent"]}]})


class FakeGemini(FakeOpenAI):
    """Runs in a thread; `url` is its base address (clients add /v1beta/...)."""

    def __init__(self, slow_delay: float = 0.5):
        super().__init__(slow_delay)
        self.text = DEFAULT_TEXT
        self.usage = {"promptTokenCount": 12, "candidatesTokenCount": 5,
                      "cachedContentTokenCount": 3}
        self.tool_plan: dict | None = None

    def routes(self):
        kw = {"fake": self}
        p = r"(?:/mode/(?P<mode>[a-z0-9_]+))?/(?P<version>v1beta|v1)"
        return [(p + r"/models/(?P<model>[^/:]+):(?P<method>[A-Za-z]+)", ModelHandler, kw),
                (p + r"/models", ListHandler, kw)]
