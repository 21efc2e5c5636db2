"""Explicit map: channel type -> adaptor.  Add a vendor by adding a line."""
from __future__ import annotations

from relay.adaptors.base import Adaptor
from relay.adaptors.midjourney import MidjourneyAdaptor
from relay.adaptors.openai import OpenAIAdaptor

ADAPTORS: dict[str, Adaptor] = {
    "openai": OpenAIAdaptor(),
    "midjourney": MidjourneyAdaptor(),
}


def adaptor_for(channel_type: str) -> Adaptor | None:
    return ADAPTORS.get(channel_type)


def channel_types() -> list[str]:
    return sorted(ADAPTORS)
