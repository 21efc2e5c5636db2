"""The OpenAI face for legacy text completions and moderations.

Both are OpenAI's own wire format, so they share the OpenAI face's
StreamWriter and render (relay/faces/openai.py): answers from an OpenAI
channel pass through as bytes, only a mapped model name is rewritten.

What is reserved and billed:
    completions  per token from the upstream's usage (streamed calls ask for
                 it); reserved: the prompt plus max_tokens (OpenAI's default
                 16) for every completion asked for (prompts x max(n, best_of))
    moderations  OpenAI reports no usage: the input's tokens as we count them,
                 one call; the model's price says what that costs (0 is free)
"""
from __future__ import annotations

from relay.adaptors.base import Call
from relay.errors import bad_request
from relay.faces.openai import StreamWriter, load_json, render, require_model  # noqa: F401

FAMILY = "openai"

# OpenAI's defaults and limits for the legacy endpoint.
DEFAULT_MAX_TOKENS = 16
MAX_N = 128
MAX_BEST_OF = 20
MODERATION_DEFAULT_MODEL = "omni-moderation-latest"


def _whole(doc: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        top = f" to {high}" if high is not None else " or more"
        raise bad_request(f"'{name}' must be a whole number from {low}{top}.", "invalid_value",
                          name)
    return value


def prompts_of(prompt) -> list:
    """The prompts of a completion call: a string, strings, token ids, or
    lists of token ids.  A 400 for anything else."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [prompt]
        if all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in p) for p in prompt):
            return list(prompt)
    if prompt is None:
        raise bad_request("You must provide a 'prompt': a string, an array of strings, or "
                          "token ids.", "missing_prompt", "prompt")
    raise bad_request("'prompt' must be a string, an array of strings, an array of token ids, "
                      "or an array of arrays of token ids.", "invalid_value", "prompt")


def parse_completions(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    model = require_model(doc)
    prompts = prompts_of(doc.get("prompt"))
    max_tokens = _whole(doc, "max_tokens", 0)
    n = _whole(doc, "n", 1, MAX_N) or 1
    best_of = _whole(doc, "best_of", 1, MAX_BEST_OF)
    if best_of is not None and best_of < n:
        raise bad_request("'best_of' must be at least 'n'.", "invalid_value", "best_of")
    if not isinstance(doc.get("suffix", ""), (str, type(None))):
        raise bad_request("'suffix' must be a string.", "invalid_value", "suffix")
    stream = bool(doc.get("stream"))
    opts = doc.get("stream_options")
    wants_usage = stream and isinstance(opts, dict) and bool(opts.get("include_usage"))
    # best_of candidates are generated (and billed) server-side; n are returned.
    out = ((DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens) * max(n, best_of or 1)
           * len(prompts))
    # The prompt is counted only if the upstream reports no usage (the
    # service does it, off the event loop when long).
    return Call(request_id=request_id, endpoint="completions", face=FAMILY, model=model,
                body=doc, raw=raw, native_body=doc, stream=stream,
                client_wants_usage=wants_usage, extra={"reserve_output": out})


def moderation_text(inp) -> str:
    """The text of a moderation input (a 400 for a malformed one); images
    add no tokens."""
    if isinstance(inp, str):
        return inp
    if isinstance(inp, list) and inp:
        if all(isinstance(i, str) for i in inp):
            return "\n".join(inp)
        parts = []
        for i, item in enumerate(inp):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text" and isinstance(item.get("text"), str):
                parts.append(item["text"])
            elif kind == "image_url" and isinstance(item.get("image_url"), dict) and \
                    isinstance(item["image_url"].get("url"), str):
                continue
            else:
                raise bad_request(f"'input[{i}]' must be a string, a {{\"type\": \"text\", "
                                  "\"text\": ...}} or an {\"type\": \"image_url\", "
                                  "\"image_url\": {\"url\": ...}} object.", "invalid_value",
                                  "input")
        return "\n".join(parts)
    if inp is None:
        raise bad_request("You must provide an 'input' to classify.", "missing_input", "input")
    raise bad_request("'input' must be a string, an array of strings, or an array of text and "
                      "image_url objects.", "invalid_value", "input")


def parse_moderations(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    if doc.get("model") is None:
        doc["model"] = MODERATION_DEFAULT_MODEL  # OpenAI's default
    model = require_model(doc)
    text = moderation_text(doc.get("input"))
    return Call(request_id=request_id, endpoint="moderations", face=FAMILY, model=model,
                body=doc, raw=raw, native_body=doc,
                extra={"prompt_text": text, "counted_basis": True})
