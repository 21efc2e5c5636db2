"""Groups a user may choose (new-api's "usable groups"): the admin decides,
per user group or per user; a key in a group its owner may not use is
refused at creation and at call time."""
import uuid

import pytest
import requests

from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import USER_PASSWORD, Api

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def w(relay, admin):
    fake = FakeOpenAI().start()
    admin.post("/api/group/", {"name": "cheap", "rate": "0.1"})
    admin.create_channel(fake.url, [MODEL], groups=["default", "cheap", "vip"])
    admin.set_price(MODEL, input_price=1, output_price=2)
    yield {"admin": admin, "url": relay.url}
    fake.stop()


def user(w):
    name = "g" + uuid.uuid4().hex[:8]
    u = w["admin"].create_user(name, quota=10_000_000)
    return u, Api.login(w["url"], name, USER_PASSWORD)


def chat(w, key):
    return requests.post(w["url"] + "/v1/chat/completions",
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


def test_seeded_groups_keep_their_choice_but_not_cheaper_ones(w):
    groups = {g["name"]: g for g in w["admin"].get("/api/group/")["data"]}
    # A group's rate is its lowest (rate rules included): svip 0.8, vvip down to
    # 0.6 for long texts and vip down to 0.8 with volume are all cheaper than default.
    assert groups["default"]["usable_groups"] == ["origin"]
    assert "default" in groups["vip"]["usable_groups"]   # dearer than vip at its lowest
    assert set(groups["svip"]["usable_groups"]) == {"default", "origin", "vip"}
    assert "vvip" not in groups["vip"]["usable_groups"]  # cheaper than vip
    assert groups["cheap"]["usable_groups"] == []  # made after: the admin decides
    _, api = user(w)
    mine = [g["name"] for g in api.get("/api/group/")["data"]]
    assert "origin" in mine and "vip" not in mine and "cheap" not in mine
    assert api.create_token(name="v", remain_quota=1000, group="origin")["group"] == "origin"


def test_a_cheaper_group_is_refused_at_creation(w):
    _, api = user(w)
    r = api.post("/api/token/", {"name": "c", "group": "cheap"}, expect=403)
    assert "cheap" in r["message"]
    t = api.create_token(name="d", remain_quota=1000)
    api.put("/api/token/", {"id": t["id"], "group": "cheap"}, expect=403)


def test_per_user_grant_and_call_time_check(w):
    u, api = user(w)
    w["admin"].put("/api/user/", {"id": u["id"], "usable_groups": ["cheap"]})
    assert "cheap" in [g["name"] for g in api.get("/api/group/")["data"]]
    tok = api.create_token(name="c", remain_quota=1_000_000, group="cheap")
    assert chat(w, tok["key"]).status_code == 200
    # The admin takes it back: the existing key stops at the next call.
    w["admin"].put("/api/user/", {"id": u["id"], "usable_groups": None})
    r = chat(w, tok["key"])
    assert r.status_code == 403 and r.json()["error"]["code"] == "group_not_usable"


def test_per_user_group_grant(w):
    _, api = user(w)
    admin = w["admin"]
    before = next(g for g in admin.get("/api/group/")["data"] if g["name"] == "default")
    admin.put("/api/group/", {"name": "default",
                              "usable_groups": before["usable_groups"] + ["cheap"]})
    try:
        tok = api.create_token(name="c", remain_quota=1_000_000, group="cheap")
        assert chat(w, tok["key"]).status_code == 200
    finally:
        admin.put("/api/group/", {"name": "default", "usable_groups": before["usable_groups"]})
    assert chat(w, tok["key"]).status_code == 403


def test_admin_cannot_move_a_users_key_to_a_group_the_user_may_not_use(w):
    _, api = user(w)
    tok = api.create_token(name="d", remain_quota=1000)
    w["admin"].put("/api/token/", {"id": tok["id"], "group": "cheap"}, expect=403)


def test_unknown_usable_group_is_refused(w):
    w["admin"].put("/api/group/", {"name": "default", "usable_groups": ["nope"]}, expect=400)
