"""Issue 30, case 3 (and 7's speech): audio billed from what the upstream did.
Transcripts asked for as text, srt or vtt are asked of the upstream as
verbose_json (json for gpt-4o transcribe models) and written here, byte for
byte as the upstream writes them; a file of any container clients send is
billed by its real length when the upstream reports none; speech bills the
audio it writes.  Real relay, the media fake on a socket."""
from __future__ import annotations

import glob
import math
import os

import pytest
import requests

from relay.money import tokenizer
from tests.fakes.media_upstream import SSE_AUDIO_TOKENS, FakeMedia, fixture_audio
from tests.helpers import ROOT
from tests.tenant import Tenant

AUDIO = os.path.join(ROOT, "tests", "fixtures", "audio")
CONTAINERS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(AUDIO, "tone.*")))


@pytest.fixture(scope="module")
def fake():
    f = FakeMedia().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-tts"],
                         name="media")
    admin.set_price("whisper-1", call_price="0.0001")          # USD a second: 50 units
    admin.set_price("gpt-4o-transcribe", input_price="6", output_price="10")
    admin.set_price("gpt-4o-mini-tts", input_price="0.6", output_price="12")
    return relay


def transcribe(url, key, model, fmt, name="tone.wav", path="/v1/audio/transcriptions"):
    data = {"model": model}
    if fmt:
        data["response_format"] = fmt
    return requests.post(url + path, headers={"Authorization": f"Bearer {key}"}, data=data,
                         files={"file": (name, fixture_audio(name.split(".")[1]))}, timeout=60)


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_whisper_text_formats_are_billed_and_byte_identical(setup, admin, fake, fmt):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = transcribe(setup.url, t.key, "whisper-1", fmt)
    assert r.status_code == 200, r.text
    direct = transcribe(fake.url, "k", "whisper-1", fmt)
    assert r.content == direct.content and r.headers["Content-Type"].startswith("text/plain")
    assert fake.uploads[-2]["fields"]["response_format"] == ["verbose_json"]
    assert t.spent_since(before) == 200   # 3.2 s -> 4 s x 50 units
    rec = t.logs(1)[0]
    assert rec["units"] == 4 and not rec["estimated"]


def test_gpt4o_transcribe_as_text_is_billed_its_tokens(setup, admin, fake):
    """The issue's case: 0 units for text where json cost its tokens."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = transcribe(setup.url, t.key, "gpt-4o-transcribe", "text")
    assert r.status_code == 200, r.text
    assert r.content == transcribe(fake.url, "k", "gpt-4o-transcribe", "text").content
    assert fake.uploads[-2]["fields"]["response_format"] == ["json"]
    # 20 audio tokens at $6/M and 10 text tokens at $10/M: 0.00022 USD
    assert t.spent_since(before) == 110


def test_gpt4o_transcribe_srt_is_refused_as_the_vendor_does(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = transcribe(setup.url, t.key, "gpt-4o-transcribe", "srt")
    assert r.status_code == 400
    assert t.balances() == before


@pytest.mark.parametrize("name", CONTAINERS)
def test_every_container_is_billed_by_its_length(setup, admin, name):
    """json from whisper-1 says nothing of the length: the file does.  Before,
    anything but WAV, MP3 and FLAC was billed one second."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = transcribe(setup.url, t.key, "whisper-1", "json", name=name)
    assert r.status_code == 200, r.text
    assert t.spent_since(before) == 200, name


def test_translation_text_is_billed_by_the_upstream_duration(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    r = transcribe(setup.url, t.key, "whisper-1", "vtt", name="tone.ogg",
                   path="/v1/audio/translations")
    assert r.status_code == 200, r.text
    assert r.text.startswith("WEBVTT\n\n00:00:00.000 --> ")
    assert t.spent_since(before) == 200


def speech(url, key, **body):
    return requests.post(url + "/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                         json={"model": "gpt-4o-mini-tts", "voice": "alloy", **body}, timeout=60)


def units(tokens_in: int, tokens_out: int) -> int:
    return round((tokens_in * 0.6 + tokens_out * 12) / 2)


def test_speech_bills_the_audio_it_wrote_from_its_length(setup, admin):
    """gpt-4o-mini-tts bills most of its price on the audio written; the
    binary answer carries no usage, so its length does (1,250 tokens a minute)."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    text = "Say this slowly."
    r = speech(setup.url, t.key, input=text, fake_real_audio=True)
    assert r.status_code == 200 and r.content == fixture_audio("mp3")
    out = math.ceil(3.384 * 1250 / 60)
    rec = t.logs(1)[0]
    assert rec["audio_output_tokens"] == out and rec["estimated"]
    assert rec["prompt_tokens"] == tokenizer.count_text(text, "gpt-4o-mini-tts")
    assert t.spent_since(before) == units(rec["prompt_tokens"], out)


def test_speech_sse_bills_the_upstreams_usage(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    text = "Count the tokens."
    r = speech(setup.url, t.key, input=text, stream_format="sse")
    assert r.status_code == 200 and b"speech.audio.done" in r.content
    rec = t.logs(1)[0]
    assert rec["completion_tokens"] == SSE_AUDIO_TOKENS and not rec["estimated"]
    assert t.spent_since(before) == units(len(text) // 4 + 1, SSE_AUDIO_TOKENS)
