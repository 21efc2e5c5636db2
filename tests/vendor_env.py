"""Shared set-up for the vendor-format tests: fake upstreams of every
channel type, one channel per (model, type), a funded user and keys, and
billing checks computed independently of the relay's pricing code."""
from __future__ import annotations

import time
import uuid

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.azure_upstream import FakeAzure
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import Api

# USD per million tokens, chosen so one token is a whole number of units:
# input 1000 units, cached input 250, output 4000 (500,000 units = 1 USD).
PRICE = {"input_price": 2000, "output_price": 8000, "cache_price": 500}


def expected_units(prompt: int, completion: int, cached: int = 0) -> int:
    return 1000 * (prompt - cached) + 250 * cached + 4000 * completion


class Env:
    """Everything one test module needs; `models` maps a channel type to
    the public model served by it."""

    def __init__(self, relay, admin: Api):
        self.relay = relay
        self.admin = admin
        self.openai = FakeOpenAI(slow_delay=0.3).start()
        self.anthropic = FakeAnthropic(slow_delay=0.3).start()
        self.gemini = FakeGemini(slow_delay=0.3).start()
        self.azure = FakeAzure(slow_delay=0.3).start()
        self.fakes = {"openai": self.openai, "anthropic": self.anthropic,
                      "gemini": self.gemini, "azure": self.azure}
        name = "u" + uuid.uuid4().hex[:8]
        self.user = admin.create_user(name, quota=10 ** 12)
        self.user_api = Api.login(relay.url, name, "Blue-Kettle-Harbor-42")
        # One model per channel type, mapped to a different upstream name so
        # that the mapping is seen to happen.
        self.models = {}
        for kind in ("openai", "anthropic", "gemini", "azure"):
            public = f"{kind}-model"
            self.channel(kind, public, upstream=f"{kind}-upstream-model")
            self.models[kind] = public

    def channel(self, kind: str, public: str, mode: str | None = None, upstream: str | None = None,
                options: dict | None = None, key: str = "upstream-key") -> dict:
        fake = self.fakes[kind]
        base = fake.mode_url(mode) if mode else fake.url
        extra = {"model_mapping": {public: upstream}} if upstream else {}
        if options:
            extra["options"] = options
        ch = self.admin.create_channel(base, [public], name=f"{kind}-{public}", type=kind,
                                       key=key, **extra)
        self.admin.set_price(public, **PRICE)
        return ch

    def token(self, **extra) -> dict:
        return self.user_api.create_token(name="k" + uuid.uuid4().hex[:6], remain_quota=10 ** 10,
                                          **extra)

    def logs(self, token_id: int, n: int = 1, timeout: float = 15.0) -> list[dict]:
        """The token's usage records, oldest first, once there are n."""
        deadline = time.monotonic() + timeout
        while True:
            items = self.admin.get(f"/api/log/?token_id={token_id}&size=100")["data"]["items"]
            if len(items) >= n or time.monotonic() > deadline:
                return sorted(items, key=lambda r: r.get("created_at") or 0)
            time.sleep(0.1)

    def unbilled(self, token_id: int, records: int = 0, quiet: float = 2.0) -> list[dict]:
        """The key was charged nothing and has exactly `records` usage
        records (a call refused after its reservation is logged with its
        error and quota 0; one refused before it, or a free endpoint, is
        not).  Waits `quiet` seconds, several usage flushes, for a record
        that should not be there to show up."""
        logs = self.logs(token_id, records + 1, timeout=quiet)
        assert len(logs) == records, logs
        assert all(r["quota"] == 0 and r["status"] >= 400 for r in logs), logs
        assert self.used(token_id) == 0
        return logs

    def used(self, token_id: int) -> int:
        return self.user_api.get(f"/api/token/{token_id}")["data"]["used_quota"]

    def check_billed(self, token: dict, prompt: int, completion: int, cached: int = 0,
                     n: int = 1) -> dict:
        """The token's last usage record carries these counts and is charged
        exactly their cost; the token's used quota agrees with the log."""
        logs = self.logs(token["id"], n)
        assert len(logs) == n, logs
        rec = logs[-1]
        assert (rec["prompt_tokens"], rec["completion_tokens"], rec["cached_tokens"]) == \
            (prompt, completion, cached), rec
        assert rec["estimated"] is False, rec
        assert rec["quota"] == expected_units(prompt, completion, cached), rec
        deadline = time.monotonic() + 10
        total = sum(r["quota"] for r in logs)
        while self.used(token["id"]) != total and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.used(token["id"]) == total
        return rec

    def stop(self) -> None:
        for f in self.fakes.values():
            f.stop()
