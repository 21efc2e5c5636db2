"""Tool-call arguments (and tool outputs read as arguments) become an
object exactly as the json module would read them: the fast path may only
skip work, never change an answer."""
from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from relay.convert.common import parse_args


def _by_json(arguments):
    """What parse_args answered when it was json.loads and nothing else."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return {"_raw": str(arguments)}
    return value if isinstance(value, dict) else {"value": value}


def _same(a, b) -> bool:
    # NaN is not equal to itself; compare the texts json writes
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


EDGES = ["", " ", "{}", " {\"a\": 1} ", "\t\n\r[1]", "\u3000{}", "\x0b{}", "NaN", "-Infinity",
         "Infinity", "nan", "12345678901234567890123", "-0", "1e400", "\"\\ud800\"", "\"\ud800\"", "\ud800", "true",
         "null", "false", "tru", "{\"a\":1,\"a\":2}", "{\"a\":1} x", "import os\nprint(1)",
         "no such file", "Traceback (most recent call last):", "{\"a\": NaN}", "[", "\"",
         b"{\"b\": 2}", b"\xff", bytearray(b"[3]"), 7, 0, None, ["x"], {"k": "v"}, 1.5]


def test_edges_read_as_json_reads_them():
    for arguments in EDGES:
        assert _same(parse_args(arguments), _by_json(arguments)), repr(arguments)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from(["", " ", "\n\t", "\u00a0", "\u2028", "\x0c"]),
       st.sampled_from(["", " ", "x", "\n"]))
def test_any_json_text_read_as_json_reads_it(value, before, after):
    text = before + json.dumps(value) + after
    assert _same(parse_args(text), _by_json(text))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_read_as_json_reads_it(text):
    assert _same(parse_args(text), _by_json(text))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=' \t\n\x0b\u00a0{}[]"-0123456789.eE+truefalsnNIiy,:\u0661', max_size=12))
def test_json_like_text_read_as_json_reads_it(text):
    # texts made of JSON's own characters: the ones a shortcut by the
    # text's ends could misjudge
    assert _same(parse_args(text), _by_json(text))
