"""Values the request may not carry, and the typed checks for single values
(JSON fields and query parameters alike).  The parser of whole bodies is
relay/serving/jsonin.py."""
from __future__ import annotations

import math
import re

from relay.errors import RelayError

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class BadInput(ValueError):
    """A value the request may not carry.  `field` is a path such as
    "messages[0].content" (None for the body as a whole); status is 400,
    or 413 for size.  `code` and `values` name the refusal and its
    variable parts for /api (the console's err.<code>); without a code it
    is field_invalid (naming the field) or body_invalid."""

    def __init__(self, message: str, field: str | None = None, status: int = 400,
                 code: str = "", **values):
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status
        if not code:
            code = ("body_too_large" if status == 413 else
                    "field_invalid" if field else "body_invalid")
        self.code = code
        self.values = {"field": field, **values} if field else values


def relay_error(exc: BadInput) -> RelayError:
    """The relay families' error for a BadInput (rendered in each family's body)."""
    if exc.status == 413:
        return RelayError(413, exc.message, "invalid_request_error", "request_too_large")
    code = "invalid_value" if exc.field else "invalid_json"
    return RelayError(exc.status, exc.message, "invalid_request_error", code, exc.field)


def lone(path: str):
    """(path, message) for a lone surrogate at path."""
    return path, (f"'{path}' contains a lone surrogate (U+D800-U+DFFF) that is not valid "
                  "Unicode; send proper text (a surrogate pair is fine).")


def whole(value, field: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """A whole number from a JSON number or its decimal text, within [lo, hi]."""
    if isinstance(value, bool) or value is None:
        raise BadInput(f"{field} must be a whole number.", field, code="field_not_whole")
    if isinstance(value, int):
        n = value
    else:
        if isinstance(value, str):
            s = value.strip()
            if re.fullmatch(r"[+-]?\d{1,25}", s):
                value = int(s)
            else:
                try:
                    value = float(s) if len(s) <= 40 else math.nan
                except ValueError:
                    raise BadInput(f"{field} must be a whole number, not {value[:40]!r}.",
                                   field, code="field_not_whole") from None
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise BadInput(f"{field} must be a whole number.", field, code="field_not_whole")
            value = int(value)
        if not isinstance(value, int):
            raise BadInput(f"{field} must be a whole number.", field, code="field_not_whole")
        n = value
    if not lo <= n <= hi:
        raise BadInput(f"{field} must be between {lo} and {hi}.", field, code="field_range",
                       min=lo, max=hi)
    return n


def number(value, field: str, lo: float = -1e15, hi: float = 1e15) -> float:
    """A finite number from a JSON number or its decimal text, within [lo, hi]."""
    if isinstance(value, bool) or value is None:
        raise BadInput(f"{field} must be a number.", field, code="field_not_number")
    if isinstance(value, str):
        try:
            value = float(value.strip()) if len(value) <= 40 else math.nan
        except ValueError:
            raise BadInput(f"{field} must be a number, not {value[:40]!r}.", field,
                           code="field_not_number") from None
    if not isinstance(value, (int, float)):
        raise BadInput(f"{field} must be a number.", field, code="field_not_number")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"{field} must be a finite number.", field, code="field_not_number")
    if not lo <= value <= hi:
        raise BadInput(f"{field} must be between {lo:g} and {hi:g}.", field, code="field_range",
                       min=f"{lo:g}", max=f"{hi:g}")
    return value


def text(value, field: str, max_len: int = 10_000, default: str = "") -> str:
    """A string (numbers are taken as their text), at most max_len characters."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadInput(f"{field} must be a string.", field, code="field_not_string")
    s = value if isinstance(value, str) else str(value)
    if len(s) > max_len:
        raise BadInput(f"{field} is longer than {max_len} characters.", field,
                       code="field_too_long", max=max_len)
    if _SURROGATE.search(s):
        raise BadInput(lone(field)[1], field, code="field_surrogate")
    return s


def flag(value, field: str) -> bool:
    """A boolean, also from the usual query spellings (1/0, true/false, yes/no)."""
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0",
                                                            "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise BadInput(f"{field} must be true or false.", field, code="field_not_bool")
