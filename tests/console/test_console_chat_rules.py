"""The built-in chat's rules for what a person may type: base addresses
(and which hosts may be called at all), messages and images."""
from __future__ import annotations

import pytest

from console.chat import ChatError, check_allowed, clean_messages, normalise_base
from console.status import clean_addresses


@pytest.mark.parametrize("typed,kind,root,mode", [
    ("http://h:3000", "chat", "http://h:3000", "openai"),
    ("http://h:3000/", "chat", "http://h:3000", "openai"),
    ("http://h:3000/v1", "chat", "http://h:3000", "openai"),
    ("http://h:3000/v1/", "chat", "http://h:3000", "openai"),
    ("http://h:3000/v1/chat/completions", "chat", "http://h:3000", "openai"),
    ("https://h/relay/v1", "chat", "https://h/relay", "openai"),
    ("http://h:3000", "image", "http://h:3000", "openai"),
    ("http://h:3000/mj", "image", "http://h:3000", "mj"),
    ("http://h:3000/mj/", "image", "http://h:3000", "mj"),
])
def test_base_forms(typed, kind, root, mode):
    assert normalise_base(typed, kind) == (root, mode)


def test_mj_is_for_images_only_and_empty_is_refused():
    with pytest.raises(ChatError) as exc:
        normalise_base("http://h/mj", "chat")
    assert exc.value.code == "bad_base"
    with pytest.raises(ChatError):
        normalise_base("  ", "chat")


def test_only_own_and_configured_addresses_are_called():
    allowed = ["http://127.0.0.1:3000", "https://api.example.test/"]
    check_allowed("http://127.0.0.1:3000", allowed)
    check_allowed("HTTPS://api.example.test", allowed)
    for bad in ("http://127.0.0.1:3001", "http://169.254.169.254", "https://api.example.test.evil",
                "http://127.0.0.1:3000/admin"):
        with pytest.raises(ChatError) as exc:
            check_allowed(bad, allowed)
        assert exc.value.code == "base_not_allowed"


def test_messages_are_checked():
    ok = clean_messages([{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [
                             {"type": "text", "text": "what is this?"},
                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert ok[1]["content"][1]["image_url"]["url"].startswith("data:image/png")
    for bad in ([], "hi", [{"role": "tool", "content": "x"}], [{"role": "user", "content": 5}],
                [{"role": "user", "content": [{"type": "image_url",
                                               "image_url": {"url": "https://x/y.png"}}]}],
                [{"role": "user", "content": [{"type": "audio"}]}]):
        with pytest.raises(ChatError):
            clean_messages(bad)


def test_images_over_20_mb_are_refused():
    big = "data:image/jpeg;base64," + "A" * (28 * 1024 * 1024)
    with pytest.raises(ChatError) as exc:
        clean_messages([{"role": "user", "content": [{"type": "image_url",
                                                      "image_url": {"url": big}}]}])
    assert exc.value.code == "too_large"


def test_admin_base_address_list_is_validated():
    assert clean_addresses([{"url": "https://a.test/", "region": "EU"}, "http://b.test"]) == [
        {"url": "https://a.test", "region": "EU", "groups": []},
        {"url": "http://b.test", "region": "", "groups": []}]
    for bad in ([{"url": "javascript:alert(1)"}], [{"url": "http://user:pw@a.test"}],
                [{"url": "https://a.test/?q=1"}], "not json", {"url": "https://a.test"}):
        with pytest.raises(ValueError):
            clean_addresses(bad)
