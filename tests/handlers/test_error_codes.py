"""Every refusal /api can send carries a code the console has words for.

Read from the source (ast), so that a new raise without a code, or with a
code that en.json or zh-CN.json lacks, fails here rather than reaching a
Chinese user in English:
- in handlers/, every ApiError(...) names a `code` (a string, a choice of
  strings, or `exc.code` passed on from an error below that names its own);
  every ApiError.of(exc, ...) names the `code` for an error that has none;
  every `fail(...)` in base.py's write_error writes a code;
- below the handlers (models/, notify/, relay/serving/values.py), every
  coded error (Refusal, Invalid, BindError, ContactError, BadInput) that
  names a code names one the tables have;
- codes chosen at run time are listed here by name (RUNTIME);
- every placeholder of an err.<code> string is a value each raise of that
  code gives (else the console would show "{max}" as it is).
"""
from __future__ import annotations

import ast
import glob
import json
import os
import re

import pytest

from handlers.refusals import HTTP_CODES, RELAY_CODES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLACEHOLDER = re.compile(r"\{(\w+)\}")

# Codes no raise spells out, with the values each one's data carries:
# BadInput's defaults (relay/serving/values.py), Invalid's
# (notify/subscriptions.py), write_error's for what is no ApiError, and the
# console's own (ui/static/js/api.js: the server could not be reached).
RUNTIME = {
    "field_invalid": {"field"}, "body_invalid": set(), "body_too_large": set(),
    "subscription_invalid": {"detail"},
    "passwords_busy": {"retry_after"}, "internal": {"id"},
    "unavailable": {"retry_after"}, "http_error": {"status"},
    **{c: {"status"} for c in HTTP_CODES.values()},
    **{c: {"retry_after"} for c in RELAY_CODES},
}
# The keyword arguments of a coded error that are not values in its data.
NOT_VALUES = {"code", "retry_after", "message"}
# Coded errors below the handlers: the position of `code` when given positionally.
BELOW = {"Refusal": 1, "Invalid": 1, "BindError": 2, "ContactError": 3, "BadInput": 3}
BELOW_FILES = (glob.glob(os.path.join(ROOT, "models", "*.py"))
               + glob.glob(os.path.join(ROOT, "notify", "**", "*.py"), recursive=True)
               + [os.path.join(ROOT, "relay", "serving", "values.py")])


def table(lang: str) -> dict:
    with open(os.path.join(ROOT, "ui", "static", "i18n", f"{lang}.json"), encoding="utf-8") as fh:
        return json.load(fh)


def parsed(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as fh:
        return ast.parse(fh.read(), path)


def name_of(func) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = name_of(func.value)
        return f"{inner}.{func.attr}" if inner else func.attr
    return ""


def strings_of(node) -> list[str] | None:
    """The codes an expression may be: a string, or a choice of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        a, b = strings_of(node.body), strings_of(node.orelse)
        return None if a is None or b is None else a + b
    return None


def passed_on(node) -> bool:
    """`exc.code`: the code of an error raised below, whose raise is checked there."""
    return isinstance(node, ast.Attribute) and node.attr == "code"


def where(path: str, node) -> str:
    return f"{os.path.relpath(path, ROOT)}:{node.lineno}"


class Found:
    def __init__(self):
        self.codes: dict[str, list[set]] = {}   # code -> the value names of each raise
        self.problems: list[str] = []

    def add(self, codes, values: set) -> None:
        for c in codes:
            self.codes.setdefault(c, []).append(values)


def keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def value_names(call: ast.Call) -> set:
    return {k.arg for k in call.keywords if k.arg and k.arg not in NOT_VALUES}


def scan() -> Found:
    found = Found()
    for path in sorted(glob.glob(os.path.join(ROOT, "handlers", "*.py"))):
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Call):
                continue
            fn = name_of(node.func)
            if fn == "ApiError":
                code = keyword(node, "code")
                if code is None and len(node.args) >= 4:
                    code = node.args[3]
                if code is None:
                    found.problems.append(f"{where(path, node)}: ApiError without a code")
                elif passed_on(code):
                    continue
                elif strings_of(code) is None:
                    found.problems.append(f"{where(path, node)}: a code chosen at run time "
                                          "(list it in RUNTIME, or pass exc.code on)")
                else:
                    found.add(strings_of(code), value_names(node))
            elif fn == "ApiError.of":
                code = keyword(node, "code")
                if code is None or strings_of(code) is None:
                    found.problems.append(f"{where(path, node)}: ApiError.of needs a code= "
                                          "for an error that names none")
                else:
                    found.add(strings_of(code), value_names(node) | {"detail"})
            elif fn == "self.fail" and path.endswith("base.py"):
                data = node.args[2] if len(node.args) > 2 else keyword(node, "data")
                if isinstance(data, ast.Call) and name_of(data.func) == "exc.data":
                    continue  # an ApiError's own code
                keys = {k.value: v for k, v in zip(getattr(data, "keys", []),
                                                   getattr(data, "values", []))
                        if isinstance(k, ast.Constant)}
                if "code" not in keys:
                    found.problems.append(f"{where(path, node)}: a refusal written without "
                                          "a code")
                elif strings_of(keys["code"]) is not None:
                    found.add(strings_of(keys["code"]), set(keys) - {"code"})
                elif not (isinstance(keys["code"], ast.Attribute) or
                          isinstance(keys["code"], (ast.Call, ast.Name))):
                    found.problems.append(f"{where(path, node)}: an unreadable code")
    for path in sorted(BELOW_FILES):
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Call):
                continue
            fn = name_of(node.func).rsplit(".", 1)[-1]
            if fn not in BELOW:
                continue
            code = keyword(node, "code")
            if code is None and len(node.args) > BELOW[fn]:
                code = node.args[BELOW[fn]]
            if code is None:
                continue  # the default (RUNTIME), or a fallback the handler names
            if strings_of(code) is None:
                # A constructor passing its own on, or a code passed on from below.
                if not isinstance(code, ast.Name) and not passed_on(code):
                    found.problems.append(f"{where(path, node)}: an unreadable code")
                continue
            values = value_names(node)
            if fn == "BadInput":
                values.add("field")
            found.add(strings_of(code), values)
    for code, values in RUNTIME.items():
        found.add([code], values)
    return found


FOUND = scan()


def test_every_refusal_names_a_code():
    assert FOUND.problems == []
    # The scan reads what it should: some hundred and fifty raises.
    assert sum(len(v) for v in FOUND.codes.values()) > 150
    for code in ("key_cap", "rate_limited", "allow_ips_entries", "field_too_long",
                 "wrong_password", "password_weak", "budget_value", "subscription_cap"):
        assert code in FOUND.codes, code


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_every_code_has_words(lang):
    words = table(lang)
    missing = sorted(c for c in FOUND.codes if f"err.{c}" not in words)
    assert missing == [], f"{lang}.json lacks err.<code> for {missing}"


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_every_placeholder_is_a_value_each_raise_gives(lang):
    words = table(lang)
    short = {}
    for code, raises in FOUND.codes.items():
        text = words.get(f"err.{code}", "")
        for values in raises:
            lacking = set(PLACEHOLDER.findall(text)) - values
            if lacking:
                short.setdefault(code, set()).update(lacking)
    assert short == {}


def test_no_code_is_left_unused():
    """An err.<code> nobody raises is a word for nothing (or a misspelt code)."""
    console_own = {"network", "amount", "page"}  # the console's own errors (api.js, pages)
    words = {k[4:] for k in table("en") if k.startswith("err.")}
    assert sorted(words - set(FOUND.codes) - console_own) == []
