"""The SSE codec: WHATWG parsing rules, arbitrary chunking, and encode/decode round trips."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from responses_gateway.protocol.sse import (
    DONE,
    EventStreamDecoder,
    SSEComment,
    SSEDecoder,
    SSEMessage,
    SSEPayloadError,
    decode_event,
    decode_events,
    encode_comment,
    encode_event,
)


def parse(data: bytes, comments: bool = False) -> list[SSEMessage]:
    decoder = SSEDecoder(comments=comments)
    return decoder.feed(data) + decoder.flush()


def parse_split(data: bytes, cuts: list[int], comments: bool = False) -> list[SSEMessage]:
    decoder = SSEDecoder(comments=comments)
    out: list[SSEMessage] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        out += decoder.feed(data[start:cut])
        start = cut
    return out + decoder.flush()


def test_spec_example_multiline_data() -> None:
    # The WHATWG spec's own example: two data lines joined with LF, then a second event.
    stream = b"data: YHOO\ndata: +2\ndata: 10\n\ndata: second\n\n"
    assert parse(stream) == [SSEMessage("message", "YHOO\n+2\n10"), SSEMessage("message", "second")]


def test_spec_example_ids_and_comments() -> None:
    stream = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
    assert parse(stream) == [
        SSEMessage("message", "first event", "1"),
        SSEMessage("message", "second event", ""),
        # Only one leading space is removed.
        SSEMessage("message", " third event", ""),
    ]


def test_spec_example_empty_data_lines() -> None:
    # "data" with no colon and "data:" both append an empty line; the last block has no blank line.
    stream = b"data\n\ndata\ndata\n\ndata:"
    decoder = SSEDecoder()
    assert decoder.feed(stream) == [SSEMessage("message", ""), SSEMessage("message", "\n")]
    assert decoder.flush() == []
    assert decoder.truncated


def test_spec_example_space_after_colon_is_optional() -> None:
    assert parse(b"data:test\n\ndata: test\n\n") == [SSEMessage("message", "test")] * 2


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings(eol: bytes) -> None:
    stream = eol.join([b"event: a", b"data: 1", b"data: 2", b"", b"data: 3", b"", b""])
    assert parse(stream) == [SSEMessage("a", "1\n2"), SSEMessage("message", "3")]


def test_mixed_line_endings_and_cr_at_chunk_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    # The LF completing the CRLF arrives in the next chunk: it must not count as a second line end.
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r") == [SSEMessage("message", "a")]
    assert decoder.feed(b"\ndata: b\n\r\n") == [SSEMessage("message", "b")]


def test_lone_cr_then_cr_is_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\r") == [SSEMessage("message", "x")]


def test_event_type_and_default() -> None:
    assert parse(b"event: add\ndata: 1\n\ndata: 2\n\n") == [
        SSEMessage("add", "1"),
        SSEMessage("message", "2"),
    ]


def test_event_type_reset_when_nothing_dispatched() -> None:
    # A block with no data is not dispatched, and its event name does not leak into the next block.
    assert parse(b"event: lost\n\ndata: x\n\n") == [SSEMessage("message", "x")]


def test_comments_are_ignored_or_reported() -> None:
    stream = b": keepalive\n:\n:no-space\ndata: x\n\n"
    assert parse(stream) == [SSEMessage("message", "x")]
    assert parse(stream, comments=True) == [
        SSEComment("keepalive"),
        SSEComment(""),
        SSEComment("no-space"),
        SSEMessage("message", "x"),
    ]


def test_field_without_colon_and_unknown_fields() -> None:
    assert parse(b"foo: bar\nbaz\ndata\n\n") == [SSEMessage("message", "")]


def test_id_persists_and_nul_is_ignored() -> None:
    stream = b"id: 7\ndata: a\n\ndata: b\n\nid: 8\x009\ndata: c\n\nid:\ndata: d\n\n"
    decoder = SSEDecoder()
    assert [m.id for m in decoder.feed(stream)] == ["7", "7", "7", ""]
    assert decoder.last_event_id == ""


def test_retry_digits_only() -> None:
    decoder = SSEDecoder()
    messages = decoder.feed(
        b"retry: 1500\ndata: a\n\nretry: 15x\ndata: b\n\nretry:\ndata: c\n\nretry: -1\n\n"
    )
    assert [m.retry for m in messages] == [1500, None, None]
    assert decoder.retry == 1500
    assert decoder.feed(b"retry: 20\n\n") == []
    assert decoder.retry == 20


def test_bom_stripped_once() -> None:
    bom = b"\xef\xbb\xbf"
    assert parse(bom + b"data: a\n\n") == [SSEMessage("message", "a")]
    # A second BOM is content: the line's field name becomes "\ufeffdata", an unknown field.
    assert parse(bom + bom + b"data: a\n\n") == []
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef") == []
    assert decoder.feed(b"\xbb") == []
    assert decoder.feed(b"\xbfdata: a\n\n") == [SSEMessage("message", "a")]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert parse(b"data: a\xffb\n\n") == [SSEMessage("message", "a\ufffdb")]


def test_truncated_flag_and_lenient_flush() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: complete\n\ndata: partial") == [SSEMessage("message", "complete")]
    assert decoder.flush() == []
    assert decoder.truncated
    decoder = SSEDecoder()
    decoder.feed(b"event: e\ndata: whole line\n")
    assert decoder.flush(dispatch_incomplete=True) == [SSEMessage("e", "whole line")]
    assert decoder.truncated
    decoder = SSEDecoder()
    decoder.feed(b"data: x\n\n: trailing comment\n")
    assert decoder.flush() == []
    assert not decoder.truncated


def test_decoder_is_reusable_after_flush() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: partial")
    decoder.flush()
    assert decoder.feed(b"\xef\xbb\xbfdata: new\n\n") == [SSEMessage("message", "new")]


MULTI_FRAME = (
    b"\xef\xbb\xbf: hello\r\n"
    b"event: response.output_text.delta\r\n"
    b'data: {"type":"response.output_text.delta","delta":"\xf0\x9f\x98\x80 caf\xc3\xa9"}\r\n\r\n'
    b"id: 42\rretry: 3000\revent: two\rdata: line1\rdata: line2\r\r"
    b"data: \xe2\x82\xac\n"
    b"data\n\n"
    b": ping\n\n"
    b"data: [DONE]\n\n"
)


def test_every_split_point_gives_identical_messages() -> None:
    expected = parse(MULTI_FRAME, comments=True)
    assert len(expected) == 6
    assert "\U0001f600" in expected[1].data
    for cut in range(len(MULTI_FRAME) + 1):
        assert parse_split(MULTI_FRAME, [cut], comments=True) == expected, cut


def test_every_pair_of_split_points_gives_identical_messages() -> None:
    expected = parse(MULTI_FRAME)
    n = len(MULTI_FRAME)
    for a in range(0, n + 1, 3):
        for b in range(a, n + 1, 5):
            assert parse_split(MULTI_FRAME, [a, b]) == expected, (a, b)


def test_byte_at_a_time() -> None:
    decoder = SSEDecoder(comments=True)
    out: list[SSEMessage] = []
    for i in range(len(MULTI_FRAME)):
        out += decoder.feed(MULTI_FRAME[i : i + 1])
    assert out + decoder.flush() == parse(MULTI_FRAME, comments=True)


def test_decode_event_json_and_fallback_type() -> None:
    assert decode_event(SSEMessage("x", '{"type":"a","n":1}')) == {"type": "a", "n": 1}
    # No "type" in the JSON: the SSE event name stands in.
    assert decode_event(SSEMessage("message_start", '{"message":{}}')) == {
        "type": "message_start",
        "message": {},
    }
    assert decode_event(SSEMessage("message", '{"choices":[]}')) == {"choices": []}
    # A duplicated "event" member in the data is just data.
    assert decode_event(SSEMessage("e", '{"type":"e","event":"e"}')) == {"type": "e", "event": "e"}


def test_decode_event_skips_done_ping_and_comments() -> None:
    assert decode_event(SSEMessage("message", "[DONE]")) is None
    assert decode_event(SSEMessage("ping", "")) is None
    assert decode_event(SSEComment("keepalive")) is None
    messages = parse(b'event: ping\ndata\n\ndata: {"type":"x"}\n\ndata: [DONE]\n\n')
    assert decode_events(messages) == [{"type": "x"}]


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", "3"])
def test_decode_event_rejects_non_object(data: str) -> None:
    with pytest.raises(SSEPayloadError):
        decode_event(SSEMessage("message", data))


def test_event_stream_decoder_flags() -> None:
    decoder = EventStreamDecoder()
    events = decoder.feed(b': OPENROUTER PROCESSING\n\nevent: a\ndata: {"type":"a"}\n\ndata: [DONE]\n\n')
    assert events == [{"type": "a"}]
    assert decoder.done and decoder.comments == 1
    assert decoder.feed(b'data: {"type":"b"}') == []
    assert decoder.flush() == []
    assert decoder.truncated


def test_encode_event_exact_bytes() -> None:
    event = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "a\nb\r\u2028\U0001f600"}
    frame = encode_event(event)
    assert frame == (
        b"event: response.output_text.delta\n"
        b'data: {"type":"response.output_text.delta","sequence_number":3,'
        b'"delta":"a\\nb\\r\xe2\x80\xa8\xf0\x9f\x98\x80"}\n\n'
    )
    assert frame.count(b"\n") == 3 and b"\r" not in frame


def test_encode_event_rejects_line_break_in_type() -> None:
    with pytest.raises(ValueError):
        encode_event({"type": "a\nb"})


def test_encode_comment() -> None:
    assert encode_comment() == b":\n\n"
    assert encode_comment("keepalive") == b": keepalive\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"
    assert parse(encode_comment("a\r\nb") + b"data: x\n\n", comments=True) == [
        SSEComment("a"),
        SSEComment("b"),
        SSEMessage("message", "x"),
    ]


def test_done_constant_decodes_as_sentinel() -> None:
    decoder = EventStreamDecoder()
    assert decoder.feed(DONE) == []
    assert decoder.done


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
event_types = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), min_size=1, max_size=30
)
events = st.builds(
    lambda kind, extra: {"type": kind, **extra},
    event_types,
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "type"), json_values, max_size=4),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(events, min_size=1, max_size=6), st.lists(st.integers(0, 10_000), max_size=8))
def test_roundtrip_random_events_random_splits(evs: list[dict[str, Any]], cuts: list[int]) -> None:
    wire = b"".join(encode_event(e) for e in evs)
    messages = parse_split(wire, [c % (len(wire) + 1) for c in cuts])
    assert [m.event for m in messages] == [e["type"] for e in evs]
    assert decode_events(messages) == evs
    assert [orjson.loads(m.data) for m in messages] == evs


def test_long_line_in_many_chunks() -> None:
    # A multi-megabyte payload (an image result) arrives in small chunks; pieces are joined once.
    payload = orjson.dumps({"type": "response.completed", "result": "A" * 2_000_000})
    wire = b"event: response.completed\r\ndata: " + payload + b"\r\n\r\n"
    decoder = EventStreamDecoder()
    events: list[dict[str, Any]] = []
    for pos in range(0, len(wire), 1000):
        events += decoder.feed(wire[pos : pos + 1000])
    assert events == [orjson.loads(payload)]


def reference_parse(stream: bytes) -> list[tuple[str, str, str | None, int | None]]:
    """The WHATWG algorithm read literally, over the whole stream at once (no chunking, no fast path)."""
    import re

    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines = re.split(rb"\r\n|\r|\n", stream)
    lines.pop()  # the text after the last line end is not a line
    out: list[tuple[str, str, str | None, int | None]] = []
    data: list[bytes] = []
    event = b""
    last_id: str | None = None
    retry: int | None = None
    for line in lines:
        if not line:
            if data:
                name = event.decode("utf-8", "replace") or "message"
                out.append((name, b"\n".join(data).decode("utf-8", "replace"), last_id, retry))
            data, event, retry = [], b"", None
            continue
        if line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            event = value
        elif field == b"id" and b"\0" not in value:
            last_id = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit():
            retry = int(value)
    return out


sse_lines = st.sampled_from(
    [
        b'data: {"a": 1}',
        b"data:x",
        b"data",
        b"data: ",
        b"data:  two spaces",
        b"event: e",
        b"event: response.output_text.delta",
        b"event:  spaced",
        b"event:",
        b"id: 7",
        b"id",
        b"retry: 30",
        b"retry: x",
        b": keepalive",
        b":",
        b"",
        b"",
        b"",
        b"bogus: 1",
        b"data: \xc3\xa9",
        b"data: [DONE]",
    ]
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(sse_lines, st.sampled_from([b"\n", b"\r\n", b"\r"])), max_size=25),
    st.lists(st.integers(0, 10_000), max_size=6),
)
@example([(b"event: e", b"\n"), (b"data: x", b"\n"), (b"data: y", b"\n"), (b"", b"\n")], [])
@example([(b"id: 7", b"\n"), (b"", b"\n"), (b"data: x", b"\n"), (b"", b"\n")], [])
@example([(b"event: e", b"\n"), (b"data: x", b"\n"), (b"id: 7", b"\n"), (b"", b"\n")], [])
@example([(b"event:", b"\n"), (b"data: x", b"\n"), (b"", b"\n")], [])
def test_decoder_matches_the_literal_algorithm(lines: list[tuple[bytes, bytes]], cuts: list[int]) -> None:
    """Whole ``data:`` blocks take a fast path at event boundaries; whatever the mix of fields, line
    ends and chunk boundaries, the result is the spec's."""
    wire = b"".join(line + end for line, end in lines)
    got = parse_split(wire, [c % (len(wire) + 1) for c in cuts])
    assert [(m.event, m.data, m.id, m.retry) for m in got] == reference_parse(wire)
