"""The console's words, kept in one file per language under ui/static/i18n/.

Templates use them through `t(key)`; the page scripts fetch the same file,
so adding a language is adding one JSON file (e.g. zh-CN.json).
"""
from __future__ import annotations

import json
import os
import re

I18N_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "ui", "static", "i18n")
DEFAULT = "en"
_cache: dict[str, tuple[float, dict]] = {}


def available() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(I18N_DIR) if f.endswith(".json"))


def pick(accept_language: str, cookie: str | None = None) -> str:
    """The language to speak: the `lang` cookie, else the browser's first known one."""
    langs = available()
    if cookie in langs:
        return cookie
    for part in (accept_language or "").split(","):
        tag = part.split(";")[0].strip()
        for cand in (tag, tag.split("-")[0]):
            if cand in langs:
                return cand
    return DEFAULT


def table(lang: str) -> dict:
    """The strings of a language, falling back to English key by key."""
    path = os.path.join(I18N_DIR, f"{lang}.json")
    if not re.fullmatch(r"[A-Za-z-]{2,10}", lang) or not os.path.exists(path):
        lang, path = DEFAULT, os.path.join(I18N_DIR, f"{DEFAULT}.json")
    mtime = os.path.getmtime(path)
    hit = _cache.get(lang)
    if hit is None or hit[0] != mtime:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if lang != DEFAULT:
            data = {**table(DEFAULT), **data}
        hit = _cache[lang] = (mtime, data)
    return hit[1]


def translator(lang: str):
    strings = table(lang)

    def t(key: str, **vars) -> str:
        text = strings.get(key, key)
        for k, v in vars.items():
            text = text.replace("{" + k + "}", str(v))
        return text
    return t
