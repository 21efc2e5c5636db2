"""Offline token estimates, for reserving cost and for billing calls whose
upstream reported no usage (client gone, stream cut off).

bpe-openai ships the OpenAI BPE tables inside its wheel, so nothing is
downloaded at run time.  Models it does not know are counted with o200k_base.

Nothing here raises on what a client sends: bpe-openai refuses a text of
1,000,000 characters or one that makes 200,000 tokens at once, so a long
text is counted in slices (SLICE characters each), and anything the
tokenizer still refuses is counted by its bytes (approx_text).  Counting
costs about 65 us per 1,000 characters: callers that may meet a long text
on the event loop hand it to a thread (is_long()).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from relay.serving import jsonin

# OpenAI's chat format adds a few tokens per message and for the reply primer.
_PER_MESSAGE = 3
_REPLY_PRIMER = 3
# Characters counted in one BPE pass: a character is at most 4 tokens, so a
# slice never reaches bpe-openai's limit of 200,000 tokens a pass.
SLICE = 50_000
# Past this many characters a count takes over a millisecond.
LONG = 16_000


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
    """The text's tokens; never raises (see the module doc)."""
    if not text:
        return 0
    try:
        # encode_ordinary: user text that happens to contain a special token
        # such as <|endoftext|> is text to us (encode() would raise), and it
        # is twice as fast.
        encode = _encoding(model).encode_ordinary
        if len(text) <= SLICE:
            return len(encode(text))
        # A cut inside a word costs a token or two a slice: a count that
        # errs, if at all, on the side of the vendor's.
        return sum(len(encode(text[i:i + SLICE])) for i in range(0, len(text), SLICE))
    except Exception:  # a tokenizer that refuses or breaks must not cost the bill
        return approx_text(text)


def approx_text(text: str) -> int:
    """A byte-based count: never fewer tokens than a byte-level BPE makes of
    the text (each of its tokens is at least one byte); about four times the
    real count for English."""
    return len(text.encode("utf-8", "surrogatepass"))


def is_long(*texts) -> bool:
    """Whether counting these would hold the event loop past a millisecond."""
    return sum(len(t) for t in texts if isinstance(t, (str, bytes))) > LONG


# Long counts run here, one at a time: a burst of them queues instead of
# taking every core from the event loop.
_pool = ThreadPoolExecutor(1, thread_name_prefix="tokens")


async def off_loop(long: bool, fn, *args):
    """fn(*args), on the counting thread when `long` (see is_long), else
    here and now (a thread hop costs more than a short count)."""
    if not long:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)


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
                texts.append(_json(part))
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
            total += count_text(_json(msg["tool_calls"]), model)
        if msg.get("name"):
            total += 1
    if tools:
        total += count_text(_json(tools), model)
    return total


def _json(value: Any) -> str:
    return jsonin.dumps(value, held=False).decode("utf-8", "replace")
