"""Midjourney-proxy upstreams (type "midjourney"): asynchronous image tasks.

Same contract as every adaptor: a submit is one call (request -> parse),
billed at the per-call price of its action when the upstream accepts it.
What follows a submit - polling the task until it ends, the refund when it
fails - lives in relay/midjourney/tasks.py, which uses `poll_request`/`read_tasks`
here so that the wire format stays in this one module.

Wire format (novicezk/midjourney-proxy and its "plus" variant): POST
{base}/mj/submit/<action> with the secret in the `mj-api-secret` header; the
reply is HTTP 200 with {code, description, result: taskId, properties}.
Codes: 1 accepted, 21 already exists (or, for a plus action, "waiting for
the modal": properties.status == MODAL), 22 queued, 23 queue full, 24
banned prompt, 3 not found, 4 validation error, 9 failure.
"""
from __future__ import annotations

import json

from relay.adaptors.base import Adaptor, Call, UpstreamRequest, join_url
from relay.errors import RelayError
from relay.money.pricing import Usage

OK, EXISTED, IN_QUEUE, QUEUE_FULL, BANNED = 1, 21, 22, 23, 24
ACCEPTED = (OK, IN_QUEUE)


class MjRefused(RelayError):
    """The upstream answered but did not take the task; `reply` is its answer,
    passed to the client as it is (with our task ids)."""

    def __init__(self, status: int, reply: dict):
        desc = str(reply.get("description") or "refused")
        super().__init__(status, f"The Midjourney upstream refused the task: {desc}",
                         "upstream_error" if status >= 500 else "invalid_request_error",
                         f"mj_code_{reply.get('code')}")
        self.reply = reply


def _status_for(code) -> int:
    if code == QUEUE_FULL:
        return 429  # another channel may have room: the service retries
    if code == BANNED or code in (3, 4):
        return 400
    return 502


class MidjourneyAdaptor(Adaptor):
    type = "midjourney"
    native = "mj"
    endpoints = frozenset({"mj_submit"})

    def headers(self, channel) -> dict:
        return {"mj-api-secret": channel.key, "Content-Type": "application/json"}

    def url(self, channel, path: str) -> str:
        return join_url(channel.base_url, path, version="/mj")

    def request(self, call: Call, channel) -> UpstreamRequest:
        """call.extra["mj_path"] is the submit route (imagine, change, ...);
        call.body is the client's body with task ids already the upstream's."""
        return UpstreamRequest("POST", self.url(channel, "/submit/" + call.extra["mj_path"]),
                               self.headers(channel),
                               json.dumps(call.body, ensure_ascii=False).encode())

    def parse(self, call: Call, body: bytes) -> tuple[dict, Usage | None]:
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("the submit reply is not a JSON object")
        code = doc.get("code")
        props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
        modal = code == EXISTED and str(props.get("status", "")).upper() == "MODAL"
        if (code in ACCEPTED or modal) and doc.get("result"):
            return doc, Usage(units=1)
        raise MjRefused(_status_for(code), doc)

    # ---- polling (relay/midjourney/tasks.py) -------------------------------------------
    def poll_request(self, channel, upstream_ids: list[str]) -> UpstreamRequest:
        return UpstreamRequest("POST", self.url(channel, "/task/list-by-condition"),
                               self.headers(channel), json.dumps({"ids": upstream_ids}).encode())

    def fetch_request(self, channel, upstream_id: str, what: str = "fetch") -> UpstreamRequest:
        """GET one task ("fetch"), or its seed ("image-seed")."""
        return UpstreamRequest("GET", self.url(channel, f"/task/{upstream_id}/{what}"),
                               {"mj-api-secret": channel.key})

    @staticmethod
    def read_tasks(body: bytes) -> list[dict]:
        """Tasks from a list-by-condition (a list) or fetch (one task) reply."""
        doc = json.loads(body or b"null")
        if isinstance(doc, dict):
            doc = [doc]
        return [t for t in doc or () if isinstance(t, dict) and t.get("id")]
