"""Explicit map: channel type -> channel (one module per channel)."""
from __future__ import annotations

from notify.channels.base import Channel
from notify.channels.email import EmailChannel
from notify.channels.group_bot import GroupBotChannel
from notify.channels.personal_push import PersonalPushChannel
from notify.channels.telegram import TelegramChannel
from notify.channels.webhook import WebhookChannel
from notify.channels.wecom_app import WecomAppChannel

CHANNELS: dict[str, Channel] = {c.type: c for c in (
    EmailChannel(), WecomAppChannel(), GroupBotChannel(), PersonalPushChannel(),
    WebhookChannel(), TelegramChannel())}


def get(channel_type: str) -> Channel | None:
    return CHANNELS.get(channel_type)
