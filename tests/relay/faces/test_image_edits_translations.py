"""Image edits and audio translations end to end: multipart uploads from the
official openai SDK (raw sockets where the SDK cannot show it) stream
through the relay to a fake upstream; billed per image and per second of
audio, checked to the unit."""
from __future__ import annotations

import hashlib
import io
import socket

import openai
import pytest
import requests

from tests.fakes.media_upstream import PNG_1PX, make_wav
from tests.fakes.text_upstream import FakeText
from tests import helpers
from tests.tenant import Tenant

pytestmark = pytest.mark.slow

PNG = PNG_1PX + b"\0" * 2000          # a PNG by its magic, big enough to stream
PNG_SHA = hashlib.sha256(PNG).hexdigest()
MASK = PNG_1PX
WAV = make_wav(3.2)                   # 3.2 s -> billed as 4 seconds


@pytest.fixture(scope="module")
def fake():
    f = FakeText().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def setup(relay, admin, fake):
    admin.create_channel(fake.url, ["dall-e-2", "edit-alias", "gpt-image-1", "whisper-1",
                                    "translate-alias"], name="media",
                         model_mapping={"edit-alias": "dall-e-2", "translate-alias": "whisper-1"})
    admin.create_channel(fake.url, ["azure-edit", "azure-whisper"], type="azure", name="az",
                         key="az-key", model_mapping={"azure-edit": "edit-deploy",
                                                      "azure-whisper": "whisper-deploy"})
    admin.set_price("dall-e-2", call_price="0.02")          # USD per image
    admin.set_price("edit-alias", call_price="0.03")
    admin.set_price("azure-edit", call_price="0.02")
    admin.set_price("gpt-image-1", input_price="10", output_price="40")
    admin.set_price("whisper-1", call_price="0.0001")       # USD per second of audio
    admin.set_price("translate-alias", call_price="0.0002")
    admin.set_price("azure-whisper", call_price="0.0001")
    return relay


def client(relay, key):
    return openai.OpenAI(api_key=key, base_url=relay.url + "/v1", max_retries=0)


def multipart(parts):
    return helpers.multipart(parts, "----relayedit", "image/png")


# ---- image edits ---------------------------------------------------------------
def test_edit_with_mask_billed_per_image(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.edit(
        model="dall-e-2", image=("photo.png", PNG, "image/png"), mask=("mask.png", MASK),
        prompt="add a hat", n=2, size="256x256", response_format="url")
    assert len(res.data) == 2 and res.data[0].url.startswith(fake.url)
    up = fake.uploads[-1]
    assert up["fields"]["prompt"] == ["add a hat"] and up["fields"]["n"] == ["2"]
    assert up["fields"]["model"] == ["dall-e-2"] and up["fields"]["size"] == ["256x256"]
    files = {f["name"]: f for f in up["files"]}
    assert files["image"]["sha256"] == PNG_SHA and files["image"]["filename"] == "photo.png"
    assert files["mask"]["size"] == len(MASK)
    assert up["transfer_encoding"] == "chunked" or int(up["content_length"]) == up["body_size"]
    assert t.spent_since(before) == 20_000                  # 2 x 0.02 USD
    rec = t.logs(1, model="dall-e-2")[0]
    assert rec["endpoint"] == "image_edits" and rec["units"] == 2 and rec["quota"] == 20_000


def test_edit_several_images_token_usage(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.edit(
        model="gpt-image-1", image=[("a.png", PNG), ("b.png", PNG), ("c.png", PNG)],
        prompt="a collage")
    assert res.usage.input_tokens == 20 + 3 * 65 and res.usage.output_tokens == 1000
    names = [f["name"] for f in fake.uploads[-1]["files"]]
    assert names == ["image[]", "image[]", "image[]"]
    # (215 x 10 + 1000 x 40) / 1e6 USD = 0.04215 USD = 21,075 units
    assert t.spent_since(before) == 21_075


def test_edit_mapping_default_n_and_fields_after_the_image(setup, admin, fake):
    """curl -F keeps the order given: model and prompt may follow the file;
    a chunked upload has no length."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    body, ctype = multipart([("image", PNG, "late.png"), ("prompt", b"a boat", None),
                             ("model", b"edit-alias", None),
                             ("response_format", b"b64_json", None)])

    def gen():
        for i in range(0, len(body), 700):
            yield body[i:i + 700]
    r = requests.post(setup.url + "/v1/images/edits", data=gen(),
                      headers={"Authorization": f"Bearer {t.key}", "Content-Type": ctype})
    assert r.status_code == 200, r.text
    assert r.json()["data"][0]["b64_json"]
    up = fake.uploads[-1]
    # No model: the call began with the whole body in, so its length is known.
    assert up["fields"]["model"] == ["dall-e-2"]
    assert up["transfer_encoding"] == "chunked" or int(up["content_length"]) == up["body_size"]
    assert up["files"][0]["sha256"] == PNG_SHA
    assert t.spent_since(before) == 15_000                  # one image at 0.03 USD


def test_edit_through_azure_deployment(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).images.edit(model="azure-edit", image=("x.png", PNG),
                                           prompt="snow")
    assert len(res.data) == 1
    up = [r for r in fake.requests if r["path"].endswith("/images/edits")][-1]
    assert up["path"] == "/openai/deployments/edit-deploy/images/edits"
    assert up["headers"]["Api-Key"] == "az-key" and "api-version=" in up["query"]
    assert t.spent_since(before) == 10_000


def test_edit_needs_the_image_first_in_no_particular_order(setup, admin, fake):
    """A missing prompt is only known at the end of the body: the upload that
    already began streaming is cut, nothing reaches the upstream whole, and
    nothing is charged."""
    t = Tenant(admin, setup.url)
    before = t.balances()
    n = len(fake.uploads)
    body, ctype = multipart([("model", b"dall-e-2", None), ("image", PNG, "a.png")])
    r = requests.post(setup.url + "/v1/images/edits", data=body,
                      headers={"Authorization": f"Bearer {t.key}", "Content-Type": ctype})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt"
    assert len(fake.uploads) == n and t.spent_since(before) == 0


@pytest.mark.parametrize("case,param", [
    ("json_body", None), ("no_image", "other"), ("n_too_big", "n"), ("bad_format", "response_format"),
    ("stream", "stream"), ("unclosed", None), ("file_field_named_file", "file"),
    ("no_file_at_all", "image"),
])
def test_edit_bad_input_is_400_and_free(setup, admin, fake, case, param):
    t = Tenant(admin, setup.url)
    before = t.balances()
    n = len(fake.uploads)
    h = {"Authorization": f"Bearer {t.key}"}
    url = setup.url + "/v1/images/edits"
    img = {"image": ("a.png", PNG, "image/png")}
    base = {"model": "dall-e-2", "prompt": "x"}
    if case == "json_body":
        r = requests.post(url, headers=h, json=base)
    elif case == "no_image":
        r = requests.post(url, headers=h, data=base, files={"other": ("", b"")})
    elif case == "n_too_big":
        r = requests.post(url, headers=h, data=dict(base, n="11"), files=img)
    elif case == "bad_format":
        r = requests.post(url, headers=h, data=dict(base, response_format="png"), files=img)
    elif case == "stream":
        r = requests.post(url, headers=h, data=dict(base, stream="true"), files=img)
    elif case == "unclosed":
        body, ctype = multipart([("model", b"dall-e-2", None), ("prompt", b"x", None),
                                 ("image", PNG, "a.png")])
        r = requests.post(url, headers=dict(h, **{"Content-Type": ctype}),
                          data=body[:-len("------relayedit--\r\n")])
    elif case == "file_field_named_file":   # a file where none is taken: named
        r = requests.post(url, headers=h, data=base, files={"file": ("a.png", PNG)})
    else:
        body, ctype = helpers.multipart([("model", b"dall-e-2", None), ("prompt", b"x", None)])
        r = requests.post(url, headers=dict(h, **{"Content-Type": ctype}), data=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "request id" in err["message"]
    if param:
        assert err["param"] == param
    assert len(fake.uploads) == n and t.spent_since(before) == 0


def test_edit_upstream_refusal_is_free(setup, admin):
    t = Tenant(admin, setup.url)
    before = t.balances()
    with pytest.raises(openai.BadRequestError) as ei:
        client(setup, t.key).images.edit(model="dall-e-2", image=("a.jpg", b"\xff\xd8jpeg"),
                                         prompt="x")
    assert "png" in str(ei.value)
    assert t.spent_since(before) == 0


def test_edit_too_large_is_413_before_the_upload_flows(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    n = len(fake.uploads)
    big = PNG + b"\0" * (33 * 1024 * 1024)
    body, ctype = multipart([("model", b"dall-e-2", None), ("prompt", b"x", None),
                             ("image", big, "big.png")])
    head = (f"POST /v1/images/edits HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {t.key}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", setup.port), timeout=60) as s:
        s.sendall(head)
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"request_too_large" in reply
    assert len(fake.uploads) == n and t.spent_since(before) == 0


def test_edit_chunked_upload_over_the_limit_is_413(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    n = len(fake.uploads)
    head, ctype = multipart([("model", b"dall-e-2", None), ("prompt", b"x", None)])
    head = head[: -len("------relayedit--\r\n")]
    part = (b"------relayedit\r\nContent-Disposition: form-data; name=\"image\"; "
            b"filename=\"big.png\"\r\nContent-Type: image/png\r\n\r\n" + PNG_1PX)

    def gen():
        yield head + part
        chunk = b"\0" * (1024 * 1024)
        for _ in range(34):
            yield chunk
        yield b"\r\n------relayedit--\r\n"
    r = requests.post(setup.url + "/v1/images/edits", data=gen(),
                      headers={"Authorization": f"Bearer {t.key}", "Content-Type": ctype})
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["code"] == "request_too_large"
    assert len(fake.uploads) == n and t.spent_since(before) == 0
    rec = t.logs(1, model="dall-e-2")
    assert rec and rec[0]["quota"] == 0 and rec[0]["status"] != 200


def test_edit_quota_checked_before_the_upload_flows(setup, admin, fake):
    t = Tenant(admin, setup.url, key_quota=15_000)         # 2 images cost 20,000
    before = t.balances()
    n = len(fake.uploads)
    with pytest.raises(openai.PermissionDeniedError):
        client(setup, t.key).images.edit(model="dall-e-2", image=("a.png", PNG), prompt="x",
                                         n=2)
    assert len(fake.uploads) == n and t.spent_since(before) == 0


# ---- translations ------------------------------------------------------------
def test_translation_json_billed_by_seconds_read_from_the_wav(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).audio.translations.create(
        model="whisper-1", file=("speech.wav", WAV, "audio/wav"), prompt="A tone.",
        temperature=0.3)
    assert res.text == "Translated 3.20 seconds of audio."
    up = fake.uploads[-1]
    assert up["fields"]["model"] == ["whisper-1"] and up["fields"]["prompt"] == ["A tone."]
    assert up["sha256"] == hashlib.sha256(WAV).hexdigest()
    assert t.spent_since(before) == 200                     # 4 s x 0.0001 USD
    rec = t.logs(1, model="whisper-1")[0]
    assert rec["endpoint"] == "translations" and rec["units"] == 4


def test_translation_verbose_json_and_mapping(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).audio.translations.create(
        model="translate-alias", file=("x.wav", io.BytesIO(make_wav(1.5))),
        response_format="verbose_json")
    assert res.duration == pytest.approx(1.5) and res.language == "english"
    assert fake.uploads[-1]["fields"]["model"] == ["whisper-1"]
    assert t.spent_since(before) == 200                     # 2 s x 0.0002 USD


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_translation_text_formats(setup, admin, fmt):
    t = Tenant(admin, setup.url)
    before = t.balances()
    out = client(setup, t.key).audio.translations.create(model="whisper-1", file=("a.wav", WAV),
                                                          response_format=fmt)
    assert "Translated 3.20" in out and "seconds of audio." in out
    assert t.spent_since(before) == 200


def test_translation_through_azure_deployment(setup, admin, fake):
    t = Tenant(admin, setup.url)
    before = t.balances()
    res = client(setup, t.key).audio.translations.create(model="azure-whisper",
                                                         file=("a.wav", WAV))
    assert res.text.startswith("Translated")
    up = [r for r in fake.requests if r["path"].endswith("/audio/translations")][-1]
    assert up["path"] == "/openai/deployments/whisper-deploy/audio/translations"
    assert up["headers"]["Api-Key"] == "az-key"
    assert t.spent_since(before) == 200


@pytest.mark.parametrize("case", ["diarized", "no_file", "no_model", "bad_temperature"])
def test_translation_bad_input_is_400_and_free(setup, admin, case):
    t = Tenant(admin, setup.url)
    before = t.balances()
    h = {"Authorization": f"Bearer {t.key}"}
    url = setup.url + "/v1/audio/translations"
    f = {"file": ("a.wav", WAV, "audio/wav")}
    if case == "diarized":   # a transcription format that translations do not have
        r = requests.post(url, headers=h, data={"model": "whisper-1",
                                                "response_format": "diarized_json"}, files=f)
    elif case == "no_file":
        r = requests.post(url, headers=h, data={"model": "whisper-1"}, files={"x": ("", b"")})
    elif case == "no_model":
        r = requests.post(url, headers=h, files=f)
    else:
        r = requests.post(url, headers=h, data={"model": "whisper-1", "temperature": "2"},
                          files=f)
    assert r.status_code == 400, r.text
    assert "request id" in r.json()["error"]["message"]
    assert t.spent_since(before) == 0
