"""/mj/image/{id}: a task's image, passed on from where its upstream put it.

The URL is the upstream's (a third-party Midjourney proxy chooses it), and
the answer is served from our own origin, where the console lives.  So:

- only to the task's owner: a key of the account that made it, or that
  account's console session (anyone else gets 404, as for an unknown id);
  the setting mj_public_images serves them to anyone, as midjourney-proxy
  does, for image links shared outside the account;
- fetched from the channel's own address as before (an administrator chose
  it), and from anywhere else through the SSRF guard that webhooks use
  (relay/upstream/guard.py): no private or loopback address, no redirect;
- served only as a raster image type (PNG, JPEG, GIF, WebP, AVIF: not SVG,
  a document that may carry script), with `Content-Security-Policy:
  default-src 'none'` and `X-Content-Type-Options: nosniff`, so that even a
  wrong answer cannot run on our origin; anything else is a 502;
- at most MAX_BYTES, streamed: nothing is held whole.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from relay.errors import RelayError
from relay.midjourney.service import not_found
from relay.upstream import guard

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/avif")
MAX_BYTES = 32 * 1024 * 1024
HEADERS = {"Content-Security-Policy": "default-src 'none'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=86400",
           "Content-Disposition": "inline"}


def image_type(headers) -> str | None:
    """The answer's type if it is one we serve, else None."""
    ctype = str(headers.get("Content-Type", "")).split(";", 1)[0].strip().lower()
    return ctype if ctype in IMAGE_TYPES else None


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


class Images:
    def __init__(self, tasks, catalog, upstream, config):
        self.tasks = tasks
        self.catalog = catalog
        self.upstream = upstream
        self.public = bool(config.mj_public_images)
        self.guarded = guard.guarded_client(config.allow_private_webhooks, max_clients=16)

    async def task(self, task_id: str, user_id: int | None) -> dict:
        """The task whose image is asked for; 404 unless it has one and the
        caller (`user_id`, None when anonymous) may see it."""
        doc = await self.tasks.get(task_id) if isinstance(task_id, str) else None
        if doc is None or not doc.get("imageUrl"):
            raise not_found("image")
        if not self.public and doc.get("user_id") != user_id:
            raise not_found("image")
        return doc

    def _channel_origin(self, doc: dict) -> tuple | None:
        channel = next((c for c in self.catalog.channels if c.id == doc.get("channel_id")), None)
        return _origin(channel.base_url) if channel is not None else None

    async def send(self, doc: dict, sink, cancel) -> None:
        """Stream the image to `sink` (the handler: start(status, headers),
        write(bytes), `closed`); raises RelayError when nothing was sent."""
        url = doc["imageUrl"]
        state = {"type": None, "n": 0}

        def on_start(status, headers) -> bool:
            state["type"] = image_type(headers) if status < 400 else None
            if state["type"] is None:
                return False
            sink.start(200, {**HEADERS, "Content-Type": state["type"]})
            return True

        def on_chunk(data: bytes) -> None:
            if state["type"] is None or sink.closed:
                return
            state["n"] += len(data)
            if state["n"] <= MAX_BYTES:
                sink.write(data)

        if self._channel_origin(doc) == _origin(url):
            # The channel's own address: as trusted as the channel itself.
            resp = await self.upstream.send("GET", url, {}, None, on_start=on_start,
                                            on_chunk=on_chunk, cancel=cancel)
            status = resp.status
            why = None if resp.error is None else resp.error.message
        else:
            status, why = await guard.stream(self.guarded, url, on_start, on_chunk, MAX_BYTES)
        if sink.started:
            return
        if why is not None and status == 0:
            raise RelayError(502, f"The image could not be fetched: {why}", "upstream_error",
                             "bad_upstream")
        if status >= 400:
            raise RelayError(502, f"The image could not be fetched ({status}).",
                             "upstream_error", "bad_upstream")
        raise RelayError(502, "The upstream's image is not a PNG, JPEG, GIF, WebP or AVIF "
                              "image.", "upstream_error", "not_an_image")
