"""OpenAI usage objects (chat, Responses, images, transcriptions, Realtime)
-> our normalised Usage.  One reader, shared by the OpenAI adaptor and the
Responses converters, so that every billed component is read the same way
whichever face or wire the call took."""
from __future__ import annotations

import math

from relay.money.pricing import Usage


def _n(v) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0


def usage_from(doc: dict | None) -> Usage | None:
    """OpenAI usage -> ours, every detail the vendor bills by.

    Chat: prompt_tokens_details {cached_tokens, audio_tokens},
    completion_tokens_details {reasoning_tokens, audio_tokens}.  The
    Responses API, images and transcriptions: input_tokens / output_tokens
    with input_tokens_details {cached_tokens, audio_tokens, image_tokens,
    cached_tokens_details {audio_tokens, image_tokens}} and
    output_tokens_details {reasoning_tokens, audio_tokens, image_tokens}
    (the Realtime API's input_token_details is the same).  An image call
    that reports no output detail made only image tokens (gpt-image-1),
    whose output price is the image price already."""
    if not isinstance(doc, dict):
        return None
    if doc.get("type") == "duration":  # transcriptions billed by time
        return Usage(units=math.ceil(float(doc.get("seconds") or 0)))
    if "input_tokens" in doc and "prompt_tokens" not in doc:
        u = Usage(_n(doc.get("input_tokens")), _n(doc.get("output_tokens")))
        pin = doc.get("input_tokens_details") or doc.get("input_token_details")
        pout = doc.get("output_tokens_details") or doc.get("output_token_details")
    else:
        u = Usage(_n(doc.get("prompt_tokens")), _n(doc.get("completion_tokens")))
        pin, pout = doc.get("prompt_tokens_details"), doc.get("completion_tokens_details")
        # DeepSeek names its cache reads prompt_cache_hit_tokens
        u.cached_tokens = _n(doc.get("prompt_cache_hit_tokens"))
    if isinstance(pin, dict):
        u.cached_tokens = _n(pin.get("cached_tokens")) or u.cached_tokens
        u.audio_input_tokens = _n(pin.get("audio_tokens"))
        u.image_input_tokens = _n(pin.get("image_tokens"))
        cached = pin.get("cached_tokens_details")
        if isinstance(cached, dict):
            u.cached_audio_tokens = _n(cached.get("audio_tokens"))
            u.cached_image_tokens = _n(cached.get("image_tokens"))
    if isinstance(pout, dict):
        u.reasoning_tokens = _n(pout.get("reasoning_tokens"))
        u.audio_output_tokens = _n(pout.get("audio_tokens"))
        u.image_output_tokens = _n(pout.get("image_tokens"))
    return u
