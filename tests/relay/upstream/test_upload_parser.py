"""relay/upstream/upload.py on its own: a multipart body fed in arbitrary
pieces comes out for the upstream as the same form, written anew under the
relay's own boundary (model field rewritten), as python-multipart read it;
checked against Tornado's own parser.  Duplicate fields, file parts past the
endpoint's limit and the other bounds are 400s naming the field (issue 30,
case 6).  The audio's length is read from the spool by mutagen or enzyme
for every container clients send (case 3)."""
from __future__ import annotations

import asyncio
import glob
import os
import random

import pytest
from tornado.httputil import parse_body_arguments

from relay.errors import RelayError
from relay.money.audio_length import seconds_of
from relay.upstream import upload as upload_mod
from relay.upstream.upload import MultipartUpload
from tests.fakes.media_upstream import make_wav
from tests.helpers import ROOT

WAV = make_wav(2.5)
AUDIO = os.path.join(ROOT, "tests", "fixtures", "audio")


def build(parts, boundary="XyZ--b0undary", preamble=b""):
    out = preamble
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        ctype = "Content-Type: audio/wav\r\n" if filename else ""
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n{ctype}\r\n".encode()
        out += value + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f'multipart/form-data; boundary="{boundary}"'


def upstream_form(up, model="upstream-model"):
    prod = up.producer(model)
    prod.start(lambda: None)
    out = b""
    while True:
        chunk = prod.read(7000)
        if not chunk:
            break
        out += chunk
    if prod.length is not None:
        assert prod.length == len(out)
    args, files = {}, {}
    parse_body_arguments(up.content_type, out, args, files)
    return args, files


def run(body, ctype, pieces, model="upstream-model", **kw):
    up = MultipartUpload(ctype, len(body), **kw)
    i = 0
    for size in pieces:
        up.feed(body[i:i + size])
        i += size
    up.feed(body[i:])
    up.finish()
    asyncio.run(up.measure())
    up.end()
    args, files = upstream_form(up, model)
    up.close()
    return up, args, files


def random_pieces(seed, n=400):
    rng = random.Random(seed)
    return [rng.choice([1, 2, 3, 17, 64, 1000, 4096]) for _ in range(n)]


@pytest.mark.parametrize("order", ["model_first", "file_first", "model_middle"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_chunking_gives_the_same_form(order, seed):
    fields = [("language", b"en", None), ("prompt", b"Line one\r\n--XyZ--b0undaryX", None)]
    model = ("model", b"public-model", None)
    file = ("file", WAV, "x.wav")
    parts = {"model_first": [model, file] + fields,
             "file_first": [file] + fields + [model],
             "model_middle": [fields[0], model, file, fields[1]]}[order]
    body, ctype = build(parts)
    up, args, files = run(body, ctype, random_pieces(seed))
    assert args["model"] == [b"upstream-model"]
    assert args["language"] == [b"en"]
    assert args["prompt"] == [b"Line one\r\n--XyZ--b0undaryX"]
    assert files["file"][0]["body"] == WAV and files["file"][0]["filename"] == "x.wav"
    assert up.fields["model"] == "public-model" and up.file["size"] == len(WAV)
    assert up.audio_seconds() == pytest.approx(2.5) and up.units() == 3
    assert b"XyZ--b0undary" not in up.content_type.encode()   # a boundary of our own


def test_preamble_is_dropped_and_byte_at_a_time_works():
    body, ctype = build([("model", b"m", None), ("file", WAV[:3000], "a.wav")],
                        preamble=b"\r\n")
    up, args, files = run(body, ctype, [1] * 5000)
    assert args["model"] == [b"upstream-model"] and files["file"][0]["body"] == WAV[:3000]


def test_the_relay_value_of_a_rewritten_field_goes_upstream():
    """response_format text is asked as verbose_json (relay/faces/media.py);
    the client's own value stays in `fields`, even when it comes before the model."""
    from relay.faces.media import upstream_format
    for order in ([("response_format", b"text", None), ("model", b"whisper-1", None)],
                  [("model", b"whisper-1", None), ("response_format", b"text", None)]):
        body, ctype = build(order + [("file", WAV, "a.wav")])
        up, args, _ = run(body, ctype, [50], rewrite=upstream_format)
        assert args["response_format"] == [b"verbose_json"]
        assert up.fields["response_format"] == "text"


@pytest.mark.parametrize("parts,param", [
    ([("model", b"a", None), ("model", b"b", None), ("file", WAV, "a.wav")], "model"),
    ([("model", b"a", None), ("language", b"en", None), ("language", b"fr", None)], "language"),
    ([("model", b"a", None), ("file", WAV, "a.wav"), ("file", WAV, "b.wav")], "file"),
    ([("model", b"a", None), ("file", WAV, "a.wav"), ("mask", WAV, "b.wav")], "mask"),
    ([("model", WAV, "model.wav"), ("file", WAV, "a.wav")], "model"),
])
def test_one_truth_duplicates_and_stray_files_are_400_naming_the_field(parts, param):
    body, ctype = build(parts)
    up = MultipartUpload(ctype, len(body))
    with pytest.raises(RelayError) as ei:
        up.feed(body)
        up.finish()
    assert ei.value.status == 400 and ei.value.param == param
    up.close()


def test_array_fields_may_repeat_and_image_edits_take_many_images():
    parts = [("model", b"m", None), ("timestamp_granularities[]", b"word", None),
             ("timestamp_granularities[]", b"segment", None), ("file", WAV, "a.wav")]
    body, ctype = build(parts)
    up, args, _ = run(body, ctype, [100])
    assert up.arrays["timestamp_granularities[]"] == ["word", "segment"]
    assert args["timestamp_granularities[]"] == [b"word", b"segment"]
    images = [("image[]", WAV[:100], f"{i}.png") for i in range(16)]
    body, ctype = build([("model", b"m", None)] + images)
    up, _, files = run(body, ctype, [100], file_fields=("image", "image[]"),
                       file_limits={"image[]": 16})
    assert len(files["image[]"]) == 16
    body, ctype = build([("model", b"m", None)] + images + [images[0]])
    with pytest.raises(RelayError) as ei:
        run(body, ctype, [100], file_fields=("image", "image[]"), file_limits={"image[]": 16})
    assert ei.value.param == "image[]"


def test_bounds_field_size_and_part_count():
    at = b"x" * upload_mod.FIELD_LIMIT
    run(*build([("model", b"m", None), ("prompt", at, None), ("file", WAV, "a.wav")]), [999])
    body, ctype = build([("model", b"m", None), ("prompt", at + b"x", None)])
    with pytest.raises(RelayError) as ei:
        MultipartUpload(ctype, None).feed(body)
    assert ei.value.param == "prompt"
    many = [(f"f{i}", b"v", None) for i in range(upload_mod.MAX_PARTS - 2)]
    run(*build([("model", b"m", None)] + many + [("file", WAV, "a.wav")]), [999])
    body, ctype = build([("model", b"m", None)] + many + [("x", b"v", None), ("file", WAV, "a")])
    with pytest.raises(RelayError) as ei:
        MultipartUpload(ctype, None).feed(body)
    assert ei.value.status == 400


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
    up = MultipartUpload(ctype, None)
    with pytest.raises(RelayError):
        up.feed(b"--XyZ--b0undary\r\nContent-Disposition: form-data\r\n\r\nx\r\n")
    body, ctype = build([("model", b"m", None)])
    up = MultipartUpload(ctype, None)
    up.feed(body)
    with pytest.raises(RelayError) as ei:
        up.finish()
    assert ei.value.param == "file"
    up.close()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(AUDIO, "tone.*"))))
def test_every_container_clients_send_has_its_length_read(path):
    """ffmpeg's 3.2 s tone (tests/fixtures/audio) in each container the
    vendors take: within encoder padding of 3.2 s, so billed as 4."""
    with open(path, "rb") as fh:
        secs = seconds_of(fh)
    assert secs == pytest.approx(3.2, abs=0.2), path
    with open(path, "rb") as fh:
        body, ctype = build([("model", b"m", None), ("file", fh.read(), os.path.basename(path))])
    up, _, _ = run(body, ctype, [4096])
    assert up.units() == 4


def test_fixtures_cover_every_container():
    names = {os.path.splitext(p)[1] for p in glob.glob(os.path.join(AUDIO, "tone.*"))}
    assert names >= {".ogg", ".opus", ".webm", ".m4a", ".mp4", ".aac", ".wav", ".mp3", ".flac"}


def test_unknown_audio_has_no_length():
    import io
    assert seconds_of(io.BytesIO(b"not audio at all" * 100)) is None
