"""What a call asks for that changes how it is billed, read from its body:
the service tier (priced apart, relay/service.py priced()) and whether the
model reasons unseen (a stream cut by its client is then read on for its
usage, relay/upstream/client.py Cancel.drain)."""
from __future__ import annotations

import re

from relay.adaptors.base import Call
from relay.bounds import CHAT_LIKE
from relay.convert.anthropic_request import effort_of
from relay.convert.gemini_config import effort_from_thinking

# Service tiers billed apart from the standard one (OpenAI's; "auto" and
# "default" are the standard tier).
PAID_TIERS = ("flex", "priority", "scale")


# Models that reason before they answer, and bill it, without streaming it.
_REASONS = re.compile(r"^(?:o\d|gpt-5|(?:models/)?gemini-(?:2\.5|[3-9]))")


def hides_reasoning(call: Call) -> bool:
    """Whether a stream cut before its usage would leave unseen reasoning
    tokens unbilled: read on for the usage then (Cancel.drain)."""
    if _REASONS.match(call.upstream_model or call.model):
        return True
    native = call.native_body if isinstance(call.native_body, dict) else {}
    thinking = native.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        return True
    # Read natively where the canonical body may not be made (Call.canonical).
    if call.face == "anthropic":
        return effort_of(native) is not None
    if call.face == "gemini":
        cfg = native.get("generationConfig") or native.get("generation_config")
        return isinstance(cfg, dict) and effort_from_thinking(
            cfg.get("thinkingConfig") or cfg.get("thinking_config")) is not None
    return bool(call.body.get("reasoning_effort")) or isinstance(native.get("reasoning"), dict)


def requested_tier(call: Call) -> str:
    """The service tier an OpenAI-format call asks for ("" for standard)."""
    if call.face not in ("openai", "responses") or call.endpoint not in CHAT_LIKE:
        return ""
    body = call.native_body if isinstance(call.native_body, dict) else call.body
    tier = body.get("service_tier")
    return tier if tier in PAID_TIERS else ""
