"""Issue 30's property: for random request shapes within the APIs'
documented limits (n, max_tokens, stream, prompt size, and what the upstream
reports within them), a limited key never ends below zero, no call is
answered unpaid, and every answered call has a record whose cost is the
price of the usage the fake reported, or, when the fake reports none (a
stream cut before its usage), of the stated estimate: the prompt counted
offline and the text streamed."""
from __future__ import annotations

import time
from decimal import ROUND_HALF_UP, Decimal
from itertools import cycle

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.money import price_catalogue, tokenizer
from tests.helpers import Api, RelayProcess, eventually
from tests.tenant import Tenant

MODEL, CUT = "prop-model", "prop-cut"
# $1 per million in, $8 out: 0.5 and 4 units a token.


def units(prompt: int, completion: int) -> int:
    usd = (Decimal(prompt) * 1 + Decimal(completion) * 8) / 1_000_000
    got = int((usd * 500_000).to_integral_value(rounding=ROUND_HALF_UP))
    return max(got, 1) if usd > 0 else 0


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL], name="prop")
    admin.create_channel(fake.mode_url("reset"), [CUT], name="prop-reset")
    for m in (MODEL, CUT):
        admin.set_price(m, input_price="1", output_price="8")
    return relay


shapes = st.fixed_dictionaries({
    "model": st.sampled_from([MODEL, MODEL, CUT]),
    "n": st.integers(1, 8),
    "max_tokens": st.one_of(st.none(), st.integers(1, 6000)),
    "stream": st.booleans(),
    "words": st.integers(1, 400),
    "share": st.sampled_from([0.0, 0.3, 1.0]),   # how much of its bound the upstream uses
})


@pytest.mark.slow
def test_random_calls_never_overdraw_and_are_billed_what_was_reported(setup, admin):
    # Small enough that the calls run it down: the bound, not luck, keeps it paid.
    t = Tenant(admin, setup.url, key_quota=150_000)
    check_property(t, cycle([setup.url]), 150_000)


@pytest.mark.slow
def test_the_property_holds_on_three_relays_sharing_a_database(fake, mongo_url, tmp_path):
    """The same calls spread over three relays on one database, service
    tiers among them (gpt-5, priced by the catalogue at the tier it ran)."""
    relays = []
    try:
        a = RelayProcess(mongo_url, str(tmp_path / "a")).start()
        relays.append(a)
        for name in ("b", "c"):
            relays.append(RelayProcess(mongo_url, str(tmp_path / name), db_name=a.db_name).start())
        admin = Api.login(a.url)
        admin.create_channel(fake.url, [MODEL, "gpt-5"], name="prop")
        admin.create_channel(fake.mode_url("reset"), [CUT], name="prop-reset")
        for m in (MODEL, CUT):
            admin.set_price(m, input_price="1", output_price="8")
        t = Tenant(admin, a.url, key_quota=900_000)
        for r in relays:
            eventually(lambda r=r: _knows_channels(r.url, t.key), timeout=10)
        check_property(t, cycle([r.url for r in relays]), 900_000, tiers=True)
    finally:
        for r in relays:
            r.stop()


def _knows_channels(url, key):
    got = requests.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    assert {m["id"] for m in got["data"]} == {MODEL, CUT, "gpt-5"}


def tier_units(tier: str, prompt: int, completion: int) -> int:
    p = price_catalogue.lookup("openai", "gpt-5", tier)
    usd = (p.input_price * prompt + p.output_price * completion) / 1_000_000
    got = int((usd * 500_000).to_integral_value(rounding=ROUND_HALF_UP))
    return max(got, 1) if usd > 0 else 0


def check_property(t: Tenant, urls, quota: int, tiers: bool = False) -> None:
    seen: list[tuple[str, dict]] = []
    tier_choice = st.sampled_from(["", "", "flex", "priority"]) if tiers else st.just("")

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(shapes, tier_choice)
    def one(shape, tier):
        text = "word " * shape["words"]
        body = {"model": shape["model"], "n": shape["n"], "stream": shape["stream"],
                "messages": [{"role": "user", "content": text}], "fake_chunks": 4}
        if tier:
            body.update(model="gpt-5", service_tier=tier)
        if shape["max_tokens"] is not None:
            body["max_tokens"] = shape["max_tokens"]
        # What the upstream reports stays within what was asked: the prompt
        # is at most its bytes, the output at most max_tokens (4,096 by
        # default here: the model's limit is unknown) for each choice.
        cap = (shape["max_tokens"] or 4096) * shape["n"]
        body["fake_usage"] = {"prompt_tokens": max(1, int(len(text) * shape["share"])),
                              "completion_tokens": max(1, int(cap * shape["share"]))}
        r = requests.post(next(urls) + "/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {t.key}"})
        assert r.status_code in (200, 403), r.text
        if r.status_code == 200:
            if shape["stream"]:
                r.content
            seen.append((r.headers["X-Request-Id"], body))
        remain = t.balances()[2]
        assert remain >= 0

    one()
    assert seen, "no call was answered"
    time.sleep(1.0)   # the records are flushed in batches
    records = {}
    for page in range(1, 5):
        items = t.api.get(f"/api/log/self?size=100&p={page}")["data"]["items"]
        records.update({i["request_id"]: i for i in items})
        if len(items) < 100:
            break
    for rid, body in seen:
        rec = records[rid]
        assert rec["unpaid"] == 0 and rec["quota"] == rec["cost"], rec
        if not rec["estimated"]:
            assert (rec["prompt_tokens"], rec["completion_tokens"]) == (
                body["fake_usage"]["prompt_tokens"], body["fake_usage"]["completion_tokens"])
        else:   # cut before the usage: the prompt as counted, and what was streamed
            assert body["model"] == CUT and body["stream"]
            assert rec["prompt_tokens"] == tokenizer.count_messages(body["messages"], CUT)
        if body.get("service_tier"):
            assert rec["cost"] == tier_units(body["service_tier"], rec["prompt_tokens"],
                                             rec["completion_tokens"]), rec
        else:
            assert rec["cost"] == units(rec["prompt_tokens"], rec["completion_tokens"]), rec
    _, _, remain, used = t.balances()
    assert remain >= 0 and remain + used == quota
