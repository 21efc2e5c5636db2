"""Offline token estimates, for reserving cost and for billing calls whose
upstream reported no usage (client gone, stream cut off).

bpe-openai ships the OpenAI BPE tables inside its wheel, so nothing is
downloaded at run time.  Models it does not know are counted with o200k_base.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

# OpenAI's chat format adds a few tokens per message and for the reply primer.
_PER_MESSAGE = 3
_REPLY_PRIMER = 3


@lru_cache(maxsize=64)
def _encoding(model: str):
    # Imported on first use: bpe_openai builds its tables at import (63 MB
    # and 1.6 s here), and a relay whose upstreams report usage on chat
    # calls may never need them.
    import bpe_openai
    try:
        return bpe_openai.encoding_for_model(model)
    except Exception:
        return bpe_openai.get_encoding("o200k_base")


def count_text(text: str, model: str = "") -> int:
    if not text:
        return 0
    # encode_ordinary: user text that happens to contain a special token
    # such as <|endoftext|> is text to us (encode() would raise), and it is
    # twice as fast.
    return len(_encoding(model).encode_ordinary(text))


def _content_text(content: Any) -> tuple[str, int]:
    """Text of a message's content and a flat token charge for images."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    texts, extra = [], 0
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in ("text", "input_text"):
                texts.append(str(part.get("text", "")))
            elif kind in ("image_url", "image", "input_image"):
                extra += 765  # OpenAI's cost of a high-detail 512px tile set
            else:
                texts.append(json.dumps(part, ensure_ascii=False))
    return "\n".join(texts), extra


def count_messages(messages: list, model: str = "", tools: Any = None) -> int:
    total = _REPLY_PRIMER
    for msg in messages or ():
        if not isinstance(msg, dict):
            continue
        total += _PER_MESSAGE
        text, extra = _content_text(msg.get("content"))
        total += count_text(text, model) + extra
        if msg.get("tool_calls"):
            total += count_text(json.dumps(msg["tool_calls"], ensure_ascii=False), model)
        if msg.get("name"):
            total += 1
    if tools:
        total += count_text(json.dumps(tools, ensure_ascii=False), model)
    return total


def approx_messages(messages: list, tools: Any = None) -> int:
    """A cheap, generous prompt estimate for reserving cost: a byte count
    instead of a BPE pass on every call.  English runs about four bytes a
    token and CJK about three, so a third of the bytes rarely falls short;
    the real count settles the bill either way."""
    total = _REPLY_PRIMER
    for msg in messages or ():
        if not isinstance(msg, dict):
            continue
        total += _PER_MESSAGE
        content = msg.get("content")
        if isinstance(content, str):
            total += len(content.encode()) // 3 + 1
        elif content is not None:
            text, extra = _content_text(content)
            total += len(text.encode()) // 3 + 1 + extra
        if msg.get("tool_calls"):
            total += len(json.dumps(msg["tool_calls"])) // 3
    if tools:
        total += len(json.dumps(tools)) // 3
    return total
