"""Azure OpenAI upstreams (type "azure").

Same wire format as OpenAI, addressed by deployment:
{base}/openai/deployments/{deployment}/chat/completions?api-version=...
with the key in the `api-key` header.  The deployment is the channel's
upstream model name (after model_mapping).  Channel option `api_version`
(default below); `api_version: "v1"` selects Azure's newer
/openai/v1/... routes, which take the model in the body instead.

The Responses API has no deployment route: it is {base}/openai/responses
?api-version=... (option `responses_api_version`, default below) or, with
`api_version: "v1"`, {base}/openai/v1/responses; the deployment goes in
the body's model.  Channel option `wire_api` as for openai channels.
"""
from __future__ import annotations

from urllib.parse import quote

from relay.adaptors.base import Call
from relay.adaptors.openai import _PATHS, OpenAIAdaptor

DEFAULT_API_VERSION = "2024-10-21"
DEFAULT_RESPONSES_VERSION = "2025-04-01-preview"


class AzureAdaptor(OpenAIAdaptor):
    type = "azure"
    native = "openai"
    # What Azure OpenAI deploys besides chat (it has no moderations or rerank).
    endpoints = frozenset({"chat", "embeddings", "completions", "image_edits", "translations",
                           "responses", "responses_compact"})

    @staticmethod
    def _base(channel) -> str:
        base = channel.base_url.rstrip("/")
        return base[: -len("/openai")] if base.endswith("/openai") else base

    def responses_url(self, channel, path: str) -> str:
        opts = channel.options or {}
        if str(opts.get("api_version") or "") == "v1":
            return f"{self._base(channel)}/openai/v1{path}"
        version = str(opts.get("responses_api_version") or DEFAULT_RESPONSES_VERSION)
        return f"{self._base(channel)}/openai{path}?api-version={quote(version, safe='')}"

    def url(self, channel, call: Call, endpoint: str | None = None) -> str:
        base = self._base(channel)
        version = str((channel.options or {}).get("api_version") or DEFAULT_API_VERSION)
        path = _PATHS[endpoint or call.endpoint]
        if version == "v1":
            return f"{base}/openai/v1{path}"
        return (f"{base}/openai/deployments/{quote(call.upstream_model, safe='')}{path}"
                f"?api-version={quote(version, safe='')}")

    def headers(self, channel) -> dict:
        return {"api-key": channel.key}
