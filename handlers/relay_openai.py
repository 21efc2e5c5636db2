"""OpenAI-format relay routes: chat, embeddings, legacy completions,
moderations, rerank, models, legacy balance.

Each route also answers without the /v1 prefix and with a trailing slash
(the variants are routed in handlers/relay_media.py).
"""
from __future__ import annotations

from handlers.relay_base import RelayHandler
from handlers.fallback import unsupported_error
from models.records import QUOTA_PER_USD
from relay.faces import completions, rerank
from relay.faces import model_lists as lists
from relay.faces import openai as face


class _OpenAIRelay(RelayHandler):
    family = "openai"
    parse = None
    face = face

    async def post(self) -> None:
        auth = await self.auth()
        await self.run_relay(auth, type(self).parse(self.request_id, self.body), self.face)


class ChatHandler(_OpenAIRelay):
    parse = staticmethod(face.parse_chat)


class EmbeddingsHandler(_OpenAIRelay):
    parse = staticmethod(face.parse_embeddings)


class CompletionsHandler(_OpenAIRelay):
    """Legacy text completions, streamed or not."""
    parse = staticmethod(completions.parse_completions)
    face = completions


class ModerationsHandler(_OpenAIRelay):
    parse = staticmethod(completions.parse_moderations)
    face = completions


class RerankHandler(_OpenAIRelay):
    """The Cohere/Jina rerank format, with OpenAI's error body (as new-api)."""
    parse = staticmethod(rerank.parse_rerank)
    face = rerank


async def answer_models(handler: RelayHandler, model: str | None) -> None:
    """GET models (or one model) in the caller's family: Gemini for a Gemini
    route or key (x-goog-api-key, ?key=; google-genai 3.x lists under /v1),
    Anthropic when `anthropic-version` is sent (the anthropic SDKs send it
    with x-api-key or, from 2.x, with Authorization: Bearer), else OpenAI.
    Lists what the key's group serves and its model lock allows."""
    h = handler.request.headers
    if handler.family != "gemini":
        if h.get("x-goog-api-key") or handler.get_query_argument("key", None):
            handler.family = "gemini"
        elif h.get("anthropic-version"):
            handler.family = "anthropic"
    auth = await handler.auth()
    models = handler.ctx["service"].models_for(auth)
    family = handler.family
    arg = handler.get_query_argument
    if model is not None:
        if model not in models:
            raise lists.not_found(model)
        one = {"anthropic": lists.anthropic_model, "gemini": lists.gemini_model}
        handler.finish(one.get(family, lists.openai_model)(model))
    elif family == "anthropic":
        handler.finish(lists.anthropic_page(models, arg("limit", None), arg("after_id", None),
                                            arg("before_id", None)))
    elif family == "gemini":
        handler.finish(lists.gemini_page(models, arg("pageSize", None), arg("pageToken", None)))
    else:
        handler.finish(lists.openai_list(models))


class ModelsHandler(RelayHandler):
    async def get(self, model: str | None = None) -> None:
        await answer_models(self, model.strip("/") if model else None)

    async def delete(self, model: str | None = None) -> None:
        # OpenAI's "delete a fine-tuned model": a vendor endpoint not served.
        raise unsupported_error("DELETE", self.request.path, "openai", "models")


class BillingSubscriptionHandler(RelayHandler):
    """Legacy OpenAI balance endpoint that chat front ends read."""

    async def get(self) -> None:
        auth = await self.auth()
        billing = self.ctx["billing"]
        if auth.token.unlimited_quota:
            remain, used = await billing.balance("user", auth.user.id)
        else:
            remain, used = await billing.balance("token", auth.token.id)
        limit_usd = (remain + used) / QUOTA_PER_USD
        expires = auth.token.expired_time if auth.token.expired_time > 0 else 0
        self.finish({
            "object": "billing_subscription", "has_payment_method": True,
            "soft_limit_usd": limit_usd, "hard_limit_usd": limit_usd,
            "system_hard_limit_usd": limit_usd, "access_until": expires,
            "plan": {"title": "relay", "id": "relay"},
        })


class BillingUsageHandler(RelayHandler):
    async def get(self) -> None:
        auth = await self.auth()
        billing = self.ctx["billing"]
        kind, ident = (("user", auth.user.id) if auth.token.unlimited_quota
                       else ("token", auth.token.id))
        _, used = await billing.balance(kind, ident)
        # OpenAI reports cents.
        self.finish({"object": "list", "total_usage": used * 100 / QUOTA_PER_USD})


_V = r"(?:/v1)?"
default_handlers = [
    (_V + r"/chat/completions/?", ChatHandler),
    (_V + r"/embeddings/?", EmbeddingsHandler),
    (_V + r"/models/?", ModelsHandler),
    (_V + r"/models/(?P<model>[^:?]+?)/?", ModelsHandler),
    (_V + r"/dashboard/billing/subscription/?", BillingSubscriptionHandler),
    (_V + r"/dashboard/billing/usage/?", BillingUsageHandler),
]
