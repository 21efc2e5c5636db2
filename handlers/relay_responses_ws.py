"""GET /v1/responses upgraded to a WebSocket (also without /v1): the
Responses API as Codex CLI speaks it over a socket (relay/responses_socket.py).

The key is checked at the handshake (401/403 in the OpenAI error body, as
for a POST).  A 426 answers where no socket is served, so that a client
falls back to HTTP at once instead of after five reconnects: when the
setting `responses_websocket` is off, and past `responses_websocket_max`
sockets open in this process.  A GET without the upgrade gets a 426 too
(handlers/relay_responses.py).
"""
from __future__ import annotations

import json
import re

import tornado.websocket
from tornado.iostream import StreamClosedError
from tornado.routing import PathMatches

from handlers.base import new_request_id
from relay.errors import RelayError, render
from relay.responses_socket import SocketSession

_open = [0]  # sockets open in this process


class UpgradeMatches(PathMatches):
    """A path, when the request asks to become a WebSocket."""

    def match(self, request):
        if request.method != "GET" or \
                request.headers.get("Upgrade", "").lower() != "websocket":
            return None
        return super().match(request)


class ResponsesSocketHandler(tornado.websocket.WebSocketHandler):
    def initialize(self) -> None:
        self.session: SocketSession | None = None
        self.gone = False
        self._request_id = new_request_id()

    @property
    def ctx(self) -> dict:
        return self.application.settings

    def request_id(self) -> str:
        """Each response.create is a call of its own, with its own id."""
        rid, self._request_id = self._request_id, new_request_id()
        return rid

    def check_origin(self, origin: str) -> bool:
        # Authenticated by the API key, never by a cookie: any origin may ask.
        return True

    def get_compression_options(self):
        return None  # permessage-deflate offered by Codex is declined: CPU for no gain here

    def refuse(self, err: RelayError, upgrade: bool = False) -> None:
        self.set_status(err.status)
        self.set_header("Content-Type", "application/json")
        self.set_header("X-Request-Id", self._request_id)
        if upgrade:
            self.set_header("Upgrade", "websocket")
        self.finish(json.dumps(render("openai", err, self._request_id), ensure_ascii=False))

    async def get(self, *args, **kwargs) -> None:
        config = self.ctx["config"]
        if not config.responses_websocket or _open[0] >= config.responses_websocket_max:
            return self.refuse(RelayError(
                426, "The Responses API is not served over a WebSocket here now: use POST "
                     "/v1/responses.", "invalid_request_error", "websocket_unavailable"))
        h = self.request.headers
        key = ""
        auth_header = h.get("Authorization", "")
        if auth_header[:7].lower() == "bearer ":
            key = auth_header[7:].strip()
        key = key or (h.get("x-api-key") or self.get_query_argument("key", "") or "").strip()
        try:
            self.auth = await self.ctx["service"].authenticate(key or None,
                                                               self.request.remote_ip or "",
                                                               self.request.host)
        except RelayError as err:
            return self.refuse(err)
        self.set_header("X-Request-Id", self._request_id)
        await super().get(*args, **kwargs)

    def open(self, *args, **kwargs) -> None:
        _open[0] += 1
        self.session = SocketSession(self, self.ctx["service"], self.ctx["responses"], self.auth,
                                     self.request.headers)

    def on_message(self, message) -> None:
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.session.receive(message)

    def on_close(self) -> None:
        if self.session is not None and not self.gone:
            _open[0] -= 1
        self.gone = True
        if self.session is not None:
            self.session.close()

    # ---- what SocketSession writes through -------------------------------------
    def send(self, text: str) -> None:
        if self.gone or self.ws_connection is None:
            self._left()
            return
        try:
            self.write_message(text)
        except tornado.websocket.WebSocketClosedError:
            self._left()

    def _left(self) -> None:
        if not self.gone:
            self.on_close()

    def pending(self) -> int:
        stream = getattr(self.ws_connection, "stream", None)
        if stream is None:
            return 0
        return stream._total_write_index - stream._total_write_done_index

    async def drain(self) -> None:
        stream = getattr(self.ws_connection, "stream", None)
        while stream is not None and self.pending() > 0 and not self.gone:
            try:
                await stream.write(b"")
            except StreamClosedError:
                self._left()


_PATH = r"(?:/v1)?/responses/?"
default_handlers = [
    tornado.routing.Rule(UpgradeMatches(re.compile(_PATH + "$")), ResponsesSocketHandler),
]
