"""The benchmark's own parts: the fake upstream's --no-record switch, the
py-spy summary, bench/streams.py's Node upstream and bench/chunk_path.py.
(The benchmarks themselves are not tests.)"""
from __future__ import annotations

import json
import os
import sys

import requests

from tests.fakes.openai_upstream import FakeOpenAI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import hotspots  # noqa: E402

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def test_fake_without_recording_answers_the_same_and_keeps_nothing():
    quiet, loud = FakeOpenAI(record=False).start(), FakeOpenAI().start()
    try:
        answers = []
        for fake in (quiet, loud):
            r = requests.post(fake.url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 200
            answers.append(r.json())
            r = requests.post(fake.url + "/v1/chat/completions", json=dict(BODY, stream=True),
                              timeout=10)
            assert r.text.rstrip().endswith("data: [DONE]")
        assert [a["choices"] for a in answers[:1]] == [a["choices"] for a in answers[1:]]
        assert answers[0]["usage"] == answers[1]["usage"]
        assert quiet.requests == []
        assert [q["body"]["model"] for q in loud.requests] == ["gpt-4o-mini"] * 2
    finally:
        quiet.stop()
        loud.stop()


RAW = """\
<module> (server.py:10);main (server.py:20);_run_once (asyncio/base_events.py:1);_OpenAIRelay.post (relay_openai.py:22);RelayService.relay (relay/service.py:5);Upstream.send (relay/upstream/client.py:9);AsyncHTTPClient.fetch (tornado/httpclient.py:3) 6
<module> (server.py:10);main (server.py:20);_run_once (asyncio/base_events.py:1);_OpenAIRelay.post (relay_openai.py:22);RelayService.relay (relay/service.py:5);dumps (json/__init__.py:2) 3
<module> (server.py:10);main (server.py:20);_run_once (asyncio/base_events.py:1);HTTP1Connection._read_message (tornado/http1connection.py:7);_RoutingDelegate.headers_received (tornado/routing.py:4);RelayApplication.find_handler (server.py:60) 1
<module> (server.py:10);main (server.py:20);_run_once (asyncio/base_events.py:1);EpollSelector.select (selectors.py:3) 5
Thread._bootstrap (threading.py:1);_worker (concurrent/futures/thread.py:81) 50
"""


def test_hotspots_shares_parts_and_other_threads():
    s = hotspots.summarise(RAW)
    assert s["samples"] == 15 and s["other_thread_samples"] == 50
    self_top = {r["function"]: r["share"] for r in s["self"]}
    assert self_top["AsyncHTTPClient.fetch (tornado/httpclient.py)"] == 0.4
    assert self_top["dumps (json/__init__.py)"] == 0.2
    ours = {r["function"]: r["samples"] for r in s["inclusive_ours"]}
    # handlers/ files appear bare in py-spy's output and get their folder back
    assert ours["_OpenAIRelay.post (handlers/relay_openai.py)"] == 9
    assert ours["Upstream.send (relay/upstream/client.py)"] == 6
    parts = {r["function"]: r["samples"] for r in s["parts"]}
    assert parts == {
        "upstream client (curl_httpclient, relay/upstream/client.py)": 6,
        "relay code (handlers/, relay/, models/, notify/)": 3,
        "inbound HTTP server (tornado web/http1connection/iostream)": 1,
        "event loop and the rest (asyncio, tornado ioloop/gen)": 5,
    }
    # frames on (nearly) every stack say nothing and are left out
    assert "main (server.py)" not in ours
    assert "Where the time goes" in hotspots.render(s)


def test_rounds_are_summed_up_by_their_medians_and_errors_by_their_total():
    import run
    rs = [{"rps": 1.0, "p50_ms": 2, "non_2xx": 0, "socket_errors": {},
           "cpu_us_per_request": {"relay": 300, "upstream": 150}},
          {"rps": 9.0, "p50_ms": 9, "non_2xx": 2, "socket_errors": {"read": 1},
           "cpu_us_per_request": {"relay": 900, "upstream": 140}},
          {"rps": 2.0, "p50_ms": 3, "non_2xx": 0, "socket_errors": {"read": 2},
           "cpu_us_per_request": {"relay": 280, "upstream": 160}}]
    assert run.median_run(rs) == {
        "rps": 2.0, "p50_ms": 3, "non_2xx": 2, "socket_errors": {"read": 3},
        "cpu_us_per_request": {"relay": 300, "upstream": 150}, "rounds": 3}
    assert run.median_run(rs[:1]) == rs[0]


def test_an_even_number_of_rounds_keeps_whole_numbers_whole():
    # `--rounds 2`: the median of two is a mean; a count such as the
    # connections must stay an int for the table's format.
    import run
    rs = [{"connections": 20, "rps": 100.0, "p50_ms": 2, "cpu_us_per_request": {"relay": 301}},
          {"connections": 20, "rps": 200.0, "p50_ms": 3, "cpu_us_per_request": {"relay": 400}}]
    out = run.median_run(rs)
    assert out["connections"] == 20 and type(out["connections"]) is int
    assert out["rps"] == 150.0 and out["p50_ms"] == 2.5
    assert out["cpu_us_per_request"]["relay"] == 350.5


def test_the_node_slow_upstream_speaks_the_python_fakes_wire_format(tmp_path):
    """bench/streams.py's default upstream (bench/slow_upstream.mjs): HTTP/2
    over TLS by ALPN, a stream of the pieces asked for with its usage and
    [DONE], a plain answer, and the drop mode's reset after one event."""
    import io
    import shutil
    import subprocess

    import pycurl
    import pytest

    import streams
    from tests.helpers import free_port, wait_port

    if not shutil.which("node"):
        pytest.skip("node is not on PATH")
    cert, key = streams.write_tls(str(tmp_path))
    port = free_port()
    proc = subprocess.Popen(["node", os.path.join(os.path.dirname(streams.__file__),
                                                  "slow_upstream.mjs"), "--port", str(port),
                             "--cert", cert, "--key", key], stdout=subprocess.DEVNULL)
    try:
        wait_port(port, proc, timeout=20, what="node slow upstream")

        def post(path: str, body: dict) -> tuple[int, int, bytes, int]:
            buf = io.BytesIO()
            c = pycurl.Curl()
            c.setopt(pycurl.URL, f"https://127.0.0.1:{port}{path}")
            c.setopt(pycurl.CAINFO, str(tmp_path / "ca.pem"))
            c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2TLS)
            c.setopt(pycurl.POSTFIELDS, json.dumps(body))
            c.setopt(pycurl.WRITEDATA, buf)
            err = 0
            try:
                c.perform()
            except pycurl.error as exc:
                err = exc.args[0]
            out = (c.getinfo(pycurl.RESPONSE_CODE), c.getinfo(pycurl.INFO_HTTP_VERSION),
                   buf.getvalue(), err)
            c.close()
            return out
        code, version, data, err = post("/v1/chat/completions", {
            "model": "m", "stream": True, "fake_chunks": 3, "fake_delay": 0.05,
            "stream_options": {"include_usage": True}})
        assert (code, version, err) == (200, pycurl.CURL_HTTP_VERSION_2, 0)
        events = [ln[6:] for ln in data.decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 3
        assert [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:4]] == \
            ["piece 1 ", "piece 2 ", "piece 3 "]
        code, _, data, err = post("/v1/chat/completions", {"model": "m"})
        assert code == 200 and err == 0 and json.loads(data)["usage"]["total_tokens"] == 11
        code, _, data, err = post("/mode/drop/v1/chat/completions",
                                  {"model": "m", "stream": True, "fake_chunks": 3})
        assert code == 200 and err != 0 and data.count(b"data: ") == 1
    finally:
        proc.terminate()
        proc.wait(10)


def test_chunk_path_bench_runs():
    import subprocess
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(hotspots.__file__),
                                                       "chunk_path.py"), "--streams", "4",
                          "--chunks", "5", "--rounds", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("CPU per chunk (us): median ")
