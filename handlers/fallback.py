"""Unknown paths: a 404 in the caller's dialect, saying why.

Two different mistakes end here:
- A vendor endpoint this relay does not serve, under a correct base
  (/v1/files, /v1/batches, /v1/messages/batches, /v1beta/cachedContents...):
  the 404 says the endpoint is not supported here, and what is.
- A wrong path, most often a client given a wrong base URL: when the path
  ends in an endpoint we serve, the hint names the base URL to use instead
  and what was wrong with the one given (an extra prefix, a wrong version).
Runs of /v1 and a chat URL given as the base are not errors: they are
routed (handlers/relay_media.py).

The family (error body) is the path's (/v1beta is Gemini's, /mj
Midjourney's) or the caller's: a Gemini key header or ?key=, an
`anthropic-version` header, else OpenAI.
"""
from __future__ import annotations

import difflib
import json
import re

from handlers.relay_base import RelayHandler
from relay.errors import RelayError

# Served endpoints (the hint's targets).  /v1/responses is served by the
# Responses face (relay/faces/responses.py).
_KNOWN = ("chat/completions", "embeddings", "models", "images/generations", "images/edits",
          "audio/transcriptions", "audio/translations", "audio/speech", "completions",
          "moderations", "rerank", "responses", "messages", "dashboard/billing/subscription",
          "dashboard/billing/usage")
_SERVED = {
    "openai": "POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, "
              "/v1/moderations, /v1/rerank, /v1/images/generations, /v1/images/edits, "
              "/v1/audio/speech, /v1/audio/transcriptions, /v1/audio/translations and "
              "GET /v1/models",
    "anthropic": "POST /v1/messages, POST /v1/messages/count_tokens and GET /v1/models",
    "gemini": "models/{model}:generateContent, :streamGenerateContent, :countTokens, "
              ":embedContent, :batchEmbedContents and GET models, under /v1beta or /v1",
}
# Vendors' endpoints that are not served, by family, after the family's base.
_UNSERVED = {
    "openai": re.compile(
        r"^/(?:v1/)*(files|uploads|batches|fine_tuning|fine-tunes|assistants|threads|"
        r"vector_stores|realtime|audio/voices|containers|conversations|evals|videos|"
        r"images/variations|chat/completions/[^/]+|organization|chatkit|skills|edits|"
        r"engines|calls)(?:/.*)?$"),
    "anthropic": re.compile(
        r"^/(?:v1/)*(messages/batches|complete|files|skills|organizations)(?:/.*)?$"),
    "gemini": re.compile(
        r"^(?:/upload)?/(?:v1beta|v1alpha|v1)/(cachedContents|files|tunedModels|corpora|"
        r"batches|operations|fileSearchStores|generatedFiles|ragStores)(?:/.*)?$"),
}
_MJ = re.compile(r"/(submit/[\w-]+|task/[^/]+/(fetch|image-seed)|task/list-by-condition|"
                 r"image/[^/]+)$")


def hint_for(path: str, base: str = "", family: str = "openai") -> str:
    clean = re.sub(r"/{2,}", "/", path).rstrip("/")
    m = _MJ.search(clean)
    if m:
        return (f" Midjourney routes are {base}/mj/{m.group(1)} (or with a mode: "
                f"{base}/mj-relax/mj/{m.group(1)}); set your client's base URL to {base}.")
    if family == "gemini":
        return (f" Set your client's base URL to {base}: the SDK adds /v1beta (or /v1) and "
                "/models/{model}:generateContent.")
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


def unsupported(path: str, family: str) -> str | None:
    """The vendor endpoint a path names that this relay does not serve, or None."""
    m = _UNSERVED.get(family, _UNSERVED["openai"]).match(path)
    return m.group(1) if m else None


def unsupported_error(method: str, path: str, family: str, endpoint: str) -> RelayError:
    return RelayError(404, f"The endpoint {method} {path} ({endpoint}) is not supported by "
                           f"this relay. It serves {_SERVED.get(family, _SERVED['openai'])}.",
                      "invalid_request_error", "unsupported_endpoint")


def family_of(handler) -> str:
    path = handler.request.path
    if re.match(r"^(?:/upload)?/(?:v1beta|v1alpha)(?:/|$)", path):
        return "gemini"
    h = handler.request.headers
    if h.get("x-goog-api-key") or handler.get_query_argument("key", None):
        return "gemini"
    if h.get("anthropic-version"):
        return "anthropic"
    return "openai"


def _relay_looking(path: str) -> bool:
    clean = re.sub(r"/{2,}", "/", path).rstrip("/")
    return any(clean.endswith("/" + k) for k in _KNOWN) or bool(_MJ.search(clean))


class NotFoundHandler(RelayHandler):
    """Answers once the body has been read (and dropped): an answer sent
    before that makes Tornado close the connection after it, and a client
    that keeps connections alive (the SDKs do) may already have sent its
    next request on it.  The size limit still refuses a body up front."""

    api_shape = False
    path_family = None  # set by routes under one vendor's own prefix
    buffer_body = False
    key_first = False  # an unknown path is a 404 with or without a key; its body is not kept

    def answer(self, *args, **kwargs):
        path = self.request.path
        clean = re.sub(r"/{2,}", "/", path).rstrip("/")
        # "/api/v1/chat/completions" is a relay client with a wrong base URL,
        # not a console call: it gets the relay's error shape and a hint.
        if path.startswith("/api/") and not _relay_looking(path):
            self.api_shape = True
            raise RelayError(404, f"Unknown API path {path}.")
        if _MJ.search(clean):
            self.family = "mj"
        else:
            self.family = self.path_family or family_of(self)
        endpoint = unsupported(clean, self.family)
        if endpoint is not None:
            raise unsupported_error(self.request.method, clean, self.family, endpoint)
        if self.path_family is not None:
            raise RelayError(404, f"Unknown path {path}: this relay serves "
                                  f"{_SERVED[self.family]}.", "not_found_error", "unknown_path")
        base = f"{self.request.protocol}://{self.request.host}"
        raise RelayError(404, f"Unknown path {path}.{hint_for(path, base, self.family)}",
                         "invalid_request_error", "unknown_path")

    get = post = put = patch = delete = head = options = answer

    def send_error_body(self, err: RelayError) -> None:
        if self.api_shape:
            self.clear()
            self.set_default_headers()
            self.set_status(404)
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps({"success": False, "message": err.message, "data": None}))
            return
        super().send_error_body(err)
