"""The one contract every vendor adaptor follows.

An adaptor speaks to one kind of upstream channel (openai, anthropic, gemini,
azure, midjourney, ...).  The relay's canonical shape is OpenAI's: requests
arrive converted to it by the inbound face (relay/faces), and an adaptor
turns its upstream's answers back into OpenAI-shaped dicts.  When the
client's format equals the upstream's (`Call.face == adaptor.native`), the
adaptor is asked to pass bytes through: it still reads them, but only to
find the usage.

Lifecycle of one call, all methods called on the IOLoop, none may block:
1. `prepare(call, channel)` once per attempt (a retry on another channel
   calls it again): notes in call.extra["wire"] the format this attempt
   speaks upstream (`wire()`), refuses what a bridged call would lose, and
   returns `request(call, channel)` -> UpstreamRequest.
2. Streaming: `stream(call)` once per attempt -> a StreamReader fed with the
   raw bytes as they arrive.
   Non-streaming: `parse(call, body)` once with the whole body.
3. On an upstream status >= 400: `error(status, body)` -> RelayError.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from relay.convert.responses_tools import BUILT_IN, DROPPABLE, HOSTED
from relay.errors import RelayError, bad_request
from relay.money.pricing import Usage
from relay.serving import jsonin, redact


@dataclass
class Call:
    """What the relay knows about one inbound call."""
    request_id: str
    endpoint: str            # "chat", "embeddings", "images", "transcriptions", "speech", ...
    face: str                # the client's wire format: "openai", "anthropic", "gemini"
    model: str               # the public model name the client asked for
    body: dict               # the request in canonical (OpenAI) shape
    raw: bytes = b""         # the client's original body, for pass-through
    native_body: dict | None = None  # the client's body parsed, in its own format
    stream: bool = False
    client_wants_usage: bool = False
    upstream_model: str = ""  # set per attempt from the channel's model_mapping
    extra: dict = field(default_factory=dict)
    # raw -> native_body, from a face whose native body is a pure function
    # of the client's bytes; what lets a stream shelve it (below).
    derive: Any = field(default=None, repr=False, compare=False)
    # native_body -> body: the face's conversion to the canonical shape, run
    # the first time something reads call.body (a face passes body=None).
    # A call whose channel speaks the client's format is sent as the client's
    # bytes and billed from the native body (relay/bounds.py reads what the
    # face noted in extra), so nothing reads it: converting a coding agent's
    # 100 KB body for nothing was a tenth of the call.  A body that cannot be
    # converted raises the conversion's RelayError(400) where it is read.
    canonical: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.body is None and self.canonical is not None:
            del self.__dict__["body"]

    def shelve(self) -> None:
        """Drop the parsed bodies once a stream's request is made (attempts.
        attempt_stream).  A coding agent's 100 KB body is 240 KB parsed, and
        twice that with the OpenAI-shaped copy, held for minutes; the bytes
        (what the upstream was sent) stay.  Read again later, they are parsed
        again from those bytes: nothing on a normal stream's path reads them
        (a retry on another channel does, and an estimate for a stream that
        lost its usage)."""
        if self.derive is not None and self.raw:
            self.__dict__.pop("body", None)
            self.__dict__.pop("native_body", None)

    def __getattr__(self, name: str):
        # Reached only for attributes not set: the bodies shelve() dropped,
        # and a canonical body not made yet.
        d = self.__dict__
        if name == "native_body" and d.get("derive") is not None:
            self.native_body = d["derive"](d["raw"])
            return self.native_body
        if name == "body" and (d.get("derive") is not None or d.get("canonical") is not None):
            native = self.native_body
            self.body = d["canonical"](native) if d.get("canonical") is not None else native
            return self.body
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# The dataclass keeps native_body's default (None) as a class attribute too,
# which would answer for a shelved one; __init__ has its own copy of it.
del Call.native_body


@dataclass
class UpstreamRequest:
    method: str
    url: str
    headers: dict
    body: bytes | None = None
    body_producer: Any = None  # for streamed uploads (multipart audio)


@dataclass
class Chunk:
    """One unit of a translated stream.

    `data` is an OpenAI chat.completion.chunk dict (None for pass-through
    events that carry nothing to translate); `raw` is the event's original
    bytes, written as they are when the client speaks the upstream's format.
    """
    data: dict | None
    raw: bytes | None = None


class StreamReader:
    """Fed raw upstream bytes; returns translated chunks; collects usage."""

    def __init__(self):
        self.usage: Usage | None = None
        self.text_parts: list[str] = []  # what was generated, for estimates

    def feed(self, data: bytes) -> list[Chunk]:
        """Called for every piece of bytes received.  Returns [] when a
        piece completes no event."""
        raise NotImplementedError

    def finish(self) -> list[Chunk]:
        """Called once when the upstream ends the stream cleanly."""
        return []

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class Adaptor:
    type = ""
    native = "openai"  # the wire format this upstream speaks
    endpoints: frozenset = frozenset()

    def wire(self, call: Call, channel) -> str:
        """The wire format this attempt speaks upstream.  A call whose face
        equals it passes through; any other is converted."""
        return self.native

    def prepare(self, call: Call, channel) -> UpstreamRequest:
        call.extra["wire"] = self.wire(call, channel)
        if call.face == "responses" and call.extra["wire"] != "responses":
            refuse_unbridgeable(call, channel)
        return self.request(call, channel)

    def request(self, call: Call, channel) -> UpstreamRequest:
        raise NotImplementedError

    def stream(self, call: Call) -> StreamReader:
        raise NotImplementedError

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        """The whole non-streamed answer -> (OpenAI-shaped dict, usage or None)."""
        raise NotImplementedError

    def error(self, status: int, body: bytes) -> RelayError:
        return generic_error(status, body)


def serves(adaptor: Adaptor, endpoint: str) -> bool:
    """Every adaptor that serves chat serves the Responses API too: the
    Responses face converts to chat for those that do not speak it."""
    if endpoint in adaptor.endpoints:
        return True
    return endpoint in ("responses", "responses_compact") and "chat" in adaptor.endpoints


# Problems that are tools merely offered (relay/convert/responses_tools.py).
OFFERED = (HOSTED, BUILT_IN)


def refuse_unbridgeable(call: Call, channel) -> None:
    """A Responses call bridged to a chat channel: a 400 naming what the
    channel cannot carry.  Hosted and OpenAI built-in tools that are only
    offered are left out (the model there cannot call them; Codex offers
    web_search on every call): the channel option `refuse_hosted_tools`
    makes them a 400 instead.  A tool_choice that forces one, and items
    only OpenAI can read, are a 400 unless `drop_hosted_tools` drops the
    tool_choice too."""
    call.body  # noqa: B018 (the Responses face makes its bridge when call.body is read)
    bridge = call.extra.get("bridge")
    problems = list(getattr(bridge, "problems", None) or ())
    opts = channel.options or {}
    if not opts.get("refuse_hosted_tools"):
        problems = [p for p in problems if not p.startswith(OFFERED)]
    if opts.get("drop_hosted_tools"):
        problems = [p for p in problems if not p.startswith(DROPPABLE)]
    if not problems:
        return
    tools = any(p.startswith(DROPPABLE + ("tool ",)) for p in problems)
    hint = (" (Codex CLI: set web_search = \"disabled\" in config.toml.)"
            if any("web_search" in p for p in problems) else "")
    raise bad_request(f"The model '{call.model}' is served here by a channel that speaks chat "
                      f"completions, not the Responses API, and it cannot run: "
                      f"{', '.join(problems)}. Remove {'them' if len(problems) > 1 else 'it'} "
                      f"from the request.{hint}", "unsupported_tool" if tools else
                      "unsupported_input_item", "tools" if tools else "input")


def cap_output_tokens(body: dict, options: dict | None) -> dict:
    """A converted call's canonical body with its output-token limit cut to
    the channel option `max_output_tokens`, when set: clients of another
    format ask for what their own vendor's models allow (Claude Code sends
    max_tokens 128000), which the upstream's model may refuse outright.
    The body itself when there is nothing to cut: callers must not change it."""
    cap = (options or {}).get("max_output_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        return body
    out = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int) and out[key] > cap:
            out[key] = cap
    return out


def join_url(base: str, path: str, version: str = "/v1") -> str:
    """Join a channel's base URL and an API path, tolerating a base given with
    or without its version segment and with a trailing slash."""
    base = base.rstrip("/")
    if version and base.endswith(version):
        base = base[: -len(version)]
    return base + version + path


def upstream_message(body: bytes) -> str:
    """The upstream's own words for its failure, passed through
    relay/serving/redact.scrub: users see them, and vendors name the
    organisation and some echo the key they were sent."""
    return redact.scrub(_message(body))


def _message(body: bytes) -> str:
    try:
        doc = jsonin.loads_answer(body)
    except ValueError:
        return body[:300].decode(errors="replace").strip()
    if isinstance(doc, list) and doc:
        doc = doc[0]
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("description") or err)[:1000]
        return str(err)[:1000]
    return str(doc)[:300]


_KIND = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")


def upstream_kind(body: bytes) -> str | None:
    """The vendor's name for the failure (OpenAI's code or type, Anthropic's
    type, Gemini's status), when it sent one that reads as a name."""
    try:
        doc = jsonin.loads_answer(body)
    except ValueError:
        return None
    if isinstance(doc, list) and doc:
        doc = doc[0]
    err = doc.get("error", doc) if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return None
    for name in ("code", "type", "status"):
        value = err.get(name)
        if isinstance(value, str) and _KIND.match(value) and value not in ("error",):
            return value
    return None


def generic_error(status: int, body: bytes) -> RelayError:
    """Map an upstream failure to our status table.  The message keeps the
    upstream's status and error type, and its text filtered (upstream_message)."""
    kind = upstream_kind(body)
    msg = (f"[{status} {kind}] " if kind else f"[{status}] ") + upstream_message(body)
    low = msg.lower()
    if status == 429:
        return RelayError(429, f"The upstream is rate limiting: {msg}", "rate_limit_error",
                          "rate_limit_exceeded")
    if status == 413 or "context length" in low or "context_length" in low or "too many tokens" in low:
        return RelayError(413, f"The request is too large for the model: {msg}",
                          "invalid_request_error", "context_length_exceeded")
    if status in (400, 404, 422):
        return RelayError(400, f"The upstream rejected the request: {msg}",
                          "invalid_request_error", "upstream_rejected")
    if status in (401, 403):
        # The channel's own credentials failed: not the caller's fault.
        return RelayError(503, "The upstream channel refused our credentials; try again later.",
                          "upstream_error", "channel_auth_failed")
    if status == 504 or status == 408:
        return RelayError(504, "The upstream did not answer in time.", "upstream_error",
                          "upstream_timeout")
    return RelayError(502, f"The upstream failed: {msg}", "upstream_error", "bad_upstream")


def retryable(status: int) -> bool:
    """Whether another channel may succeed where this one failed."""
    return status == 429 or status >= 500 or status in (401, 403, 408)
