"""Relay errors and their bodies in each route family's own shape.

A RelayError carries an HTTP status and an OpenAI-style (type, code); the
handler of each route family renders it with `render(family, ...)`.
"""
from __future__ import annotations

from typing import Any

_GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
                  500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
                  524: "DEADLINE_EXCEEDED"}
_ANTHROPIC_TYPE = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                   504: "api_error", 524: "api_error"}
_MJ_CODE = {400: 4, 401: 4, 403: 4, 404: 3, 429: 23, 503: 4}


class RelayError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers: dict = {}  # sent with the error (Retry-After, x-ratelimit-*)

    # Seconds a client should wait before trying again, sent as Retry-After.
    @property
    def retry_after(self) -> int | None:
        value = self.headers.get("Retry-After")
        return int(value) if value is not None else None

    @retry_after.setter
    def retry_after(self, seconds: int | None) -> None:
        if seconds is None:
            self.headers.pop("Retry-After", None)
        else:
            self.headers["Retry-After"] = str(int(seconds))


def bad_request(message: str, code: str = "invalid_request", param: str | None = None) -> RelayError:
    return RelayError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str, code: str = "invalid_api_key") -> RelayError:
    return RelayError(401, message, "authentication_error", code)


def forbidden(message: str, code: str) -> RelayError:
    return RelayError(403, message, "permission_error", code)


def model_not_found(model: str) -> RelayError:
    """The vendors' answer for a model they do not serve: 404, which SDKs and
    coding agents do not retry (they retry a 503)."""
    return RelayError(404, f"The model '{model}' does not exist or this key may not use it.",
                      "invalid_request_error", "model_not_found", "model")


def render(family: str, err: RelayError, request_id: str) -> dict[str, Any]:
    """The error body for a route family: openai, anthropic, gemini or mj."""
    message = f"{err.message} (request id: {request_id})"
    if family == "anthropic":
        return {"type": "error",
                "error": {"type": _ANTHROPIC_TYPE.get(err.status, "api_error"), "message": message},
                "request_id": request_id}
    if family == "gemini":
        return {"error": {"code": err.status, "message": message,
                          "status": _GEMINI_STATUS.get(err.status, "UNKNOWN")}}
    if family == "mj":
        # 23 is midjourney-proxy's "queue full, try again later".
        code = 23 if err.code == "relay_overloaded" else _MJ_CODE.get(err.status, 4)
        return {"code": code, "description": message, "result": None,
                "properties": {}}
    return {"error": {"message": message, "type": err.type, "param": err.param,
                      "code": err.code}}
