"""Steps 7-8 of a relay call (relay/service.py): settle from real usage at
the group's rate rule, and write the usage record that is the charge.

A mixin of RelayService: it reads the service's billing, catalog,
sessions and prompt_tokens(), and is kept apart only so that the
orchestrator stays readable.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from relay import bounds
from relay.adaptors.base import Call
from relay.asks import PAID_TIERS
from relay.attempts import Outcome
from relay.money import pricing, rates, tokenizer
from relay.serving.buglog import log_bug

log = logging.getLogger("relay.service")

CHAT_LIKE = bounds.CHAT_LIKE


class Settling:
    async def _settle(self, call, auth, price, res, out: Outcome, t0: float, cancel) -> None:
        usage = out.usage
        delivered = out.error is None or out.started or (cancel.cancelled and out.streamed_text)
        if usage is None and delivered:
            long = tokenizer.is_long(out.streamed_text, call.raw) or (
                not call.raw and call.endpoint in CHAT_LIKE)
            usage = await tokenizer.off_loop(long, self._estimate_usage, call, out)
        if usage is not None and call.extra.get("units") and not usage.units:
            usage = replace(usage, units=int(call.extra["units"]))
        # Noted by the OpenAI face: a stream's body is shelved by now (read
        # again, it would be parsed again).
        if usage is not None and not usage.web_search_calls and call.endpoint == "chat" and \
                call.extra.get("web_search_options") and \
                getattr(out.channel, "type", "") in ("openai", "azure"):
            usage = replace(usage, web_search_calls=1)  # a search model's one search
        cost = saved = unread = 0
        rate, rule = auth.rate, "flat"
        if delivered and usage is not None:
            per_call = auth.token.billing_mode == "per_call"
            rate, rule = rates.for_call(auth.rule, auth.rate, res.counters, self.billing.spent,
                                        usage.prompt_tokens,
                                        lambda r: pricing.cost(usage, price, r, per_call))
            cost = pricing.cost(usage, price, rate, per_call)
            # Cache health (README "Cache health"): what caching saved, and an
            # earlier write of this conversation no call read.
            saved = 0 if per_call else pricing.cache_saving(usage, price, rate)
            if self.sessions is not None and out.channel is not None:
                unread = self.sessions.cache_use(call, out.channel, usage)
        status = 200 if out.error is None else (499 if cancel.cancelled and out.error.status == 499
                                                else out.error.status)
        if (cancel.cancelled or cancel.left) and out.started:
            status = 499
        ch = out.channel
        # The record is the charge: billing fills in cost, quota (charged)
        # and unpaid, and makes the two durable together.
        record = {
            "_id": call.request_id, "user_id": auth.user.id, "username": auth.user.username,
            "token_id": auth.token.id, "token_name": auth.token.name, "group": auth.group,
            "model": call.model, "upstream_model": call.upstream_model,
            "channel_id": getattr(ch, "id", None), "endpoint": call.endpoint, "face": call.face,
            "session": call.extra.get("session", ""), "cache_saved": saved,
            "cache_unread": unread,
            **(usage or pricing.Usage()).record(),  # every component, for invoices
            "estimated": bool(usage and usage.estimated),
            "duration_ms": int((time.monotonic() - t0) * 1000), "ttfb_ms": int(out.ttfb * 1000),
            "status": status, "stream": call.stream, "client_ip": auth.client_ip,
            "billing_mode": auth.token.billing_mode, "rate": str(rate), "rate_rule": rule,
            "error": out.error.message[:500] if out.error else "", "created_at": time.time(),
        }
        tier = call.extra.get("service_tier")
        if tier:
            record["service_tier"] = tier
        out.charged = await self.billing.settle(res, cost, record)

    def _ran_in(self, auth, call: Call, out: Outcome, asked: str, price):
        """The price of the service tier the upstream says it ran the call in
        (flex may run as default; auto may run as priority), where it says
        one and the catalogue prices it; the asked one's otherwise."""
        said = out.usage.service_tier if out.usage is not None else ""
        ran = said if said in PAID_TIERS else ("" if said in ("default", "standard") else asked)
        call.extra["service_tier"] = ran
        if ran == asked or out.channel is None:
            return price
        return self.catalog.price(call.model, auth.group, out.channel, ran) or price

    def _estimate_usage(self, call: Call, out: Outcome) -> pricing.Usage:
        """What a call that delivered without usage is billed: the prompt and
        what was streamed (or answered), counted offline."""
        return pricing.Usage(self.prompt_tokens(call),
                             tokenizer.count_text(out.streamed_text, call.model)
                             if out.streamed_text else self._completion_estimate(out, call),
                             0, int(call.extra.get("units", 1)),
                             # Moderations: our count is the basis itself, no estimate.
                             estimated=not call.extra.get("counted_basis"))

    async def _settle_failed(self, call, auth, res, out: Outcome, t0: float, exc) -> None:
        """Settling raised (a bug): the call is charged its reservation,
        which bounds what it could cost, and its record says why."""
        if res.done:
            return
        record = {
            "_id": call.request_id, "user_id": auth.user.id, "username": auth.user.username,
            "token_id": auth.token.id, "token_name": auth.token.name, "group": auth.group,
            "model": call.model, "upstream_model": call.upstream_model,
            "channel_id": getattr(out.channel, "id", None), "endpoint": call.endpoint,
            "face": call.face, **pricing.Usage().record(), "estimated": True,
            "duration_ms": int((time.monotonic() - t0) * 1000), "ttfb_ms": int(out.ttfb * 1000),
            "status": 200 if out.error is None else out.error.status, "stream": call.stream,
            "client_ip": auth.client_ip, "billing_mode": auth.token.billing_mode,
            "error": f"settling failed ({type(exc).__name__}): charged the reservation"[:500],
            "created_at": time.time(),
        }
        try:
            out.charged = await self.billing.settle(res, res.amount, record)
        except Exception as again:
            log_bug(log, f"charging the reservation of {call.request_id}", again)

    def _completion_estimate(self, out: Outcome, call: Call) -> int:
        if out.body and call.endpoint in CHAT_LIKE + ("completions",):
            try:
                return tokenizer.count_text(
                    "".join(str((c.get("message") or {}).get("content") or c.get("text") or "")
                            for c in out.body.get("choices") or ()), call.model)
            except (AttributeError, TypeError):
                return 0
        return 0
