"""The Midjourney-proxy protocol end to end: HTTP client -> relay -> a fake
midjourney-proxy on a socket; the relay's background poller follows tasks.

Prices: the per-call price of an action is the price of "mj_<action>"."""
from __future__ import annotations

import time

import pytest
import requests

from tests.fakes.media_upstream import PNG_1PX
from tests.fakes.mj_upstream import FakeMidjourney
from tests.helpers import Api, RelayProcess
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

MODELS = ["mj_imagine", "mj_relax_imagine", "mj_upscale", "mj_variation", "mj_reroll",
          "mj_describe", "mj_blend", "mj_shorten", "mj_inpaint", "mj_modal"]
PRICES = {"mj_imagine": "0.05", "mj_relax_imagine": "0.02", "mj_upscale": "0.01",
          "mj_variation": "0.03", "mj_reroll": "0.04", "mj_describe": "0.006",
          "mj_blend": "0.07", "mj_shorten": "0.002", "mj_inpaint": "0.08", "mj_modal": "0.001"}
IMG = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    proc = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("mjrelay")),
                        env={"RELAY_MJ_POLL_INTERVAL": "0.2",
                             "RELAY_MJ_TASK_TIMEOUT": "4"}).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def admin(relay):
    return Api.login(relay.url)


@pytest.fixture(scope="module")
def fake():
    f = FakeMidjourney().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, MODELS, name="mj", type="midjourney", key=fake.secret)
    for model, price in PRICES.items():
        admin.set_price(model, call_price=price)
    return relay


def units(model: str) -> int:
    return int(round(float(PRICES[model]) * 500_000))


def mj(relay, t: Tenant, path: str, body=None, method="POST", bearer=False, expect=200):
    h = {"Authorization": f"Bearer {t.key}"} if bearer else {"mj-api-secret": t.key}
    r = requests.request(method, relay.url + path, json=body, headers=h)
    assert r.status_code == expect, f"{path} -> {r.status_code} {r.text}"
    return r.json()


def wait_status(relay, t, task_id, statuses=("SUCCESS", "FAILURE"), timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        task = mj(relay, t, f"/mj/task/{task_id}/fetch", method="GET")
        if task["status"] in statuses or time.monotonic() > deadline:
            return task
        time.sleep(0.1)


def wait_refund(t: Tenant, before, timeout=15.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        spent = t.spent_since(before)
        if spent == 0 or time.monotonic() > deadline:
            return spent
        time.sleep(0.1)


def test_imagine_polls_to_success_and_bills_once(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    reply = mj(setup, t, "/mj/submit/imagine", {"prompt": "a cat in space", "state": "s1"})
    assert reply["code"] == 1 and reply["result"] and isinstance(reply["properties"], dict)
    task_id = reply["result"]
    assert task_id not in fake.tasks  # our id, not the upstream's
    first = mj(setup, t, f"/mj/task/{task_id}/fetch", method="GET")
    assert first["id"] == task_id and first["action"] == "IMAGINE"
    assert first["status"] in ("NOT_START", "SUBMITTED", "IN_PROGRESS", "SUCCESS")
    assert first["state"] == "s1" and first["submitTime"] > 0
    done = wait_status(setup, t, task_id)
    assert done["status"] == "SUCCESS" and done["progress"] == "100%"
    assert done["imageUrl"].startswith(fake.url) and done["finishTime"] > 0
    assert [b["label"] for b in done["buttons"]][:4] == ["U1", "U2", "U3", "U4"]
    assert done["prompt"] == "a cat in space"
    # Our fetches are answered from our store: the upstream saw only the poller.
    reads_before = fake.reads("/fetch")
    for _ in range(5):
        mj(setup, t, f"/mj/task/{task_id}/fetch", method="GET")
    assert fake.reads("/fetch") == reads_before == 0
    assert fake.reads("/list-by-condition") >= 3
    sent = [c for c in fake.calls if c["path"] == "/mj/submit/imagine"][-1]
    assert sent["headers"]["Mj-Api-Secret"] == fake.secret
    time.sleep(0.5)  # a few more polls must not charge or refund anything
    assert t.spent_since(before) == units("mj_imagine")
    rec = t.logs(1, model="mj_imagine")[0]
    assert rec["quota"] == units("mj_imagine") and rec["endpoint"] == "mj_submit"


def test_failed_task_is_refunded(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    reply = mj(setup, t, "/mj/submit/imagine", {"prompt": "please FAIL"}, bearer=True)
    assert reply["code"] == 1
    assert t.spent_since(before) == units("mj_imagine")
    done = wait_status(setup, t, reply["result"])
    assert done["status"] == "FAILURE" and "fake" in done["failReason"]
    assert wait_refund(t, before) == 0
    logs = t.logs(2)
    quotas = sorted(x["quota"] for x in logs)
    assert quotas == [-units("mj_imagine"), units("mj_imagine")]
    time.sleep(0.6)  # further polls do not refund twice
    assert t.spent_since(before) == 0


def test_other_users_task_is_not_found(setup, admin):
    owner, other = Tenant(admin, setup.url), Tenant(admin, setup.url)
    task_id = mj(setup, owner, "/mj/submit/imagine", {"prompt": "mine"})["result"]
    err = mj(setup, other, f"/mj/task/{task_id}/fetch", method="GET", expect=404)
    assert err["code"] == 3 and "request id" in err["description"]
    assert mj(setup, other, "/mj/task/list-by-condition", {"ids": [task_id]}) == []
    assert [x["id"] for x in mj(setup, owner, "/mj/task/list-by-condition",
                                {"ids": [task_id, "123"]})] == [task_id]
    mj(setup, other, f"/mj/task/{task_id}/image-seed", method="GET", expect=404)
    before = other.balances()
    err = mj(setup, other, "/mj/submit/change",
             {"taskId": task_id, "action": "UPSCALE", "index": 1}, expect=404)
    assert err["code"] == 3
    assert other.spent_since(before) == 0


def test_change_and_simple_change_use_the_upstream_id_and_channel(setup, admin, fake):
    t = Tenant(admin, setup.url)
    task_id = mj(setup, t, "/submit/imagine", {"prompt": "a dog"})["result"]  # no /mj prefix
    assert wait_status(setup, t, task_id)["status"] == "SUCCESS"
    upstream_id = [c for c in fake.calls if c["path"] == "/mj/submit/imagine"]
    before = t.balances()
    up = mj(setup, t, "/mj/submit/change", {"taskId": task_id, "action": "UPSCALE", "index": 2})
    assert up["code"] == 1
    sent = [c for c in fake.calls if c["path"] == "/mj/submit/change"][-1]["body"]
    assert sent["taskId"] in fake.tasks and sent["taskId"] != task_id
    assert upstream_id
    var = mj(setup, t, "/mj/submit/simple-change", {"content": f"{task_id} V3"})
    assert var["code"] == 1
    sent = [c for c in fake.calls if c["path"] == "/mj/submit/simple-change"][-1]["body"]
    assert sent["content"].endswith(" V3") and sent["content"].split()[0] in fake.tasks
    assert t.spent_since(before) == units("mj_upscale") + units("mj_variation")
    assert wait_status(setup, t, up["result"])["action"] == "UPSCALE"


def test_mode_prefix_uses_the_mode_price(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    reply = mj(setup, t, "/mj-relax/mj/submit/imagine", {"prompt": "slow and cheap"})
    assert reply["code"] == 1
    assert t.spent_since(before) == units("mj_relax_imagine")
    sent = [c for c in fake.calls if c["path"] == "/mj/submit/imagine"][-1]["body"]
    assert sent["accountFilter"]["modes"] == ["RELAX"]
    before = t.balances()
    mj(setup, t, "/mj-turbo/submit/imagine", {"prompt": "no turbo price: base price"})
    assert t.spent_since(before) == units("mj_imagine")


def test_refusals_cost_nothing(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    banned = mj(setup, t, "/mj/submit/imagine", {"prompt": "BANNED words"})
    assert banned["code"] == 24 and banned["result"] is None
    full = mj(setup, t, "/mj/submit/imagine", {"prompt": "QUEUE_FULL now"})
    assert full["code"] == 23
    assert t.spent_since(before) == 0
    queued = mj(setup, t, "/mj/submit/imagine", {"prompt": "QUEUED please"})
    assert queued["code"] == 22 and queued["result"]
    assert t.spent_since(before) == units("mj_imagine")


@pytest.mark.parametrize("path,body,param", [
    ("/mj/submit/imagine", {}, "prompt"),
    ("/mj/submit/describe", {"base64": "not a data url"}, "base64"),
    ("/mj/submit/blend", {"base64Array": [IMG]}, "base64Array"),
    ("/mj/submit/change", {"taskId": "1", "action": "UPSCALE", "index": 1}, None),
    ("/mj/submit/simple-change", {"content": "nonsense"}, "content"),
    ("/mj/submit/action", {"taskId": "1"}, None),
])
def test_bad_submits_are_refused_free(setup, admin, path, body, param):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + path, json=body, headers={"mj-api-secret": t.key})
    assert r.status_code in (400, 404), r.text
    doc = r.json()
    assert doc["code"] in (3, 4) and doc["result"] is None
    if param:
        assert r.status_code == 400
    assert t.spent_since(before) == 0


def test_no_key_is_401_in_mj_shape(setup):
    r = requests.post(setup.url + "/mj/submit/imagine", json={"prompt": "x"})
    assert r.status_code == 401
    assert r.json()["code"] == 4 and "API key" in r.json()["description"]


def test_describe_blend_shorten_billing(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    assert mj(setup, t, "/mj/submit/describe", {"base64": IMG})["code"] == 1
    assert mj(setup, t, "/mj/submit/blend", {"base64Array": [IMG, IMG],
                                              "dimensions": "SQUARE"})["code"] == 1
    assert mj(setup, t, "/mj/submit/shorten", {"prompt": "a very long prompt"})["code"] == 1
    assert t.spent_since(before) == (units("mj_describe") + units("mj_blend")
                                     + units("mj_shorten"))


def test_action_modal_seed_and_image(setup, admin, fake):
    t = Tenant(admin, setup.url)
    task_id = mj(setup, t, "/mj/submit/imagine", {"prompt": "a castle"})["result"]
    done = wait_status(setup, t, task_id)
    assert done["status"] == "SUCCESS"
    seed = mj(setup, t, f"/mj/task/{task_id}/image-seed", method="GET")
    assert seed["code"] == 1 and seed["result"].isdigit()
    img = requests.get(setup.url + f"/mj/image/{task_id}", headers={"mj-api-secret": t.key})
    assert img.status_code == 200 and img.content == PNG_1PX
    assert img.headers["Content-Type"] == "image/png"
    before = t.balances()
    u1 = [b for b in done["buttons"] if b["label"] == "U1"][0]["customId"]
    act = mj(setup, t, "/mj/submit/action", {"taskId": task_id, "customId": u1})
    assert act["code"] == 1
    assert t.spent_since(before) == units("mj_upscale")
    inpaint = [b for b in done["buttons"] if "Inpaint" in b["customId"]][0]["customId"]
    before = t.balances()
    wait = mj(setup, t, "/mj/submit/action", {"taskId": task_id, "customId": inpaint})
    assert wait["code"] == 21 and wait["properties"]["status"] == "MODAL"
    assert mj(setup, t, f"/mj/task/{wait['result']}/fetch", method="GET")["status"] == "MODAL"
    modal = mj(setup, t, "/mj/submit/modal", {"taskId": wait["result"], "prompt": "a flag",
                                              "maskBase64": IMG})
    assert modal["code"] == 1 and modal["result"] == wait["result"]
    assert t.spent_since(before) == units("mj_inpaint") + units("mj_modal")
    assert wait_status(setup, t, wait["result"])["status"] == "SUCCESS"


def test_task_lost_by_the_upstream_times_out_and_is_refunded(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    task_id = mj(setup, t, "/mj/submit/imagine", {"prompt": "lost"})["result"]
    upstream_id = [c for c in fake.calls if c["path"] == "/mj/submit/imagine"][-1]
    assert upstream_id
    fake.tasks.clear()  # the upstream restarted and forgot everything
    done = wait_status(setup, t, task_id, timeout=30)
    assert done["status"] == "FAILURE" and "in time" in done["failReason"]
    assert wait_refund(t, before) == 0


def test_upstream_without_list_by_condition_is_fetched_per_task(setup, admin, fake):
    t = Tenant(admin, setup.url)
    fake.no_list = True
    try:
        task_id = mj(setup, t, "/mj/submit/imagine", {"prompt": "old proxy"})["result"]
        assert wait_status(setup, t, task_id)["status"] == "SUCCESS"
        assert fake.reads("/fetch") >= 3
    finally:
        fake.no_list = False
