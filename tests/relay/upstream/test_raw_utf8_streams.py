"""An upstream that writes characters past ASCII as they are (serde_json, Go
and orjson do; Python's json escapes them) sends U+2028, U+2029 and U+0085
raw inside its events' JSON.  They are not line ends in server-sent events:
every delta reaches the client whole, over a real socket, on a route that
passes the events on and on one that converts them, and the usage record
counts the whole text."""
import json

import pytest
import requests

from tests.helpers import Api, eventually

MODEL = "gpt-4o-mini"
TEXT = "one\u2028two\u2029three\u0085four \u00e9\u4e2d end"


@pytest.fixture(scope="module")
def w(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=4)
    admin.create_user("utf", quota=1_000_000_000)
    api = Api.login(relay.url, "utf", "Blue-Kettle-Harbor-42")
    tok = api.create_token(name="utf", remain_quota=500_000_000)
    return {"api": api, "url": relay.url, "key": tok["key"]}


def _post(w, path: str, body: dict, headers: dict | None = None) -> requests.Response:
    r = requests.post(w["url"] + path, json=body, stream=True, timeout=30,
                      headers={"Authorization": f"Bearer {w['key']}", **(headers or {})})
    assert r.status_code == 200, r.text
    return r


def _events(r: requests.Response) -> list[bytes]:
    # split as the SSE grammar does: only CR LF, LF or CR end a line
    data = r.raw.read()
    return [e for e in data.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def _usage(w, rid: str) -> dict:
    def found():
        items = w["api"].get("/api/log/self?size=100")["data"]["items"]
        rec = next((i for i in items if i["request_id"] == rid), None)
        assert rec is not None
        return rec
    return eventually(found, timeout=10)


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_chat_passes_raw_separators_whole(w, chunks):
    r = _post(w, "/v1/chat/completions", {
        "model": MODEL, "stream": True, "stream_options": {"include_usage": True},
        "fake_raw_utf8": True, "fake_text": TEXT, "fake_chunks": chunks,
        "messages": [{"role": "user", "content": "go"}]})
    events = _events(r)
    assert any("\u2028".encode() in e for e in events), "the relay escaped or lost them"
    text = ""
    for e in events:
        assert e.startswith(b"data: "), e
        if e == b"data: [DONE]":
            continue
        doc = json.loads(e[6:])
        for c in doc["choices"]:
            text += c["delta"].get("content") or ""
    assert text == TEXT
    rec = _usage(w, r.headers["X-Request-Id"])
    assert rec["completion_tokens"] == chunks  # the fake's own usage, read from the stream


def test_messages_converted_from_chat_keeps_every_delta(w, fake):
    fake.raw_utf8, fake.text = True, TEXT  # a Messages body cannot carry fake_* fields
    try:
        r = _post(w, "/v1/messages", {
            "model": MODEL, "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "go"}]},
            headers={"anthropic-version": "2023-06-01"})
        events = _events(r)
    finally:
        fake.raw_utf8, fake.text = False, None
    text = ""
    for e in events:
        lines = e.split(b"\n")
        data = b"\n".join(ln[6:] for ln in lines if ln.startswith(b"data: "))
        doc = json.loads(data)
        if doc.get("type") == "content_block_delta":
            text += doc["delta"].get("text") or ""
    assert text == TEXT
