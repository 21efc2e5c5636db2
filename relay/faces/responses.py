"""The Responses face: OpenAI Responses clients (openai SDKs'
`client.responses`, Codex CLI, the Vercel AI SDK's `openai(model)`) calling
POST /v1/responses, answered in the Responses format whatever the channel.

Like the other faces: `parse_create` builds a Call whose body is the
canonical chat request (for channels that speak only chat; made when first
read) and keeps the client's own body and bytes for channels that speak
Responses; `StreamWriter` writes Responses events; `render` a whole
Response.  Errors use the OpenAI error body.

What the relay must remember of a call (the finished response for the
bridge, the upstream's id for a pass-through) is left in call.extra for
relay/stored_responses.py: "response" and "upstream_response_id".
"""
from __future__ import annotations

import functools

from relay.serving import sse
from relay.money import tokenizer
from relay.adaptors.base import Call, Chunk
from relay.adaptors.openai_responses import FORWARD_HEADERS, rename_model
from relay.convert import responses as conv
from relay.convert.common import converted, new_id
from relay.convert.responses_stream import ChunksToEvents
from relay.convert.responses_tools import ToolNames
from relay.errors import RelayError, bad_request
from relay.faces.openai import load_json, load_passing, require_model

FAMILY = "openai"  # the error body
FACE = "responses"
# Problems (relay/convert/responses_tools.py) a call without tools no longer has.
TOOL_PROBLEMS = ("hosted tool", "OpenAI built-in tool", "tool_choice", "tool '")


def parse_create(request_id: str, raw: bytes, headers=None, compact: bool = False) -> Call:
    """POST /v1/responses (or /v1/responses/compact) -> Call.  Raises
    RelayError(400) on a bad body."""
    doc, sent = load_passing(raw)
    model = require_model(doc)
    conv.validate(doc)
    if doc.get("background") not in (None, False):
        # Answered `queued` with no usage, finished later upstream: a bill
        # made from the answer relayed would be the prompt's alone.
        raise bad_request("'background' is not supported by this relay: it bills a call from "
                          "the answer it relays, and a background response is answered before "
                          "it runs. Send the request without it (a stream keeps a long call "
                          "alive).", "unsupported_value", "background")
    if compact and doc.get("stream"):
        raise bad_request("'stream' is not supported by /v1/responses/compact.", "invalid_value",
                          "stream")
    call = Call(request_id=request_id, endpoint="responses_compact" if compact else "responses",
                face=FACE, model=model, body=None, raw=sent,
                native_body=doc,
                stream=bool(doc.get("stream")) and not compact)
    call.extra["response_id"] = new_id("resp_")
    call.extra["client_headers"] = {h: headers[h] for h in FORWARD_HEADERS
                                    if headers is not None and headers.get(h)}
    continue_from(call, [])
    return call


def continue_from(call: Call, history: list) -> None:
    """(Re)build the canonical body, with the items of the conversation the
    call continues (a response stored here) before its own input.  A call
    ending in a compaction_trigger item is, on the bridge, a compaction
    like /v1/responses/compact: the model summarises (with no tools), and
    the answer is one compaction item carrying that summary.

    The bridge (the chat body and how its names map back) is made the
    first time something reads call.body (Call.canonical): a Responses
    channel is sent the client's own items, and converting Codex's 73 KB
    of them for nothing cost 120 us of the call.  What the reservation
    reads is noted from the items themselves (relay/bounds.py)."""
    if call.endpoint == "responses" and conv.wants_compaction(call.native_body):
        call.extra["compaction"] = True
    call.extra.pop("bridge", None)
    call.__dict__.pop("body", None)
    # Bound to the call's extra, not to the call: no cycle keeps a Call
    # (and its parsed body) alive until the collector comes round.
    call.canonical = functools.partial(_bridge, call.extra, call.endpoint, history)
    call.extra["references"] = references(history) + references(conv.items_of(call.native_body))
    call.extra["output_asked"] = call.native_body.get("max_output_tokens")


def _bridge(extra: dict, endpoint: str, history: list, native: dict) -> dict:
    bridge = converted(conv.request_to_chat, native, history)
    if endpoint == "responses_compact" or extra.get("compaction"):
        bridge.body["messages"].append({"role": "user", "content": COMPACT_PROMPT})
    if extra.get("compaction"):
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            bridge.body.pop(key, None)
        bridge.problems = [p for p in bridge.problems if not p.startswith(TOOL_PROBLEMS)]
    extra["bridge"] = bridge
    # Files and images by id or URL that the bridge could not carry still
    # reach a Responses upstream: counted in "references" above.
    return bridge.body


def bridge_of(call: Call):
    """The call's bridge, made now if nothing has read call.body yet."""
    call.body  # noqa: B018
    return call.extra["bridge"]


def references(items) -> int:
    """Images and files in Responses items that the upstream fetches by
    reference (a URL that is not a data: URL, a file id): their size is not
    in the body (relay/bounds.py).  What the bridge's chat messages and its
    problems counted, read off the items: an assistant turn's images too,
    which only errs on the safe side."""
    n = 0
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "input_image":
                url = part.get("image_url")
                n += not (isinstance(url, str) and url.startswith("data:"))
            elif kind == "input_file":
                n += not part.get("file_data")
    return n


# A compaction on a channel that speaks only chat is the model's own summary.
COMPACT_PROMPT = ("Summarise the conversation so far for your own later use: the task, what "
                  "was done and decided, the state of the work, and what remains. Be complete "
                  "and concise; this summary replaces the conversation.")


def input_tokens(raw: bytes) -> tuple[str, int]:
    """POST /v1/responses/input_tokens -> (model, our own count)."""
    doc = load_json(raw)
    model = require_model(doc)
    conv.validate(doc)
    body = converted(conv.request_to_chat, doc).body
    return model, tokenizer.count_messages(body["messages"], model, body.get("tools"))


def _shell(call: Call) -> dict:
    return conv.response_shell(call.native_body, call.extra["response_id"], call.model)


class StreamWriter:
    """Canonical chunks -> Responses events; a Responses upstream's own
    events (chunk.raw) are written untouched but for a mapped model name."""

    def __init__(self, call: Call):
        self.call = call
        self._conv = None
        self.passthrough = False

    @property
    def conv(self) -> ChunksToEvents:
        """Made for the first canonical chunk: a pass-through needs none
        (nor the bridge it reads)."""
        if self._conv is None:
            call = self.call
            try:
                names = bridge_of(call).names
            except RelayError:  # a body only a Responses channel reads, its stream empty
                names = ToolNames()
            self._conv = ChunksToEvents(_shell(call), names,
                                        int(call.extra.get("prompt_tokens", 0)),
                                        compaction=bool(call.extra.get("compaction")))
        return self._conv

    def write(self, chunk: Chunk) -> bytes:
        if chunk.raw is not None:
            self.passthrough = True
            data = chunk.data
            if data is None:
                return chunk.raw
            resp = data.get("response") or {}
            if data.get("type") == "response.created" and resp.get("id"):
                self.call.extra["upstream_response_id"] = resp["id"]
            if self.call.upstream_model != self.call.model:
                return rename_model(chunk.raw, data, self.call.model)
            return chunk.raw
        if chunk.data is None or self.passthrough:
            return b""
        return _encode(self.conv.feed(chunk.data))

    def finish(self) -> bytes:
        if self.passthrough:
            return b""
        out = _encode(self.conv.end())
        self.call.extra["response"] = self.conv.response
        return out

    def error(self, status: int, message: str) -> bytes:
        """The stream broke after it began: response.failed, as OpenAI ends a
        failed stream (an `error` event where the upstream's own events ran)."""
        if self.passthrough:
            return sse.encode({"type": "error", "code": "server_error", "message": message,
                               "param": None, "sequence_number": 0}, "error")
        return _encode(self.conv.fail(message))


def _encode(events) -> bytes:
    return b"".join(sse.encode(doc, name) for name, doc in events)


def render(call: Call, doc: dict) -> dict:
    """The whole answer: a Responses upstream's own (renamed to the public
    model), else the canonical chat completion converted."""
    native = call.extra.get("native_answer")
    if isinstance(native, dict):
        return dict(native, model=call.model)
    if call.endpoint == "responses_compact":
        return compaction_from_chat(call, doc)
    if "response" in call.extra:  # rendered already, to be stored
        return call.extra["response"]
    resp = conv.response_from_chat(doc, _shell(call), bridge_of(call).names)
    if call.extra.get("compaction"):
        summary = conv.text_of(((doc.get("choices") or [{}])[0].get("message") or {}).get(
            "content"))
        resp["output"] = [conv.compaction_item(summary)]
    call.extra["response"] = resp
    return resp


def compaction_from_chat(call: Call, doc: dict) -> dict:
    """A bridged compaction: the client's own user messages, then the model's
    summary as a user message, which is what the next turn starts from."""
    summary = conv.text_of(((doc.get("choices") or [{}])[0].get("message") or {}).get("content"))
    kept = [dict(i, id=i.get("id") or new_id("msg_")) for i in conv.items_of(call.native_body)
            if i.get("type", "message") == "message" and i.get("role") == "user"]
    kept.append({"id": new_id("msg_"), "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": summary}]})
    return {"id": call.extra["response_id"], "object": "response.compaction",
            "created_at": _shell(call)["created_at"], "output": kept,
            "usage": conv.usage_doc_from_chat(doc.get("usage")) or conv.usage_doc(0, 0)}
