"""Secrets kept out of what we write down and what we pass on.

- Query strings: Gemini clients send their key as `?key=`, and any client
  may put a credential in a parameter.  `redact_uri` masks such parameters
  for the access log; `strip_credentials` drops them from a query passed on
  to an upstream (which must never see a relay key).
- Upstream error texts reach our users: vendors' 429s name the
  organisation and project, and some aggregators echo fragments of the key
  they were sent (ours, the channel's).  `scrub` replaces key-like strings
  and account identifiers with [redacted]; the status and the vendor's error
  type are kept by the caller (relay/adaptors/base.py).
"""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

# A parameter whose name says it carries a credential.
_CREDENTIAL = re.compile(r"key|token|secret|passw|auth|sig|credential|session", re.I)

_SECRETS = re.compile(
    r"\b(?:sk|rk|pk|ak)-[A-Za-z0-9_\-*]{6,}"         # sk-..., sk-proj-..., sk-ant-..., masked too
    r"|\bAIza[0-9A-Za-z_\-]{20,}"                     # Google API keys
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{12,}"                  # AWS access key ids
    r"|\b(?:ghp|gho|ghs|glpat|xox[abpr])[-_][A-Za-z0-9_\-]{10,}"
    r"|\b(?:org|proj|project|user|acct|team)[-_][A-Za-z0-9]{8,}\b"   # OpenAI org-..., proj_...
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=\-]{8,}"
    # Anything else long and random-looking: letters and digits mixed, no spaces.
    r"|\b(?=[A-Za-z0-9_\-]*\d)(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{32,}\b")
REDACTED = "[redacted]"


def is_credential(name: str) -> bool:
    return bool(_CREDENTIAL.search(name or ""))


def strip_credentials(query: str) -> str:
    """A query string without its credential parameters (the rest as sent)."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(is_credential(k) for k, _ in pairs):
        return query
    return urlencode([(k, v) for k, v in pairs if not is_credential(k)])


def redact_uri(uri: str) -> str:
    """A request URI as the log may show it: credential parameters masked."""
    path, sep, query = (uri or "").partition("?")
    if not sep or not _CREDENTIAL.search(query):
        return uri
    parts = []
    for piece in query.split("&"):
        name, eq, _ = piece.partition("=")
        parts.append(f"{name}={REDACTED}" if eq and is_credential(name) else piece)
    return f"{path}?{'&'.join(parts)}"


def scrub(text: str) -> str:
    """An upstream's error text with key-like strings and account ids replaced."""
    return _SECRETS.sub(REDACTED, text or "")
