"""Naming where in a request body something went wrong, for a refusal's
message and `param`: the field where nesting first gets too deep (found with
a bounded token scan when the parser could not build the document), and
keys made printable.  relay/serving/jsonin.py refuses; this names."""
from __future__ import annotations

import re

from relay.serving.values import BadInput

_SURROGATE = re.compile("[\ud800-\udfff]")
# One token of JSON text, for naming the field where nesting gets too deep.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]')
_SCAN_TOKENS, _SCAN_CHARS = 200_000, 2_000_000


def deep(path: str, max_depth: int):
    """Deep nesting is named by its top-level field: the full path is a
    thousand "[0]"s long."""
    top = re.match(r"[^.\[]*", path).group()
    where = f" in '{top}'" if top else ""
    return top, f"{{what}} nests deeper than {max_depth} levels{where}."


def name(key: str) -> str:
    """A key as it may appear in a message: short, and with any surrogate
    written as its escape (the message itself must be valid text)."""
    key = key if len(key) <= 64 else key[:61] + "..."
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", key)


def too_deep(text: str, what: str, max_depth: int) -> BadInput:
    field, problem = deep(_path_at_depth(text, max_depth), max_depth)
    return BadInput(problem.replace("{what}", what), field or None)


def _path_at_depth(text: str, max_depth: int) -> str:
    """The path at which text first nests deeper than max_depth, found with a
    bounded token scan (the parser could not build the document)."""
    stack: list[list] = []  # [is_object, key or index]
    pending_key = None
    for n, m in enumerate(_TOKEN.finditer(text, 0, _SCAN_CHARS)):
        if n > _SCAN_TOKENS:
            return ""
        tok = m.group()
        if tok in "[{":
            if len(stack) >= max_depth:
                return _format_path(stack)
            stack.append([tok == "{", None if tok == "{" else 0])
        elif tok in "]}":
            if stack:
                stack.pop()
        elif tok == ",":
            if stack and not stack[-1][0]:
                stack[-1][1] += 1
        elif tok == ":":
            if stack and stack[-1][0]:
                stack[-1][1] = pending_key
        else:
            pending_key = name(tok[1:-1])
    return ""


def _format_path(stack: list) -> str:
    out = ""
    for is_obj, key in stack:
        if is_obj:
            if key is not None:
                out += f".{key}" if out else str(key)
        else:
            out += f"[{key}]"
    return out
