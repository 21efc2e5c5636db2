"""The /api refusal: ApiError, and the names of the refusals that are not
one (handlers/base.py ApiHandler.write_error writes them all)."""
from __future__ import annotations

# The codes of refusals that are no ApiError (the console's err.<code>).
HTTP_CODES = {400: "bad_request", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
# Billing's and the catalog's refusals of a change (RelayError.code) that
# /api passes on by name; any other is "unavailable".
RELAY_CODES = ("billing_unavailable", "invalidation_not_recorded")


class ApiError(Exception):
    """A refusal: `message` is English, for API clients and as the console's
    fallback; `code` is a stable name and `values` the message's variable
    parts by name, both in the reply's `data` ({"code": "field_too_long",
    "field": "name", "max": 64}), which the console shows as err.<code> in
    its own language (ui/static/i18n/*.json; tests/handlers/test_error_codes.py
    fails on a raise without a code, or with one the tables lack)."""

    def __init__(self, status: int, message: str, retry_after: int = 0, code: str = "",
                 **values):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.code = code
        self.values = values

    @classmethod
    def of(cls, exc: Exception, status: int = 400, code: str = "", message: str = "",
           **values) -> "ApiError":
        """The refusal for an error raised below the handlers: its own code
        and values when it has them (models/refusal.Refusal, BadInput,
        ContactError...), else `code` with the English text as `detail`
        (for messages from code that names no refusal: a template's error)."""
        message = message or getattr(exc, "message", None) or str(exc)
        status = getattr(exc, "status", None) or status
        own = getattr(exc, "code", "")
        if own:
            return cls(status, message, getattr(exc, "retry_after", 0) or 0, own,
                       **(getattr(exc, "values", None) or {}))
        return cls(status, message, 0, code, detail=str(exc).rstrip("."), **values)

    def data(self) -> dict | None:
        """The reply's `data`: the code, the values and, for a 429, retry_after."""
        out = {**self.values}
        if self.code:
            out["code"] = self.code
        if self.retry_after:
            out["retry_after"] = self.retry_after
        return out or None
