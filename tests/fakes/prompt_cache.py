"""Prompt caching as the vendors account for it, per upstream account (API
key), for the fakes that turn it on (`fake.caching = True`).

Anthropic (explicit breakpoints): a request's prompt is its tools, then its
system blocks, then its messages' content blocks, in that order; a block
with `cache_control` is a breakpoint.  The longest prefix this account has
cached is read (cache_read_input_tokens); the part from there to the last
breakpoint is written (cache_creation_input_tokens); the rest is plain input.
Markers are not part of what is cached (Claude Code moves its last one
forward every turn, and the earlier prefix still hits).

OpenAI (automatic): the longest prefix of messages this account has seen
before is read (prompt_tokens_details.cached_tokens) once it is 1,024 tokens
or more; every request's prefixes are kept.

Tokens are counted as the JSON's length / 4: the fakes need only that a
read is a read, and that a prompt sent to another account is a write.
"""
from __future__ import annotations

import hashlib
import json


def _segments(body: dict) -> list[tuple[dict, bool]]:
    """(block without its cache_control, whether it is a breakpoint), in cache order."""
    out = []

    def add(block, role=None):
        if not isinstance(block, dict):
            block = {"type": "text", "text": str(block)}
        marked = "cache_control" in block
        clean = {k: v for k, v in block.items() if k != "cache_control"}
        if role is not None:
            clean = {"role": role, **clean}
        out.append((clean, marked))

    for tool in body.get("tools") or ():
        add(tool)
    system = body.get("system")
    for block in (system if isinstance(system, list) else [system] if system else []):
        add(block)
    for m in body.get("messages") or ():
        content = m.get("content")
        for block in content if isinstance(content, list) else [content]:
            add(block, m.get("role"))
    return out


def tokens(doc) -> int:
    return max(1, len(json.dumps(doc, sort_keys=True)) // 4)


class PromptCache:
    def __init__(self):
        self.prefixes: dict[str, set[str]] = {}  # account -> prefix digests

    def anthropic(self, account: str, body: dict) -> dict:
        """The usage counts of a Messages request for this account."""
        seen = self.prefixes.setdefault(account, set())
        h = hashlib.sha256()
        sizes, digests, marks = [], [], []
        total = 0
        for block, marked in _segments(body):
            h.update(json.dumps(block, sort_keys=True).encode())
            total += tokens(block)
            sizes.append(total)
            digests.append(h.copy().hexdigest())
            marks.append(marked)
        last = max((i for i, m in enumerate(marks) if m), default=-1)
        read = max((sizes[i] for i in range(last + 1) if digests[i] in seen), default=0)
        written = max(sizes[last] - read, 0) if last >= 0 else 0
        for i in range(last + 1):
            seen.add(digests[i])
        return {"input_tokens": total - read - written, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written}

    def openai(self, account: str, messages: list) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of a chat request for this account."""
        seen = self.prefixes.setdefault(account, set())
        h = hashlib.sha256()
        total, cached = 0, 0
        for m in messages:
            h.update(json.dumps(m, sort_keys=True).encode())
            total += tokens(m)
            d = h.hexdigest()
            if d in seen and total >= 1024:
                cached = total
            seen.add(d)
        return total, cached
