"""A hypothesis-driven fuzz of every relay face: bodies that are nearly
right, bodies of the wrong shape, and bytes that are not JSON at all
(truncated, invalid UTF-8, lone surrogates, NaN, huge numbers, deep
nesting), against real fake upstreams of every channel type.  No answer may
be a 500 and the relay's log must hold no traceback.

Adding a face is one entry in FACES: a name and a strategy of requests.
Bounded: EXAMPLES per face, derandomized, loopback only (the fakes run on
127.0.0.1).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

import pytest
import requests

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fakes.anthropic_upstream import FakeAnthropic  # noqa: E402
from tests.fakes.gemini_upstream import FakeGemini  # noqa: E402
from tests.fakes.media_upstream import make_wav  # noqa: E402
from tests.fakes.mj_upstream import FakeMidjourney  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402
from tests.fakes.text_upstream import FakeText  # noqa: E402
from tests.helpers import Api, RelayProcess  # noqa: E402
from tests.tenant import Tenant  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = 60
CHAT_MODELS = ["oa-model", "an-model", "ge-model"]
# Served by the text fake (tests/fakes/text_upstream.py): legacy completions,
# moderations, rerank, image edits and translations.
TEXT_MODELS = ["instruct-model", "mod-model", "rerank-model", "dall-e-2", "whisper-1"]
MJ_MODELS = ["mj_imagine", "mj_upscale", "mj_variation", "mj_reroll", "mj_describe",
             "mj_blend", "mj_shorten", "mj_action", "mj_modal", "mj_inpaint"]


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: bytes | None = None


# ---- values ----------------------------------------------------------------
text = st.text(max_size=24)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                 st.floats(allow_nan=False, allow_infinity=False), text)
anything = st.recursive(leaf, lambda c: st.lists(c, max_size=4)
                        | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


def either(plausible):
    """Mostly the plausible value, sometimes anything at all."""
    return st.one_of(plausible, plausible, plausible, anything)


def fields(required: dict, optional: dict):
    return st.fixed_dictionaries({k: either(v) for k, v in required.items()},
                                 optional={k: either(v) for k, v in optional.items()})


# Raw bytes: the body as JSON, sometimes damaged on the way.
MUTATIONS = ("none", "none", "none", "truncate", "bad_utf8", "surrogate_bytes",
             "escaped_surrogate", "nan", "huge", "deep", "not_json", "empty")


@st.composite
def encoded(draw, body_strategy):
    raw = json.dumps(draw(body_strategy)).encode()
    how = draw(st.sampled_from(MUTATIONS))
    at = draw(st.integers(0, max(len(raw) - 1, 0)))
    if how == "truncate":
        return raw[:at]
    if how == "bad_utf8":
        return raw[:at] + b"\xff\xc3(" + raw[at:]
    if how == "surrogate_bytes":
        return raw.replace(b'"', b'"\xed\xa0\x80', 2)
    if how == "escaped_surrogate":
        return raw.replace(b'"', b'"\\udc00', 2)
    if how == "nan":
        return raw.replace(b"1", b"NaN", 1) if b":" in raw else b"NaN"
    if how == "huge":
        return raw.replace(b": ", b": 1e999, \"x\": ", 1) if b": " in raw else b"1e999"
    if how == "deep":
        n = draw(st.sampled_from([70, 1000, 5000]))
        return b'{"model": "oa-model", "messages": ' + b"[" * n + b"]" * n + b"}"
    if how == "not_json":
        return draw(st.binary(max_size=40))
    if how == "empty":
        return b""
    return raw


# ---- bodies of each face ----------------------------------------------------
role = st.sampled_from(["user", "assistant", "system", "tool", "developer"])
part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                 st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries(
                     {"url": st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "x"])})}))
message = fields({"role": role, "content": st.one_of(text, st.lists(part, max_size=3))},
                 {"name": text, "tool_call_id": text})
tool = st.fixed_dictionaries({"type": st.just("function"), "function": fields(
    {"name": st.sampled_from(["get_weather", "f"])},
    {"description": text, "parameters": st.just({"type": "object", "properties": {
        "city": {"type": "string"}}})})})
small_int = st.integers(-5, 10 ** 6)

CHAT = fields({"model": st.sampled_from(CHAT_MODELS),
               "messages": st.lists(message, min_size=1, max_size=3)},
              {"stream": st.booleans(), "max_tokens": small_int, "temperature": st.floats(0, 2),
               "tools": st.lists(tool, max_size=2), "n": small_int,
               "stream_options": st.just({"include_usage": True}),
               "max_completion_tokens": small_int, "response_format": anything})
EMBED = fields({"model": st.sampled_from(CHAT_MODELS), "input": st.one_of(text, st.lists(text))},
               {"encoding_format": st.sampled_from(["float", "base64", "x"])})
ablock = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                   st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": text,
                                          "input": st.just({})}),
                   st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text,
                                          "content": text}),
                   st.fixed_dictionaries({"type": st.just("image"), "source": st.just(
                       {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="})}))
amessage = fields({"role": st.sampled_from(["user", "assistant", "system"]),
                   "content": st.one_of(text, st.lists(ablock, max_size=3))}, {})
MESSAGES = fields({"model": st.sampled_from(CHAT_MODELS), "max_tokens": small_int,
                   "messages": st.lists(amessage, min_size=1, max_size=3)},
                  {"stream": st.booleans(), "system": st.one_of(text, st.lists(ablock)),
                   "tools": st.lists(fields({"name": text, "input_schema": st.just(
                       {"type": "object"})}, {"description": text}), max_size=2),
                   "thinking": st.just({"type": "enabled", "budget_tokens": 1024}),
                   "temperature": st.floats(0, 1), "tool_choice": anything})
gpart = st.one_of(st.fixed_dictionaries({"text": text}),
                  st.fixed_dictionaries({"inlineData": st.fixed_dictionaries(
                      {"mimeType": st.just("image/png"), "data": st.just("iVBORw0KGgo=")})}),
                  st.fixed_dictionaries({"functionCall": st.fixed_dictionaries(
                      {"name": text, "args": st.just({})})}))
gcontent = fields({"role": st.sampled_from(["user", "model"]), "parts": st.lists(gpart, max_size=3)},
                  {})
GEMINI = fields({"contents": st.lists(gcontent, min_size=1, max_size=3)},
                {"generationConfig": fields({}, {"maxOutputTokens": small_int,
                                                 "temperature": st.floats(0, 2)}),
                 "systemInstruction": gcontent, "tools": anything,
                 "content": gcontent, "requests": st.lists(fields({"content": gcontent}, {}))})
IMAGES = fields({"prompt": text}, {"model": st.sampled_from(["dall-e-3", "oa-model"]),
                                   "n": small_int, "size": text,
                                   "response_format": st.sampled_from(["url", "b64_json"])})
SPEECH = fields({"model": st.just("tts-1"), "input": text, "voice": st.just("alloy")},
                {"response_format": st.sampled_from(["mp3", "wav", "x"]),
                 "speed": st.floats(0, 5)})
MJ = fields({"prompt": text}, {"base64Array": st.lists(st.just("data:image/png;base64,AAAA")),
                               "base64": text, "taskId": text, "action": text, "index": small_int,
                               "customId": text, "content": text, "state": text})
RESPONSES = fields({"model": st.sampled_from(CHAT_MODELS),
                    "input": st.one_of(text, st.lists(message, max_size=3))},
                   {"stream": st.booleans(), "instructions": text, "store": st.booleans(),
                    "max_output_tokens": small_int, "tools": anything})

token_ids = st.lists(st.integers(-5, 100_000), max_size=4)
COMPLETIONS = fields({"model": st.sampled_from(["instruct-model", "oa-model"]),
                      "prompt": st.one_of(text, st.lists(text, max_size=3), token_ids,
                                          st.lists(token_ids, max_size=3))},
                     {"stream": st.booleans(), "max_tokens": small_int, "n": small_int,
                      "best_of": small_int, "suffix": text, "echo": st.booleans(),
                      "logprobs": small_int, "stream_options": st.just({"include_usage": True}),
                      "temperature": st.floats(0, 2)})
mpart = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                  st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.just(
                      {"url": "data:image/png;base64,iVBORw0KGgo="})}))
MODERATIONS = fields({"input": st.one_of(text, st.lists(text, max_size=3),
                                         st.lists(mpart, max_size=3))},
                     {"model": st.sampled_from(["mod-model", "omni-moderation-latest"])})
RERANK = fields({"model": st.sampled_from(["rerank-model", "oa-model"]), "query": text,
                 "documents": st.lists(st.one_of(text, st.fixed_dictionaries({"text": text})),
                                       max_size=4)},
                {"top_n": small_int, "return_documents": st.booleans()})
response_id = st.one_of(st.just("resp_0123456789abcdef"), text.map(lambda t: quote(t, safe="")))


def post(path, body, auth="bearer", extra=None):
    def make(raw, key):
        h = {"Content-Type": "application/json", **(extra or {})}
        h.update({"bearer": {"Authorization": f"Bearer {key}"},
                  "anthropic": {"x-api-key": key, "anthropic-version": "2023-06-01"},
                  "gemini": {"x-goog-api-key": key}, "mj": {"mj-api-secret": key}}[auth])
        return Request("POST", path, h, raw)
    return st.builds(lambda raw: lambda key: make(raw, key), encoded(body))


@st.composite
def gemini_request(draw):
    model = draw(st.one_of(st.sampled_from(CHAT_MODELS), text.map(lambda t: quote(t, safe=""))))
    method = draw(st.sampled_from(["generateContent", "streamGenerateContent", "countTokens",
                                   "embedContent", "batchEmbedContents", "nope"]))
    q = draw(st.sampled_from(["", "?alt=sse", "?$alt=json;enum-encoding=int"]))
    version = draw(st.sampled_from(["v1beta", "v1"]))
    raw = draw(encoded(GEMINI))
    path = f"/{version}/models/{model or 'x'}:{method}{q}"
    return lambda key: Request("POST", path, {"x-goog-api-key": key,
                                              "Content-Type": "application/json"}, raw)


@st.composite
def mj_request(draw):
    kind = draw(st.sampled_from(["submit", "submit", "fetch", "list", "seed"]))
    mode = draw(st.sampled_from(["", "/mj", "/mj-relax/mj", "/fast"]))
    h = {"Content-Type": "application/json"}
    if kind == "submit":
        action = draw(st.sampled_from(["imagine", "change", "simple-change", "describe", "blend",
                                       "action", "modal", "shorten"]))
        raw = draw(encoded(MJ))
        return lambda key: Request("POST", f"{mode}/submit/{action}", {**h, "mj-api-secret": key}, raw)
    if kind == "list":
        raw = draw(encoded(fields({"ids": st.lists(text)}, {})))
        return lambda key: Request("POST", f"{mode}/task/list-by-condition",
                                   {**h, "mj-api-secret": key}, raw)
    tid = quote(draw(text), safe="") or "x"
    tail = "fetch" if kind == "fetch" else "image-seed"
    return lambda key: Request("GET", f"{mode}/task/{tid}/{tail}", {"mj-api-secret": key})


WAV = make_wav(0.2)
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06"
       b"\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\x00\x05"
       b"\x00\x01\xff\x89\x99=\x1d\x00\x00\x00\x00IEND\xaeB`\x82")
# (fields always sent, with their good value; other fields; values to try)
AUDIO_FIELDS = ({"model": "whisper-1"},
                ["response_format", "temperature", "language", "prompt",
                 "timestamp_granularities[]", "x"],
                ["whisper-1", "json", "text", "verbose_json", "0.5", "2"])
EDIT_FIELDS = ({"model": "dall-e-2", "prompt": "a cat"},
               ["n", "size", "response_format", "quality", "x"],
               ["dall-e-2", "gpt-image-1", "a cat", "1", "3", "256x256", "b64_json", "url"])
# (the file field a good call sends; other file fields; file name, type, good bytes)
AUDIO_FILES = ("file", [], "a.wav", "audio/wav", WAV)
EDIT_FILES = ("image", ["image[]", "mask"], "a.png", "image/png", PNG)


@st.composite
def multipart(draw, path: str, names_values: tuple, files: tuple):
    """An upload that streams through (relay/upstream/upload.py): fields of the right
    names with right and wrong values, files real or not, a body cut short,
    a wrong or missing boundary."""
    required, names, values = names_values
    main_file, file_names, filename, ctype_of_file, good = files
    boundary = "fuzzboundary" + draw(st.sampled_from(["", "x"]))
    value = st.one_of(st.sampled_from(values), text)
    chosen = {k: draw(st.one_of(st.just(v), st.just(v), st.just(v), value))
              for k, v in required.items() if draw(st.sampled_from([True] * 5 + [False]))}
    chosen.update(draw(st.dictionaries(st.sampled_from(names), value, max_size=4)))
    parts = []
    for name, value in chosen.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                     .encode() + value.encode("utf-8", "surrogatepass") + b"\r\n")
    uploads = [main_file] * draw(st.sampled_from([1, 1, 1, 0, 2])) + draw(
        st.lists(st.sampled_from(file_names or [main_file]), max_size=2))
    for name in uploads:
        data = draw(st.one_of(st.just(good), st.just(good), st.binary(max_size=200)))
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                     f'filename="{filename}"\r\nContent-Type: {ctype_of_file}\r\n\r\n'.encode()
                     + data + b"\r\n")
    end = f"--{boundary}--\r\n".encode()
    body = b"".join(parts) + draw(st.sampled_from([end, end, end, b"", b"--"]))
    ctype = draw(st.sampled_from([f"multipart/form-data; boundary={boundary}"] * 3 + [
        "multipart/form-data", "application/json", f"multipart/form-data; boundary={boundary}x"]))
    return lambda key: Request("POST", path, {"Authorization": f"Bearer {key}",
                                              "Content-Type": ctype}, body)


@st.composite
def stored_response(draw):
    """The routes of responses stored here: retrieve, delete, cancel, input
    items, with ids real-looking or not and query values of every kind."""
    rid = draw(response_id)
    method, tail = draw(st.sampled_from([("GET", ""), ("DELETE", ""), ("POST", "/cancel"),
                                         ("GET", "/input_items")]))
    query = draw(st.dictionaries(st.sampled_from(["limit", "order", "after", "include[]",
                                                  "stream", "starting_after"]),
                                 st.one_of(st.sampled_from(["1", "100", "101", "-1", "asc",
                                                            "desc", "x", "1e99",
                                                            "99999999999999999999"]),
                                           text.map(lambda t: quote(t, safe=""))),
                                 max_size=3))
    q = "&".join(f"{k}={v}" for k, v in query.items())
    path = f"/v1/responses/{rid or 'x'}{tail}" + (f"?{q}" if q else "")
    return lambda key: Request(method, path, {"Authorization": f"Bearer {key}"})


@st.composite
def model_list(draw):
    """GET /v1/models in each family's shape, with each family's paging."""
    family = draw(st.sampled_from(["openai", "anthropic", "gemini"]))
    model = draw(st.one_of(st.just(""), st.sampled_from(CHAT_MODELS + ["nope", "a:b"]),
                           text.map(lambda t: quote(t, safe=""))))
    query = draw(st.dictionaries(st.sampled_from(["limit", "after_id", "before_id", "pageSize",
                                                  "pageToken"]),
                                 st.one_of(st.sampled_from(["0", "1", "1000", "-1", "x",
                                                            "99999999999999999999", "oa-model"]),
                                           text.map(lambda t: quote(t, safe=""))),
                                 max_size=3))
    q = "&".join(f"{k}={v}" for k, v in query.items())
    base = "/v1beta/models" if family == "gemini" and draw(st.booleans()) else "/v1/models"
    path = base + (f"/{model}" if model else "") + (f"?{q}" if q else "")
    headers = {"openai": lambda k: {"Authorization": f"Bearer {k}"},
               "anthropic": lambda k: {"x-api-key": k, "anthropic-version": "2023-06-01"},
               "gemini": lambda k: {"x-goog-api-key": k}}[family]
    return lambda key: Request("GET", path, headers(key))


@dataclass
class Face:
    name: str
    requests: st.SearchStrategy


FACES = [
    Face("chat", post("/v1/chat/completions", CHAT)),
    Face("embeddings", post("/v1/embeddings", EMBED)),
    Face("messages", post("/v1/messages", MESSAGES, "anthropic")),
    Face("count_tokens", post("/v1/messages/count_tokens", MESSAGES, "anthropic")),
    Face("gemini", gemini_request()),
    Face("images", post("/v1/images/generations", IMAGES)),
    Face("speech", post("/v1/audio/speech", SPEECH)),
    Face("transcriptions", multipart("/v1/audio/transcriptions", AUDIO_FIELDS, AUDIO_FILES)),
    Face("translations", multipart("/v1/audio/translations", AUDIO_FIELDS, AUDIO_FILES)),
    Face("image_edits", multipart("/v1/images/edits", EDIT_FIELDS, EDIT_FILES)),
    Face("midjourney", mj_request()),
    Face("responses", post("/v1/responses", RESPONSES)),
    Face("responses_input_tokens", post("/v1/responses/input_tokens", RESPONSES)),
    Face("responses_compact", post("/v1/responses/compact", RESPONSES)),
    Face("stored_responses", stored_response()),
    Face("completions", post("/v1/completions", COMPLETIONS)),
    Face("moderations", post("/v1/moderations", MODERATIONS)),
    Face("rerank", post("/v1/rerank", RERANK)),
    Face("models", model_list()),
]


@pytest.fixture(scope="module")
def env(mongo_url, tmp_path_factory):
    fakes = {"openai": FakeOpenAI().start(), "anthropic": FakeAnthropic().start(),
             "gemini": FakeGemini().start(), "media": FakeText().start(),
             "mj": FakeMidjourney().start()}
    relay = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("fuzzfaces")),
                         env={"RELAY_MJ_POLL_INTERVAL": "0.5"}).start()
    admin = Api.login(relay.url)
    admin.create_channel(fakes["openai"].url, ["oa-model"], name="oa")
    admin.create_channel(fakes["anthropic"].url, ["an-model"], name="an", type="anthropic")
    admin.create_channel(fakes["gemini"].url, ["ge-model"], name="ge", type="gemini")
    admin.create_channel(fakes["media"].url, ["tts-1", "dall-e-3"] + TEXT_MODELS, name="media")
    admin.create_channel(fakes["mj"].url, MJ_MODELS, name="mj", type="midjourney",
                         key=fakes["mj"].secret)
    for m in CHAT_MODELS:
        admin.set_price(m, input_price=1, output_price=2)
    for m in ["instruct-model", "mod-model", "rerank-model"]:
        admin.set_price(m, input_price=1, output_price=2)
    for m in ["whisper-1", "tts-1", "dall-e-3", "dall-e-2"] + MJ_MODELS:
        admin.set_price(m, call_price="0.0001")
    tenant = Tenant(admin, relay.url, quota=10 ** 12, key_quota=10 ** 11)
    yield relay, tenant.key
    relay.stop()
    for f in fakes.values():
        f.stop()


@pytest.mark.parametrize("face", FACES, ids=[f.name for f in FACES])
def test_no_500_and_no_traceback(env, face):
    relay, key = env
    found: list[str] = []
    session = requests.Session()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(make=face.requests)
    def run(make):
        req = make(key)
        r = session.request(req.method, relay.url + req.path, headers=req.headers, data=req.body,
                            timeout=60)
        if r.status_code == 500:
            found.append(f"{req.method} {req.path} {req.body[:300] if req.body else b''!r} "
                         f"-> {r.text[:200]}")
    run()
    assert found == [], "\n".join(found[:10])
    log = relay.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 300:][:3000]

