"""A fake upstream for the rest of the OpenAI surface, on a real socket.

FakeText is FakeMedia (chat, embeddings, images, image edits, audio; the
failure modes by path prefix `/mode/<name>`) plus, from the vendors'
documented wire formats:

    POST /v1/completions   legacy text completions: `prompt` a string, strings or
                           token ids; n choices per prompt (index = prompt * n + j);
                           max_tokens (default 16) caps the chunks; streamed as
                           `text_completion` chunks, a usage chunk with `choices: []`
                           when stream_options.include_usage, then [DONE]
    POST /v1/moderations   {id, model, results: [{flagged, categories, category_scores,
                           category_applied_input_types}]} per input; no usage, as
                           OpenAI; text containing "kill" is flagged as violence
    POST /v1/rerank        Jina's shape: {model, object, usage: {total_tokens,
                           prompt_tokens}, results: [{index, relevance_score,
                           document: {text}}]}, documents returned unless
                           return_documents is false (Jina's default is true)

Named failure modes besides FakeOpenAI's (path prefix `/mode/<name>`):
    cohere     rerank answers in Cohere's v1 shape: no usage, documents only when
               return_documents is true, meta.billed_units.search_units
    nousage    completions and rerank report no usage at all
    reset      completions streams reset the connection after two chunks

The request body may steer completions like the chat fake: fake_text,
fake_chunks, fake_usage.  A prompt containing CONTEXT_TOO_LONG gets
OpenAI's 400 context_length_exceeded.

FakeText also answers Azure's addressing for the endpoints Azure deploys
(`/openai/deployments/{d}/completions|images/edits|audio/translations
?api-version=`), which need the `api-key` header; the deployment is recorded.
"""
from __future__ import annotations

import asyncio
import json
import time

from tornado.iostream import StreamClosedError

from tests.fakes.media_upstream import FakeMedia, ImageEditHandler, TranslationHandler
from tests.fakes.openai_upstream import DEFAULT_TEXT, _Base, _err, _split
from tests.fakes.server import reset_connection

CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
              "illicit/violent", "self-harm", "self-harm/intent", "self-harm/instructions",
              "sexual", "sexual/minors", "violence", "violence/graphic")
IMAGE_CATEGORIES = {"self-harm", "self-harm/intent", "self-harm/instructions", "sexual",
                    "violence", "violence/graphic"}


def _prompts(prompt) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt or [""])


class CompletionsHandler(_Base):
    async def post(self, mode=None, deployment=None):
        if self._finished:
            return
        b = self.body
        model = deployment or b.get("model", "")
        prompts = _prompts(b.get("prompt"))
        if "CONTEXT_TOO_LONG" in json.dumps(prompts):
            return _err(self, 400, "This model's maximum context length is 4097 tokens, however "
                                   "you requested 5000 tokens.", "invalid_request_error",
                        "context_length_exceeded")
        n = int(b.get("n") or 1)
        max_tokens = b.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens  # OpenAI's default
        wanted = max(1, int(b.get("fake_chunks", 3)))
        nchunks = max(1, min(wanted, max_tokens))
        finish = "length" if wanted > max_tokens else "stop"
        pieces = _split(b.get("fake_text", DEFAULT_TEXT), nchunks)
        usage = {"prompt_tokens": 4 * len(prompts), "completion_tokens": nchunks * n * len(prompts)}
        usage.update(b.get("fake_usage") or {})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        cid = f"cmpl-fake{int(time.time() * 1000)}"
        report_usage = self.mode != "nousage"
        choices = range(n * len(prompts))

        def doc(chs, with_usage=False):
            d = {"id": cid, "object": "text_completion", "created": int(time.time()),
                 "model": model, "choices": chs, "system_fingerprint": "fp_fake"}
            if with_usage:
                d["usage"] = usage
            return d

        if not b.get("stream"):
            text = "".join(pieces)
            return self.finish(doc([{"text": (prompts[i // n] if b.get("echo") and isinstance(
                prompts[i // n], str) else "") + text, "index": i, "logprobs": None,
                "finish_reason": finish} for i in choices], report_usage))
        self.set_header("Content-Type", "text/event-stream")
        delay = float(b.get("fake_delay", 0)) + (self.fake.slow_delay if self.mode == "slow" else 0)
        events = [doc([{"text": p, "index": i, "logprobs": None, "finish_reason": None}])
                  for p in pieces for i in choices]
        events.append(doc([{"text": "", "index": i, "logprobs": None, "finish_reason": finish}
                           for i in choices]))
        for k, ev in enumerate(events):
            if delay:
                await asyncio.sleep(delay)
            if self.mode == "reset" and k == 2:
                reset_connection(self)
                return
            self.write(f"data: {json.dumps(ev)}\n\n")
            try:
                await self.flush()
            except StreamClosedError:
                self.rec["aborted"] = True
                return
        if report_usage and (b.get("stream_options") or {}).get("include_usage"):
            self.write(f"data: {json.dumps(doc([], True))}\n\n")
        self.write("data: [DONE]\n\n")
        self.finish()


def moderation_result(text: str, image: bool) -> dict:
    violent = "kill" in text.lower()
    scores = {c: 0.0001 for c in CATEGORIES}
    if violent:
        scores["violence"] = 0.91
    return {"flagged": violent,
            "categories": {c: scores[c] > 0.5 for c in CATEGORIES},
            "category_scores": scores,
            "category_applied_input_types": {
                c: (["text", "image"] if image and c in IMAGE_CATEGORIES else
                    [] if image and not text else ["text"]) for c in CATEGORIES}}


class ModerationsHandler(_Base):
    def post(self, mode=None):
        if self._finished:
            return
        b = self.body
        inp = b.get("input")
        if isinstance(inp, str):
            results = [moderation_result(inp, False)]
        elif isinstance(inp, list) and inp and all(isinstance(i, str) for i in inp):
            results = [moderation_result(i, False) for i in inp]
        elif isinstance(inp, list) and inp:
            # Multi-modal input is classified as one whole.
            text = " ".join(i.get("text", "") for i in inp if i.get("type") == "text")
            results = [moderation_result(text, any(i.get("type") == "image_url" for i in inp))]
        else:
            return _err(self, 400, "'input' is a required property", "invalid_request_error")
        self.finish({"id": f"modr-fake{int(time.time() * 1000)}",
                     "model": b.get("model") or "omni-moderation-latest", "results": results})


def relevance(query: str, doc) -> float:
    text = doc if isinstance(doc, str) else doc.get("text", json.dumps(doc))
    q = set(query.lower().split())
    words = set(text.lower().replace(".", " ").split())
    return round(len(q & words) / (len(q) or 1) * 0.9 + 0.05 / (1 + len(words)), 6)


class RerankHandler(_Base):
    def post(self, mode=None):
        if self._finished:
            return
        b = self.body
        query, docs = b.get("query"), b.get("documents")
        if not isinstance(query, str) or not isinstance(docs, list) or not docs:
            return _err(self, 400, "query and documents are required", "invalid_request_error")
        ranked = sorted(((relevance(query, d), i) for i, d in enumerate(docs)),
                        key=lambda x: (-x[0], x[1]))
        top = b.get("top_n") or len(docs)
        cohere = self.mode == "cohere"
        want = b.get("return_documents", not cohere)
        results = []
        for score, i in ranked[:top]:
            r = {"index": i, "relevance_score": score}
            if want:
                r["document"] = {"text": docs[i]} if isinstance(docs[i], str) else docs[i]
            results.append(r)
        if cohere:
            return self.finish({"id": "rr-fake", "results": results,
                                "meta": {"api_version": {"version": "1"},
                                         "billed_units": {"search_units": 1}}})
        doc = {"model": b.get("model"), "object": "list", "results": results}
        if self.mode != "nousage":
            tokens = 3 + sum(len(str(d).split()) for d in docs)
            doc["usage"] = {"total_tokens": tokens, "prompt_tokens": tokens}
        self.finish(doc)


class _Azure:
    """Azure's addressing in front of a handler: api-key, api-version."""

    async def prepare(self):
        key = self.request.headers.get("api-key")
        if not key:
            self.set_status(401)
            return self.finish({"error": {"code": "401", "message": "Access denied due to "
                                          "invalid subscription key or wrong API endpoint."}})
        if not self.get_query_argument("api-version", ""):
            self.set_status(404)
            return self.finish({"error": {"code": "404", "message": "Resource not found"}})
        await super().prepare()


class AzureCompletions(_Azure, CompletionsHandler):
    pass


class AzureImageEdit(_Azure, ImageEditHandler):
    def post(self, mode=None, deployment=None):
        super().post(mode)


class AzureTranslation(_Azure, TranslationHandler):
    def prepare(self):
        if self.request.headers.get("api-key") and self.get_query_argument("api-version", ""):
            return super(_Azure, self).prepare()
        self.set_status(401 if not self.request.headers.get("api-key") else 404)
        self.finish({"error": {"code": str(self.get_status()), "message": "refused"}})

    def post(self, mode=None, deployment=None):
        if not self._finished:
            super().post(mode)


class FakeText(FakeMedia):
    def __init__(self, slow_delay: float = 0.5):
        super().__init__(slow_delay)
        self.extra_handlers += [("/completions", CompletionsHandler),
                                ("/moderations", ModerationsHandler),
                                ("/rerank", RerankHandler)]

    def routes(self):
        kw = {"fake": self}
        d = r"(?:/mode/(?P<mode>[a-z0-9]+))?/openai/deployments/(?P<deployment>[^/]+)"
        return super().routes() + [(d + "/completions", AzureCompletions, kw),
                                   (d + "/images/edits", AzureImageEdit, kw),
                                   (d + "/audio/translations", AzureTranslation, kw)]
