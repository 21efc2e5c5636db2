"""relay/serving/jsonin.py reads request bodies with orjson when it can, and with
the json module (which names the field at fault) when it cannot.  The two
must agree on every body: the same document, or a refusal either way.
Hypothesis writes the bodies, hostile ones included."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.serving import jsonin
from tests.helpers import interleaved

orjson = pytest.importorskip("orjson")

_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
_docs = st.recursive(_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=30)


def _slow(raw: bytes):
    """What the json-module path alone says."""
    saved = jsonin.orjson
    jsonin.orjson = None
    try:
        return ("ok", jsonin.parse(raw))
    except jsonin.BadInput as exc:
        return ("refused", exc.message)
    finally:
        jsonin.orjson = saved


def _fast(raw: bytes):
    try:
        return ("ok", jsonin.parse(raw))
    except jsonin.BadInput as exc:
        return ("refused", exc.message)


def _same(a, b) -> bool:
    # NaN is never equal to itself; both paths refuse it anyway.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_docs)
def test_both_paths_read_a_document_alike(doc):
    raw = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
    fast, slow = _fast(raw), _slow(raw)
    assert fast[0] == slow[0], (raw, fast, slow)
    assert _same(fast[1], slow[1]) if fast[0] == "ok" else fast == slow


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=60) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_both_paths_refuse_the_same_bytes(raw):
    fast, slow = _fast(raw), _slow(raw)
    assert fast[0] == slow[0], (raw, fast, slow)
    if fast[0] == "ok":
        assert _same(fast[1], slow[1])


@pytest.mark.parametrize("raw", [
    b'{"a":12345678901234567890123}', b'{"a":-9223372036854775809}', b'{"a":1e400}',
    b'{"a":"\\ud800"}', b'{"a":NaN}', b'\xef\xbb\xbf{"a":1}', b'{"a":"\xed\xa0\x80"}',
    b"[" * 65 + b"]" * 65, b'{"a":1,"a":2}', b"  ", b'{"a":"\\ud83d\\ude00"}'])
def test_the_edges_orjson_would_read_otherwise(raw):
    assert _fast(raw) == _slow(raw)


def test_what_we_send_is_json_alike():
    doc = {"model": "m", "messages": [{"role": "user", "content": "héllo \u2028 \x00"}],
           "temperature": 0.1, "n": 2 ** 70, "x": [1.5e-7, -0.0, True, None]}
    assert json.loads(jsonin.dumps(doc)) == doc
    assert json.loads(jsonin.dumps({1: "int key"})) == {"1": "int key"}
    assert jsonin.loads_answer(b'{"id": 123456789012345678901234, "v": NaN}')["id"] == \
        123456789012345678901234


def test_what_we_send_takes_only_its_own_size():
    # An upstream request is held for the whole stream: orjson's bytes
    # alone would keep the buffer they were written in (4 KB for 130 bytes).
    import tracemalloc
    for doc in ({"model": "m", "stream": True}, {"x": "a" * 3000}, {"x": "é" * 50_000}):
        tracemalloc.start()
        try:
            kept = [jsonin.dumps(doc) for _ in range(50)]
            held = tracemalloc.get_traced_memory()[0] / len(kept)
        finally:
            tracemalloc.stop()
        # (a non-ASCII str keeps its own UTF-8 copy once: the 5%)
        assert held < len(kept[0]) * 1.05 + 200, (len(kept[0]), held)


def test_an_event_frame_takes_only_its_own_size():
    # relay/sse.encode joins the JSON to its frame, which is the copy.
    import tracemalloc

    from relay.serving import sse
    doc = {"choices": [{"index": 0, "delta": {"content": "hello " * 20}}]}
    tracemalloc.start()
    try:
        kept = [sse.encode(doc, "message") for _ in range(50)]
        held = tracemalloc.get_traced_memory()[0] / len(kept)
    finally:
        tracemalloc.stop()
    assert kept[0].startswith(b"event: message\ndata: {") and kept[0].endswith(b"}\n\n")
    assert held < len(kept[0]) + 200, (len(kept[0]), held)


# The shapes jsonin looks for in one pass of bytes.translate, each against the
# regex it stands for (relay/serving/jsonin.py: _long_int, _big_float, _surrogate_escape).
_SHAPED = st.binary(max_size=80) | st.lists(
    st.sampled_from([b"1", b"9", b"0" * 18, b"7" * 19, b"e", b"E", b"+", b"-", b".", b"\\u",
                     b"d8", b"D9", b"a", b"\xb2", b"\xd9\xa3", b" ", b'"']),
    max_size=40).map(b"".join)


@settings(max_examples=600, deadline=None)
@given(_SHAPED)
def test_the_shape_checks_find_what_the_regexes_find(raw):
    import re
    shape = raw.translate(jsonin._SHAPES)
    assert jsonin._long_int(shape) == bool(re.search(rb"\d{19}", raw))
    assert jsonin._big_float(shape) == bool(re.search(rb"[eE]\+?\d{3}|\d{300}", raw))
    assert jsonin._surrogate_escape(raw) == bool(re.search(rb"\\u[dD][89a-fA-F]", raw))


def test_a_run_of_300_digits_is_a_big_float():
    shape = (b"1" * 300).translate(jsonin._SHAPES)
    assert jsonin._big_float(shape) and not jsonin._big_float(shape[:299])


@pytest.mark.parametrize("depth", [1, 2, 62, 63, 64, 65, 66, 100, 300])
@pytest.mark.parametrize("shape", ["list", "dict", "mixed"])
@pytest.mark.parametrize("inner", [0, [], {}])
@pytest.mark.parametrize("pad", [0, 8000])
def test_many_brackets_at_and_past_the_depth_limit(depth, shape, inner, pad):
    """An agent's body has hundreds of brackets, so the bracket count cannot
    settle it: orjson's document is checked for its depth (walked, or for a
    long body read off its indented encoding), and kept only if that agrees
    with the json path (the same document, or the same refusal naming the
    same field).  An empty container at the bottom is a level too."""
    def nest(d):
        v = inner
        for i in range(d - 1):  # the top object below is level 1
            v = [v] if shape == "list" or (shape == "mixed" and i % 2) else {"k": v}
        return v
    doc = {"tools": [{"type": "function", "parameters": {}} for _ in range(80)],
           "deep": nest(depth - (inner != 0)), "pad": "x\n" * pad}
    raw = json.dumps(doc).encode()
    assert raw.count(b"[") + raw.count(b"{") > jsonin.MAX_DEPTH
    fast, slow = _fast(raw), _slow(raw)
    assert fast == slow
    assert fast[0] == ("ok" if depth <= jsonin.MAX_DEPTH else "refused"), fast


def test_the_fast_path_keeps_orjsons_document_for_a_deep_but_allowed_body():
    raw = json.dumps({"tools": [{"a": [[[]]]} for _ in range(100)]}).encode()
    calls = []
    saved = json.loads
    json.loads = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        jsonin.parse(raw)
    finally:
        json.loads = saved
    assert not calls  # the json module was not needed


def test_orjson_writes_254_containers_deep_and_no_deeper():
    """The depth check leans on orjson's own limit on what it writes; an
    orjson that moved it leaves the check to the walk of the containers."""
    assert jsonin._DEEPEST_WRITTEN == 254


@pytest.mark.parametrize("written", ["orjson's limit", "the walk"])
@pytest.mark.parametrize("depth", [63, 64, 65])
@pytest.mark.parametrize("number", [7, 2 ** 60, 2 ** 64, 1e300])
def test_the_depth_and_the_numbers_by_one_encoding_or_by_the_walks(monkeypatch, written,
                                                                  depth, number):
    """At the limit and one past it, with numbers orjson writes as they are,
    refuses (past 53 bits) or reads otherwise than json: the answer is the
    json path's, and a body of allowed depth and numbers never needs it."""
    if written == "the walk":
        monkeypatch.setattr(jsonin, "_DEEPEST_WRITTEN", 0)
    deep: object = number
    for i in range(depth - 1):
        deep = [deep] if i % 2 else {"k": deep}
    raw = json.dumps({"tools": [{"a": [[[]]]} for _ in range(100)], "deep": deep}).encode()
    calls = []
    saved = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: calls.append(1) or saved(*a, **k))
    fast = _fast(raw)
    monkeypatch.setattr(json, "loads", saved)
    assert fast == _slow(raw)
    assert fast[0] == ("ok" if depth <= jsonin.MAX_DEPTH and number != 2 ** 64 else "refused")
    if fast[0] == "ok" and number != 1e300:
        assert not calls


@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "\\u4f60\\u597d \\ud83e\\udd16", "\\ud800",
                                  "\\udc00", "x\\ud800\\u0041", "\\ude00\\ud83d"])
def test_surrogate_escapes_go_the_fast_way_and_agree(text):
    """Python clients escape every emoji as a surrogate pair (json.dumps'
    ensure_ascii): such bodies stay on orjson's path; a lone one is refused
    by both paths alike."""
    raw = ('{"model": "m", "messages": [{"role": "user", "content": "%s"}]}' % text).encode()
    assert _fast(raw) == _slow(raw)


# Runs of 19 digits in text (nanosecond times, snowflake ids, a device id of
# zeros in Claude Code's metadata) beside integer tokens of every length and
# sign, in every position a token may take: both paths read them alike, and
# a run that is only text keeps orjson's path.
_RUN_PIECES = st.lists(st.sampled_from([
    b'"t":', b'"0000000000000000000"', b'"x1234567890123456789"', b'"a-12345678901234567890"',
    b'"pi 3.14159265358979323846"', b"9223372036854775807", b"9223372036854775808",
    b"-9223372036854775809", b"18446744073709551616", b"1234567890123456789012345",
    b"0.00000000000000000001", b"1.5e10", b"7", b"-3"]), min_size=1, max_size=8)


@settings(max_examples=400, deadline=None)
@given(_RUN_PIECES)
def test_digit_runs_in_text_and_in_numbers_read_alike(pieces):
    values = [p for p in pieces if p != b'"t":']
    if not values:
        return
    raw = b'{"v":[' + b", ".join(values) + b'],"s":' + values[0] + b"}"
    fast, slow = _fast(raw), _slow(raw)
    assert fast[0] == slow[0]
    if fast[0] == "ok":
        assert _same(fast[1], slow[1]) and repr(fast[1]) == repr(slow[1])
    else:
        assert fast == slow


def test_a_digit_run_inside_a_string_keeps_orjsons_path():
    raw = json.dumps({"metadata": {"user_id": json.dumps({"device_id": "0" * 64})},
                      "messages": [{"role": "user", "content": "at 1732623456789012345 ns"}],
                      "tools": [{"a": [[[]]]} for _ in range(100)]}).encode()
    calls = []
    saved = json.loads
    json.loads = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        assert jsonin.parse(raw)["metadata"]["user_id"].count("0") == 64
    finally:
        json.loads = saved
    assert not calls


@pytest.mark.parametrize("raw", [b"18446744073709551616", b"-9223372036854775809",
                                 b"9223372036854775808", b"1234567890123456789", b"[1e19]"])
def test_a_lone_long_number_reads_alike(raw):
    assert _fast(raw) == _slow(raw) or _same(_fast(raw)[1], _slow(raw)[1])


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1e-400", b"1" * 300, b"1" * 400 + b".5",
                                    b"0." + b"0" * 350 + b"1", b"1e0000000000000000001",
                                    b"2.2250738585072011e-308", b"1.7976931348623157e308"])
def test_extreme_numbers_read_alike_on_either_path(number):
    raw = b'{"tools":[' + b",".join([b'{"a":[[]]}'] * 40) + b'],"n":' + number + b"}"
    fast, slow = _fast(raw), _slow(raw)
    assert fast[0] == slow[0], (fast, slow)
    assert fast == slow or repr(fast[1]) == repr(slow[1])


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_of_two_to_the_63_or_more_is_seen_in_orjsons_encoding(x):
    """The fast path spares the walk of every number when the compact
    encoding shows no float that large: it must never miss one."""
    encoded = orjson.dumps({"a": [x]}, option=orjson.OPT_STRICT_INTEGER)
    if abs(x) >= 2.0 ** 63:
        assert jsonin._large_float(encoded), encoded


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_docs, st.booleans())
def test_parse_passing_is_parse_then_passed_on(doc, compact):
    """What a pass-through face reads and sends (one encoding for both) is
    what parse and passed_on say apart, for compact and spaced bodies alike."""
    if not isinstance(doc, dict):
        doc = {"v": doc}
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":") if compact else None)
    raw = raw.encode("utf-8", "surrogatepass")
    try:
        want = jsonin.parse(raw)
    except jsonin.BadInput as exc:
        with pytest.raises(jsonin.BadInput) as got:
            jsonin.parse_passing(raw)
        assert got.value.message == exc.message
        return
    doc_got, sent = jsonin.parse_passing(raw)
    assert _same(doc_got, want) and sent == jsonin.passed_on(raw, want)


@pytest.mark.parametrize("raw", [b'{"model":"dear","model":"cheap","n":1}',
                                 b'{"model": "dear", "model": "cheap", "n": 1}',
                                 b'{"model":"a","big":9223372036854775807}'])
def test_parse_passing_sends_what_was_read(raw):
    doc, sent = jsonin.parse_passing(raw)
    assert json.loads(sent) == doc
    if raw.count(b'"model"') == 2:
        assert sent != raw  # the key given twice is sent once, as read


def test_the_lists_a_document_is_nested_in_are_never_shared_by_two_threads():
    """The lists _encoded_within nests a document in are kept for the next
    call; threads (bodies parsed off the loop) each encode their own
    document, never another's, and a failed encoding leaves no document
    behind in them."""
    docs = [{"n": i, "pad": "x" * (5000 + i)} for i in range(8)]
    wrong = []

    def encode(doc):
        for _ in range(3000):
            out = jsonin._encoded_within(doc, jsonin.MAX_DEPTH)
            if out != orjson.dumps(doc):
                wrong.append(doc["n"])
                return

    interleaved(encode, [(d,) for d in docs])
    assert wrong == []
    assert jsonin._encoded_within({"big": 2 ** 64}, jsonin.MAX_DEPTH) is None
    for outer, inner in jsonin._WRAPS:
        assert inner == [None]
    # one level past MAX_DEPTH still fails, with the lists reused
    assert jsonin._encoded_within(jsonin._nested(0, jsonin.MAX_DEPTH + 1), jsonin.MAX_DEPTH) is None
    assert jsonin._encoded_within(jsonin._nested(0, jsonin.MAX_DEPTH), jsonin.MAX_DEPTH) \
        == orjson.dumps(jsonin._nested(0, jsonin.MAX_DEPTH))
