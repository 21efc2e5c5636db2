"""Why billing refuses a call: the balance cannot pay (403), or billing
cannot make a charge durable or is waiting on a change (503)."""
from __future__ import annotations

from relay.errors import RelayError

USER, TOKEN = "user", "token"


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
