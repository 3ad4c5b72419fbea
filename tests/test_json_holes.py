"""``protocol.json_holes.StringHoles``: a learnt document's bytes matched with other strings in its
holes gives exactly what parsing gives, and nothing else matches; and the text delta frame made from
a matched text is the frame the serialized event makes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_gateway.protocol.json_holes import StringHoles
from responses_gateway.protocol.sse import encode_event, text_delta_frame, text_delta_middle

TEXT = ("choices", 0, "delta", "content")
OBFUSCATION = ("obfuscation",)


def chunk(text: str, obfuscation: str | None = "pad", **head: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        **head,
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
    }
    if obfuscation is not None:
        doc["obfuscation"] = obfuscation
    return doc


def learnt(**head: Any) -> StringHoles:
    holes = StringHoles.learn(orjson.dumps(chunk("Hello", **head)), TEXT, [OBFUSCATION])
    assert holes is not None
    return holes


def test_a_learnt_shape_gives_the_text_and_its_json() -> None:
    holes = learnt()
    assert holes.match(orjson.dumps(chunk(" wörld ✓", "xyzzy-12"))) == (" wörld ✓", '" wörld ✓"'.encode())
    # An obfuscation string of any length, empty included.
    assert holes.match(orjson.dumps(chunk("a", ""))) == ("a", b'"a"')


def test_a_hole_before_the_text_is_kept_in_order() -> None:
    data = b'{"obfuscation":"xy","choices":[{"index":0,"delta":{"content":"Hi"}}]}'
    holes = StringHoles.learn(data, TEXT, [OBFUSCATION])
    assert holes is not None
    other = b'{"obfuscation":"long-one","choices":[{"index":0,"delta":{"content":"Yo \xc3\xa9"}}]}'
    assert holes.match(other) == ("Yo é", b'"Yo \xc3\xa9"')


@pytest.mark.parametrize(
    "data",
    [
        orjson.dumps(chunk("m")),  # the text's token is also the model's
        orjson.dumps(chunk("index")),  # ... or a key
        orjson.dumps(chunk("a\nb")),  # escaped
        orjson.dumps(chunk("")),  # nothing to find
        b'{"choices":[{"index":0,"delta":{"content":7}}]}',  # not a string
        b'{"choices":[]}',
        b"{not json",
        b'{"choices":[{"index":0,"delta":{"content": "Hi"}}],"content": "Hi"}',
    ],
)
def test_what_cannot_be_learnt_exactly_is_not(data: bytes) -> None:
    assert StringHoles.learn(data, TEXT, [OBFUSCATION]) is None


def test_a_changing_string_it_was_not_told_of_is_no_hole() -> None:
    # Learnt without the obfuscation hole: another obfuscation string does not match.
    holes = StringHoles.learn(orjson.dumps(chunk("Hello")), TEXT)
    assert holes is not None
    assert holes.match(orjson.dumps(chunk("x", "pad"))) == ("x", b'"x"')
    assert holes.match(orjson.dumps(chunk("x", "other"))) is None


@pytest.mark.parametrize(
    "data",
    [
        orjson.dumps(chunk("a", created=2)),  # a number changed
        orjson.dumps(chunk("a", None)),  # a field gone
        orjson.dumps(chunk("a", usage=None)),  # a field more
        orjson.dumps(chunk("a")) + b" ",
        b" " + orjson.dumps(chunk("a")),
        orjson.dumps(chunk('a"b')),
        orjson.dumps(chunk("a\\b")),
        orjson.dumps(chunk("a\tb")),
        orjson.dumps(chunk("a", 'x"y')),
        orjson.dumps(chunk("")),
        orjson.dumps(chunk("a")).replace(b'"a"', b'"\xff"'),
        orjson.dumps(chunk("a")).replace(b'"pad"', b'"\xc3"'),
        orjson.dumps(chunk("a")).replace(b'"a"', b'"a\x01"'),
    ],
)
def test_anything_else_does_not_match(data: bytes) -> None:
    assert learnt().match(data) is None


@settings(max_examples=300, deadline=None)
@given(text=st.text(), padding=st.text(alphabet=st.characters(codec="utf-8"), max_size=20))
def test_a_match_is_what_parsing_gives(text: str, padding: str) -> None:
    data = orjson.dumps(chunk(text, padding))
    got = learnt().match(data)
    token = orjson.dumps(text)
    plain = (
        bool(text)
        and token == b'"' + text.encode() + b'"'
        and orjson.dumps(padding)[1:-1] == padding.encode()
    )
    if got is None:
        assert not plain
    else:
        assert plain
        assert got == (orjson.loads(data)["choices"][0]["delta"]["content"], token)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    sequence_number=st.integers(min_value=0, max_value=2**53),
    item_id=st.text(max_size=40),
    output_index=st.integers(min_value=0, max_value=10_000),
    content_index=st.integers(min_value=0, max_value=100),
)
def test_the_text_delta_frame_is_the_serialized_event(
    text: str, sequence_number: int, item_id: str, output_index: int, content_index: int
) -> None:
    event = {
        "type": "response.output_text.delta",
        "sequence_number": sequence_number,
        "item_id": item_id,
        "output_index": output_index,
        "content_index": content_index,
        "delta": text,
        "logprobs": [],
    }
    middle = text_delta_middle(item_id, output_index, content_index)
    assert text_delta_frame(sequence_number, middle, orjson.dumps(text)) == encode_event(event)
