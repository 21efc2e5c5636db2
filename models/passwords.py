"""Password hashing (libpass, the maintained passlib fork: same import).

argon2 for new hashes; bcrypt hashes still verify, and are upgraded on the
next successful login by `needs_update`.
"""
from passlib.context import CryptContext

_ctx = CryptContext(schemes=["argon2", "bcrypt"], deprecated="auto")


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


def password_problem(password: str, username: str = "", email: str = "") -> str | None:
    """Why `password` may not be used as a new password, or None if it may.

    The one rule every place that sets a password asks (registration, the
    user's own change, an administrator's reset).
    """
    if len(password) < 8:
        return "The password must be at least 8 characters long."
    return None
