"""Vendor-native relay routes: Anthropic Messages and Gemini.

Anthropic: POST /v1/messages (also /messages), /v1/messages/count_tokens.
Gemini: POST /{v1beta,v1}/models/{model}:{method}; GET /v1beta/models[/{m}].
Every route answers errors in its own family's body.  The routes with ':'
never match the OpenAI /v1/models/{m} route, which excludes ':'.
"""
from __future__ import annotations


from handlers.base import RelayHandler
from relay.count_tokens import count_tokens
from relay.errors import RelayError
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
            self.finish({"totalTokens": gface.count_tokens(self.body, model)})
            return
        alt = self.get_query_argument("alt", None) or self.get_query_argument("$alt", "")
        call = gface.parse(self.request_id, self.body, model, method,
                           sse_mode=alt.split(";")[0] == "sse")
        await self.relay(auth, call)


async def vendor_models(handler: RelayHandler, model: str | None) -> bool:
    """GET /v1/models from a Gemini or Anthropic client (told apart by its
    key header), answered in that client's format.  Returns False when the
    caller is neither, for the OpenAI handler to answer."""
    h = handler.request.headers
    if h.get("x-goog-api-key") or handler.get_query_argument("key", None):
        handler.family = "gemini"
    elif h.get("anthropic-version"):
        handler.family = "anthropic"
    else:
        return False
    auth = await handler.auth()
    models = handler.ctx["service"].models_for(auth)
    if model is not None and model not in models:
        raise RelayError(404, f"The model '{model}' does not exist or this key may not use it.",
                         "invalid_request_error", "model_not_found")
    face = gface if handler.family == "gemini" else aface
    handler.finish(face.model_list(models) if model is None else face.model_info(model))
    return True


class GeminiModelsHandler(RelayHandler):
    family = "gemini"

    async def get(self, model: str | None = None) -> None:
        if not await vendor_models(self, model):  # no key at all: Gemini's 401
            await self.auth()


class _NotFound(RelayHandler):
    """Unknown paths under a vendor's own prefix: a 404 in that vendor's body."""

    def prepare(self):
        raise RelayError(404, f"Unknown path {self.request.path}: this relay serves "
                              f"{self.routes}.", "not_found_error", "unknown_path")


class AnthropicNotFound(_NotFound):
    family = "anthropic"
    routes = "POST /v1/messages and POST /v1/messages/count_tokens"


class GeminiNotFound(_NotFound):
    family = "gemini"
    routes = ("POST /v1beta/models/{model}:generateContent, :streamGenerateContent, "
              ":countTokens, :embedContent, :batchEmbedContents, and GET /v1beta/models")


_G = r"/(?:v1beta|v1|v1alpha)"
default_handlers = [
    (r"(?:/v1)?/messages/count_tokens/?", CountTokensHandler),
    (r"(?:/v1)?/messages/?", MessagesHandler),
    (_G + r"/models/(?P<model>[^/:]+):(?P<method>[A-Za-z]+)/?", GenerateHandler),
    (r"/v1beta/models/?", GeminiModelsHandler),
    (r"/v1beta/models/(?P<model>[^/:]+)/?", GeminiModelsHandler),
    (r"(?:/v1)?/messages/.*", AnthropicNotFound),
    (r"/(?:v1beta|v1alpha)/.*", GeminiNotFound),
]
