"""The console's words, kept in one file per language under ui/static/i18n/.

Templates use them through `t(key)`; the page scripts fetch the same file,
so adding a language is adding one JSON file (e.g. zh-CN.json).  The same
files hold the built-in notification texts (keys `notice.*`), which notify/
renders in the language of the user they go to.
"""
from __future__ import annotations

import json
import os
import re

I18N_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "ui", "static", "i18n")
DEFAULT = "en"
# A language tag as a browser or a form sends it (BCP 47 is at most 35 long).
MAX_TAG = 35
_TAG = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")
_cache: dict[str, tuple[float, dict]] = {}
_listed: tuple[float, list[str]] = (-1.0, [])


def available() -> list[str]:
    """The languages there is a file for (read again when the folder changes)."""
    global _listed
    mtime = os.path.getmtime(I18N_DIR)
    if _listed[0] != mtime:
        _listed = (mtime, sorted(f[:-5] for f in os.listdir(I18N_DIR) if f.endswith(".json")))
    return list(_listed[1])


def normalize(tag) -> str | None:
    """The language we speak that `tag` asks for, or None: case does not
    matter, and a tag we lack falls back to one of the same primary language
    (zh, zh-Hans, zh-TW -> zh-CN; en-GB -> en)."""
    if not isinstance(tag, str) or len(tag) > MAX_TAG or not _TAG.fullmatch(tag.strip()):
        return None
    tag = tag.strip().lower()
    langs = available()
    by_lower = {lang.lower(): lang for lang in langs}
    if tag in by_lower:
        return by_lower[tag]
    primary = tag.split("-")[0]
    if primary in by_lower:
        return by_lower[primary]
    for lang in langs:
        if lang.lower().split("-")[0] == primary:
            return lang
    return None


def _accepted(accept_language: str) -> list[str]:
    """The tags of an Accept-Language header, most wanted first (q=0: not at all)."""
    ranked = []
    for i, part in enumerate((accept_language or "")[:1000].split(",")[:32]):
        tag, *params = [p.strip() for p in part.split(";")]
        q = 1.0
        for p in params:
            if p[:2].lower() == "q=":
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if tag and tag != "*" and q > 0:
            ranked.append((-q, i, tag))
    return [tag for _, _, tag in sorted(ranked)]


def pick(accept_language: str, cookie: str | None = None, preferred: str | None = None) -> str:
    """The language to speak: the `lang` cookie (this browser's choice), else
    the signed-in user's preference, else the browser's most wanted one we
    have, else English."""
    for choice in (cookie, preferred):
        lang = normalize(choice)
        if lang:
            return lang
    for tag in _accepted(accept_language):
        lang = normalize(tag)
        if lang:
            return lang
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


def names() -> list[tuple[str, str]]:
    """(tag, the language's own name for itself) of every language, for the switch."""
    return [(lang, table(lang).get("lang.name", lang)) for lang in available()]


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def translator(lang: str):
    """t(key, **vars): the string with its {placeholders} filled in one pass
    (a value that itself holds "{name}" stays as it is); the key when missing."""
    strings = table(lang)

    def t(key: str, /, **vars) -> str:
        text = strings.get(key, key)
        if not vars:
            return text
        return _PLACEHOLDER.sub(lambda m: str(vars[m.group(1)]) if m.group(1) in vars
                                else m.group(0), text)
    return t
