"""Quota never overdraws under concurrency, and a stream cut by the client
is still billed for what was streamed."""
import asyncio
import socket
import time

import pytest

from tests.helpers import Api, eventually

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def w(relay, admin, fake):
    admin.create_channel(fake.url, [MODEL])
    admin.set_price(MODEL, input_price=1, output_price=4, call_price=0.001)  # 500 units a call
    admin.create_user("erin", quota=1_000_000_000)
    api = Api.login(relay.url, "erin", "Blue-Kettle-Harbor-42")
    return {"admin": admin, "api": api, "url": relay.url}


async def _fire(url, key, n, body):
    """n requests at once on n connections, raw HTTP/1.1 over asyncio."""
    payload = body.encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
           "Connection: close\r\n\r\n").encode() + payload
    host, port = url.split("//")[1].split(":")

    async def one():
        r, wr = await asyncio.open_connection(host, int(port))
        wr.write(req)
        await wr.drain()
        data = await r.read()
        wr.close()
        return int(data.split(b" ", 2)[1])
    return await asyncio.gather(*[one() for _ in range(n)])


@pytest.mark.parametrize("mode", ["key", "account"])
def test_exactly_n_succeed_and_balance_ends_at_zero(w, mode):
    n, price = 25, 500
    if mode == "key":
        tok = w["api"].create_token(name="n-calls", remain_quota=n * price, billing_mode="per_call")
        api = w["api"]
    else:
        w["admin"].create_user("frank", quota=n * price)
        api = Api.login(w["url"], "frank", "Blue-Kettle-Harbor-42")
        tok = api.create_token(name="unl", unlimited_quota=True, billing_mode="per_call")
    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "fake_delay": 0.05}' % MODEL
    statuses = asyncio.run(_fire(w["url"], tok["key"], 80, body))
    assert statuses.count(200) == n, statuses
    assert set(statuses) == {200, 403}
    t = api.get(f"/api/token/{tok['id']}")["data"]
    me = api.get("/api/user/self")["data"]
    if mode == "key":
        assert t["remain_quota"] == 0 and t["used_quota"] == n * price
    else:
        assert me["quota"] == 0 and me["used_quota"] == n * price
    # Totals are the rollups, kept as the flusher applies the records.
    def check():
        logs = api.get(f"/api/log/self?token_id={tok['id']}&size=200")["data"]
        assert logs["totals"]["quota"] == n * price
        # one record per billed call; calls refused before reserving are not billed
        assert logs["totals"]["requests"] == n
    eventually(check, timeout=10)


def test_client_disconnect_mid_stream_bills_what_was_streamed(w, fake):
    tok = w["api"].create_token(name="cut", remain_quota=10_000_000)
    url = w["url"].split("//")[1]
    host, port = url.split(":")
    body = ('{"model": "%s", "stream": true, "fake_chunks": 40, "fake_delay": 0.1, '
            '"fake_text": "%s", "messages": [{"role": "user", "content": "hi"}]}'
            % (MODEL, "word " * 400))
    s = socket.create_connection((host, int(port)))
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               f"{tok['key']}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
               "\r\n\r\n" + body).encode())
    got = b""
    while got.count(b"data: {") < 6:
        got += s.recv(65536)
    s.close()  # the client goes away after a few chunks
    rid = got.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
    rec = None
    for _ in range(60):
        items = w["api"].get("/api/log/self?size=100")["data"]["items"]
        rec = next((i for i in items if i["request_id"] == rid), None)
        if rec:
            break
        time.sleep(0.1)
    assert rec is not None, "the usage record of a cut stream was lost"
    assert rec["status"] == 499 and rec["estimated"] is True
    # it billed the prompt and what had been streamed, not nothing and not everything
    assert 0 < rec["completion_tokens"] < 400
    assert rec["quota"] > 0
    # and the upstream request was cancelled rather than left to run its 4 s
    up = next(q for q in fake.requests if q["body"].get("fake_chunks") == 40)
    for _ in range(30):
        if up["aborted"]:
            break
        time.sleep(0.1)
    assert up["aborted"] and up["sent_events"] < 30
    t = w["api"].get(f"/api/token/{tok['id']}")["data"]
    assert t["used_quota"] == rec["quota"]
