"""Reading a channel's refusal for the one thing it does not support, and
taking exactly that out of a request.  Pure functions, no I/O.

Vendors name what they refuse, each in its own words (as their APIs and
the gateways in front of them answer today):

  Anthropic, Vertex  "Unexpected value(s) `context-management-2025-06-27` for the
                     `anthropic-beta` header. Please consult our documentation ..."
  Anthropic, Bedrock "context_management: Extra inputs are not permitted",
                     "tools.0.custom.input_examples: Extra inputs are not permitted"
                     (Bedrock prefixes "The model returned the following errors: ")
  OpenAI Responses   "Unknown parameter: 'client_metadata'."
  OpenAI chat, Azure "Unrecognized request argument supplied: client_metadata"
  OpenAI models      "Unsupported parameter: 'temperature' is not supported with this
                     model." / "Unsupported value: 'temperature' does not support 0.2 ..."
  FastAPI servers    [{'type': 'extra_forbidden', 'loc': ('body', 'client_metadata'), ...}]
  Gemini             "Invalid JSON payload received. Unknown name \"foo\" at
                     'generation_config': Cannot find field."

`refusals()` turns such an answer into Fixes, keeping only what the request
really carried and may lose: never the model, the output limit, the tools
themselves, the conversation, the stream switch or what decides the price
or safety of a call (PROTECTED).  A refusal that names nothing (Bedrock's
"invalid beta flag") gives no Fix: guessing would strip the wrong thing.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from relay.adaptors.base import UpstreamRequest

BETA_HEADER = "anthropic-beta"
REASON_LIMIT = 300
# A field whose leaf is one of these is never stripped (names compared
# without case or underscores, so Gemini's camelCase is the same field).
PROTECTED = frozenset(n.replace("_", "") for n in (
    "model", "max_tokens", "max_completion_tokens", "max_output_tokens", "tools", "messages",
    "input", "contents", "system", "instructions", "system_instruction", "stream",
    "stream_options", "prompt", "n", "best_of", "safety_identifier", "user", "safety_settings",
    "moderation", "service_tier", "cache_control", "type", "name", "role", "content", "text",
    "input_schema", "parameters", "function", "function_declarations", "tool_choice"))

_BETAS = re.compile(r"Unexpected value\(s\)\s+(.{1,2000}?)\s+for the\s+`?anthropic-beta`?\s+header",
                    re.I | re.S)
_BETA_NAMED = re.compile(r"(?:unsupported|invalid|unknown|unexpected)\s+(?:anthropic[- ])?beta"
                         r"(?:\s+(?:flag|header|value))?s?[:\s]+[`'\"]?([a-z][a-z0-9.-]*-\d{4}-\d{2}-\d{2})",
                         re.I)
_FIELD_PATTERNS = [
    re.compile(r"([A-Za-z_][\w.\[\]-]{0,200}): Extra inputs are not permitted"),
    re.compile(r"Unknown parameter: '([^']{1,200})'"),
    re.compile(r"Unsupported parameter: '([^']{1,200})'"),
    re.compile(r"Unsupported parameter: ([A-Za-z_][\w.]{0,200})"),
    re.compile(r"Unsupported value: '([^']{1,200})' does not support"),
    re.compile(r"Unrecognized request arguments? supplied: ([\w.]+(?:\s*,\s*[\w.]+)*)"),
]
_LOC = re.compile(r"extra_forbidden['\"]\s*,\s*['\"]loc['\"]\s*:\s*[\(\[]([^\)\]]{1,300})[\)\]]")
# Thinking made by another upstream (a conversation that moved from another
# channel): its signatures are refused, or a tool loop lacks the thinking
# block that must open it.  Not the channel's lack: taken out of this call only.
_THINKING = re.compile(r"Invalid `?signature`? in `?thinking`? block|Expected `thinking` or "
                       r"`redacted_thinking`|thinking block.{0,80}signature", re.I)
ONCE = ("thinking",)
_GEMINI = re.compile(r"Unknown name \\?\"([^\"\\]{1,100})\\?\"(?: at '([^']{1,200})')?: Cannot find field")


@dataclass(frozen=True)
class Fix:
    """One thing a channel refused: `kind` "beta" (an anthropic-beta value),
    "field" (a body field, `name` its path with "*" for list indexes),
    "wire" (`name` the API the channel speaks instead: relay/compat/wire.py)
    or "thinking" (this call's history carries thinking the channel cannot
    verify: the call goes without thinking; never remembered)."""
    kind: str
    name: str
    reason: str = ""

    @property
    def label(self) -> str:
        """How the console shows it: tools[].input_examples, a beta as it is."""
        return self.name.replace(".*", "[]") if self.kind == "field" else self.name


# ---- reading a refusal -------------------------------------------------------
def _texts(body: bytes) -> list[str]:
    text = body[:20000].decode("utf-8", "replace")
    # Gateways wrap the vendor's JSON error in a string: read it unescaped too.
    plain = text.replace('\\"', '"').replace("\\\\", "\\")
    return [text] if plain == text else [text, plain]


def _reason(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return msg[:REASON_LIMIT]
    return body[:REASON_LIMIT].decode("utf-8", "replace")


def path_of(raw: str) -> list[str]:
    """A field path as a vendor writes it -> its parts, indexes as "*":
    "tools.0.custom.input_examples", "tools[0].input_examples",
    "'body', 'tools', 0, 'input_examples'"."""
    raw = re.sub(r"\[(\d+)\]", r".\1", raw.strip())
    if "," in raw:
        parts = [p.strip().strip("'\"") for p in raw.split(",")]
    else:
        parts = [p for p in raw.split(".")]
    parts = [p for p in parts if p]
    if parts and parts[0] in ("body", "request"):
        parts = parts[1:]
    return ["*" if p.isdigit() else p for p in parts]


def _fields(texts: list[str]) -> list[list[str]]:
    found: list[list[str]] = []
    for text in texts:
        for pattern in _FIELD_PATTERNS:
            for m in pattern.finditer(text):
                for one in m.group(1).split(",") if "supplied" in m.group(0) else [m.group(1)]:
                    found.append(path_of(one))
        for m in _LOC.finditer(text):
            found.append(path_of(m.group(1)))
        for m in _GEMINI.finditer(text):
            found.append(path_of(f"{m.group(2)}.{m.group(1)}" if m.group(2) else m.group(1)))
    return found


def _betas(texts: list[str]) -> list[str]:
    names: list[str] = []
    for text in texts:
        for m in _BETAS.finditer(text):
            quoted = re.findall(r"`([^`]+)`", m.group(1))
            names += quoted or [n.strip(" '\"") for n in m.group(1).split(",")]
        names += _BETA_NAMED.findall(text)
    return [n.strip() for n in names if n.strip()]


def protected(parts: list[str]) -> bool:
    return not parts or _norm(parts[-1]) in PROTECTED or parts[-1] == "*"


def refusals(status: int, body: bytes, headers: dict, sent: bytes | None) -> list[Fix]:
    """What an upstream's refusal (status, body) names that this request
    (its headers and body bytes) carried and may lose; [] for none."""
    if status not in (400, 422) or not body:
        return []
    texts = _texts(body)
    reason = _reason(body)
    fixes: list[Fix] = []
    if sent and any(_THINKING.search(t) for t in texts) and b'"thinking"' in sent:
        return [Fix("thinking", "off", reason)]
    sent_betas = betas_of(headers)
    for name in _betas(texts):
        if name in sent_betas and all(f.name != name for f in fixes):
            fixes.append(Fix("beta", name, reason))
    if sent:
        try:
            doc = json.loads(sent)
        except ValueError:
            doc = None
        for parts in _fields(texts):
            name = ".".join(parts)
            if protected(parts) or any(f.name == name for f in fixes):
                continue
            if isinstance(doc, dict) and strip(json.loads(json.dumps(doc)), parts):
                fixes.append(Fix("field", name, reason))
    return fixes


# ---- taking it out -----------------------------------------------------------
def _norm(key: str) -> str:
    return key.replace("_", "").lower()


def _key(node: dict, part: str):
    if part in node:
        return part
    want = _norm(part)
    return next((k for k in node if isinstance(k, str) and _norm(k) == want), None)


def strip(doc, parts: list[str]) -> bool:
    """Delete the field at `parts` ("*" is every element of a list) from
    `doc` in place; True if anything was deleted.  A part the document lacks
    below the top level is stepped over: Anthropic names a tool's union tag
    ("tools.0.custom.input_examples") that the JSON does not hold."""
    if not parts:
        return False
    changed = False

    def walk(node, i: int) -> None:
        nonlocal changed
        part = parts[i]
        if isinstance(node, list):
            for item in node:
                walk(item, i + 1 if part == "*" else i)
            return
        if not isinstance(node, dict) or part == "*":
            if part == "*" and i + 1 < len(parts):
                walk(node, i + 1)
            return
        key = _key(node, part)
        if i == len(parts) - 1:
            if key is not None:
                del node[key]
                changed = True
            return
        if key is not None:
            walk(node[key], i + 1)
        elif i > 0:
            walk(node, i + 1)

    walk(doc, 0)
    return changed


def betas_of(headers: dict) -> list[str]:
    value = next((v for k, v in headers.items() if k.lower() == BETA_HEADER), "")
    return [b.strip() for b in str(value).split(",") if b.strip()]


def without_thinking(doc: dict) -> bool:
    """A Messages body with thinking off: no `thinking`, no thinking blocks in
    its history, no context edit that clears thinking.  True if changed."""
    changed = doc.pop("thinking", None) is not None
    for m in doc.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in (
                "thinking", "redacted_thinking"))]
            if len(kept) != len(content):
                m["content"] = kept or [{"type": "text", "text": ""}]
                changed = True
    cm = doc.get("context_management")
    if isinstance(cm, dict) and isinstance(cm.get("edits"), list):
        edits = [e for e in cm["edits"] if not str((e or {}).get("type", "")).startswith(
            "clear_thinking")]
        if len(edits) != len(cm["edits"]):
            changed = True
            if edits:
                cm["edits"] = edits
            else:
                doc.pop("context_management")
    return changed


def apply(req: UpstreamRequest, fixes: list[Fix]) -> UpstreamRequest:
    """The request with the refused betas and fields taken out (the same
    request when none of them is in it)."""
    betas = {f.name for f in fixes if f.kind == "beta"}
    fields = [path_of(f.name) for f in fixes if f.kind == "field"]
    thinking = any(f.kind == "thinking" for f in fixes)
    headers, body = req.headers, req.body
    sent = betas_of(headers)
    if betas & set(sent):
        kept = [b for b in sent if b not in betas]
        headers = {k: v for k, v in headers.items() if k.lower() != BETA_HEADER}
        if kept:
            headers[BETA_HEADER] = ",".join(kept)
    if (fields or thinking) and isinstance(body, (bytes, bytearray)) and body:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and any([strip(doc, parts) for parts in fields]
                                         + [thinking and without_thinking(doc)]):
            body = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    if headers is req.headers and body is req.body:
        return req
    return replace(req, headers=headers, body=body)
