"""A value refused, with a name for it.

`code` is stable (the console shows `err.<code>` from its string tables,
ui/static/i18n/*.json) and `values` are the message's variable parts, by
name, so that a translation can place them; the message itself stays
English, for API clients and as the fallback.  A ValueError, so that the
callers that catch ValueError still do.
"""
from __future__ import annotations


class Refusal(ValueError):
    def __init__(self, message: str, code: str, **values):
        super().__init__(message)
        self.code = code
        self.values = values
