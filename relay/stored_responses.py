"""Responses that outlive their call: `previous_response_id`, and
GET / DELETE / cancel / input_items of /v1/responses/{id}.

A response made through the bridge is kept here (models/responses.py);
one made on a channel that speaks Responses is kept by that upstream, and
the relay remembers only which channel served it, so that every follow-up
goes there.  Either way a response belongs to the API key that made it:
any other key gets 404, exactly as for an id that never existed (the
upstream account is shared by every key, so its answer alone proves
nothing).
"""
from __future__ import annotations

import json

from models.responses import LOCAL, UPSTREAM, ResponseStore
from relay import registry
from relay.adaptors.base import Call
from relay.convert.common import new_id
from relay.convert.responses import items_of
from relay.errors import RelayError, bad_request
from relay.faces.responses import continue_from, render
from relay.serving import jsonin, redact


def not_found(rid: str, param: str | None = None) -> RelayError:
    what = "Previous response" if param else "Response"
    return RelayError(404, f"{what} with id '{rid}' not found.", "invalid_request_error",
                      "response_not_found" if not param else "previous_response_not_found", param)


class StoredResponses:
    def __init__(self, records: ResponseStore, catalog, upstream):
        self.records = records
        self.catalog = catalog
        self.upstream = upstream

    # ---- around a create call ------------------------------------------------
    async def prepare(self, call: Call, auth) -> None:
        """Resolve previous_response_id: a response kept here becomes the
        history in front of the call's input; one kept upstream pins the
        call to the channel that holds it."""
        await self._resolve_references(call, auth)
        prev = call.native_body.get("previous_response_id")
        if prev is None:
            return
        if not isinstance(prev, str) or not prev:
            raise bad_request("'previous_response_id' must be a response id.", "invalid_type",
                              "previous_response_id")
        rec = await self.records.get(prev, auth.token.id)
        if rec is None:
            raise not_found(prev, "previous_response_id")
        if rec["kind"] == UPSTREAM:
            call.extra["channel_id"] = rec["channel_id"]
            # The conversation the upstream holds is input too, not in the
            # body: the reservation counts it (relay/bounds.py).
            call.extra["context_tokens"] = int(rec.get("context_tokens") or 0)
            return
        history: list = []
        for r in await self.records.chain(rec, auth.token.id):
            history += (r.get("input") or []) + ((r.get("response") or {}).get("output") or [])
        continue_from(call, history)
        # A channel that speaks Responses gets the whole conversation: it
        # cannot know an id that only we hold.
        doc = {k: v for k, v in call.native_body.items() if k != "previous_response_id"}
        call.extra["upstream_doc"] = dict(doc, input=history + items_of(call.native_body))

    async def _resolve_references(self, call: Call, auth) -> None:
        """`item_reference` items naming items kept here (the Vercel AI SDK
        sends them for the previous step's output) become those items."""
        refs = [i.get("id") for i in items_of(call.native_body)
                if isinstance(i, dict) and i.get("type") == "item_reference"]
        if not refs:
            return
        found = await self.records.items([r for r in refs if isinstance(r, str)], auth.token.id)
        if not found:
            return
        resolved = [found.get(i.get("id"), i) if i.get("type") == "item_reference" else i
                    for i in items_of(call.native_body)]
        call.native_body = dict(call.native_body, input=resolved)
        call.raw = b""  # the body changed: re-encoded for a Responses channel
        continue_from(call, [])

    async def remember(self, call: Call, out, auth) -> None:
        """After the call: keep a bridged response, or note which channel
        holds a passed-through one (unless the client said store: false)."""
        if call.endpoint != "responses" or out.error is not None or \
                call.native_body.get("store") is False:
            return
        owner = (auth.token.id, auth.user.id)
        if not call.stream and out.raw is None and "native_answer" not in call.extra:
            render(call, out.body)  # the bridged answer, as the client will get it
        resp = call.extra.get("response")
        if resp is not None:
            items = [_stored_item(i) for i in items_of(call.native_body)]
            ids = [i["id"] for i in items] + [o.get("id") for o in resp.get("output") or ()]
            await self.records.save(resp["id"], LOCAL, *owner, model=call.model,
                                    previous_response_id=call.native_body.get(
                                        "previous_response_id"), input=items, response=resp,
                                    item_ids=[i for i in ids if i])
            return
        rid = call.extra.get("upstream_response_id") or (
            call.extra.get("native_answer") or {}).get("id")
        if rid and out.channel is not None:
            u = out.usage
            await self.records.save(rid, UPSTREAM, *owner, model=call.model,
                                    channel_id=out.channel.id, context_tokens=(
                                        u.prompt_tokens + u.completion_tokens) if u else 0)

    # ---- /v1/responses/{id}[/...] ----------------------------------------------
    async def _record(self, auth, rid: str) -> dict:
        rec = await self.records.get(rid, auth.token.id)
        if rec is None:
            raise not_found(rid)
        return rec

    async def retrieve(self, auth, rid: str, query: str = "") -> bytes:
        rec = await self._record(auth, rid)
        if rec["kind"] == LOCAL:
            return _dumps(rec["response"])
        return _renamed(await self._forward(rec, "GET", f"/responses/{rid}", query), rec)

    async def delete(self, auth, rid: str) -> bytes:
        rec = await self._record(auth, rid)
        if rec["kind"] == UPSTREAM:
            try:
                body = await self._forward(rec, "DELETE", f"/responses/{rid}")
            except RelayError as exc:
                if exc.status != 404:
                    raise
                body = b""  # gone upstream already: forget it here too
        await self.records.delete(rid, auth.token.id)
        if rec["kind"] == UPSTREAM and body:
            return body
        return _dumps({"id": rid, "object": "response.deleted", "deleted": True})

    async def cancel(self, auth, rid: str) -> bytes:
        rec = await self._record(auth, rid)
        if rec["kind"] == LOCAL:
            raise bad_request("Only responses created with background=true can be cancelled; "
                              "this one has already finished.", "invalid_request", None)
        return _renamed(await self._forward(rec, "POST", f"/responses/{rid}/cancel"), rec)

    async def input_items(self, auth, rid: str, query: str, args: dict) -> bytes:
        rec = await self._record(auth, rid)
        if rec["kind"] == UPSTREAM:
            return await self._forward(rec, "GET", f"/responses/{rid}/input_items", query)
        items = list(rec.get("input") or [])
        if args.get("order", "desc") != "asc":
            items.reverse()
        after = args.get("after")
        if after:
            ids = [i.get("id") for i in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        try:
            limit = min(max(int(args.get("limit") or 20), 1), 100)
        except ValueError:
            raise bad_request("'limit' must be an integer from 1 to 100.", "invalid_value",
                              "limit") from None
        page = items[:limit]
        return _dumps({"object": "list", "data": page,
                       "first_id": page[0]["id"] if page else None,
                       "last_id": page[-1]["id"] if page else None,
                       "has_more": len(items) > limit})

    async def count_upstream(self, channel, model: str, doc: dict) -> int | None:
        """POST /v1/responses/input_tokens on a channel that speaks
        Responses; None when it cannot say (our own count is used then)."""
        adaptor = registry.adaptor_for(channel.type)
        if not getattr(adaptor, "speaks_responses", lambda _c: False)(channel):
            return None
        body = jsonin.dumps(dict(doc, model=channel.upstream_model(model)))
        headers = dict(adaptor.headers(channel), **{"Content-Type": "application/json"})
        resp = await self.upstream.send("POST", adaptor.responses_url(
            channel, "/responses/input_tokens"), headers, body, first_byte_timeout=30)
        if resp.error is not None or resp.status >= 400:
            return None
        try:
            return int(json.loads(resp.body)["input_tokens"])
        except (ValueError, KeyError, TypeError):
            return None

    async def _forward(self, rec: dict, method: str, path: str, query: str = "") -> bytes:
        channel = next((c for c in self.catalog.channels if c.id == rec.get("channel_id")), None)
        adaptor = registry.adaptor_for(channel.type) if channel is not None else None
        if channel is None or adaptor is None or not hasattr(adaptor, "responses_url"):
            raise RelayError(503, "The channel that holds this response is no longer available.",
                             "service_unavailable", "channel_gone")
        url = adaptor.responses_url(channel, path)
        query = redact.strip_credentials(query)  # a Gemini-style ?key= is ours, not theirs
        if query:
            url += ("&" if "?" in url else "?") + query
        resp = await self.upstream.send(method, url, adaptor.headers(channel),
                                        b"" if method == "POST" else None,
                                        first_byte_timeout=60)
        if resp.error is not None:
            raise resp.error
        if resp.status == 404:
            raise not_found(path.split("/")[2])
        if resp.status >= 400:
            raise adaptor.error(resp.status, resp.body)
        return resp.body


def _stored_item(item: dict) -> dict:
    """An input item as OpenAI lists it back: with an id, and a message's
    text as a content part."""
    item = dict(item, id=item.get("id") or new_id("msg_"))
    if item.get("type", "message") == "message":
        item["type"] = "message"
        if isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
    return item


def _dumps(doc) -> bytes:
    return jsonin.dumps(doc)


def _renamed(body: bytes, rec: dict) -> bytes:
    """The upstream's Response with the public model name."""
    try:
        doc = jsonin.loads_answer(body)
    except ValueError:
        return body
    if isinstance(doc, dict) and "model" in doc and rec.get("model"):
        return _dumps(dict(doc, model=rec["model"]))
    return body
