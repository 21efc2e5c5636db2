"""A stream's pieces reach the client whole and in order, whether the socket
takes them at once (handlers/relay_base.py sends them straight) or a slow
reader leaves some in the relay's buffer; a client that resets the
connection mid-stream ends the upstream call and is billed as cut."""
import json
import socket
import struct
import time

import pytest
import requests

from tests.helpers import Api, dechunk, eventually, recv_all

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def w(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=4)
    admin.create_user("sam", quota=1_000_000_000)
    api = Api.login(relay.url, "sam", "Blue-Kettle-Harbor-42")
    tok = api.create_token(name="writes", remain_quota=500_000_000)
    return {"api": api, "url": relay.url, "key": tok["key"]}


def _open(w, body: dict, rcvbuf: int | None = None) -> socket.socket:
    host, port = w["url"].split("//")[1].split(":")
    s = socket.socket()
    if rcvbuf:  # before connect, so the window is small from the start
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    payload = json.dumps(body).encode()
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {w['key']}"
              f"\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
              "Connection: close\r\n\r\n".encode() + payload)
    return s


def _read_answer(s: socket.socket) -> tuple[bytes, list[str], str]:
    """The whole answer: its head, its SSE events and the text they carry."""
    raw = recv_all(s)
    s.close()
    head, body = raw.split(b"\r\n\r\n", 1)
    events = [e for e in dechunk(body).decode().split("\n\n") if e]
    content = "".join((json.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content")
                      or "" for e in events if e != "data: [DONE]")
    return head, events, content


def _record(w, rid: str) -> dict:
    def found():
        items = w["api"].get("/api/log/self?size=100")["data"]["items"]
        rec = next((i for i in items if i["request_id"] == rid), None)
        assert rec is not None, f"no usage record for {rid}"
        return rec
    return eventually(found, timeout=10)


def test_a_slow_reader_gets_every_byte_in_order(w):
    # About 7 MB of events: more than the kernel buffers of both ends hold,
    # so the relay's sends come back short and the rest waits in its buffer.
    text = "".join(f"{i:08d}," for i in range(600_000))
    s = _open(w, {"model": MODEL, "stream": True, "fake_chunks": 300, "fake_text": text,
                  "messages": [{"role": "user", "content": "count"}]}, rcvbuf=4096)
    time.sleep(1.0)  # not reading yet
    s.settimeout(30)
    head, events, content = _read_answer(s)
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert events[-1] == "data: [DONE]" and content == text
    rid = head.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
    rec = _record(w, rid)
    assert rec["status"] == 200 and rec["completion_tokens"] == 300


def test_a_client_that_resets_mid_stream_ends_the_call(w, fake):
    s = _open(w, {"model": MODEL, "stream": True, "fake_chunks": 60, "fake_delay": 0.05,
                  "fake_text": "tick " * 600, "messages": [{"role": "user", "content": "go"}]})
    s.settimeout(10)
    got = b""
    while got.count(b"data: {") < 3:
        got += s.recv(65536)
    # RST rather than FIN: the relay's next send fails at once.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    rid = got.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
    rec = _record(w, rid)
    assert rec["status"] == 499 and 0 < rec["completion_tokens"] < 60
    up = next(q for q in fake.requests if q["body"].get("fake_chunks") == 60)

    def aborted():
        assert up["aborted"] and up["sent_events"] < 50
    eventually(aborted)


def test_a_reader_that_stops_stops_the_upstream(w, fake):
    # Back-pressure: with the client not reading, the relay holds about a
    # megabyte for it and stops taking the upstream's stream, rather than
    # buffering the whole answer (here over 20 MB) in memory.
    text = "".join(f"{i:08d}," for i in range(2_500_000))
    s = _open(w, {"model": MODEL, "stream": True, "fake_chunks": 1000, "fake_text": text,
                  "messages": [{"role": "user", "content": "more"}]}, rcvbuf=4096)
    s.settimeout(30)
    def flowing():
        up = next((q for q in fake.requests if q["body"].get("fake_chunks") == 1000), None)
        assert up is not None and up.get("flushed_events")
        return up
    up = eventually(flowing, interval=0.05)
    time.sleep(3.0)
    stalled_at = up.get("flushed_events", 0)
    assert stalled_at < 1002, "the relay took the whole stream from a client that did not read"
    head, events, content = _read_answer(s)
    assert events[-1] == "data: [DONE]" and up["flushed_events"] == 1002
    assert content == text


# ---- characters an upstream writes raw ---------------------------------------------
# An upstream that writes characters past ASCII as they are (serde_json, Go
# and orjson do; Python's json escapes them) sends U+2028, U+2029 and U+0085
# raw inside its events' JSON.  They are not line ends in server-sent events:
# every delta reaches the client whole, on a route that passes the events on
# and on one that converts them, and the usage record counts the call.
RAW_TEXT = "one\u2028two\u2029three\u0085four \u00e9\u4e2d end"


def _post(w, path: str, body: dict, headers: dict | None = None) -> requests.Response:
    r = requests.post(w["url"] + path, json=body, stream=True, timeout=30,
                      headers={"Authorization": f"Bearer {w['key']}", **(headers or {})})
    assert r.status_code == 200, r.text
    return r


def _events(r: requests.Response) -> list[bytes]:
    # split as the SSE grammar does: only CR LF, LF or CR end a line
    data = r.raw.read()
    return [e for e in data.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_chat_passes_raw_separators_whole(w, chunks):
    r = _post(w, "/v1/chat/completions", {
        "model": MODEL, "stream": True, "stream_options": {"include_usage": True},
        "fake_raw_utf8": True, "fake_text": RAW_TEXT, "fake_chunks": chunks,
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
    assert text == RAW_TEXT
    rec = _record(w, r.headers["X-Request-Id"])
    assert rec["completion_tokens"] == chunks  # the fake's own usage, read from the stream


def test_messages_converted_from_chat_keeps_every_delta(w, fake):
    fake.raw_utf8, fake.text = True, RAW_TEXT  # a Messages body cannot carry fake_* fields
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
    assert text == RAW_TEXT
