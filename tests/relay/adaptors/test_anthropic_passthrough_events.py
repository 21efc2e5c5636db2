"""An Anthropic stream passed through is written as it came, and read only
for its usage and its text (the estimate of a stream cut short): no OpenAI
chunk is made for it.  What it notes must be what the converting reader
notes, event for event, cut anywhere."""
from __future__ import annotations

import json

import pytest

from relay.adaptors.anthropic import AnthropicStream
from tests.relay.adaptors.stream_pairs import fed_alike, stream_call


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


EVENTS = [
    _event("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [], "usage": {"input_tokens": 1200, "output_tokens": 1,
                                 "cache_read_input_tokens": 900,
                                 "cache_creation_input_tokens": 40}}}),
    _event("ping", {"type": "ping"}),
    _event("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "thinking", "thinking": ""}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "thinking_delta", "thinking": "Let me see"}}),
    _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    _event("content_block_start", {"type": "content_block_start", "index": 1,
                                   "content_block": {"type": "text", "text": ""}}),
    *[_event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                     "delta": {"type": "text_delta", "text": f"word{i} \u2028"}})
      for i in range(30)],
    _event("content_block_stop", {"type": "content_block_stop", "index": 1}),
    _event("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                   "delta": {"type": "input_json_delta",
                                             "partial_json": "{\"file_path\": \"/a"}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                   "delta": {"type": "input_json_delta", "partial_json": "\"}"}}),
    # a delta for a block never started: noted by neither
    _event("content_block_delta", {"type": "content_block_delta", "index": 7,
                                   "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
    _event("content_block_stop", {"type": "content_block_stop", "index": 2}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                             "usage": {"output_tokens": 87}}),
    _event("message_stop", {"type": "message_stop"}),
]


def _call():
    return stream_call("anthropic", "claude-x")


def _state(reader: AnthropicStream):
    conv = reader.conv
    return (dict(conv.usage_doc), list(conv.text_parts), conv.final, dict(conv.tool_index),
            reader.usage, reader.text)


@pytest.mark.parametrize("cut", [1, 3, 10, 36, 38, 40, 41, len(EVENTS)])
def test_passing_through_notes_what_converting_notes(cut):
    passing, converting = AnthropicStream(_call(), True), AnthropicStream(_call(), False)
    fed_alike(passing, converting, EVENTS[:cut], 1 / 3)
    assert _state(passing) == _state(converting)


def test_the_converting_reader_still_makes_every_chunk():
    reader = AnthropicStream(_call(), False)
    chunks = []
    for ev in EVENTS:
        chunks += reader.feed(ev)
    chunks += reader.finish()
    deltas = [c.data["choices"][0]["delta"] for c in chunks if c.data and c.data.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == "".join(
        f"word{i} \u2028" for i in range(30))
    assert chunks[-1].data["usage"]["completion_tokens"] == 87
