"""The one contract every delivery channel implements.

A channel is a module in notify/channels with one `Channel` subclass.  The
outbox worker calls `send(msg, config, ctx)` for one outbox record; the
channel turns the message into its vendor's wire format and reports success
by returning a short receipt, failure by raising DeliveryError.  Channels
hold no state of their own except caches (e.g. access tokens) in `ctx`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from models.refusal import Refusal


# Entries of an object field (a webhook's headers): more is no header set.
MAX_OBJECT_KEYS = 50


class DeliveryError(Exception):
    """A failed send.  permanent=True: retrying cannot help (bad config)."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    secret: bool = False
    required: bool = False
    kind: str = "string"           # string | object | text | choice
    choices: tuple = ()
    # For an object (e.g. headers): stored encrypted as a whole, and values
    # under names that look like credentials are shown masked.
    secret_values: bool = False

    def view(self) -> dict:
        out = {"name": self.name, "label": self.label, "secret": self.secret,
               "required": self.required, "kind": self.kind}
        if self.choices:
            out["choices"] = list(self.choices)
        if self.secret_values:
            out["secret_values"] = True
        return out


@dataclass
class Message:
    """What to tell one subscriber; `vars` are the template variables."""
    id: str
    event_type: str
    title: str
    content: str
    vars: dict = field(default_factory=dict)
    user: dict = field(default_factory=dict)   # {id, username, email}

    def text(self) -> str:
        return f"{self.title}\n\n{self.content}" if self.content else self.title


@dataclass
class Context:
    """What a channel may use: settings, the guarded HTTP client, caches."""
    settings: Any
    http: Any
    cache: dict = field(default_factory=dict)
    clock: Any = time.time


class Channel:
    type: str = ""
    label: str = ""
    fields: tuple[Field, ...] = ()

    def describe(self) -> dict:
        return {"type": self.type, "label": self.label, "fields": [f.view() for f in self.fields]}

    def secret_fields(self) -> set[str]:
        return {f.name for f in self.fields if f.secret}

    def secret_objects(self) -> set[str]:
        return {f.name for f in self.fields if f.secret_values}

    def clean(self, config: dict) -> dict:
        """Validate and normalise a channel_config; raise ValueError with a clear message."""
        out = {}
        for f in self.fields:
            value = config.get(f.name)
            if f.kind == "object":
                value = value or {}
                if isinstance(value, dict) and len(value) > MAX_OBJECT_KEYS:
                    raise Refusal(f"{f.name} takes at most {MAX_OBJECT_KEYS} entries.",
                                  "list_too_long", field=f.name, max=MAX_OBJECT_KEYS)
                if not isinstance(value, dict) or not all(
                        isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in value.items()):
                    raise Refusal(f"{f.name} must be an object of string values.",
                                  "field_not_object", field=f.name)
                value = {k: str(v) for k, v in value.items()}
            else:
                value = "" if value is None else str(value).strip() if f.kind != "text" else str(value)
                if f.choices and value and value not in f.choices:
                    raise Refusal(f"{f.name} must be one of {', '.join(f.choices)}.",
                                  "field_choice", field=f.name, choices=", ".join(f.choices))
            if f.required and not value:
                raise Refusal(f"{self.label}: {f.label} is required.", "field_required",
                              field=f.name)
            out[f.name] = value
        return out

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        """Deliver msg now; return a short receipt, or raise DeliveryError."""
        raise NotImplementedError


def check_reply(reply, vendor: str, ok) -> None:
    """Turn a vendor reply into DeliveryError unless ok(json) is true.

    5xx and 429 are worth retrying; other 4xx mean the request or the
    credentials are wrong, which is still retried (an admin may fix them
    within the retry window) but reported as such.
    """
    data = reply.json()
    if 200 <= reply.status < 300 and isinstance(data, dict) and ok(data):
        return
    raise DeliveryError(f"{vendor} answered HTTP {reply.status}: {reply.snippet()}")
