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
