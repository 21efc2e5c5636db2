"""The orchestrator: one relay call, in the order of ARCHITECTURE.md.

1. authenticate the key (from cache)          -> authenticate()
2. check group, IP allow-list, model lock     -> authenticate(), check_model()
3. pick channels for (group, model)           -> scheduler.candidates(), priced()
   rate and concurrency limits                -> limits.admit() (relay/money/limits.py)
4. reserve the most it can cost (at the highest rate its group's rule gives;
   from budgets too)                          -> bounds.worst_case(), billing.reserve()
5. convert the request for the vendor         -> adaptor.prepare()
6. relay the upstream reply                   -> relay/attempts.py
7. settle from real usage, at the group's rate rule -> billing.settle()
8. record a usage log (the record is the charge) -> billing.settle(record)
9. publish the balance                        -> billing (via the bus)

Handlers give us a Sink to write to; we never touch Tornado objects here.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from decimal import Decimal

from models.records import (TOKEN_DISABLED, TOKEN_EXHAUSTED, TOKEN_EXPIRED, USER_ENABLED, Group,
                            Token, User)
from relay import bounds, registry
from relay.asks import hides_reasoning, requested_tier
from relay.money import budgets, rates, tokenizer
from relay.adaptors.base import Call, retryable, serves
from relay.attempts import Outcome, Sink, attempt_plain, attempt_stream
from relay.catalog import MAX_KEY_LENGTH
from relay.compat import rules
from relay.money.billing import TOKEN, QuotaExhausted
from relay.serving.buglog import log_bug
from relay.settle import Settling
from relay.errors import RelayError, bad_request, forbidden, model_not_found, unauthorized
from relay.upstream.client import Cancel

log = logging.getLogger("relay.service")

# Endpoints whose canonical body is a chat request (the Responses face converts).
CHAT_LIKE = bounds.CHAT_LIKE
# A connect that failed sent nothing, so trying again is safe: twice on the
# same channel, after 50 and 100 ms (each +-50%), before the next channel.
# A burst of new connections past an upstream's accept backlog, or an
# upstream restarting, clears within that; a dead one costs 150 ms more.
CONNECT_RETRIES = 2
CONNECT_BACKOFF = 0.05
# Retries on the same channel after refusals that name what to take out
# (relay/compat): each for something new, so a refusal is retried once.
MAX_HEALS = 3


@dataclass
class Auth:
    token: Token
    user: User
    group: str
    rate: Decimal      # the highest the group's rule can bill at (reservations)
    client_ip: str
    rule: Group | None = None


class RelayService(Settling):
    def __init__(self, settings, catalog, billing, usage_log, scheduler, upstream):
        self.settings = settings
        self.catalog = catalog
        self.billing = billing
        self.usage_log = usage_log
        self.scheduler = scheduler
        self.upstream = upstream
        # The Cancel of every call past its reservation (each call has its own).
        self.running: set = set()
        self._bound: dict | None = None
        self.limits = None  # relay/limits.Limiter, installed by it
        self.compat = None  # relay/compat/memory.Compat, installed by server.build_app
        self.sessions = None  # relay/sessions.Sessions, installed by server.build_app

    # ---- 1-2: who is calling, and may they ---------------------------------
    async def authenticate(self, key: str | None, client_ip: str, host: str = "") -> Auth:
        if not key:
            raise unauthorized("No API key was given. Send it as 'Authorization: Bearer sk-...'.",
                               "missing_api_key")
        if len(key) > MAX_KEY_LENGTH:
            raise unauthorized(f"The API key is longer than {MAX_KEY_LENGTH} characters: it is "
                               "not a key of this relay.", "invalid_api_key")
        token = await self.catalog.token_by_key(key)
        if token is None:
            raise unauthorized("The API key is not valid.")
        if token.status == TOKEN_DISABLED:
            raise unauthorized("The API key is disabled.", "api_key_disabled")
        if token.status == TOKEN_EXPIRED or token.expired():
            raise forbidden("The API key has expired.", "api_key_expired")
        if token.status == TOKEN_EXHAUSTED:
            raise forbidden("The API key's quota is exhausted.", "token_quota_exhausted")
        user = await self.catalog.user(token.user_id)
        if user is None or user.status != USER_ENABLED:
            raise unauthorized("The account behind this API key is disabled.", "account_disabled")
        group = self.catalog.groups.get(token.group)
        if group is None or not group.enabled:
            raise forbidden(f"The key's group '{token.group}' is disabled.", "group_disabled")
        if not user.may_use(token.group, self.catalog.groups):
            raise forbidden(f"The key's group '{token.group}' is not one its owner may use.",
                            "group_not_usable")
        bound = self._address_groups(host)
        if bound is not None and token.group not in bound:
            raise unauthorized(f"The key's group '{token.group}' is not served on this address.",
                               "group_not_served_here")
        if not token.ip_allowed(client_ip):
            raise forbidden(f"Your address {client_ip} is not on this key's allow-list.",
                            "ip_not_allowed")
        self.usage_log.touch(token.id)
        return Auth(token, user, token.group, rates.highest(group), client_ip, group)

    def _address_groups(self, host: str):
        """The groups a base address (by Host header) is bound to, or None."""
        if self._bound is None:
            self._bound = {}
            for addr in self.settings.base_address_list():
                url = str(addr.get("url", "")).lower()
                netloc = url.split("://", 1)[-1].split("/", 1)[0]
                if netloc and addr.get("groups"):
                    self._bound[netloc] = frozenset(addr["groups"])
        return self._bound.get((host or "").lower()) if self._bound else None

    def check_model(self, auth: Auth, model: str) -> None:
        if not auth.token.model_allowed(model):
            raise forbidden(f"This key may not use the model '{model}'.", "model_not_allowed")

    def models_for(self, auth: Auth) -> list[str]:
        models = self.catalog.models_for_group(auth.group)
        return [m for m in models if auth.token.model_allowed(m)]

    def channels_for(self, auth: Auth, call: Call) -> list:
        chans = [c for c in self.scheduler.candidates(auth.group, call.model)
                 if (a := registry.adaptor_for(c.type)) is not None and serves(a, call.endpoint)]
        if call.extra.get("channel_id") is not None:
            # A follow-up to an asynchronous task (Midjourney) or to a response
            # stored upstream must go to the channel that holds it.
            chans = [c for c in chans if c.id == call.extra["channel_id"]]
        if chans:
            return chans
        if call.model != call.model.strip():
            raise RelayError(503, f"No channel serves the model {call.model!r}: the name has "
                                  "leading or trailing spaces; remove them.",
                             "service_unavailable", "model_name_has_spaces")
        if not any(auth.group in c.groups and call.model in c.models
                   for c in self.catalog.channels):
            raise model_not_found(call.model)
        raise RelayError(503, f"No available channel for model '{call.model}' in group "
                              f"'{auth.group}'.", "service_unavailable", "model_not_available")

    def priced(self, auth: Auth, model: str, channels: list,
               tier: str = "") -> tuple[list, dict]:
        """The channels that can bill the model, and each one's price: an
        administrator's, else the vendor's from the catalogue for what that
        channel calls the model, in the service tier asked for.  A channel
        with neither is skipped."""
        prices = {}
        for c in channels:
            p = self.catalog.price(model, auth.group, c, tier)
            if p is not None:
                prices[c.id] = p
        if not prices and tier:
            raise bad_request(f"service_tier '{tier}' has no price for the model '{model}' "
                              "here (the vendor's catalogue does not list one, or an "
                              "administrator prices the model); leave it out or use 'auto'.",
                              "unsupported_value", "service_tier")
        if not prices:
            raise RelayError(503, f"The model '{model}' has no price: the vendor's catalogue "
                                  "does not list it, and no administrator has set one.",
                             "service_unavailable", "model_price_missing")
        return [c for c in channels if c.id in prices], prices

    # ---- 4: what to reserve -------------------------------------------------
    def prompt_tokens(self, call: Call) -> int:
        """The call's input tokens as we count them (for a call whose
        upstream reports none).  A long input takes milliseconds: callers on
        the event loop go through tokenizer.off_loop."""
        if "prompt_tokens" not in call.extra:
            b = call.body
            if call.endpoint in CHAT_LIKE:
                n = tokenizer.count_messages(b.get("messages") or [], call.model, b.get("tools"))
            elif "prompt_text" in call.extra:  # a face that knows the text (moderations)
                n = tokenizer.count_text(call.extra["prompt_text"], call.model)
            else:
                n = _count_inputs(b.get("prompt") if b.get("prompt") is not None
                                  else b.get("input"), call.model)
            call.extra["prompt_tokens"] = n
        return call.extra["prompt_tokens"]

    def estimate(self, auth: Auth, call: Call, channels: list, prices: dict) -> int:
        """What to reserve: the most the call can cost on any channel it may
        be tried on (relay/bounds.py)."""
        per_call = auth.token.billing_mode == "per_call"
        return max(bounds.worst_case(call, c, prices[c.id], auth.rate, per_call,
                                     self.settings.default_max_tokens)
                   for c in channels[: self.settings.retries + 1])

    # ---- the call -----------------------------------------------------------
    async def relay(self, call: Call, auth: Auth, sink: Sink, face, cancel: Cancel) -> Outcome:
        """Run one call end to end.  Returns the Outcome; for non-streamed
        calls the handler renders it.  Raises RelayError before anything was
        reserved; after that, errors come back in Outcome.error."""
        self.check_model(auth, call.model)
        tier = requested_tier(call)
        channels, prices = self.priced(auth, call.model, self.channels_for(auth, call), tier)
        if self.sessions is not None:  # the conversation's own channel first
            channels = await self.sessions.order(call, auth, channels)
        price = prices[channels[0].id]
        if not registry.passes_through(call, channels[0]):
            # A conversion the face deferred (Call.canonical) is made now, so
            # that a body it cannot read is a 400 before anything is reserved.
            call.body  # noqa: B018
        estimate = self.estimate(auth, call, channels, prices)
        ticket = await self.limits.admit(auth.token, auth.user) if self.limits else None
        counters = budgets.counters_for(
            auth.user, auth.token, rates.counts_month(auth.rule, auth.user, self.catalog.groups),
            time.time())
        try:
            res = await self.billing.reserve(call.request_id, auth.user.id, auth.token.id,
                                             not auth.token.unlimited_quota, estimate,
                                             auth.user.credit_limit, counters)
        except QuotaExhausted as exc:
            if self.limits:
                self.limits.done(ticket)
            raise over_balance(exc, estimate, call) from None
        except BaseException:
            if self.limits:
                self.limits.done(ticket)
            raise
        t0 = time.monotonic()
        self.running.add(cancel)
        outcome = None
        try:
            outcome = await self._try_channels(call, channels, sink, face, cancel)
        except Exception as exc:  # never leave a reservation open
            if not isinstance(exc, RelayError):
                log_bug(log, f"the relay of {call.request_id}", exc)
            outcome = Outcome(error=exc if isinstance(exc, RelayError) else RelayError(
                500, "Internal error.", "server_error", "internal_error"))
        finally:
            if outcome is None:  # cancelled: settled as what was delivered
                outcome = Outcome()
            self.running.discard(cancel)
            if self.limits:
                self.limits.done(ticket, outcome.usage)
            # Billed at the price of the channel that answered, in the tier it ran.
            price = prices.get(getattr(outcome.channel, "id", None), price)
            try:
                price = self._ran_in(auth, call, outcome, tier, price)
                await self._settle(call, auth, price, res, outcome, t0, cancel)
            except Exception as exc:  # the reservation is charged, never left open
                log_bug(log, f"settling {call.request_id}", exc)
                await self._settle_failed(call, auth, res, outcome, t0, exc)
        return outcome

    @property
    def inflight(self) -> int:
        return len(self.running)

    def cancel_running(self) -> None:
        """Stop every call in flight (shutdown, past the grace period): each
        is settled as what it delivered while billing can still take it."""
        for cancel in list(self.running):
            cancel.cancelled = True

    async def _try_channels(self, call, channels, sink, face, cancel) -> Outcome:
        last = None
        for channel in channels[: self.settings.retries + 1]:
            if cancel.cancelled:
                break
            began = time.monotonic()
            out = await self._attempt(call, channel, sink, face, cancel)
            if out.error is None:
                self.scheduler.success(channel)
                if self.sessions is not None:
                    self.sessions.served(call, channel)
                return out
            if out.started or cancel.cancelled or out.error.code == "relay_overloaded":
                return out  # our own limit: another channel would meet it too
            if out.error.status in (502, 503, 504, 524, 429) or retryable(out.status or 0):
                self.scheduler.failure(channel, out.error.message, began)
                last = out
                continue
            return out
        return last or Outcome(error=RelayError(503, "No channel answered.",
                                                "service_unavailable", "model_not_available"))

    async def _attempt(self, call, channel, sink, face, cancel) -> Outcome:
        """One channel, healed: a refusal that names what the channel does
        not take (its API, a beta, a field) is learnt and the call sent
        again without it, on the same channel (relay/compat)."""
        compat, tried, done = self.compat, [], []
        while True:
            seen = compat.view(channel) if compat is not None else channel
            call.upstream_model = seen.upstream_model(call.model)
            adaptor = registry.adaptor_for(seen.type)
            fixes = (compat.fixes_for(seen.id, call.upstream_model)
                     + [f for f in done if f.kind in rules.ONCE]) if compat is not None else ()
            adjust = (lambda req, f=fixes: rules.apply(req, f)) if fixes else None
            cancel.drain = (self.settings.stream_drain_seconds,
                            self.settings.stream_drain_mb * 1024 * 1024) \
                if call.stream and hides_reasoning(call) else None
            out = await self._send(call, seen, adaptor, sink, face, cancel, adjust)
            out.channel = channel
            if compat is None:
                return out
            if tried:
                wrong = compat.refuted(tried, out)
                compat.unlearn(channel.id, call.upstream_model, wrong)
                compat.keep(channel.id, call.upstream_model, [f for f in tried if f not in wrong])
            if out.error is None or out.started or cancel.cancelled or len(done) >= MAX_HEALS:
                return out
            tried = [f for f in compat.diagnose(call, seen, out) if f not in done]
            if not tried:
                return out
            compat.learn(channel, call.upstream_model, tried)
            done += tried

    async def _send(self, call, channel, adaptor, sink, face, cancel, adjust) -> Outcome:
        """One request to one channel; a connect that failed (it sent
        nothing) is tried again, CONNECT_RETRIES times with a short backoff."""
        for again in range(CONNECT_RETRIES + 1):
            if call.stream:
                out = await attempt_stream(self.upstream, call, channel, adaptor, sink, face,
                                           cancel, adjust)
            else:
                out = await attempt_plain(self.upstream, call, channel, adaptor, cancel, adjust)
            if (out.error is None or out.started or cancel.cancelled or again == CONNECT_RETRIES
                    or out.error.code != "upstream_unreachable"):
                return out
            await asyncio.sleep(CONNECT_BACKOFF * 2 ** again * random.uniform(0.5, 1.5))
        return out


def over_balance(exc: QuotaExhausted, estimate: int, call: Call) -> RelayError:
    """The 403 for a call whose worst case is more than the balance holds."""
    who = "API key" if exc.kind == TOKEN else "account"
    what = ("max_tokens (or the model's output limit when none is given), n and the size "
            "of the input" if call.endpoint in CHAT_LIKE else "what it asks for")
    return RelayError(403, f"This call could cost up to {estimate} quota units, more than "
                           f"the {who}'s balance allows; it was not sent. The bound comes from "
                           f"{what}: lower it, or top up.", "insufficient_quota", exc.code)


def _count_inputs(value, model: str) -> int:
    """Tokens of a prompt or input given as text, texts, token ids, or
    lists of token ids (legacy completions, embeddings)."""
    if isinstance(value, str):
        return tokenizer.count_text(value, model)
    if isinstance(value, list):
        if all(isinstance(i, int) for i in value):
            return len(value)
        return sum(_count_inputs(i, model) for i in value if isinstance(i, (str, list)))
    return 0


__all__ = ["RelayService", "Auth", "Outcome", "Sink", "QuotaExhausted"]
