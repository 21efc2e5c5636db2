"""Gemini request pieces that map field by field: JSON schema <-> Gemini's
Schema subset, and the canonical reasoning effort <-> thinkingConfig."""
from __future__ import annotations

import re
import threading
from typing import Any

from cachetools import LRUCache

from relay.convert.common import canonical_effort, effort_from_budget
from relay.serving import jsonin

# Clients that ask for `enum-encoding=int` (the legacy library) also send
# enums as numbers: Schema.Type here.
_TYPE_NAMES = {1: "string", 2: "number", 3: "integer", 4: "boolean", 5: "array", 6: "object",
               7: "null"}
# The Schema fields Gemini accepts in function declarations; others
# ($schema, additionalProperties, ...) make it reject the whole request.
_SCHEMA_KEYS = {"type", "format", "title", "description", "nullable", "enum", "maxItems",
                "minItems", "properties", "required", "minProperties", "maxProperties",
                "minLength", "maxLength", "pattern", "example", "anyOf", "propertyOrdering",
                "default", "items", "minimum", "maximum"}
# Thinking budgets per canonical effort, valid for every 2.5 model (Pro
# takes 128-32768, Flash 0-24576, Flash-Lite 512-24576).
_BUDGETS = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
# Gemini 3 and later take a thinkingLevel instead; Pro knows only low and high.
_LEVELS = {"minimal": "low", "low": "low", "medium": "high", "high": "high"}
_LEVEL_MODELS = re.compile(r"^(?:models/)?gemini-(?:[3-9]|\d\d)")


# ---- schemas ---------------------------------------------------------------
def schema_to_openai(s: Any) -> Any:
    """Gemini Schema (upper-case types) -> JSON schema."""
    if isinstance(s, list):
        return [schema_to_openai(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k == "type" and isinstance(v, str):
            out[k] = v.lower()
        elif k == "type" and isinstance(v, int):
            out[k] = _TYPE_NAMES.get(v, "string")
        elif k in ("properties",) and isinstance(v, dict):
            out[k] = {name: schema_to_openai(sub) for name, sub in v.items()}
        elif k in ("items", "anyOf"):
            out[k] = schema_to_openai(v)
        else:
            out[k] = v
    return out


def schema_from_openai(s: Any) -> Any:
    """JSON schema -> the Schema subset Gemini accepts."""
    if isinstance(s, list):
        return [schema_from_openai(x) for x in s]
    if not isinstance(s, dict):
        return s
    out: dict = {}
    for k, v in s.items():
        if k not in _SCHEMA_KEYS:
            continue
        if k == "type":
            types = v if isinstance(v, list) else [v]
            real = [t for t in types if t != "null"]
            if len(real) < len(types):
                out["nullable"] = True
            out[k] = str(real[0] if real else "string").upper()
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: schema_from_openai(sub) for name, sub in v.items()}
        elif k in ("items", "anyOf"):
            out[k] = schema_from_openai(v)
        else:
            out[k] = v
    return out


# An agent sends the same tools on every call (Claude Code 18, each schema
# a few KB): their converted form is kept by their JSON text, whose
# encoding and lookup cost a third of converting them again.  Bounded by
# the bytes of the texts kept; a schema past _CACHED_BELOW is converted
# each time.
_CACHED_BELOW = 16 * 1024
_converted: LRUCache = LRUCache(maxsize=1 << 20, getsizeof=lambda kept: kept[0])
# Conversions also run off the loop (a countTokens, a cut stream's estimate:
# tokenizer.off_loop), and an LRU is reordered by every read.
_converted_lock = threading.Lock()


def tool_schema(convert, schema: Any) -> Any:
    """convert(schema) (schema_from_openai or schema_to_openai) for a tool's
    parameters.  What it returns may be shared by other calls: the request
    holding it is only encoded, never changed."""
    text = jsonin.dumps(schema, held=False)
    if len(text) >= _CACHED_BELOW:
        return convert(schema)
    with _converted_lock:
        kept = _converted.get((convert, text))
    if kept is None:  # (the text's size, for the bound; the converted schema)
        kept = len(text), convert(schema)
        with _converted_lock:
            _converted[convert, memoryview(text).tobytes()] = kept
    return kept[1]


# ---- thinking ----------------------------------------------------------------
def thinking_config(effort: Any, model: str = "") -> dict | None:
    """A canonical reasoning effort -> generationConfig.thinkingConfig for
    `model` (the upstream name): a level for Gemini 3 and later, a budget
    before; thoughts included, as the client asked for reasoning.  None
    when there is no effort to map."""
    effort = canonical_effort(effort)
    if effort is None:
        return None
    if _LEVEL_MODELS.match(model or ""):
        return {"thinkingLevel": _LEVELS[effort], "includeThoughts": True}
    return {"thinkingBudget": _BUDGETS[effort], "includeThoughts": True}


def effort_from_thinking(cfg: Any) -> str | None:
    """A Gemini client's thinkingConfig -> the canonical effort, or None
    (no config, or -1: the model decides)."""
    if not isinstance(cfg, dict):
        return None
    level = cfg.get("thinkingLevel") or cfg.get("thinking_level")
    if level:
        return canonical_effort(str(level))
    budget = cfg.get("thinkingBudget", cfg.get("thinking_budget"))
    return effort_from_budget(budget)


def uses_thought_signatures(model: str) -> bool:
    """Gemini 3 and later refuse a replayed function call without the
    thoughtSignature it came with."""
    return bool(_LEVEL_MODELS.match(model or ""))
