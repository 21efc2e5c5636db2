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

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.money import tokenizer
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
    "share": st.floats(0, 1),       # how much of its bound the upstream uses
})


@pytest.mark.slow
def test_random_calls_never_overdraw_and_are_billed_what_was_reported(setup, admin):
    t = Tenant(admin, setup.url, key_quota=600_000)
    seen: list[tuple[str, dict]] = []

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(shapes)
    def one(shape):
        text = "word " * shape["words"]
        body = {"model": shape["model"], "n": shape["n"], "stream": shape["stream"],
                "messages": [{"role": "user", "content": text}], "fake_chunks": 4}
        if shape["max_tokens"] is not None:
            body["max_tokens"] = shape["max_tokens"]
        # What the upstream reports stays within what was asked: the prompt
        # is at most its bytes, the output at most max_tokens (4,096 by
        # default here: the model's limit is unknown) for each choice.
        cap = (shape["max_tokens"] or 4096) * shape["n"]
        body["fake_usage"] = {"prompt_tokens": max(1, int(len(text) * shape["share"])),
                              "completion_tokens": max(1, int(cap * shape["share"]))}
        r = requests.post(setup.url + "/v1/chat/completions", json=body, timeout=60,
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
        assert rec["cost"] == units(rec["prompt_tokens"], rec["completion_tokens"]), rec
    _, _, remain, used = t.balances()
    assert remain >= 0 and remain + used == 600_000
