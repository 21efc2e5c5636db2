"""The Responses API over a WebSocket, as Codex CLI speaks it.

The client opens `GET /v1/responses` upgraded to a WebSocket (`OpenAI-Beta:
responses_websockets=2026-02-06`), authenticated like any call, and sends
JSON text frames:

    {"type": "response.create", ...the body of POST /v1/responses, without stream}
    {"type": "response.processed", "response_id": ...}   (an acknowledgement)

Each response.create is answered with the same events a streamed POST
/v1/responses sends, each event's JSON one text frame, ending with
response.completed (or .incomplete, .failed); an error before any event is
one frame {"type": "error", "status": N, "error": {type, code, message,
param}}, which Codex reads as that HTTP status.  One response at a time.

Each response.create is one relay call (relay/service.py: reserved, settled,
recorded like the HTTP call, streamed); a client that closes the socket
mid-response is billed as a cut stream.  It reaches any channel: passed
through to one that speaks Responses (its events go on as they came) and
bridged to the rest, exactly as the HTTP face does (relay/faces/responses.py).

The connection remembers its last response: Codex sends the next request as
`previous_response_id` of it plus only the new input items, also with
`store: false`, and a model-less warm-up (`generate: false`) before a turn.
Both are resolved here: the warm-up is answered at once (nothing billed,
nothing sent upstream) and remembered; a create continuing the last
response gets that response's input and output in front of its own input,
so the upstream sees the whole conversation over plain HTTP.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from tornado.httputil import HTTPHeaders

from relay.convert.common import new_id
from relay.convert.responses import items_of, response_shell
from relay.errors import RelayError, bad_request, render
from relay.faces import responses as face
from relay.serving import jsonin, sse
from relay.serving.buglog import log_bug
from relay.sessions import client_session
from relay.upstream.client import Cancel

log = logging.getLogger("relay.responses")

FINAL = ("response.completed", "response.incomplete", "response.failed")
# Frames a connection may have waiting behind the response that runs.
MAX_WAITING = 8
# WebSocket-only members of a response.create, not sent upstream.
SOCKET_ONLY = ("type", "generate")


def error_frame(err: RelayError, request_id: str) -> str:
    body = render("openai", err, request_id)["error"]
    return json.dumps({"type": "error", "status": err.status, "error": body}, ensure_ascii=False)


def forwarded(headers) -> HTTPHeaders:
    """The handshake's headers as a POST's would be: its OpenAI-Beta without
    the WebSocket's own value (an HTTP upstream knows nothing of it)."""
    out = HTTPHeaders()
    for name, value in (headers.get_all() if headers is not None else ()):
        if name.lower() == "openai-beta":
            value = ",".join(v for v in value.split(",")
                             if v.strip() and not v.strip().startswith("responses_websockets"))
            if not value:
                continue
        out.add(name, value)
    return out


class FrameSink:
    """The relay service's Sink for one response: the face's SSE bytes in,
    one text frame per event out, the final response noted on the way."""

    def __init__(self, socket):
        self.socket = socket
        self.started = False
        self.parser = sse.SSEParser()
        self.final: dict | None = None

    @property
    def closed(self) -> bool:
        return self.socket.gone

    def start(self, status: int, headers: dict) -> None:
        self.started = True

    def write(self, data: bytes) -> None:
        for ev in self.parser.feed(data):
            self._frame(ev)

    def finish(self) -> None:
        for ev in self.parser.flush():
            self._frame(ev)

    def _frame(self, ev) -> None:
        if not ev.data:
            return
        if ev.event in FINAL or ev.event == "" and '"response.' in ev.data[:60]:
            try:
                doc = json.loads(ev.data)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and doc.get("type") in FINAL:
                self.final = doc.get("response") or {}
        self.socket.send(ev.data)

    def pending(self) -> int:
        return self.socket.pending()

    async def drain(self) -> None:
        await self.socket.drain()


class SocketSession:
    """One WebSocket connection's conversation with the relay.  `socket` is
    the handler: send(text), pending(), drain(), gone, request_id()."""

    def __init__(self, socket, service, stored, auth, headers):
        self.socket = socket
        self.service = service
        self.stored = stored
        self.auth = auth
        self.headers = forwarded(headers)
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.tasks: set[asyncio.Task] = set()
        self.cancel: Cancel | None = None
        # The last response: its id, the whole input it answered, its output.
        self.last: tuple[str, list, list] | None = None

    def receive(self, text: str) -> None:
        """One frame from the client, handled beside the socket's reading (a
        close or an acknowledgement is seen while a response runs);
        responses run one at a time, in the order asked for."""
        if self.waiting >= MAX_WAITING:
            return self.socket.send(error_frame(RelayError(
                429, f"More than {MAX_WAITING} frames are waiting on this connection.",
                "rate_limit_error", "too_many_frames"), self.socket.request_id()))
        self.waiting += 1
        task = asyncio.get_running_loop().create_task(self._in_turn(text))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log_bug(log, "a Responses socket frame", task.exception())

    async def _in_turn(self, text: str) -> None:
        try:
            async with self.lock:
                if not self.socket.gone:
                    await self.frame(text)
        finally:
            self.waiting -= 1

    async def frame(self, text: str) -> None:
        """One frame from the client."""
        request_id = self.socket.request_id()
        try:
            doc = jsonin.parse_object(text, "The frame")
        except jsonin.BadInput as exc:
            return self.socket.send(error_frame(jsonin.relay_error(exc), request_id))
        kind = doc.get("type")
        if kind == "response.processed":
            return
        if kind != "response.create":
            return self.socket.send(error_frame(bad_request(
                f"Unknown frame type {kind!r}: send 'response.create'.", "invalid_value",
                "type"), request_id))
        try:
            await self._create(doc, request_id)
        except RelayError as err:
            if not self.socket.gone:
                self.socket.send(error_frame(err, request_id))
        except jsonin.BadInput as exc:
            self.socket.send(error_frame(jsonin.relay_error(exc), request_id))
        finally:
            self.cancel = None

    def close(self) -> None:
        """The client went away: a response running is cut (billed as
        delivered, as a cut stream is)."""
        if self.cancel is not None:
            self.cancel.cancelled = True

    async def _create(self, doc: dict, request_id: str) -> None:
        warmup = doc.get("generate") is False
        body = {k: v for k, v in doc.items() if k not in SOCKET_ONLY}
        prev = body.get("previous_response_id")
        if self.last is not None and prev == self.last[0]:
            body.pop("previous_response_id")
            body["input"] = self.last[1] + self.last[2] + list(items_of(body))
        if warmup:
            return self._warm(body)
        body["stream"] = True
        raw = jsonin.dumps(body)
        call = face.parse_create(request_id, raw, self.headers)
        call.extra["transport"] = "websocket"
        await self.stored.prepare(call, self.auth)
        call.extra["client_session"] = client_session(self.headers, call)
        sink = FrameSink(self.socket)
        self.cancel = Cancel()
        pending = self.stored.records.begin(self.auth.token.id)
        try:
            out = await self.service.relay(call, self.auth, sink, face, self.cancel)
            await self.stored.remember(call, out, self.auth)
        finally:
            self.stored.records.end(self.auth.token.id, pending)
        if out.error is not None and not sink.started:
            raise out.error
        sink.finish()
        if sink.final is not None and sink.final.get("id"):
            self.last = (sink.final["id"], list(items_of(call.native_body)),
                         list(sink.final.get("output") or ()))

    def _warm(self, body: dict) -> None:
        """A warm-up: an empty response, remembered, nothing billed or sent on."""
        if not isinstance(body.get("model"), str):
            body["model"] = ""
        rid = new_id("resp_")
        shell = response_shell(body, rid, body["model"], int(time.time()))
        done = dict(shell, status="completed", completed_at=shell["created_at"],
                    usage={"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                           "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens_details": {"reasoning_tokens": 0}})
        self.socket.send(json.dumps({"type": "response.created", "sequence_number": 0,
                                     "response": shell}, ensure_ascii=False))
        self.socket.send(json.dumps({"type": "response.completed", "sequence_number": 1,
                                     "response": done}, ensure_ascii=False))
        self.last = (rid, list(items_of(body)), [])
