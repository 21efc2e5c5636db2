"""Secrets at rest: API keys, channel keys and notification secrets.

A database dump must not reveal a usable key, yet the console must be able to
show a key to its owner.  So a secret is stored twice: encrypted (AES-GCM,
reversible with the server secret) and as a keyed hash (HMAC-SHA256) that the
relay looks it up by.  Both sub-keys are derived from one server secret.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets as _secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def random_string(n: int) -> str:
    return "".join(_secrets.choice(_ALPHABET) for _ in range(n))


def new_api_key() -> str:
    return "sk-" + random_string(48)


def mask(value: str, keep: int = 4) -> str:
    if not value:
        return ""
    if len(value) <= keep * 2:
        return "*" * len(value)
    return value[:keep] + "*" * 8 + value[-keep:]


def load_or_create_secret(data_dir: str) -> str:
    path = os.path.join(data_dir, "secret.key")
    if os.path.exists(path):
        return open(path).read().strip()
    os.makedirs(data_dir, exist_ok=True)
    value = _secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    return value


class Vault:
    def __init__(self, server_secret: str):
        root = server_secret.encode()
        self._enc = AESGCM(hmac.new(root, b"relay/encrypt/v1", hashlib.sha256).digest())
        self._mac = hmac.new(root, b"relay/lookup/v1", hashlib.sha256).digest()
        # Keyed once: a lookup copies this (each request hashes its key, and
        # keying an HMAC by name each time was twice the work).
        self._lookup = hmac.new(self._mac, digestmod=hashlib.sha256)
        self.cookie_secret = hmac.new(root, b"relay/cookie/v1", hashlib.sha256).hexdigest()

    def lookup_hash(self, value: str) -> str:
        mac = self._lookup.copy()
        mac.update(value.encode())
        return mac.hexdigest()

    def encrypt(self, value: str) -> str:
        if not value:
            return ""
        nonce = os.urandom(12)
        return base64.urlsafe_b64encode(nonce + self._enc.encrypt(nonce, value.encode(), None)).decode()

    def decrypt(self, blob: str) -> str:
        if not blob:
            return ""
        raw = base64.urlsafe_b64decode(blob.encode())
        return self._enc.decrypt(raw[:12], raw[12:], None).decode()

    def sign(self, payload: bytes) -> str:
        return hmac.new(self._mac, payload, hashlib.sha256).hexdigest()
