"""POST /v1/messages/count_tokens: an input-token count, free of charge.

The channel a message call for the model would go to first decides who
counts: an Anthropic channel answers with the upstream's own count (the
client's body, headers and query passed through, only the model mapped);
any other channel type, an Anthropic upstream that cannot answer (down,
refusing our key, an Anthropic-compatible server without the endpoint), or
a model no channel serves, gets our offline estimate.  Nothing is reserved,
billed or logged, and the scheduler's health counts are left alone: this is
not a model call.
"""
from __future__ import annotations

import json

from relay import registry
from relay.adaptors.base import Call
from relay.errors import RelayError
from relay.faces import anthropic as face
from relay.money import tokenizer
from relay.serving import redact

# Upstream answers passed on as they are: the count, or the upstream's own
# verdict on a bad request (in Anthropic's error body already).
_PASS = (200, 400, 413)
# A count is quick; past this, our own estimate serves the client better.
FIRST_BYTE_TIMEOUT = 15.0


async def count_tokens(service, auth, call: Call, cancel) -> tuple[int, dict, bytes]:
    """(status, headers, body) to answer the client with."""
    service.check_model(auth, call.model)
    try:
        channels = service.channels_for(auth, call)
    except RelayError:
        channels = []
    for channel in channels[:1]:
        adaptor = registry.adaptor_for(channel.type)
        if not hasattr(adaptor, "count_tokens_request"):
            break
        call.upstream_model = channel.upstream_model(call.model)
        req = adaptor.count_tokens_request(call, channel)
        resp = await service.upstream.send(req.method, req.url, req.headers, req.body,
                                           cancel=cancel, first_byte_timeout=FIRST_BYTE_TIMEOUT)
        if resp.error is None and resp.status in _PASS:
            body = resp.body
            if resp.status != 200:  # the upstream's own words, filtered as every error's are
                body = redact.scrub(body.decode("utf-8", "replace")).encode()
            return resp.status, {"Content-Type": resp.headers.get(
                "Content-Type", "application/json")}, body
    n = await tokenizer.off_loop(tokenizer.is_long(call.raw), face.estimate_tokens, call)
    body = json.dumps({"input_tokens": n}).encode()
    return 200, {"Content-Type": "application/json"}, body
