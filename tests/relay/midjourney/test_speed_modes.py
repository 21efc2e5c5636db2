"""Issue 30, case 5: the Midjourney speed mode sent upstream is the mode
billed.  A mode route (/mj-relax, ...) overwrites accountFilter.modes and
refuses a prompt flag naming another mode; without one, the mode the body
names is billed at that mode's price.  Real relay, the fake
midjourney-proxy on a socket (tests/fakes/mj_upstream.py)."""
from __future__ import annotations

import pytest
import requests

from tests.fakes.mj_upstream import FakeMidjourney
from tests.tenant import Tenant

PRICES = {"mj_imagine": "0.04", "mj_relax_imagine": "0.02", "mj_turbo_imagine": "0.1"}
RELAX, BASE, TURBO = 10_000, 20_000, 50_000   # units


@pytest.fixture(scope="module")
def fake():
    f = FakeMidjourney().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, list(PRICES), name="mj", type="midjourney", key=fake.secret)
    for model, price in PRICES.items():
        admin.set_price(model, call_price=price)
    return relay


def submit(relay, t, path, body):
    return requests.post(relay.url + path, json=body, headers={"mj-api-secret": t.key},
                         timeout=30)


def sent(fake) -> dict:
    return [c for c in fake.calls if c["path"] == "/mj/submit/imagine"][-1]["body"]


def test_the_path_mode_overwrites_account_filter_modes(setup, admin, fake):
    """The issue's case: /mj-relax with accountFilter.modes ["TURBO"] was
    billed 10,000 and run as TURBO (50,000)."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = submit(setup, t, "/mj-relax/mj/submit/imagine",
               {"prompt": "a cat", "accountFilter": {"modes": ["TURBO"], "remark": "x"}})
    assert r.status_code == 200 and r.json()["code"] == 1, r.text
    assert sent(fake)["accountFilter"] == {"modes": ["RELAX"], "remark": "x"}
    assert t.spent_since(before) == RELAX


@pytest.mark.parametrize("flag", ["--turbo", "--fast", "--TURBO"])
def test_a_prompt_flag_against_the_path_is_a_400(setup, admin, fake, flag):
    t = Tenant(admin, setup.url)
    before, calls = t.balances(), len(fake.calls)
    r = submit(setup, t, "/mj-relax/submit/imagine", {"prompt": f"a cat {flag} --ar 2:3"})
    assert r.status_code == 400
    assert r.json()["code"] == 4 and flag.lower() in r.json()["description"]
    assert len(fake.calls) == calls and t.balances() == before


def test_a_prompt_flag_that_agrees_with_the_path_is_fine(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = submit(setup, t, "/mj-relax/submit/imagine", {"prompt": "a cat --relax"})
    assert r.status_code == 200 and r.json()["code"] == 1
    assert t.spent_since(before) == RELAX


@pytest.mark.parametrize("body", [{"prompt": "a cat --turbo"},
                                  {"prompt": "a cat", "accountFilter": {"modes": ["TURBO"]}}])
def test_without_a_mode_route_the_mode_the_body_names_is_billed(setup, admin, fake, body):
    """A --turbo in the prompt (or accountFilter) on /mj passed at the base
    price before; now it is billed, and sent, as turbo."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = submit(setup, t, "/mj/submit/imagine", body)
    assert r.status_code == 200 and r.json()["code"] == 1, r.text
    assert sent(fake)["accountFilter"]["modes"] == ["TURBO"]
    assert t.spent_since(before) == TURBO


def test_no_mode_named_is_the_base_price(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = submit(setup, t, "/mj/submit/imagine", {"prompt": "a cat --ar 16:9"})
    assert r.status_code == 200
    assert "accountFilter" not in sent(fake)
    assert t.spent_since(before) == BASE


@pytest.mark.parametrize("body,says", [
    ({"prompt": "a cat --fast", "accountFilter": {"modes": ["RELAX"]}}, "more than one"),
    ({"prompt": "a cat --fast --turbo"}, "more than one"),
    ({"prompt": "a cat", "accountFilter": {"modes": ["RELAX", "FAST"]}}, "more than one"),
    ({"prompt": "a cat", "accountFilter": {"modes": ["WARP"]}}, "accountFilter.modes"),
])
def test_two_modes_named_are_a_400(setup, admin, fake, body, says):
    t = Tenant(admin, setup.url)
    before, calls = t.balances(), len(fake.calls)
    r = submit(setup, t, "/mj/submit/imagine", body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == 4 and says in r.json()["description"]
    assert len(fake.calls) == calls and t.balances() == before
