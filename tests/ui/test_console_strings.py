"""The console's words live in one file per language: every key the pages
and scripts use is there, and a missing language falls back to English."""
from __future__ import annotations

import glob
import json
import os
import re

from console import strings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def used_keys() -> set[str]:
    keys = set()
    for path in glob.glob(os.path.join(ROOT, "ui", "templates", "*.html")):
        keys |= set(re.findall(r"""\bt\(\s*["']([\w.]+)["']""", open(path).read()))
    for path in glob.glob(os.path.join(ROOT, "ui", "static", "js", "**", "*.js"), recursive=True):
        keys |= set(re.findall(r"""\bt\(\s*'([\w.]+)'""", open(path).read()))
    return keys - {"key"}  # the example in i18n.js's comment


def test_every_used_string_is_in_english():
    table = json.load(open(os.path.join(strings.I18N_DIR, "en.json"), encoding="utf-8"))
    missing = sorted(k for k in used_keys() if k not in table and not k.endswith("."))
    assert missing == []
    assert all(isinstance(v, str) and v.strip() for v in table.values())


def test_pages_have_titles_in_the_table():
    from handlers.console import PAGES
    table = strings.table("en")
    assert all(f"page.{name}" in table for name, _, _ in PAGES)


def test_language_choice_falls_back_to_english():
    assert strings.pick("zh-CN,zh;q=0.9") in strings.available()
    assert strings.pick("", "xx") == "en"
    assert strings.pick("en-GB,en;q=0.8") == "en"
    t = strings.translator("../../etc/passwd")
    assert t("login.submit") == "Sign in"
    assert strings.translator("en")("topup.done", amount="2.00") == \
        "Added 2.00 credits to your balance."
    assert strings.translator("en")("no.such.key") == "no.such.key"
