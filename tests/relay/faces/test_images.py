"""Image generation end to end: the official openai SDK -> relay -> a fake
OpenAI upstream on a socket; every call's charge checked to the unit."""
from __future__ import annotations

import base64

import openai
import pytest
import requests

from tests.fakes.media_upstream import PNG_1PX, FakeMedia
from tests.tenant import Tenant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake():
    f = FakeMedia().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, ["dall-e-3", "dall-e-2", "gpt-image-1", "img-alias"],
                         name="media", model_mapping={"img-alias": "dall-e-3"})
    # dall-e: USD per image; gpt-image-1: USD per million tokens (it reports usage).
    admin.set_price("dall-e-3", call_price="0.04")
    admin.set_price("dall-e-2", call_price="0.018")
    admin.set_price("img-alias", call_price="0.05")
    admin.set_price("gpt-image-1", input_price="5", output_price="40")
    return relay


def client(relay, key):
    return openai.OpenAI(api_key=key, base_url=relay.url + "/v1", max_retries=0)


def test_images_url_billed_per_image(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.generate(model="dall-e-3", prompt="a red fox", n=2,
                                               size="1024x1024", quality="standard",
                                               response_format="url")
    assert len(res.data) == 2
    assert all(d.url.startswith(fake.url) for d in res.data)
    # 2 images x 0.04 USD x 500,000 units/USD
    assert t.spent_since(before) == 40_000
    sent = [r for r in fake.requests if r["path"].endswith("/images/generations")][-1]["body"]
    assert sent["n"] == 2 and sent["size"] == "1024x1024" and sent["quality"] == "standard"
    log = [x for x in t.logs(1, model="dall-e-3")]
    assert log[0]["units"] == 2 and log[0]["quota"] == 40_000 and log[0]["status"] == 200


def test_images_b64_json_default_n_and_model_mapping(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.generate(model="img-alias", prompt="a blue whale",
                                               response_format="b64_json")
    assert len(res.data) == 1
    assert base64.b64decode(res.data[0].b64_json) == PNG_1PX
    assert t.spent_since(before) == 25_000  # one image at 0.05 USD
    sent = [r for r in fake.requests if r["path"].endswith("/images/generations")][-1]["body"]
    assert sent["model"] == "dall-e-3"


def test_images_default_model_is_dalle2(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/images/generations", json={"prompt": "a cat", "n": 3},
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 3
    assert t.spent_since(before) == 27_000  # 3 x 0.018 USD


def test_images_billed_by_tokens_when_upstream_reports_usage(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.generate(model="gpt-image-1", prompt="a lighthouse", n=2)
    assert len(res.data) == 2 and res.usage.output_tokens == 2000
    # (50 x 5 + 2000 x 40) / 1e6 USD = 0.08025 USD = 40,125 units
    assert t.spent_since(before) == 40_125


@pytest.mark.parametrize("body,param", [
    ({"model": "dall-e-3"}, "prompt"),
    ({"model": "dall-e-3", "prompt": "x", "n": 0}, "n"),
    ({"model": "dall-e-3", "prompt": "x", "n": 11}, "n"),
    ({"model": "dall-e-3", "prompt": "x", "n": 1.5}, "n"),
    ({"model": "dall-e-3", "prompt": "x", "response_format": "png"}, "response_format"),
    ({"model": "dall-e-3", "prompt": "x", "size": 1024}, "size"),
])
def test_images_bad_input_is_400_and_free(setup, admin, body, param):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/images/generations", json=body,
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "request id" in err["message"]
    assert t.spent_since(before) == 0


def test_images_rejected_upstream_costs_nothing(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    with pytest.raises(openai.BadRequestError) as ei:
        client(setup, t.key).images.generate(model="dall-e-3", prompt="FORBIDDEN_WORD", n=1)
    assert "safety" in str(ei.value)
    assert t.spent_since(before) == 0


def test_images_quota_too_small_is_refused(setup, admin):
    t = Tenant(admin, setup.url, key_quota=30_000)
    before = t.balances()
    with pytest.raises(openai.PermissionDeniedError) as ei:
        client(setup, t.key).images.generate(model="dall-e-3", prompt="a fox", n=2)
    assert "quota" in str(ei.value)
    assert t.spent_since(before) == 0
