"""OpenAI Responses API routes (OpenAI error bodies; also without /v1):

    POST   /v1/responses                      create (streamed or not)
    GET    /v1/responses (WebSocket upgrade)  create over a socket (relay_responses_ws.py)
    GET    /v1/responses/{id}                 retrieve
    DELETE /v1/responses/{id}                 delete
    POST   /v1/responses/{id}/cancel          cancel (background responses)
    GET    /v1/responses/{id}/input_items     list the input items
    POST   /v1/responses/input_tokens         count input tokens (not billed)
    POST   /v1/responses/compact              compact a conversation (billed)
"""
from __future__ import annotations

from handlers.relay_base import RelayHandler
from handlers.relay_responses_ws import default_handlers as socket_handlers
from relay.errors import RelayError
from relay.faces import responses as face
from relay.money import tokenizer


class _Responses(RelayHandler):
    family = "openai"

    @property
    def stored(self):
        return self.ctx["responses"]

    def answer(self, body: bytes) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class CreateHandler(_Responses):
    compact = False

    async def get(self) -> None:
        """A GET without the WebSocket upgrade (relay_responses_ws.py serves
        the upgraded one): 426, naming what this path takes."""
        err = RelayError(426, "GET /v1/responses is the Responses API over a WebSocket: send "
                              "the upgrade, or POST /v1/responses.", "invalid_request_error",
                         "upgrade_required")
        err.headers["Upgrade"] = "websocket"
        raise err

    async def post(self) -> None:
        auth = await self.auth()
        call = face.parse_create(self.request_id, self.body, self.request.headers, self.compact)
        await self.stored.prepare(call, auth)
        records = self.stored.records
        pending = records.begin(auth.token.id)
        try:
            await self.run_relay(auth, call, face,
                                 after=lambda out: self.stored.remember(call, out, auth))
        finally:
            records.end(auth.token.id, pending)


class CompactHandler(CreateHandler):
    compact = True


class ResponseHandler(_Responses):
    async def get(self, rid: str) -> None:
        auth = await self.auth()
        self.answer(await self.stored.retrieve(auth, rid, self.request.query))

    async def delete(self, rid: str) -> None:
        auth = await self.auth()
        self.answer(await self.stored.delete(auth, rid))


class CancelHandler(_Responses):
    async def post(self, rid: str) -> None:
        auth = await self.auth()
        self.answer(await self.stored.cancel(auth, rid))


class InputItemsHandler(_Responses):
    async def get(self, rid: str) -> None:
        auth = await self.auth()
        args = {k: self.get_query_argument(k, None) for k in ("order", "after", "limit")}
        self.answer(await self.stored.input_items(auth, rid, self.request.query, args))


class InputTokensHandler(_Responses):
    async def post(self) -> None:
        auth = await self.auth()
        body = self.body
        model, n = await tokenizer.off_loop(tokenizer.is_long(body), face.input_tokens, body)
        service = self.ctx["service"]
        service.check_model(auth, model)
        channels = service.scheduler.candidates(auth.group, model)
        if channels:
            doc = face.load_json(self.body)
            n = await self.stored.count_upstream(channels[0], model, doc) or n
        self.finish({"object": "response.input_tokens", "input_tokens": n})


_R = r"(?:/v1)?/responses"
default_handlers = socket_handlers + [
    (_R + r"/?", CreateHandler),
    (_R + r"/input_tokens/?", InputTokensHandler),
    (_R + r"/compact/?", CompactHandler),
    (_R + r"/(?P<rid>[^/]+)/cancel/?", CancelHandler),
    (_R + r"/(?P<rid>[^/]+)/input_items/?", InputItemsHandler),
    (_R + r"/(?P<rid>[^/]+)/?", ResponseHandler),
]
