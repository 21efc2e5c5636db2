"""The Messages checks count the blocks fetched by reference on their own
walk (relay/convert/anthropic_request.validate): for any body, the count is
what a separate walk of the messages finds, and a body is refused exactly
when one of its blocks is one the conversion cannot read."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from relay.convert.anthropic_request import references_in, validate
from relay.errors import RelayError

_SOURCES = st.sampled_from([
    {"type": "url", "url": "https://x.test/a.png"},
    {"type": "file", "file_id": "file_1"},
    {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    {"type": "text", "media_type": "text/plain", "data": "t"},
])
_LEAVES = st.one_of(
    st.just({"type": "text", "text": "t"}),
    st.just({"type": "text"}),                                   # no text: refused
    st.builds(lambda s: {"type": "image", "source": s}, _SOURCES),
    st.builds(lambda s: {"type": "document", "source": s}, _SOURCES),
    st.just({"type": "image", "source": "https://x.test/a.png"}),  # not an object: refused
    st.just({"type": "tool_use", "id": "t", "name": "f", "input": {}}),
    st.just({"type": "tool_use", "id": "t", "name": "f", "input": "{}"}),  # refused
    st.just({"type": "search_result", "source": "s", "title": "t", "content": []}),
    st.just({"type": 3}),                                        # refused
    st.just("text"),                                             # refused
)


def _blocks(leaves):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.builds(lambda c: {"type": "tool_result", "tool_use_id": "t", "content": c},
                  st.one_of(st.just("out"), st.lists(inner, max_size=3), st.just(7))),
        st.builds(lambda c: {"type": "document", "source": {"type": "content", "content": c}},
                  st.lists(inner, max_size=3)),
    ), max_leaves=8)


_MESSAGES = st.lists(st.builds(lambda role, content: {"role": role, "content": content},
                               st.sampled_from(["user", "assistant", "system"]),
                               st.one_of(st.just("hi"), st.lists(_blocks(_LEAVES), max_size=4))),
                     min_size=1, max_size=4)


def _walked(messages) -> int:
    """The count as a separate walk of every message's content makes it."""
    return sum(references_in(m.get("content")) for m in messages)


def _readable(block) -> bool:
    """Whether the conversion can read a block: the rules, written plainly."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        return False
    need = {"text": {"text": str}, "image": {"source": dict}, "document": {"source": dict},
            "tool_use": {"id": str, "name": str, "input": dict},
            "tool_result": {"tool_use_id": str}}.get(block["type"], {})
    if not all(isinstance(block.get(k), t) for k, t in need.items()):
        return False
    if block["type"] == "tool_result":
        inner = block.get("content")
        if isinstance(inner, list):
            return all(_readable(b) for b in inner)
        return inner is None or isinstance(inner, str)
    return True


@settings(max_examples=400, deadline=None)
@given(_MESSAGES)
def test_the_count_is_a_separate_walks_and_refusals_are_the_rules(messages):
    doc = {"model": "m", "max_tokens": 5, "messages": messages}
    readable = all(isinstance(m["content"], str) or all(_readable(b) for b in m["content"])
                   for m in messages)
    if readable:
        assert validate(doc) == _walked(messages)
    else:
        with pytest.raises(RelayError) as ei:
            validate(doc)
        assert ei.value.status == 400 and ei.value.message.startswith("messages.")


def test_a_document_read_by_reference_inside_a_tool_result_is_counted_once():
    doc = {"model": "m", "max_tokens": 5, "system": [
        {"type": "text", "text": "s"}], "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "document", "source": {"type": "url", "url": "https://x.test/a.pdf"}},
                {"type": "document", "source": {"type": "content", "content": [
                    {"type": "image", "source": {"type": "file", "file_id": "f"}}]}}]},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}]}]}
    assert validate(doc) == 2


def test_a_bad_block_is_named_by_its_path():
    doc = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "fine"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {
            "type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_use",
                                                                    "id": "i", "name": "f"}]}]}]}
    with pytest.raises(RelayError) as ei:
        validate(doc)
    assert ei.value.message.startswith("messages.1.content.1.content.0.input: Field required")
    doc = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
           "system": [{"type": "text", "text": "a"}, {"type": "text"}]}
    with pytest.raises(RelayError) as ei:
        validate(doc)
    assert ei.value.message.startswith("system.1.text: Field required")
