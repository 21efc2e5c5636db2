"""Vendor-native relay routes: Anthropic Messages and Gemini.

Anthropic: POST /v1/messages (also /messages), /v1/messages/count_tokens.
Gemini: POST /{v1beta,v1}/models/{model}:{method}; GET /v1beta/models[/{m}].
Every route answers errors in its own family's body.  The routes with ':'
never match the OpenAI /v1/models/{m} route, which excludes ':'.
"""
from __future__ import annotations


from handlers.relay_base import RelayHandler
from handlers.fallback import NotFoundHandler
from handlers.relay_openai import answer_models
from relay.faces.count_tokens import count_tokens
from relay.money import tokenizer
from relay.faces import anthropic as aface
from relay.faces import gemini as gface


class _VendorRelay(RelayHandler):
    face = None

    async def relay(self, auth, call) -> None:
        await self.run_relay(auth, call, self.face)


class _AnthropicHeaders:
    def set_default_headers(self) -> None:
        super().set_default_headers()
        # The anthropic SDKs read the request id from this header (`_request_id`).
        self.set_header("request-id", self.request_id)


class MessagesHandler(_AnthropicHeaders, _VendorRelay):
    family = "anthropic"
    face = aface

    async def post(self) -> None:
        auth = await self.auth()
        call = aface.parse_messages(self.request_id, self.body, self.request.headers,
                                    self.request.query)
        await self.relay(auth, call)


class CountTokensHandler(_AnthropicHeaders, RelayHandler):
    family = "anthropic"

    async def post(self) -> None:
        auth = await self.auth()
        call = aface.parse_count_tokens(self.request_id, self.body, self.request.headers,
                                        self.request.query)
        status, headers, body = await count_tokens(self.ctx["service"], auth, call, self.cancel)
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        self.finish(body)


class GenerateHandler(_VendorRelay):
    family = "gemini"
    face = gface

    async def post(self, model: str, method: str) -> None:
        gface.check_method(method)
        auth = await self.auth()
        if method == "countTokens":
            self.ctx["service"].check_model(auth, model)
            body = self.body
            self.finish({"totalTokens": await tokenizer.off_loop(
                tokenizer.is_long(body), gface.count_tokens, body, model)})
            return
        alt = self.get_query_argument("alt", None) or self.get_query_argument("$alt", "")
        call = gface.parse(self.request_id, self.body, model, method,
                           sse_mode=alt.split(";")[0] == "sse")
        await self.relay(auth, call)


class GeminiModelsHandler(RelayHandler):
    family = "gemini"

    async def get(self, model: str | None = None) -> None:
        await answer_models(self, model)


class AnthropicNotFound(NotFoundHandler):
    """Paths under /v1/messages/ we do not serve: a 404 in Anthropic's body."""
    path_family = "anthropic"


class GeminiNotFound(NotFoundHandler):
    path_family = "gemini"


_G = r"/(?:v1beta|v1|v1alpha)"
default_handlers = [
    (r"(?:/v1)?/messages/count_tokens/?", CountTokensHandler),
    (r"(?:/v1)?/messages/?", MessagesHandler),
    (_G + r"/models/(?P<model>[^/:]+):(?P<method>[A-Za-z]+)/?", GenerateHandler),
    (r"/v1beta/models/?", GeminiModelsHandler),
    (r"/v1beta/models/(?P<model>[^/]+?)/?", GeminiModelsHandler),
    (r"(?:/v1)?/messages/.*", AnthropicNotFound),
    (r"/(?:v1beta|v1alpha)/.*", GeminiNotFound),
]
