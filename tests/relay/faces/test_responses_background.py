"""Issue 30, case 2: a Responses `background: true` call was billed the
prompt estimate while the finished response (fetched later by id) was free.
The relay refuses `background` with a 400 naming the field, before anything
is reserved or sent: it bills from the answer it relays (README, Money)."""
from __future__ import annotations

import pytest
import requests

from tests.tenant import Tenant


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, ["o3"], name="responses")
    admin.set_price("o3", input_price="2", output_price="8")
    return relay


@pytest.mark.parametrize("stream", [False, True])
def test_background_is_refused_naming_the_field(setup, admin, fake, stream):
    t = Tenant(admin, setup.url)
    before, sent = t.balances(), len(fake.requests)
    r = requests.post(setup.url + "/v1/responses", timeout=30,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "o3", "input": "Think for a long time.", "background": True,
                            "stream": stream})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "background" and err["code"] == "unsupported_value"
    assert len(fake.requests) == sent and t.balances() == before


def test_background_false_is_an_ordinary_call(setup, admin):
    t = Tenant(admin, setup.url)
    r = requests.post(setup.url + "/v1/responses", timeout=30,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "o3", "input": "hi", "background": False})
    assert r.status_code == 200, r.text
    assert t.logs(1)[0]["quota"] > 0
