"""Passwords: the one rule for new passwords, and hashing.

Hashing uses libpass (the maintained passlib fork: same import): argon2 for
new hashes; bcrypt hashes still verify, and are upgraded on the next
successful login by `needs_update`.  An argon2 hash is hundreds of
milliseconds of CPU and 64 MB of memory, so request handlers use the
`*_async` forms, which run on a small thread pool (argon2 releases the
interpreter lock): the event loop stays free, and at most two hashes run at
once however many sign-ins arrive.  At most QUEUE more wait for them; past
that a check is refused at once (PasswordsBusy, a 429), so that a flood of
sign-ins cannot make everyone's wait as long as the flood.
"""
from __future__ import annotations

import asyncio
import re
import secrets
from concurrent.futures import ThreadPoolExecutor

from passlib.context import CryptContext

from models.refusal import Refusal
from models.strength import Estimator

_ctx = CryptContext(schemes=["argon2", "bcrypt"], deprecated="auto")
WORKERS = 2
# Checks that may wait for a worker: with argon2's ~0.1-0.3 s a check, the
# last of them waits a second or two.
QUEUE = 16
_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="passwords")
_admitted = [0]
estimator = Estimator()

MIN_LENGTH = 8
MAX_LENGTH = 1024
# zxcvbn's score 0-4 (guesses < 10^3, 10^6, 10^8, 10^10, more): 2 and up
# withstands an online attack slowed by login throttling.
MIN_SCORE = 2
# zxcvbn's matching grows fast with length; the first characters decide.
_JUDGED = 32
_SURROGATE = re.compile("[\ud800-\udfff]")


def hash_password(password: str) -> str:
    return _ctx.hash(password)


def verify_password(password: str, hashed: str) -> bool:
    if not hashed:
        return False
    try:
        return _ctx.verify(password, hashed)
    except (ValueError, TypeError):
        return False


def needs_update(hashed: str) -> bool:
    return _ctx.needs_update(hashed)


class PasswordsBusy(Exception):
    """Every worker is busy and QUEUE checks wait: try again in a moment."""


async def _run(fn, *args):
    if _admitted[0] >= WORKERS + QUEUE:
        raise PasswordsBusy()
    _admitted[0] += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
    finally:
        _admitted[0] -= 1


async def hash_password_async(password: str) -> str:
    """hash_password on the pool; raises PasswordsBusy when its queue is full."""
    return await _run(hash_password, password)


async def verify_password_async(password: str, hashed: str) -> bool:
    """Like verify_password; with no hash (no such user) it still spends a
    hash's time, so that timing does not tell which users exist.  Raises
    PasswordsBusy when the pool's queue is full."""
    return await _run(_verify_timed, password, hashed)


_dummy: list[str] = []


def _verify_timed(password: str, hashed: str) -> bool:
    if hashed:
        return verify_password(password, hashed)
    if not _dummy:
        _dummy.append(hash_password(secrets.token_urlsafe(16)))
    verify_password(password, _dummy[0])
    return False


async def password_problem(password: str, username: str = "", email: str = "") -> str | None:
    """Why `password` may not be used as a new password, or None if it may
    (password_refusal's message)."""
    refusal = await password_refusal(password, username, email)
    return None if refusal is None else str(refusal)


async def password_refusal(password: str, username: str = "",
                           email: str = "") -> Refusal | None:
    """Why `password` may not be used as a new password (a Refusal to raise,
    whose code the console shows in its language), or None if it may.

    The one rule every place that sets a password asks (registration, the
    user's own change, an administrator's reset, account recovery): at least
    8 characters, and not guessable by zxcvbn's measure (common passwords,
    keyboard walks, repeats, dates, the user's own name or address).
    """
    if not isinstance(password, str) or _SURROGATE.search(password):
        return Refusal("The password must be text (it contains characters that are not valid "
                       "Unicode).", "password_not_text")
    if len(password) < MIN_LENGTH:
        return Refusal(f"The password must be at least {MIN_LENGTH} characters long.",
                       "password_short", min=MIN_LENGTH)
    if len(password) > MAX_LENGTH:
        return Refusal(f"The password must be at most {MAX_LENGTH} characters long.",
                       "password_long", max=MAX_LENGTH)
    hints = [h for h in (username, email, (email or "").split("@")[0]) if h]
    # Measured in a helper process (models/strength.py): zxcvbn's
    # dictionaries would stay resident here for good.
    result = await estimator.measure(password[:_JUDGED], hints)
    if result["score"] >= MIN_SCORE:
        return None
    why = result["warning"] or "This password is too easy to guess."
    tips = " ".join(result["suggestions"])
    # zxcvbn's words are English: the console says it in its own, without them.
    return Refusal(f"Choose a stronger password: {why.rstrip('.')}. {tips}".strip(),
                   "password_weak")
