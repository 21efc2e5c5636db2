"""Small helpers shared by the notification tests."""
from __future__ import annotations

import time


def wait_for(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def subscribe(api, channel_type, config, events=("announcement",), **kw) -> dict:
    body = {"name": channel_type, "event_types": list(events), "channel_type": channel_type,
            "channel_config": config, "enabled": True}
    body.update(kw)
    return api.post("/api/subscription/", body)["data"]
