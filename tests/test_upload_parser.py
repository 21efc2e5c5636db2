"""relay/upload.py on its own: a multipart body fed in arbitrary pieces must
come out for the upstream as the same form (model field rewritten), with
the WAV length read on the way.  Checked against Tornado's own parser."""
from __future__ import annotations

import random

import pytest
from tornado.httputil import parse_body_arguments

from relay.errors import RelayError
from relay.upload import MultipartUpload, wav_seconds
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
