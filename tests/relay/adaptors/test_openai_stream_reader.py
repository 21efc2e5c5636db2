"""The OpenAI stream reader's pass-through path (relay/adaptors/openai.py
OpenAIStream, lazy): complete events leave as the bytes that came, however
the upstream's chunks cut them; usage is still read, and the generated text
is still there to estimate a call that lost its usage."""
import json
import random

import pytest

from relay.adaptors.openai import OpenAIStream


def _event(doc) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _wire(crlf: bool = False, endings: random.Random | None = None) -> bytes:
    parts = [b": keep-alive\n\n"]
    for word in ("Hel", 'lo, \\u00e9', ' w\\"orld'):
        parts.append(b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"'
                     + word.encode() + b'"}}]}\n\n')
    parts.append(_event({"id": "c1", "choices": [{"index": 0, "delta": {
        "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}}]}))
    parts.append(_event({"id": "c1", "choices": [], "usage": {
        "prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 2}}}))
    parts.append(b"data: [DONE]\n\n")
    if endings is not None:  # each event ends its own way, as SSE allows
        parts = [p[:-2] + endings.choice((b"\n\n", b"\r\n\r\n", b"\r\r")) for p in parts]
    wire = b"".join(parts)
    return wire.replace(b"\n", b"\r\n") if crlf else wire


def _run(wire: bytes, cuts: list[int]):
    reader = OpenAIStream(keep_raw=True, lazy=True)
    out, at = [], 0
    for cut in sorted(cuts) + [len(wire)]:
        out += reader.feed(wire[at:cut])
        at = cut
    out += reader.finish()
    return reader, out


@pytest.mark.parametrize("crlf", [False, True, "mixed"])
@pytest.mark.parametrize("seed", range(20))
def test_bytes_usage_and_text_whatever_the_cuts(crlf, seed):
    rnd = random.Random(seed)
    wire = _wire(crlf is True, rnd if crlf == "mixed" else None)
    cuts = [rnd.randrange(1, len(wire)) for _ in range(rnd.randrange(0, 12))]
    reader, chunks = _run(wire, cuts)
    sent = b"".join(c.raw for c in chunks)
    usage_at = wire.index(b'data: {"id": "c1", "choices": [], "usage"')
    # Everything before the usage event leaves byte for byte; from there on
    # the events are read (usage, [DONE]) and written again the same way.
    assert sent[:usage_at] == wire[:usage_at]
    assert sent.endswith(b"data: [DONE]\n\n") and sent.count(b"[DONE]") == 1
    assert sent.count(b"data: ") == wire.count(b"data: ")
    assert b'"usage"' in sent[usage_at:]
    assert reader.usage.prompt_tokens == 7 and reader.usage.completion_tokens == 5
    assert reader.usage.cached_tokens == 2
    assert reader.text == 'Hello, \u00e9 w"orldf{"a": 1}'


def test_a_stream_cut_off_keeps_its_text_and_no_usage():
    wire = _wire()
    cut = wire.index(b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"tool')
    reader, chunks = _run(wire[:cut + 10], [])
    assert b"".join(c.raw for c in chunks) == wire[:cut] + b"data: " + wire[cut + 6:cut + 10] \
        + b"\n\n"
    assert reader.usage is None
    assert reader.text.startswith('Hello, \u00e9 w"orld')


def test_an_endless_event_is_refused():
    reader = OpenAIStream(keep_raw=True, lazy=True)
    reader.parser.max_event = 1000
    with pytest.raises(ValueError):
        reader.feed(b"data: " + b"x" * 2000)
