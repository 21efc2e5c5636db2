"""Unknown paths: a 404 in the caller's dialect, with a hint at the likely fix."""
from __future__ import annotations

import re

import json

from handlers.base import RelayHandler
from relay.errors import RelayError

_KNOWN = ("chat/completions", "embeddings", "models", "images/generations",
          "audio/transcriptions", "audio/speech", "messages", "dashboard/billing/subscription",
          "dashboard/billing/usage")


def hint_for(path: str) -> str:
    clean = re.sub(r"/{2,}", "/", path).rstrip("/")
    for known in _KNOWN:
        if clean.endswith(known) or known in clean:
            return (f" Did you mean /v1/{known}? Set your client's base URL to this server's "
                    "address followed by /v1.")
    return " Check the base URL: it should be this server's address followed by /v1 (for " \
           "example http://host:3000/v1), with or without a trailing slash."


class NotFoundHandler(RelayHandler):
    def prepare(self):
        path = self.request.path
        if path.startswith("/api/"):
            raise RelayError(404, f"Unknown API path {path}.")
        raise RelayError(404, f"Unknown path {path}.{hint_for(path)}", "invalid_request_error",
                         "unknown_path")

    def send_error_body(self, err: RelayError) -> None:
        if self.request.path.startswith("/api/"):
            self.clear()
            self.set_default_headers()
            self.set_status(404)
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps({"success": False, "message": err.message, "data": None}))
            return
        super().send_error_body(err)
