"""Azure OpenAI upstreams (type "azure").

Same wire format as OpenAI, addressed by deployment:
{base}/openai/deployments/{deployment}/chat/completions?api-version=...
with the key in the `api-key` header.  The deployment is the channel's
upstream model name (after model_mapping).  Channel option `api_version`
(default below); `api_version: "v1"` selects Azure's newer
/openai/v1/... routes, which take the model in the body instead.
"""
from __future__ import annotations

from urllib.parse import quote

from relay.adaptors.base import Call
from relay.adaptors.openai import _PATHS, OpenAIAdaptor

DEFAULT_API_VERSION = "2024-10-21"


class AzureAdaptor(OpenAIAdaptor):
    type = "azure"
    native = "openai"
    # What Azure OpenAI deploys besides chat (it has no moderations or rerank).
    endpoints = frozenset({"chat", "embeddings", "completions", "image_edits", "translations"})

    def url(self, channel, call: Call) -> str:
        base = channel.base_url.rstrip("/")
        if base.endswith("/openai"):
            base = base[: -len("/openai")]
        version = str((channel.options or {}).get("api_version") or DEFAULT_API_VERSION)
        path = _PATHS[call.endpoint]
        if version == "v1":
            return f"{base}/openai/v1{path}"
        return (f"{base}/openai/deployments/{quote(call.upstream_model, safe='')}{path}"
                f"?api-version={quote(version, safe='')}")

    def headers(self, channel) -> dict:
        return {"api-key": channel.key}
