"""A Gemini stream passed through is written as it came and read only for
its usage, its grounding searches and its text: no OpenAI chunk is made
for it.  What it notes must be what the converting reader notes, cut
anywhere."""
from __future__ import annotations

import json

import pytest

from relay.adaptors.gemini import GeminiStream
from tests.relay.adaptors.stream_pairs import fed_alike, stream_call


def _event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\r\n\r\n"


def _text(text: str, thought: bool = False, meta: dict | None = None) -> bytes:
    part = {"text": text, **({"thought": True} if thought else {})}
    doc = {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}]}
    if meta:
        doc["usageMetadata"] = meta
    return _event(doc)


EVENTS = [
    _text("Thinking it over.", thought=True, meta={"promptTokenCount": 800,
                                                   "totalTokenCount": 805}),
    *[_text(f"part {i} \u2028 ", meta={"promptTokenCount": 800, "candidatesTokenCount": i})
      for i in range(12)],
    _event({"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "read_file", "args": {"path": "/a"}}}]}, "index": 0}]}),
    _event({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                            "finishReason": "STOP", "index": 0,
                            "groundingMetadata": {"webSearchQueries": ["q1", "q2"]}}],
            "usageMetadata": {"promptTokenCount": 800, "candidatesTokenCount": 40,
                              "thoughtsTokenCount": 12, "cachedContentTokenCount": 500,
                              "totalTokenCount": 852}}),
]


def _call():
    return stream_call("gemini", "gemini-2.5-pro")


def _state(reader: GeminiStream):
    conv = reader.conv
    return (conv.meta, list(conv.text_parts), conv.calls, reader.usage, reader.text,
            reader.searches)


@pytest.mark.parametrize("cut", [1, 2, 8, 13, 14, len(EVENTS)])
def test_passing_through_notes_what_converting_notes(cut):
    passing, converting = GeminiStream(_call(), True), GeminiStream(_call(), False)
    _, made = fed_alike(passing, converting, EVENTS[:cut], 1 / 2)
    assert _state(passing) == _state(converting)
    if cut == len(EVENTS):
        assert made[-1].data["usage"]["prompt_tokens"] == 800  # the converting one still makes them
