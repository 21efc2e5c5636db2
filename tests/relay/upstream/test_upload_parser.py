"""relay/upstream/upload.py on its own: a multipart body fed in arbitrary pieces must
come out for the upstream as the same form (model field rewritten), with
the WAV length read on the way.  Checked against Tornado's own parser."""
from __future__ import annotations

import random

import pytest
from tornado.httputil import parse_body_arguments

from relay.errors import RelayError
from relay.money.audio_length import flac_seconds, mp3_seconds, seconds, wav_seconds
from relay.upstream.upload import MultipartUpload
from tests.fakes.media_upstream import make_wav

WAV = make_wav(2.5)


def build(parts, boundary="XyZ--b0undary", preamble=b""):
    out = preamble
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        ctype = "Content-Type: audio/wav\r\n" if filename else ""
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n{ctype}\r\n".encode()
        out += value + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f'multipart/form-data; boundary="{boundary}"'


def run(body, ctype, pieces, model="upstream-model"):
    up = MultipartUpload(ctype, len(body))
    i = 0
    for size in pieces:
        up.feed(body[i:i + size])
        i += size
    up.feed(body[i:])
    up.finish()
    prod = up.producer(model)
    prod.start(lambda: None)
    out = b""
    while True:
        chunk = prod.read(7000)
        if not chunk:
            break
        out += chunk
    assert prod.length == len(out)
    args, files = {}, {}
    parse_body_arguments(ctype, out, args, files)
    up.close()
    return up, args, files


def random_pieces(seed, n=400):
    rng = random.Random(seed)
    return [rng.choice([1, 2, 3, 17, 64, 1000, 4096]) for _ in range(n)]


@pytest.mark.parametrize("order", ["model_first", "file_first", "model_middle"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_chunking_gives_the_same_form(order, seed):
    fields = [("language", b"en", None), ("prompt", b"Line one\r\n--not a boundary", None)]
    model = ("model", b"public-model", None)
    file = ("file", WAV, "x.wav")
    parts = {"model_first": [model, file] + fields,
             "file_first": [file] + fields + [model],
             "model_middle": [fields[0], model, file, fields[1]]}[order]
    body, ctype = build(parts)
    up, args, files = run(body, ctype, random_pieces(seed))
    assert args["model"] == [b"upstream-model"]
    assert args["language"] == [b"en"]
    assert args["prompt"] == [b"Line one\r\n--not a boundary"]
    assert files["file"][0]["body"] == WAV and files["file"][0]["filename"] == "x.wav"
    assert up.fields["model"] == "public-model" and up.file["size"] == len(WAV)
    assert up.audio_seconds() == pytest.approx(2.5) and up.units() == 3


def test_preamble_is_dropped_and_byte_at_a_time_works():
    body, ctype = build([("model", b"m", None), ("file", WAV[:3000], "a.wav")],
                        preamble=b"ignored preamble\r\n")
    up, args, files = run(body, ctype, [1] * 5000)
    assert args["model"] == [b"upstream-model"] and files["file"][0]["body"] == WAV[:3000]


def test_malformed_bodies_are_400():
    body, ctype = build([("model", b"m", None), ("file", WAV, "a.wav")])
    up = MultipartUpload(ctype, None)
    up.feed(body[: len(body) // 2])
    with pytest.raises(RelayError) as ei:
        up.finish()
    assert ei.value.status == 400
    up.close()
    with pytest.raises(RelayError):
        MultipartUpload("application/json", None)
    body, ctype = build([("model", b"m", None)])
    up = MultipartUpload(ctype, None)
    up.feed(body)
    with pytest.raises(RelayError) as ei:
        up.finish()
    assert ei.value.param == "file"
    up.close()


def test_wav_seconds_streamed_header_and_not_wav():
    streamed = bytearray(WAV)
    streamed[40:44] = b"\xff\xff\xff\xff"  # data size unknown, as streaming writers do
    assert wav_seconds(bytes(streamed[:100])) is not None
    assert wav_seconds(bytes(streamed), len(streamed)) == pytest.approx(2.5)
    assert wav_seconds(b"ID3\x04" + b"\0" * 100) is None
    assert wav_seconds(WAV[:20]) is None


def _mp3_frame_header(version=3, kbps_idx=9, sr_idx=0, mono=False) -> bytes:
    b1 = 0xE0 | (version << 3) | (1 << 1) | 1  # Layer III, no CRC
    return bytes([0xFF, b1, (kbps_idx << 4) | (sr_idx << 2), (3 if mono else 0) << 6])


def test_mp3_constant_bit_rate_and_xing_frame_count():
    # 128 kbit/s MPEG-1 after a 100-byte ID3 tag: 16,000 bytes a second.
    tag = b"ID3\x04\x00\x00" + bytes([0, 0, 0, 90]) + b"\0" * 90
    head = tag + _mp3_frame_header() + b"\0" * 500
    assert mp3_seconds(head) is None  # needs the size
    assert mp3_seconds(head, 100 + 16_000 * 7) == pytest.approx(7.0)
    # A Xing header counting 1,000 frames of 1152 samples at 44.1 kHz.
    xing = _mp3_frame_header() + b"\0" * 32 + b"Xing" + (1).to_bytes(4, "big") + \
        (1000).to_bytes(4, "big") + b"\0" * 200
    assert seconds(xing) == pytest.approx(1000 * 1152 / 44100)


def test_flac_streaminfo():
    rate, total = 16000, 16000 * 9
    packed = (rate << 44) | (1 << 41) | (15 << 36) | total
    info = b"\0" * 10 + packed.to_bytes(8, "big") + b"\0" * 16
    head = b"fLaC" + b"\x80\x00\x00\x22" + info
    assert flac_seconds(head) == pytest.approx(9.0)
    assert seconds(b"OggS" + b"\0" * 100) is None
