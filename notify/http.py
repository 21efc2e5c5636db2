"""Outbound HTTP for notifications, behind the SSRF guard
(relay/upstream/guard.py: users choose webhook and bot URLs, so every
address is checked at connect time in the resolver, and redirects are not
followed).  `allow_private` (the admin setting allow_private_webhooks)
turns the guard off, e.g. for tests and intranet receivers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest

from relay.upstream.guard import Refused, check_url, guarded_client, is_public  # noqa: F401


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict

    def json(self):
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    def snippet(self, n: int = 300) -> str:
        return self.body[:n].decode("utf-8", "replace")


class HttpClient:
    """One guarded client per notifier; send() never follows redirects."""

    def __init__(self, allow_private: bool, timeout: float = 20.0):
        self.allow_private = allow_private
        self.timeout = timeout
        self._client = guarded_client(allow_private)

    def check_url(self, url: str) -> None:
        """Refuse a URL before any I/O when its scheme or literal address is wrong."""
        check_url(url, self.allow_private)

    async def send(self, method: str, url: str, headers: dict | None = None,
                   body: bytes | str | None = None, json_body=None) -> Reply:
        """Send one request; raises Refused or OSError-like errors, returns any status."""
        self.check_url(url)
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False).encode()
            headers.setdefault("Content-Type", "application/json; charset=utf-8")
        if isinstance(body, str):
            body = body.encode()
        req = HTTPRequest(url, method=method, headers=headers, body=body,
                          follow_redirects=False, connect_timeout=min(self.timeout, 10.0),
                          request_timeout=self.timeout,
                          allow_nonstandard_methods=True)
        try:
            resp = await self._client.fetch(req, raise_error=False)
        except HTTPClientError as exc:  # timeouts come back as 599
            raise ConnectionError(str(exc)) from None
        if resp.code == 599:
            err = resp.error
            if isinstance(err, Refused):
                raise err
            raise ConnectionError(f"no answer from {urlsplit(url).hostname}: {err}")
        return Reply(resp.code, resp.body or b"", dict(resp.headers.get_all()))

    def close(self) -> None:
        self._client.close()
