"""Why billing refuses a call: the balance cannot pay (403), a budget by
period is spent (429 until the next period), or billing cannot make a
charge durable or is waiting on a change (503)."""
from __future__ import annotations

from relay.errors import RelayError

USER, TOKEN, BUDGET = "user", "token", "budget"


class QuotaExhausted(RelayError):
    def __init__(self, kind: str):
        who = "API key" if kind == TOKEN else "account"
        super().__init__(403, f"The {who}'s quota is exhausted; top up or raise the key's quota.",
                         "insufficient_quota", f"{kind}_quota_exhausted")
        self.kind = kind


class BillingUnavailable(RelayError):
    def __init__(self, why: str):
        super().__init__(503, f"Billing is unavailable ({why}); try again shortly.",
                         "service_unavailable", "billing_unavailable")


class BudgetExceeded(RelayError):
    """A key's or an account's budget for the period is spent: 429 with
    Retry-After to the next period's start (relay/money/budgets.py)."""

    def __init__(self, scope: str, period: str, limit: int, retry_after: int):
        who = "API key" if scope == TOKEN else "account"
        super().__init__(429, f"The {who}'s budget for this {period} ({limit} quota units) is "
                              f"spent; it starts again in {retry_after} s.",
                         "insufficient_quota", "budget_exceeded")
        self.retry_after = max(int(retry_after), 1)
        self.scope, self.period = scope, period
