"""Gemini's usageMetadata <-> ours and OpenAI's, and the grounding calls
an answer is billed for (re-exported by relay/convert/gemini.py)."""
from __future__ import annotations

import re

from relay.convert.common import openai_usage
from relay.money.pricing import Usage

# MediaModality, also as the numbers of enum-encoding=int.
_MODALITY = {1: "TEXT", 2: "IMAGE", 3: "VIDEO", 4: "AUDIO", 5: "DOCUMENT"}


def usage_from(meta: dict | None) -> Usage | None:
    """usageMetadata -> ours.  promptTokenCount already includes the cached
    tokens (cachedContentTokenCount); thinking tokens (thoughtsTokenCount)
    come on top of candidatesTokenCount and are billed as output, as Google
    bills them.  The per-modality details (promptTokensDetails,
    cacheTokensDetails, candidatesTokensDetails) give the audio and image
    parts, which some models price apart; video and documents are billed
    as text input."""
    if not isinstance(meta, dict) or not meta:
        return None

    def n(v) -> int:
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0

    def by_modality(key: str) -> dict:
        out: dict = {}
        for d in meta.get(key) or ():
            if isinstance(d, dict):
                m = d.get("modality")
                m = _MODALITY.get(m, "") if isinstance(m, int) else str(m or "").upper()
                out[m] = out.get(m, 0) + n(d.get("tokenCount"))
        return out

    prompt = n(meta.get("promptTokenCount")) + n(meta.get("toolUsePromptTokenCount"))
    thoughts = n(meta.get("thoughtsTokenCount"))
    inp = by_modality("promptTokensDetails")
    tool = by_modality("toolUsePromptTokensDetails")
    cached = by_modality("cacheTokensDetails")
    out = by_modality("candidatesTokensDetails")
    return Usage(prompt_tokens=prompt, completion_tokens=n(meta.get("candidatesTokenCount")) + thoughts,
                 cached_tokens=n(meta.get("cachedContentTokenCount")), reasoning_tokens=thoughts,
                 audio_input_tokens=inp.get("AUDIO", 0) + tool.get("AUDIO", 0),
                 image_input_tokens=inp.get("IMAGE", 0) + tool.get("IMAGE", 0),
                 cached_audio_tokens=cached.get("AUDIO", 0),
                 cached_image_tokens=cached.get("IMAGE", 0),
                 audio_output_tokens=out.get("AUDIO", 0), image_output_tokens=out.get("IMAGE", 0))


# Gemini 3 bills each search query it runs; earlier models each grounded prompt.
_PER_QUERY = re.compile(r"^(?:models/)?gemini-(?:[3-9]|\d\d)")


def grounding_calls(doc: dict, model: str, queries: set | None = None) -> int:
    """Grounding with Google Search billed for an answer (or, with `queries`
    kept across a stream's chunks, for the stream so far): its
    groundingMetadata's search queries for Gemini 3, else one a prompt."""
    queries = set() if queries is None else queries
    grounded = False
    for cand in doc.get("candidates") or ():
        gm = cand.get("groundingMetadata") if isinstance(cand, dict) else None
        if isinstance(gm, dict) and (gm.get("webSearchQueries") or gm.get("groundingChunks")
                                     or gm.get("searchEntryPoint")):
            grounded = True
            queries.update(q for q in gm.get("webSearchQueries") or () if isinstance(q, str))
    if not grounded and not queries:
        return 0
    return max(len(queries), 1) if _PER_QUERY.match(model or "") else 1


def usage_meta(u: dict | None) -> dict:
    """OpenAI usage -> usageMetadata."""
    u = u or {}
    p, c = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    meta = {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if cached:
        meta["cachedContentTokenCount"] = cached
    return meta


def usage_to_openai(meta: dict | None) -> dict:
    u = usage_from(meta) or Usage()
    return openai_usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
