"""The console's words live in one file per language: every key the pages
and scripts use is there, every language has every English key (and no
other), translated, with the same placeholders; a missing language falls
back to English; the language is chosen from the cookie, the account's
preference and the browser's Accept-Language."""
from __future__ import annotations

import glob
import json
import os
import re

import pytest

from console import strings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLACEHOLDER = re.compile(r"\{(\w+)\}")
CJK = re.compile(r"[\u3400-\u9fff\uff00-\uffef\u3000-\u303f]")

# Values a translation may keep exactly as in English, each with the reason.
# Everything else must differ (a test names any that does not).
SAME_AS_ENGLISH = {
    "notify.vendor.wxpusher": "a product's name (WxPusher), written so in every language",
}


def used_keys() -> set[str]:
    keys = set()
    for path in glob.glob(os.path.join(ROOT, "ui", "templates", "*.html")):
        keys |= set(re.findall(r"""\bt\(\s*["']([\w.]+)["']""", open(path).read()))
    for path in glob.glob(os.path.join(ROOT, "ui", "static", "js", "**", "*.js"), recursive=True):
        keys |= set(re.findall(r"""\bt\(\s*'([\w.]+)'""", open(path).read()))
    return keys - {"key"}  # the example in i18n.js's comment


def raw(lang: str) -> dict:
    """A language's file as written (table() fills gaps from English)."""
    with open(os.path.join(strings.I18N_DIR, f"{lang}.json"), encoding="utf-8") as fh:
        return json.load(fh)


TRANSLATIONS = [lang for lang in strings.available() if lang != strings.DEFAULT]


def test_every_used_string_is_in_english():
    table = raw("en")
    missing = sorted(k for k in used_keys() if k not in table and not k.endswith("."))
    assert missing == []
    assert all(isinstance(v, str) and v.strip() for v in table.values())


def test_pages_have_titles_in_the_table():
    from handlers.console import PAGES
    table = strings.table("en")
    assert all(f"page.{name}" in table for name, _, _ in PAGES)


def test_there_is_a_chinese_console():
    assert "zh-CN" in TRANSLATIONS


@pytest.mark.parametrize("lang", TRANSLATIONS)
def test_every_language_has_exactly_the_english_keys(lang):
    en, other = raw("en"), raw(lang)
    missing = sorted(set(en) - set(other))
    assert not missing, f"{lang}.json lacks {len(missing)} key(s) en.json has: {missing}"
    extra = sorted(set(other) - set(en))
    assert not extra, f"{lang}.json has key(s) en.json lacks: {extra}"


@pytest.mark.parametrize("lang", TRANSLATIONS)
def test_every_value_is_translated_with_its_placeholders(lang):
    en, other = raw("en"), raw(lang)
    untranslated = sorted(k for k in en if k in other and other[k] == en[k]
                          and k not in SAME_AS_ENGLISH)
    assert not untranslated, f"{lang}.json leaves these in English: {untranslated}"
    moved = {k: (en[k], other[k]) for k in en if k in other
             and sorted(PLACEHOLDER.findall(en[k])) != sorted(PLACEHOLDER.findall(other[k]))}
    assert not moved, f"{lang}.json changes placeholders: {moved}"
    assert all(isinstance(v, str) and v.strip() for v in other.values())


def test_chinese_is_chinese():
    """Each zh-CN value has Chinese in it, but for the allowed product names."""
    zh = raw("zh-CN")
    latin_only = sorted(k for k, v in zh.items() if not CJK.search(v) and k not in SAME_AS_ENGLISH)
    assert not latin_only, latin_only
    assert zh["lang.name"] == "简体中文"


def test_notification_channels_have_words_for_every_label():
    """The server names its channels and their fields in English
    (notify/channels); the console shows the table's words for them, so a
    channel or field added there needs its keys (named here when missing)."""
    from notify import channels
    en = raw("en")
    want = {}
    for ch in channels.CHANNELS.values():
        want[f"notify.ch.{ch.type}"] = ch.label
        for f in ch.fields:
            want[f"notify.field.{ch.type}.{f.name}"] = f.label
            for choice in f.choices:
                want[f"notify.vendor.{choice}"] = en.get(f"notify.vendor.{choice}", "?")
    missing = sorted(k for k in want if k not in en)
    assert not missing, f"en.json lacks: {missing}"
    differ = {k: (en[k], v) for k, v in want.items() if en[k] != v}
    assert not differ, f"en.json's words differ from the server's labels: {differ}"


def test_language_choice_falls_back_to_english():
    assert strings.pick("zh-CN,zh;q=0.9") == "zh-CN"
    assert strings.pick("", "xx") == "en"
    assert strings.pick("en-GB,en;q=0.8") == "en"
    t = strings.translator("../../etc/passwd")
    assert t("login.submit") == "Sign in"
    assert strings.translator("en")("topup.done", amount="2.00") == \
        "Added 2.00 credits to your balance."
    assert strings.translator("en")("no.such.key") == "no.such.key"


@pytest.mark.parametrize("header, cookie, preferred, want", [
    ("zh", None, None, "zh-CN"),                      # the primary language
    ("zh-Hans-CN", None, None, "zh-CN"),
    ("zh-TW,en;q=0.5", None, None, "zh-CN"),          # closer than English
    ("ZH-cn", None, None, "zh-CN"),                   # any case
    ("fr-FR,fr;q=0.9,zh;q=0.8,en;q=0.7", None, None, "zh-CN"),  # the first we have
    ("en;q=0.5,zh-CN;q=0.9", None, None, "zh-CN"),    # by q, not by order
    ("zh-CN;q=0,en", None, None, "en"),               # q=0: not wanted
    ("zh-CN", "en", None, "en"),                      # this browser's switch
    ("en", None, "zh-CN", "zh-CN"),                   # the account's preference
    ("en", "zh-cn", "en", "zh-CN"),                   # the switch over the account
    ("en", "../en", "x" * 100, "en"),                 # junk is ignored
    ("zh;q=banana", None, None, "en"),
    ("*", None, None, "en"),
    ("x" * 100_000, None, None, "en"),                # a huge header costs little
])
def test_language_choice(header, cookie, preferred, want):
    assert strings.pick(header, cookie, preferred) == want


def test_normalize_bounds_the_tag():
    assert strings.normalize("zh-cn") == "zh-CN"
    assert strings.normalize("en-US") == "en"
    assert strings.normalize("zh-" + "a" * strings.MAX_TAG) is None
    for junk in (None, 5, "", "zh_CN;", "<script>", "de"):
        assert strings.normalize(junk) is None


def test_placeholders_are_filled_once():
    """A value holding a placeholder's name (a key called "{balance}") stays as it is."""
    t = strings.translator("en")
    assert t("notice.key_low.title", id="{id}") == "API key #{id} is running low"
    out = t("notice.key_low.content", key="{balance}", id=3, balance="5", threshold="9")
    assert out.startswith("The remaining quota of API key #3 (the name given to it: {balance}) "
                          "is 5")
