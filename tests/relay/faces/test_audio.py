"""Speech to text and text to speech end to end: the official openai SDK (and
raw sockets where the SDK cannot show it) -> relay -> a fake upstream.

Transcriptions are billed by seconds of audio (call_price = USD per second),
speech by characters of input (call_price = USD per character)."""
from __future__ import annotations

import hashlib
import io
import json
import socket
import time

import openai
import pytest
import requests

from tests.fakes.media_upstream import FakeMedia, make_wav, speech_bytes
from tests.helpers import multipart, recv_all
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

WAV = make_wav(3.2)          # 3.2 s -> billed as 4 seconds
WAV_SHA = hashlib.sha256(WAV).hexdigest()


@pytest.fixture(scope="module")
def fake():
    f = FakeMedia().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, ["whisper-1", "stt-alias", "gpt-4o-transcribe", "tts-1",
                                    "tts-alias"], name="media",
                         model_mapping={"stt-alias": "whisper-1", "tts-alias": "tts-1"})
    admin.set_price("whisper-1", call_price="0.0001")       # USD per second of audio
    admin.set_price("stt-alias", call_price="0.0002")
    admin.set_price("gpt-4o-transcribe", input_price="6", output_price="10")
    admin.set_price("tts-1", call_price="0.000015")         # USD per character
    admin.set_price("tts-alias", call_price="0.00003")
    return relay


def client(relay, key):
    return openai.OpenAI(api_key=key, base_url=relay.url + "/v1", max_retries=0)


def last_upload(fake):
    return fake.uploads[-1]


# ---- speech to text -----------------------------------------------------------
def test_transcription_verbose_json_billed_by_duration(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).audio.transcriptions.create(
        model="whisper-1", file=("tone.wav", WAV, "audio/wav"), response_format="verbose_json",
        language="en", prompt="A test tone.", temperature=0.2)
    assert res.duration == pytest.approx(3.2)
    assert res.text == "Transcribed 3.20 seconds of audio."
    assert t.spent_since(before) == 200  # 4 s x 0.0001 USD x 500,000
    up = last_upload(fake)
    assert up["sha256"] == WAV_SHA and up["filename"] == "tone.wav"
    assert up["fields"]["model"] == ["whisper-1"]
    assert up["fields"]["language"] == ["en"] and up["fields"]["prompt"] == ["A test tone."]
    assert up["fields"]["temperature"] == ["0.2"]
    assert up["transfer_encoding"] == "chunked" or int(up["content_length"]) == up["body_size"]
    rec = t.logs(1, model="whisper-1")[0]
    assert rec["units"] == 4 and rec["quota"] == 200 and rec["endpoint"] == "transcriptions"


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt", "json"])
def test_transcription_duration_read_from_the_wav(setup, admin, fake, fmt):
    """The upstream reports no duration in these formats: the WAV header tells."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/audio/transcriptions",
                      headers={"Authorization": f"Bearer {t.key}"},
                      data={"model": "whisper-1", "response_format": fmt},
                      files={"file": ("a.wav", WAV, "audio/wav")})
    assert r.status_code == 200, r.text
    if fmt == "json":
        assert r.json() == {"text": "Transcribed 3.20 seconds of audio."}
    else:
        assert r.headers["Content-Type"].startswith("text/plain")
        assert "Transcribed 3.20" in r.text and "seconds of audio." in r.text
        if fmt == "vtt":
            assert r.text.startswith("WEBVTT")
    assert t.spent_since(before) == 200


def test_transcription_text_with_sdk_and_model_mapping(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    text = client(setup, t.key).audio.transcriptions.create(
        model="stt-alias", file=("x.wav", io.BytesIO(WAV)), response_format="text")
    assert "Transcribed 3.20 seconds" in text
    up = last_upload(fake)
    assert up["fields"]["model"] == ["whisper-1"] and up["sha256"] == WAV_SHA
    assert up["transfer_encoding"] == "chunked" or int(up["content_length"]) == up["body_size"]
    assert t.spent_since(before) == 400  # 4 s x 0.0002 USD


def test_transcription_billed_by_tokens_when_reported(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).audio.transcriptions.create(
        model="gpt-4o-transcribe", file=("x.wav", WAV), response_format="json")
    assert res.text.startswith("Transcribed")
    # (20 x 6 + 10 x 10) / 1e6 USD = 0.00022 USD = 110 units
    assert t.spent_since(before) == 110


def test_transcription_model_after_file_and_chunked_upload(setup, admin, fake):
    """curl -F puts fields in the order given; a chunked upload has no length."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    body, ctype = multipart([("file", WAV, "late.wav"), ("response_format", b"json", None),
                              ("model", b"stt-alias", None)])

    def gen():
        for i in range(0, len(body), 5000):
            yield body[i:i + 5000]
    r = requests.post(setup.url + "/v1/audio/transcriptions", data=gen(),
                      headers={"Authorization": f"Bearer {t.key}", "Content-Type": ctype})
    assert r.status_code == 200, r.text
    up = last_upload(fake)
    assert up["fields"]["model"] == ["whisper-1"] and up["sha256"] == WAV_SHA
    assert up["fields"]["response_format"] == ["json"]
    # The model came last: whether the call began before the body's end is timing.
    assert up["transfer_encoding"] == "chunked" or int(up["content_length"]) == up["body_size"]
    assert t.spent_since(before) == 400


def test_transcription_upload_flows_before_the_client_is_done(setup, admin, fake):
    """Half the file is sent and the client waits: the upstream must already
    be receiving it (the relay does not wait for the whole body)."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    big = make_wav(20.0)  # 320 KB
    body, ctype = multipart([("model", b"whisper-1", None), ("file", big, "big.wav")])
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {t.key}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    half = len(body) // 2
    fake.receiving = 0
    with socket.create_connection(("127.0.0.1", setup.port), timeout=60) as s:
        s.sendall(head + body[:half])
        deadline = time.monotonic() + 30
        while fake.receiving < half // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_while_waiting = fake.receiving
        s.sendall(body[half:])
        reply = recv_all(s)
    assert seen_while_waiting >= half // 2, "the upload did not flow through"
    status, _, rest = reply.partition(b"\r\n")
    assert b" 200 " in status, reply[:500]
    assert hashlib.sha256(big).hexdigest() == last_upload(fake)["sha256"]
    assert t.spent_since(before) == 1000  # 20 s x 0.0001 USD


@pytest.mark.parametrize("case", ["not_multipart", "no_file", "no_model", "bad_format",
                                  "bad_temperature", "unknown_model"])
def test_transcription_bad_input_is_400_and_free(setup, admin, case):
    t = Tenant(admin, setup.url)
    before = t.balances()
    h = {"Authorization": f"Bearer {t.key}"}
    url = setup.url + "/v1/audio/transcriptions"
    f = {"file": ("a.wav", WAV, "audio/wav")}
    if case == "not_multipart":
        r = requests.post(url, headers=h, json={"model": "whisper-1"})
    elif case == "no_file":
        r = requests.post(url, headers=h, data={"model": "whisper-1"}, files={"x": ("", b"")})
    elif case == "no_model":
        r = requests.post(url, headers=h, files=f)
    elif case == "bad_format":
        r = requests.post(url, headers=h, data={"model": "whisper-1", "response_format": "mp4"},
                          files=f)
    elif case == "bad_temperature":
        r = requests.post(url, headers=h, data={"model": "whisper-1", "temperature": "hot"},
                          files=f)
    else:
        r = requests.post(url, headers=h, data={"model": "no-such-model"}, files=f)
    expected = 404 if case == "unknown_model" else 400
    assert r.status_code == expected, r.text
    assert "request id" in r.json()["error"]["message"]
    assert t.spent_since(before) == 0


def test_transcription_bad_key_refused_before_the_body(setup):
    r = requests.post(setup.url + "/v1/audio/transcriptions",
                      headers={"Authorization": "Bearer sk-nope"},
                      data={"model": "whisper-1"}, files={"file": ("a.wav", WAV)})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_transcription_upstream_rejects_non_audio_free(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    with pytest.raises(openai.BadRequestError):
        client(setup, t.key).audio.transcriptions.create(
            model="whisper-1", file=("notes.txt", b"not audio at all"))
    assert t.spent_since(before) == 0


# ---- text to speech -----------------------------------------------------------
def test_speech_streams_audio_billed_per_character(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    text = "Hello world"
    res = client(setup, t.key).audio.speech.create(model="tts-1", voice="alloy", input=text,
                                                   response_format="mp3", speed=1.25)
    assert res.content == speech_bytes(text, 300 * len(text))
    assert res.response.headers["content-type"] == "audio/mpeg"
    # 11 characters x 0.000015 USD = 0.000165 USD = 82.5 -> 83 units
    assert t.spent_since(before) == 83
    sent = [r for r in fake.requests if r["path"].endswith("/audio/speech")][-1]["body"]
    assert sent["speed"] == 1.25 and sent["voice"] == "alloy"
    rec = t.logs(1, model="tts-1")[0]
    assert rec["units"] == 11 and rec["quota"] == 83 and rec["status"] == 200


def test_speech_streaming_response_and_mapping(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    text = "Ünïcode counts characters, not bytes: ✓"
    with client(setup, t.key).audio.speech.with_streaming_response.create(
            model="tts-alias", voice="nova", input=text, response_format="wav") as resp:
        assert resp.headers["content-type"] == "audio/wav"
        got = b"".join(resp.iter_bytes(1000))
    assert got == speech_bytes(text, 300 * len(text))
    sent = [r for r in fake.requests if r["path"].endswith("/audio/speech")][-1]["body"]
    assert sent["model"] == "tts-1"
    # 39 characters (not 43 bytes) x 0.00003 USD = 0.00117 USD = 585 units
    assert len(text) == 39 and len(text.encode()) == 43
    assert t.spent_since(before) == 585


def test_speech_broken_upstream_is_not_a_clean_end(setup, admin):
    t = Tenant(admin, setup.url)
    r = requests.post(setup.url + "/v1/audio/speech", stream=True,
                      headers={"Authorization": f"Bearer {t.key}"},
                      json={"model": "tts-1", "voice": "alloy", "input": "BREAK_MID_STREAM now"})
    assert r.status_code == 200
    got = []
    with pytest.raises(requests.exceptions.RequestException):
        for piece in r.iter_content(4096):
            got.append(piece)
    assert sum(map(len, got)) > 0  # what came before the break, then the cut


@pytest.mark.parametrize("body,param", [
    ({"model": "tts-1", "input": "hi"}, "voice"),
    ({"model": "tts-1", "voice": "alloy"}, "input"),
    ({"model": "tts-1", "voice": "alloy", "input": "x" * 4097}, "input"),
    ({"model": "tts-1", "voice": "alloy", "input": "hi", "speed": 5}, "speed"),
    ({"model": "tts-1", "voice": "alloy", "input": "hi", "response_format": "mp4"},
     "response_format"),
    ({"voice": "alloy", "input": "hi"}, "model"),
])
def test_speech_bad_input_is_400_and_free(setup, admin, body, param):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = requests.post(setup.url + "/v1/audio/speech", json=body,
                      headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert t.spent_since(before) == 0


def test_speech_upstream_error_passes_as_json(setup, admin, fake):
    t = Tenant(admin, setup.url)
    ch = admin.create_channel(fake.mode_url("500"), ["tts-broken"], name="broken")
    admin.set_price("tts-broken", call_price="0.00001")
    before = t.balances()
    r = requests.post(setup.url + "/v1/audio/speech", json={
        "model": "tts-broken", "voice": "alloy", "input": "hi"},
        headers={"Authorization": f"Bearer {t.key}"})
    assert r.status_code == 502 and r.headers["Content-Type"].startswith("application/json")
    assert json.loads(r.text)["error"]["type"] == "upstream_error"
    assert t.spent_since(before) == 0
    admin.delete(f"/api/channel/{ch['id']}")




def test_transcription_quota_checked_before_the_upload_flows(setup, admin, fake):
    """4 s at 0.0001 USD = 200 units reserved from the WAV header; the key has 100."""
    t = Tenant(admin, setup.url, key_quota=100)
    before = t.balances()
    n = len(fake.uploads)
    r = requests.post(setup.url + "/v1/audio/transcriptions",
                      headers={"Authorization": f"Bearer {t.key}"},
                      data={"model": "whisper-1"}, files={"file": ("a.wav", WAV, "audio/wav")})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "token_quota_exhausted"
    assert len(fake.uploads) == n  # nothing reached the upstream
    assert t.spent_since(before) == 0


def test_transcription_client_leaving_mid_upload_costs_nothing(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    big = make_wav(20.0)
    body, ctype = multipart([("model", b"whisper-1", None), ("file", big, "big.wav")])
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {t.key}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    fake.receiving = 0
    n = len(fake.uploads)
    with socket.create_connection(("127.0.0.1", setup.port), timeout=60) as s:
        s.sendall(head + body[: len(body) // 2])
        deadline = time.monotonic() + 30
        while fake.receiving == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.receiving > 0
    # The relay aborts the upstream transfer: the upstream never gets a whole body.
    rec = t.logs(1, model="whisper-1")
    assert rec and rec[0]["status"] == 499 and rec[0]["quota"] == 0
    assert len(fake.uploads) == n
    assert t.spent_since(before) == 0
