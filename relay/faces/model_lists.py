"""The model list (GET /v1/models, /v1beta/models) in each family's shape,
paged the way each vendor pages it:

    openai     {"object": "list", "data": [{id, object, created, owned_by}]}, no paging
    anthropic  {"data": [{type, id, display_name, created_at}], has_more, first_id,
               last_id}; ?limit= (1-1000, default 20), ?after_id=, ?before_id=
    gemini     {"models": [{name: "models/..", displayName, supportedGenerationMethods,
               ...}], nextPageToken}; ?pageSize= (default 50, at most 1000), ?pageToken=

The relay knows no release dates: OpenAI's `created` is one fixed time (as
one-api and new-api report it) and Anthropic's `created_at` is the epoch,
which Anthropic documents for "release date unknown".  Bad paging input is a
400 from the caller's family (RelayError; the handler renders it).
"""
from __future__ import annotations

import base64
import binascii

from relay.errors import RelayError, bad_request, model_not_found

OPENAI_CREATED = 1626777600
ANTHROPIC_CREATED_AT = "1970-01-01T00:00:00Z"


def not_found(model: str) -> RelayError:
    return model_not_found(model)


# ---- OpenAI -------------------------------------------------------------------
def openai_model(model: str) -> dict:
    return {"id": model, "object": "model", "created": OPENAI_CREATED, "owned_by": "relay"}


def openai_list(models: list[str]) -> dict:
    return {"object": "list", "data": [openai_model(m) for m in models]}


# ---- Anthropic ----------------------------------------------------------------
def anthropic_model(model: str) -> dict:
    return {"type": "model", "id": model, "display_name": model,
            "created_at": ANTHROPIC_CREATED_AT, "lifecycle": "active"}


def _position(models: list[str], name: str, model: str) -> int:
    try:
        return models.index(model)
    except ValueError:
        raise bad_request(f"'{name}' names no model this key can list: {model!r}.",
                          "invalid_value", name) from None


def anthropic_page(models: list[str], limit: str | None = None, after_id: str | None = None,
                   before_id: str | None = None) -> dict:
    """One page of Anthropic's cursor paging: after_id pages forward,
    before_id backward (the `limit` models just before it)."""
    try:
        size = 20 if limit in (None, "") else int(limit)
    except ValueError:
        size = 0
    if not 1 <= size <= 1000:
        raise bad_request("'limit' must be a whole number from 1 to 1000.", "invalid_value",
                          "limit")
    if after_id and before_id:
        raise bad_request("Give 'after_id' or 'before_id', not both.", "invalid_value",
                          "before_id")
    if before_id:
        end = _position(models, "before_id", before_id)
        start = max(end - size, 0)
        page, more = models[start:end], start > 0
    else:
        start = _position(models, "after_id", after_id) + 1 if after_id else 0
        page, more = models[start:start + size], start + size < len(models)
    return {"data": [anthropic_model(m) for m in page], "has_more": more,
            "first_id": page[0] if page else None, "last_id": page[-1] if page else None}


# ---- Gemini -------------------------------------------------------------------
def gemini_model(model: str) -> dict:
    embedding = "embed" in model
    return {"name": f"models/{model}", "baseModelId": model, "version": "001",
            "displayName": model, "description": "",
            "inputTokenLimit": 1048576, "outputTokenLimit": 8192 if not embedding else 1,
            "supportedGenerationMethods": (["embedContent", "batchEmbedContents"] if embedding
                                           else ["generateContent", "streamGenerateContent",
                                                 "countTokens"])}


def _token(model: str) -> str:
    return base64.urlsafe_b64encode(b"after:" + model.encode()).decode().rstrip("=")


def _after(models: list[str], token: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    if not raw.startswith("after:") or raw[6:] not in models:
        raise bad_request("The page token is not valid; start again without 'pageToken'.",
                          "invalid_value", "pageToken")
    return models.index(raw[6:]) + 1


def gemini_page(models: list[str], page_size: str | None = None,
                page_token: str | None = None) -> dict:
    try:
        size = 50 if page_size in (None, "", "0") else int(page_size)
    except ValueError:
        size = -1
    if size < 1:
        raise bad_request("'pageSize' must be a positive whole number.", "invalid_value",
                          "pageSize")
    size = min(size, 1000)  # Gemini coerces larger sizes to its maximum
    start = _after(models, page_token) if page_token else 0
    page = models[start:start + size]
    out = {"models": [gemini_model(m) for m in page]}
    if start + size < len(models):
        out["nextPageToken"] = _token(page[-1])
    return out
