"""Which API an OpenAI-format channel speaks, learnt from its answers.

A channel whose option `wire_api` is "both" (the default) is tried with the
client's own API.  A server that serves only chat completions (DeepSeek,
Qwen, Moonshot, vLLM, most self-hosted servers) answers /v1/responses with
404 or 405, or a 400 saying the URL is unknown; one that serves only the
Responses API answers chat completions so.  Such an answer is read here as
"this channel speaks the other API": the same call is bridged at once, and
the channel is remembered (relay/compat/memory.py) as speaking only that one.
A 404 about a model the upstream does not have is no such answer.

/v1/responses/compact is often missing where /v1/responses is served
(vLLM, Azure): its absence is remembered apart ("compact") and only
compactions are bridged.
"""
from __future__ import annotations

import re

from relay.compat.rules import Fix

CHAT, RESPONSES, COMPACT = "chat", "responses", "compact"
_UNKNOWN_URL = re.compile(
    r"unknown request url|invalid url|unrecognized request url|unknown endpoint|no such endpoint|"
    r"unsupported endpoint|endpoint not found|endpoint .{0,40}not (?:supported|found)|"
    r"route not found|no route|unknown path|path not found|not a valid endpoint", re.I)
# A model (Azure: a deployment) the upstream does not have: a 404 that is not about the path.
_MODEL_MISSING = re.compile(
    r"(?:model|deployment).{0,120}(?:not found|does not exist|not exist|no such|unknown|"
    r"not available|not supported)|model_not_found|deploymentnotfound|unknown model|"
    r"no such model", re.I | re.S)


def unknown_endpoint(status: int, body: bytes) -> bool:
    """Whether an answer says the path itself is not served."""
    text = (body or b"")[:4000].decode("utf-8", "replace")
    if status in (404, 405):
        return not _MODEL_MISSING.search(text)
    return status == 400 and bool(_UNKNOWN_URL.search(text))


def refusal(endpoint: str, sent_wire: str, options: dict, status: int, body: bytes) -> Fix | None:
    """The wire this channel must speak instead, when its answer to a call
    sent on `sent_wire` ("responses" or "openai") says the path is not
    there; None otherwise, and always when the operator chose `wire_api`."""
    if str((options or {}).get("wire_api") or "both") != "both":
        return None
    if not unknown_endpoint(status, body):
        return None
    reason = (body or b"")[:200].decode("utf-8", "replace")
    if endpoint == "responses_compact" and sent_wire == "responses":
        return Fix("wire", COMPACT, reason)
    if endpoint == "responses" and sent_wire == "responses":
        return Fix("wire", CHAT, reason)
    if endpoint == "chat" and sent_wire == "openai":
        return Fix("wire", RESPONSES, reason)
    return None
