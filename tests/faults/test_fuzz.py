"""Property-based fuzzing of the request parser and of every upstream translator.

Whatever a client sends, ``parse_request`` raises nothing but ``RequestError``. Whatever an upstream
streams (well-formed chunks with fields dropped, retyped or replaced by arbitrary JSON, split at any
byte), each HTTP back end raises nothing but ``ProviderError`` and, once it has started, ends the
Response with exactly one terminal event and a stream the checker accepts.

The back ends run in-process against an upstream that replays bytes (the real translators, decoders
and dispatch; only the socket is left out), so hundreds of examples take seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soundness import assert_sound_stream
from wire import BACKENDS, answer, provider

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import RequestError, parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.transport import Transport
from upstream_mock import encode_chunks

JSON = dict[str, Any]
# CI runs the same examples every time (a red CI names a bug, not a lucky draw); a developer's run draws
# new ones, which is where new findings come from (hypothesis keeps failures in .hypothesis/).
IN_CI = os.environ.get("CI") == "true"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)

VALID_BODIES: list[JSON] = [
    {"model": "m", "input": "hi"},
    {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "stream": True,
        "max_output_tokens": 20,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low", "summary": "auto"},
        "metadata": {"a": "b"},
        "include": ["reasoning.encrypted_content"],
    },
]


def mutate(value: Any, path: list[int], replacement: Any) -> Any:
    """``value`` with the container member chosen by ``path`` replaced (or removed when
    ``replacement`` is the sentinel ``...``)."""
    if not path or not isinstance(value, dict | list) or not value:
        return replacement if replacement is not ... else None
    if isinstance(value, dict):
        keys = list(value)
        key = keys[path[0] % len(keys)]
        out = dict(value)
        if replacement is ... and len(path) == 1:
            del out[key]
        else:
            out[key] = mutate(value[key], path[1:], replacement)
        return out
    index = path[0] % len(value)
    out_list = list(value)
    if replacement is ... and len(path) == 1:
        del out_list[index]
    else:
        out_list[index] = mutate(value[index], path[1:], replacement)
    return out_list


replacements = st.one_of(st.just(...), json_values)
paths = st.lists(st.integers(0, 50), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None, derandomize=IN_CI)
@given(st.one_of(json_values, st.tuples(st.sampled_from(VALID_BODIES), paths, replacements)))
def test_parse_request_raises_only_request_error(case: Any) -> None:
    body = mutate(case[0], case[1], case[2]) if isinstance(case, tuple) else case
    try:
        parse_request(body)
    except RequestError as exc:
        assert exc.status == 400 and exc.message


class Replay:
    """An upstream answer replaying fixed bytes in fixed pieces (the UpstreamResponse interface)."""

    def __init__(self, pieces: list[bytes], content_type: str) -> None:
        self.pieces = pieces
        self.status = 200
        self.headers = {"content-type": content_type}

    async def iter_chunks(self) -> AsyncGenerator[bytes, None]:
        for piece in self.pieces:
            yield piece

    async def pump(self, on_chunk: Callable[[bytes], Awaitable[None] | None]) -> None:
        raise AssertionError("push mode is not used here")

    async def read(self, limit: int | None = None) -> bytes:
        return b"".join(self.pieces)[:limit]

    async def json(self) -> Any:
        try:
            return json.loads(b"".join(self.pieces))
        except ValueError:
            return None

    async def aclose(self) -> None:
        return None


class ReplayTransport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reply: Replay | None = None

    async def post(self, *args: Any, **kwargs: Any) -> Any:
        assert self.reply is not None
        return self.reply


WIRES = {
    "anthropic": "anthropic",
    "gemini": "gemini",
    "openai": "openai-responses",
    "openai-chat": "openai-chat",
}


def base_chunks(name: str) -> list[JSON]:
    """The chunks of a well-formed answer (text), parsed back from its wire bytes."""
    out = []
    for line in answer(name, ["Hello ", "world"]).splitlines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


async def drive(name: str, reply: Replay) -> list[JSON] | None:
    """Run back end ``name`` on ``reply``: its events, or None if it refused before starting."""
    transport = ReplayTransport()
    transport.reply = reply
    backend = provider(name, "http://upstream.invalid", transport=transport)
    request = parse_request({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}]})
    builder = StreamBuilder(new_response("m", **request.echo()))
    builder.start()
    events = builder.take()
    try:
        async for _ in backend.stream(request, builder):
            events += builder.take()
    except ProviderError:
        assert len(events) == 2, "a ProviderError after the stream started must end it, not escape"
        return None
    events += builder.take()
    return events


@pytest.mark.parametrize("name", BACKENDS)
@settings(
    max_examples=120,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_translators_raise_only_provider_error(name: str, data: st.DataObject) -> None:
    chunks: list[Any] = base_chunks(name)
    for _ in range(data.draw(st.integers(0, 4), label="mutations")):
        chunks = mutate(chunks, data.draw(paths, label="path"), data.draw(replacements, label="value"))
        if not isinstance(chunks, list):
            chunks = [chunks]
    if data.draw(st.booleans(), label="extra"):
        chunks.insert(data.draw(st.integers(0, len(chunks))), data.draw(json_values, label="inserted"))
    body = encode_chunks([c if isinstance(c, dict) else {"value": c} for c in chunks], WIRES[name])
    if data.draw(st.booleans(), label="cut"):
        body = body[: data.draw(st.integers(0, len(body)))]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6), label="splits"))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
    events = asyncio.run(drive(name, Replay(pieces, "text/event-stream")))
    if events is not None:
        assert_sound_stream(events)


def test_an_upstream_event_with_an_empty_type_is_dropped() -> None:
    """Found by the fuzzing above: the passthrough relayed ``{"type": ""}`` as an event."""
    chunks = base_chunks("openai")
    chunks.insert(1, {"type": "", "sequence_number": 1})
    body = encode_chunks(chunks, WIRES["openai"])
    events = asyncio.run(drive("openai", Replay([body], "text/event-stream")))
    assert events is not None
    assert_sound_stream(events)


@pytest.mark.parametrize("annotations", ["0", [0, "x", None]])
def test_an_upstream_done_part_with_bad_annotations_keeps_the_stream_sound(annotations: Any) -> None:
    """Found by the fuzzing above: an ``output_item.done`` whose text part's ``annotations`` was a
    string made the passthrough emit one ``annotation.added`` per character, with a string as the
    annotation. What is not an annotation object is dropped, as a streamed one would be."""
    chunks = base_chunks("openai")
    done = next(c for c in chunks if c.get("type") == "response.output_item.done")
    done["item"]["content"][0]["annotations"] = annotations
    body = encode_chunks(chunks, WIRES["openai"])
    events = asyncio.run(drive("openai", Replay([body], "text/event-stream")))
    assert events is not None
    assert_sound_stream(events)
    assert not [e for e in events if e["type"] == "response.output_text.annotation.added"]
