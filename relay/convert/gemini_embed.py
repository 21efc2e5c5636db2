"""Gemini embedContent / batchEmbedContents <-> OpenAI embeddings.

Gemini reports no usage for embeddings; the relay then bills the tokens it
counted itself (marked estimated in the usage log).
"""
from __future__ import annotations

import base64
import struct

from relay.errors import bad_request


def _content_text(content) -> str:
    if not isinstance(content, dict):
        raise bad_request("* EmbedContentRequest.content: must be an object with parts.",
                          "invalid_content", "content")
    return "".join(p.get("text", "") for p in content.get("parts") or () if isinstance(p, dict))


def requests_of(doc: dict, method: str) -> list[dict]:
    """The list of single embed requests in a client's body."""
    if method == "embedContent":
        return [doc]
    reqs = doc.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise bad_request("* BatchEmbedContentsRequest.requests: must be a non-empty array.",
                          "missing_requests", "requests")
    return reqs


def request_to_openai(doc: dict, method: str, model: str) -> dict:
    reqs = requests_of(doc, method)
    body: dict = {"model": model, "input": [_content_text(r.get("content")) for r in reqs]}
    dims = reqs[0].get("outputDimensionality")
    if dims:
        body["dimensions"] = int(dims)
    return body


def request_from_openai(body: dict, upstream_model: str) -> dict:
    """An OpenAI embeddings request -> batchEmbedContents."""
    inp = body.get("input")
    items = inp if isinstance(inp, list) else [inp]
    if any(not isinstance(i, str) for i in items):
        raise bad_request("This model takes text input only, not token arrays.",
                          "unsupported_input", "input")
    reqs = []
    for text in items:
        r: dict = {"model": f"models/{upstream_model}", "content": {"parts": [{"text": text}]}}
        if body.get("dimensions"):
            r["outputDimensionality"] = int(body["dimensions"])
        reqs.append(r)
    return {"requests": reqs}


def _encode(values: list, fmt: str | None):
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def response_to_openai(doc: dict, model: str, fmt: str | None, prompt_tokens: int) -> dict:
    """embedContent or batchEmbedContents answer -> OpenAI embeddings list."""
    embs = doc.get("embeddings")
    if embs is None:
        embs = [doc.get("embedding") or {}]
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i,
                      "embedding": _encode(list(e.get("values") or ()), fmt)}
                     for i, e in enumerate(embs)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def _decode(emb) -> list:
    if isinstance(emb, str):
        raw = base64.b64decode(emb)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return list(emb or ())


def response_from_openai(doc: dict, method: str) -> dict:
    """OpenAI embeddings list -> the answer shape of the client's method."""
    data = sorted(doc.get("data") or (), key=lambda d: d.get("index", 0))
    vecs = [{"values": _decode(d.get("embedding"))} for d in data]
    if method == "embedContent":
        return {"embedding": vecs[0] if vecs else {"values": []}}
    return {"embeddings": vecs}
