"""Reading the non-streamed answers of OpenAI-format endpoints besides chat:
legacy completions, moderations and rerank.  Each returns (doc, usage) like
Adaptor.parse; a usage of None is estimated by the service (relay/service.py
_estimate_usage), so a call the upstream answered is billed on a known basis
even when the upstream reported nothing.
"""
from __future__ import annotations

from relay.adaptors.base import Call
from relay.money.pricing import Usage


def _int(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def completions(call: Call, doc: dict, usage: Usage | None) -> tuple[dict, Usage | None]:
    """Billed from the upstream's usage; without one, the service estimates
    it from the prompt and the text that came back (off the event loop when
    long)."""
    return doc, usage


def moderations(call: Call, doc: dict, usage: Usage | None) -> tuple[dict, Usage | None]:
    """OpenAI reports no usage for moderations (they are free there): the
    service then bills the input's tokens as we count them, one call."""
    if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
        return doc, usage
    return doc, None


def rerank(call: Call, doc: dict, usage: Usage | None) -> tuple[dict, Usage]:
    """A Jina- or Cohere-shaped answer -> the canonical rerank answer
    (relay/faces/rerank.py) and what to bill: the upstream's tokens (Jina's
    usage, Cohere's billed_units.input_tokens), Cohere's search units as
    units, else our count of the query and documents."""
    results = doc.get("results")
    if not isinstance(results, list):
        raise ValueError("a rerank answer needs a 'results' array")
    sent = call.body.get("documents") or []
    want_docs = call.body.get("return_documents") is True
    out = []
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("index"), int):
            raise ValueError("every rerank result needs an 'index'")
        r = dict(r)
        if "relevance_score" not in r and "score" in r:  # TEI-style servers
            r["relevance_score"] = r.pop("score")
        if not isinstance(r.get("relevance_score"), (int, float)):
            raise ValueError("every rerank result needs a 'relevance_score'")
        if want_docs and "document" not in r and 0 <= r["index"] < len(sent):
            d = sent[r["index"]]
            r["document"] = {"text": d} if isinstance(d, str) else d
        out.append(r)
    reported = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    billed = ((doc.get("meta") or {}).get("billed_units") or {}) if isinstance(
        doc.get("meta"), dict) else {}
    tokens = (_int(reported.get("prompt_tokens")) or _int(reported.get("total_tokens"))
              or _int(reported.get("input_tokens")) or _int(billed.get("input_tokens")))
    units = _int(billed.get("search_units"))
    estimated = not tokens and not units
    if not tokens:
        tokens = int(call.extra.get("prompt_tokens") or 0)
    answer = dict(doc, results=out)
    answer["usage"] = dict(reported) if reported else {"prompt_tokens": tokens,
                                                       "total_tokens": tokens}
    return answer, Usage(prompt_tokens=tokens, units=units, estimated=estimated)


PARSERS = {"completions": completions, "moderations": moderations, "rerank": rerank}
