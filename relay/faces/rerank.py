"""The rerank face: the Cohere/Jina wire format that new-api serves at
POST /v1/rerank.

    request   {model, query, documents: [str | object], top_n?, return_documents?}
    answer    {results: [{index, relevance_score, document?}], usage: {prompt_tokens,
              total_tokens}, ...the upstream's other fields}

Upstreams differ in what they report (Jina: usage tokens; Cohere: meta.billed_units),
so answers are never passed through as bytes: the adaptor reads them into the
canonical answer above (relay/adaptors/openai_answers.py), which always has
`usage`, and render() writes it.  Errors use the OpenAI body, as new-api does.
Reserved: the tokens of the query and the documents as we count them.
"""
from __future__ import annotations

import json

from relay.money import tokenizer
from relay.adaptors.base import Call
from relay.errors import bad_request
from relay.faces.openai import load_json, render, require_model  # noqa: F401

FAMILY = "rerank"


def document_text(doc) -> str:
    if isinstance(doc, str):
        return doc
    if isinstance(doc.get("text"), str):
        return doc["text"]
    return json.dumps(doc, ensure_ascii=False)


def parse_rerank(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    model = require_model(doc)
    query = doc.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad_request("'query' must be a non-empty string.", "missing_query", "query")
    docs = doc.get("documents")
    if not isinstance(docs, list) or not docs:
        raise bad_request("'documents' must be a non-empty array of strings or objects.",
                          "missing_documents", "documents")
    for i, d in enumerate(docs):
        if not isinstance(d, (str, dict)):
            raise bad_request(f"'documents[{i}]' must be a string or an object.",
                              "invalid_value", "documents")
    top_n = doc.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request("'top_n' must be a whole number of 1 or more.", "invalid_value",
                          "top_n")
    if not isinstance(doc.get("return_documents", False), bool):
        raise bad_request("'return_documents' must be true or false.", "invalid_value",
                          "return_documents")
    tokens = tokenizer.count_text(query, model) + sum(
        tokenizer.count_text(document_text(d), model) for d in docs)
    return Call(request_id=request_id, endpoint="rerank", face=FAMILY, model=model, body=doc,
                raw=raw, native_body=doc, extra={"prompt_tokens": tokens})
