"""A customer of the relay for end-to-end tests: an account with quota and a
limited API key, and the live balances of both."""
from __future__ import annotations

import time
import uuid

from tests.helpers import Api


class Tenant:
    def __init__(self, admin: Api, base: str, quota: int = 10_000_000, key_quota: int = 5_000_000,
                 **token_fields):
        self.admin = admin
        self.base = base
        name = "u" + uuid.uuid4().hex[:8]
        user = admin.create_user(name, password="Blue-Kettle-Harbor-42", quota=quota)
        self.user_id = user["id"]
        self.api = Api.login(base, name, "Blue-Kettle-Harbor-42")
        tok = self.api.create_token(name="k", remain_quota=key_quota, **token_fields)
        self.token_id = tok["id"]
        self.key = tok["key"]

    def balances(self) -> tuple[int, int, int, int]:
        """(account remaining, account used, key remaining, key used), live."""
        u = self.admin.get(f"/api/user/{self.user_id}")["data"]
        t = self.api.get(f"/api/token/{self.token_id}")["data"]
        return u["quota"], u["used_quota"], t["remain_quota"], t["used_quota"]

    def spent_since(self, before: tuple) -> int:
        """The charge since `before`, checked to be the same on account and key."""
        now = self.balances()
        spent_user = before[0] - now[0]
        assert now[1] - before[1] == spent_user, (before, now)
        assert before[2] - now[2] == spent_user, (before, now)
        assert now[3] - before[3] == spent_user, (before, now)
        return spent_user

    def logs(self, n: int, timeout: float = 15.0, **filters) -> list[dict]:
        """The newest usage records (waits for the batched writer)."""
        qs = "&".join(f"{k}={v}" for k, v in filters.items())
        deadline = time.monotonic() + timeout
        while True:
            items = self.api.get(f"/api/log/self?size=100&{qs}")["data"]["items"]
            if len(items) >= n or time.monotonic() > deadline:
                return items
            time.sleep(0.1)
