"""relay/serving/sse.py's splitter: whatever way a stream is cut into chunks,
the events found, and their exact bytes, are those of the whole stream read
at once (a reference that finds each event's end by searching the whole
remaining buffer for every separator, as the splitter did before it learnt
to scan each byte once)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.convert.common import RawEvents
from relay.serving import sse

SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def reference(stream: bytes) -> tuple[list[bytes], bytes]:
    """Each event's bytes up to and including its blank line, and the rest."""
    out = []
    while True:
        best = -1
        for sep in SEPARATORS:
            i = stream.find(sep)
            if i >= 0 and (best < 0 or i + len(sep) < best):
                best = i + len(sep)
        if best < 0:
            return out, stream
        out.append(stream[:best])
        stream = stream[best:]


line = st.sampled_from([b"data: {\"a\":1}", b"data: x", b"event: response.completed", b": ping",
                        b"id: 7", b"data: " + b"y" * 300, b"data:", b""])
ending = st.sampled_from([b"\n", b"\r\n", b"\r"])
blocks = st.lists(st.tuples(st.lists(st.tuples(line, ending), max_size=4), st.sampled_from(
    [b"\n", b"\r\n", b"\r", b""])), max_size=12)


def _stream(parts) -> bytes:
    return b"".join(b"".join(t + e for t, e in lines) + end for lines, end in parts)


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points}) if data else []
    out, last = [], 0
    for p in points + [len(data)]:
        out.append(data[last:p])
        last = p
    return out


@settings(max_examples=300, deadline=None)
@given(blocks, st.lists(st.integers(0, 10_000), max_size=20))
def test_raw_events_match_the_whole_stream_however_it_is_cut(parts, points):
    _assert_split_as_the_reference(_stream(parts), points)


def _assert_split_as_the_reference(data: bytes, points: list[int]) -> None:
    """RawEvents fed `data` cut at `points` gives the reference's events,
    and the rest when it is flushed."""
    want, rest = reference(data)
    raw = RawEvents()
    got = []
    for chunk in _cuts(data, points):
        got += [b for b, _ in raw.feed(chunk)]
    assert got == want
    assert [b for b, _ in raw.flush()] == ([rest] if rest.strip() else [])


@settings(max_examples=300, deadline=None)
@given(blocks, st.lists(st.integers(0, 10_000), max_size=20))
def test_parsed_events_match_the_whole_stream_however_it_is_cut(parts, points):
    data = _stream(parts)
    want, rest = reference(data)
    expect = [e for e in (sse.parse_block(b) for b in want + ([rest] if rest.strip() else []))
              if e is not None]
    p = sse.SSEParser()
    got = []
    for chunk in _cuts(data, points):
        got += list(p.feed(chunk))
    got += list(p.flush())
    assert got == expect


lf_blocks = st.lists(st.tuples(st.lists(st.tuples(line, st.just(b"\n")), max_size=4),
                               st.sampled_from([b"\n", b""])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(lf_blocks, blocks, st.lists(st.integers(0, 10_000), max_size=20))
def test_a_stream_of_lf_only_then_crs_is_split_as_the_reference(lf_parts, parts, points):
    """What every vendor sends (LF only, one search an event) and a stream
    whose CRs begin after many events: the splitter changes how it looks
    for an end mid-stream, and the events are still the reference's."""
    _assert_split_as_the_reference(_stream(lf_parts) + _stream(parts), points)


def test_a_large_event_in_many_pieces_is_one_event():
    big = b"event: response.created\ndata: {\"instructions\": \"" + b"x" * 40_000 + b"\"}\n\n"
    raw = RawEvents()
    got = []
    for i in range(0, len(big), 1000):
        got += raw.feed(big[i:i + 1000])
    assert [b for b, _ in got] == [big]
    assert got[0][1].event == "response.created"


def test_an_event_over_the_limit_is_refused():
    raw = RawEvents(max_event=1000)
    raw.feed(b"data: " + b"x" * 900)
    try:
        raw.feed(b"x" * 200)
    except ValueError:
        return
    raise AssertionError("an unfinished event past max_event was kept")


def spec_block(raw: bytes) -> sse.Event | None:
    """An event's fields as the SSE grammar reads them: a line ends at CR LF,
    LF or CR and nowhere else; `name: value` (one space after the colon
    dropped), a line starting with a colon is a comment."""
    import re
    data, event, ident = [], "", ""
    for ln in re.split(r"\r\n|\r|\n", raw.decode("utf-8", errors="replace")):
        if not ln or ln.startswith(":"):
            continue
        name, _, value = ln.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            ident = value
    return sse.Event("\n".join(data), event, ident) if data or event else None


# Text a model writes inside a JSON string, raw (orjson, serde_json and Go
# write U+2028, U+2029 and U+0085 unescaped): str.splitlines() would end a
# line at each, and the event's data there.
text_line = st.builds(lambda name, sp, body: name + sp + body,
                      st.sampled_from([b"data", b"event", b"id", b"retry", b"", b"data ", b"Data"]),
                      st.sampled_from([b":", b": ", b":  ", b""]),
                      st.text(st.sampled_from(list("ab :{}\"\\\u2028\u2029\u0085\x0b\x0c\x1c\x1d"
                                                   "\x1e\u00e9\U0001f600")), max_size=12)
                      .map(lambda s: s.encode()))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(text_line, ending), max_size=5), st.sampled_from([b"\n", b"\r\n", b""]))
def test_an_event_is_read_as_the_sse_grammar_reads_it(lines, end):
    raw = b"".join(t + e for t, e in lines) + end
    assert sse.parse_block(raw) == spec_block(raw)


def test_a_delta_holding_a_line_separator_is_read_whole():
    text = "one\u2028two\u2029three\u0085four"
    raw = ('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
           '"delta":{"type":"text_delta","text":"%s"}}\n\n' % text).encode()
    (_, ev), = RawEvents().feed(raw)
    assert ev.event == "content_block_delta"
    assert sse.Event.json(ev)["delta"]["text"] == text


@settings(max_examples=300, deadline=None)
@given(blocks, st.lists(st.booleans(), max_size=12))
def test_one_event_a_chunk_as_upstreams_flush_them(parts, split):
    """An upstream flushes one event at a time, so most chunks are one
    whole event (read without the splitter): fed so, some of them cut in
    two, the events and their fields are the reference's."""
    data = _stream(parts)
    want, rest = reference(data)
    raw, parser = RawEvents(), sse.SSEParser()
    got, parsed = [], []
    for i, event in enumerate(want):
        pieces = [event[:1], event[1:]] if i < len(split) and split[i] and len(event) > 1 \
            else [event]
        for piece in pieces:
            got += raw.feed(piece)
            parsed += parser.feed(piece)
    got += raw.feed(rest)
    parsed += parser.feed(rest)
    assert [b for b, _ in got] == want
    assert [ev for _, ev in got] == [spec_block(b) for b in want]
    assert parsed == [ev for ev in (spec_block(b) for b in want) if ev is not None]


@pytest.mark.parametrize("chunk", [
    b"data: a\r\rdata: b\r\n\r\n", b"data: a\n\ndata: b\r\n\r\n", b"data: a\r\n\r\ndata: b\r\n\r\n",
    b"data: a\n\ndata: b\n\n", b"event: x\ndata: a\n\n\n\n", b"\r\n\r\n", b"\n\n", b"\r\r",
    b"data: a\r\n\r\n\r\n\r\n", b"data: a\r\n\n\r\n\r\n"])
def test_a_chunk_of_more_than_one_event_is_split_as_the_reference(chunk):
    """Only a chunk whose one separator is its end is taken whole."""
    raw = RawEvents()
    raw.feed(b"data: before\n\n")  # nothing held, as after any whole event
    got = raw.feed(chunk)
    want, rest = reference(chunk)
    assert [b for b, _ in got] == want and not rest
    assert [ev for _, ev in got] == [spec_block(b) for b in want]
