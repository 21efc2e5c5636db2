"""Unknown paths: a 404 in the caller's dialect, with a hint at the likely fix.

Most unknown paths are a client given a wrong base URL.  When the path ends
in an endpoint we serve, the hint names the base URL to use instead and
what was wrong with the one given (an extra prefix, a wrong version).
Runs of /v1 and a chat URL given as the base are not errors: they are
routed (handlers/relay_media.py).
"""
from __future__ import annotations

import difflib
import json
import re

from handlers.base import RelayHandler
from relay.errors import RelayError

_KNOWN = ("chat/completions", "embeddings", "models", "images/generations",
          "audio/transcriptions", "audio/speech", "messages", "dashboard/billing/subscription",
          "dashboard/billing/usage")
_MJ = re.compile(r"/(submit/[\w-]+|task/[^/]+/(fetch|image-seed)|task/list-by-condition|"
                 r"image/[^/]+)$")


def hint_for(path: str, base: str = "") -> str:
    clean = re.sub(r"/{2,}", "/", path).rstrip("/")
    m = _MJ.search(clean)
    if m:
        return (f" Midjourney routes are {base}/mj/{m.group(1)} (or with a mode: "
                f"{base}/mj-relax/mj/{m.group(1)}); set your client's base URL to {base}.")
    for known in _KNOWN:
        if clean.endswith("/" + known):
            prefix = clean[: -len(known) - 1]
            if known == "messages":
                want = f"{base} (the SDK adds /v1/messages)"
            else:
                want = f"{base}/v1"
            what = (f"the prefix '{prefix}' is not served here" if prefix and prefix != "/v1"
                    else "the path is not served here")
            return (f" Did you mean {'/v1/' + known}? Set your client's base URL to {want}: "
                    f"{what}.")
    for known in _KNOWN:
        if known in clean:
            return (f" Did you mean /v1/{known}? Set your client's base URL to {base}/v1, with "
                    "or without a trailing slash.")
    parts = clean.strip("/").split("/")
    tails = ["/".join(parts[-2:]), parts[-1]] if parts else []
    for tail in tails:
        close = difflib.get_close_matches(tail, _KNOWN, n=1, cutoff=0.8)
        if close:
            return f" Did you mean /v1/{close[0]}? (The base URL should be {base}/v1.)"
    return (f" Check the base URL: it should be this server's address followed by /v1 "
            f"({base}/v1), with or without a trailing slash.")


def _relay_looking(path: str) -> bool:
    clean = re.sub(r"/{2,}", "/", path).rstrip("/")
    return any(clean.endswith("/" + k) for k in _KNOWN) or bool(_MJ.search(clean))


class NotFoundHandler(RelayHandler):
    api_shape = False

    def prepare(self):
        path = self.request.path
        # "/api/v1/chat/completions" is a relay client with a wrong base URL,
        # not a console call: it gets the relay's error shape and a hint.
        if path.startswith("/api/") and not _relay_looking(path):
            self.api_shape = True
            raise RelayError(404, f"Unknown API path {path}.")
        if _MJ.search(re.sub(r"/{2,}", "/", path).rstrip("/")):
            self.family = "mj"
        base = f"{self.request.protocol}://{self.request.host}"
        raise RelayError(404, f"Unknown path {path}.{hint_for(path, base)}",
                         "invalid_request_error", "unknown_path")

    def send_error_body(self, err: RelayError) -> None:
        if self.api_shape:
            self.clear()
            self.set_default_headers()
            self.set_status(404)
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps({"success": False, "message": err.message, "data": None}))
            return
        super().send_error_body(err)
