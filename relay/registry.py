"""Explicit map: channel type -> adaptor.  Add a vendor by adding a line."""
from __future__ import annotations

from relay.adaptors.anthropic import AnthropicAdaptor
from relay.adaptors.azure import AzureAdaptor
from relay.adaptors.base import Adaptor
from relay.adaptors.gemini import GeminiAdaptor
from relay.adaptors.midjourney import MidjourneyAdaptor
from relay.adaptors.openai import OpenAIAdaptor

ADAPTORS: dict[str, Adaptor] = {
    "openai": OpenAIAdaptor(),
    "anthropic": AnthropicAdaptor(),
    "gemini": GeminiAdaptor(),
    "azure": AzureAdaptor(),
    "midjourney": MidjourneyAdaptor(),
}


def adaptor_for(channel_type: str) -> Adaptor | None:
    return ADAPTORS.get(channel_type)


def channel_types() -> list[str]:
    return sorted(ADAPTORS)


def passes_through(call, channel) -> bool:
    """Whether an attempt on this channel is sent the client's own body (the
    wire it speaks for this call is the client's format), so that the
    conversion a face deferred (Call.canonical) need not be made for it.
    The wire, not the adaptor's native format: an OpenAI channel speaks
    Responses to a Responses call unless told it serves only chat."""
    return adaptor_for(channel.type).wire(call, channel) == call.face
