"""OpenAI-format relay routes: chat, embeddings, models, legacy balance.

Each route also answers without the /v1 prefix and with a trailing slash.
"""
from __future__ import annotations

import time

from handlers.base import RelayHandler
from models.records import QUOTA_PER_USD
from relay.faces import openai as face


class _OpenAIRelay(RelayHandler):
    family = "openai"
    parse = None

    async def post(self) -> None:
        auth = await self.auth()
        await self.run_relay(auth, type(self).parse(self.request_id, self.body), face)


class ChatHandler(_OpenAIRelay):
    parse = staticmethod(face.parse_chat)


class EmbeddingsHandler(_OpenAIRelay):
    parse = staticmethod(face.parse_embeddings)


class ModelsHandler(RelayHandler):
    async def get(self, model: str | None = None) -> None:
        model = model.strip("/") if model else None
        # google-genai 3.x and anthropic clients list models here too.
        from handlers.relay_vendors import vendor_models
        if await vendor_models(self, model):
            return
        auth = await self.auth()
        service = self.ctx["service"]
        now = int(time.time())
        models = service.models_for(auth)
        if model:
            if model not in models:
                from relay.errors import RelayError
                raise RelayError(404, f"The model '{model}' does not exist or this key may not "
                                      "use it.", "invalid_request_error", "model_not_found")
            self.finish({"id": model, "object": "model", "created": now, "owned_by": "relay"})
            return
        self.finish({"object": "list", "data": [
            {"id": m, "object": "model", "created": now, "owned_by": "relay"} for m in models]})


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
