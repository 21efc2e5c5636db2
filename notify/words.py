"""The built-in notification texts, in the language of the user they go to.

The words live beside the console's, under `notice.*` in
ui/static/i18n/<lang>.json (console/strings.py), so a language is still one
file.  A message is written in its user's language when it is made (at
fan-out, or for a test send and a preview), and kept as written in the
outbox.  What people write stays as they wrote it: an announcement's title
and text, and a webhook's body template (only the variables it places,
such as {{ title }}, carry these words).
"""
from __future__ import annotations

import re

from console import strings
from models.records import QUOTA_PER_USD


_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}):/+")
_DOT = re.compile(r"(?<=\w)[.](?=\w)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def user_text(text) -> str:
    """Text a user chose (a key's name), as a notification may carry it: one
    line of at most 64 characters in quotation marks, with no control or
    direction characters, and nothing a mail or chat client would turn into
    a link (https://evil.example -> https[:]//evil[.]example): a message
    from us must not read as an instruction written by us."""
    one = " ".join(_CONTROL.sub(" ", str(text or "")).split())[:64]
    one = _DOT.sub("[.]", _SCHEME.sub(lambda m: m.group(1) + "[:]//", one))
    return "\u201c" + one.replace("@", "[at]") + "\u201d"


def language(user: dict | None) -> str:
    """The user's language, English when they never chose one."""
    return strings.normalize((user or {}).get("language")) or strings.DEFAULT


def money(units: int, lang: str) -> str:
    return strings.translator(lang)("notice.money", units=units,
                                    usd=f"{units / QUOTA_PER_USD:.2f}")


def warning(etype: str, payload: dict, sub: dict, key_name: str,
            lang: str) -> tuple[str, str, int]:
    """(title, content, threshold) of a balance warning."""
    t = strings.translator(lang)
    balance = money(payload["balance"], lang)
    if etype == "user_quota_warning":
        threshold = sub.get("user_threshold", 0)
        return (t("notice.user_low.title"),
                t("notice.user_low.content", balance=balance, threshold=money(threshold, lang)),
                threshold)
    threshold = sub.get("key_threshold", 0)
    # The key's name is the user's text: never in the title (a mail's
    # subject), and in the body only quoted, marked and defanged.
    return (t("notice.key_low.title", id=payload["token_id"]),
            t("notice.key_low.content", key=user_text(key_name), id=payload["token_id"],
              balance=balance, threshold=money(threshold, lang)),
            threshold)


def confirm_mail(code: str, lang: str) -> tuple[str, str]:
    """(title, content) of the mail that confirms a new address: our own
    fixed words and the code, nothing the user wrote, no link."""
    t = strings.translator(lang)
    return t("notice.confirm.title"), t("notice.confirm.content", code=code)


def cache_collapse(payload: dict, key_name: str, lang: str) -> tuple[str, str]:
    """(title, content) of a key whose prompt-cache hits collapsed.  The
    key's name as in a balance warning: never in the title, and in the body
    quoted, marked and defanged."""
    t = strings.translator(lang)
    return (t("notice.cache_collapse.title", id=payload.get("token_id")),
            t("notice.cache_collapse.content", key=user_text(key_name), id=payload.get("token_id"),
              before=f"{100 * float(payload.get('before') or 0):.0f}",
              now=f"{100 * float(payload.get('now') or 0):.0f}",
              minutes=int(payload.get("minutes") or 0),
              tokens=f"{int(payload.get('tokens') or 0):,}"))


def budget(payload: dict, key_name: str, lang: str) -> tuple[str, str, int]:
    """(title, content, threshold) of a budget by period 80% used."""
    t = strings.translator(lang)
    period = t(f"notice.period.{payload.get('period', 'day')}")
    used, limit = money(payload["used"], lang), money(payload["limit"], lang)
    if payload.get("token_id"):
        # As in a key's warning: its name (the user's text) only quoted in the body.
        return (t("notice.key_budget.title", id=payload["token_id"], period=period),
                t("notice.key_budget.content", key=user_text(key_name), id=payload["token_id"],
                  period=period, used=used, limit=limit),
                payload["limit"])
    return (t("notice.user_budget.title", period=period),
            t("notice.user_budget.content", period=period, used=used, limit=limit),
            payload["limit"])


def storage(payload: dict, lang: str) -> tuple[str, str, str]:
    """(title, content, ceiling) of a storage warning (relay/money/retention.py):
    the database near its ceiling, or at it and pruning the oldest records."""
    t = strings.translator(lang)
    size = f"{payload.get('bytes', 0) / 1e9:.1f} GB"
    ceiling = f"{payload.get('max_bytes', 0) / 1e9:.1f} GB"
    level = "pruning" if payload.get("pruning") else "near"
    return (t(f"notice.storage_{level}.title"),
            t(f"notice.storage_{level}.content", size=size, ceiling=ceiling), ceiling)


def sample(event_type: str, lang: str) -> tuple[str, str]:
    """(title, content) of a test message of an announcement-like event."""
    t = strings.translator(lang)
    kind = "marketing" if event_type == "marketing" else "announcement"
    return t(f"notice.sample.{kind}.title"), t(f"notice.sample.{kind}.content")


def test_title(title: str, lang: str) -> str:
    return strings.translator(lang)("notice.test_title", title=title)
