"""The per-event fast path (``SSEDecoder.single`` + a translator's ``fast``) says what the general path says.

``HTTPProvider.stream`` hands an upstream read that is exactly one event to the translator's fast path,
which applies plain text deltas itself and declines everything else, untouched, to the decoder and the
dispatcher. Every recorded Chat Completions and Responses stream, and each with its deltas edited one
way at a time, is run both ways here, one event per read: the same events come out, in the same order,
with the same ending, and the fast path did take the plain deltas.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures_loader import list_fixtures, load_chunks, load_sse
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.protocol.sse import SSEDecoder, encode_event
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider

Event = tuple[str, dict[str, Any]]  # (SSE event name, "" for none; JSON data)


def recorded(name: str) -> list[Event]:
    if name.endswith(".chunks.jsonl"):
        return [("", chunk) for chunk in load_chunks(name)]
    decoder = SSEDecoder()
    out: list[Event] = []
    for msg in decoder.feed(load_sse(name) + b"\n\n") + decoder.flush():
        if msg.data.strip() == "[DONE]":
            continue
        payload = orjson.loads(msg.data)
        out.append(("" if msg.event == "message" else msg.event, payload))
    return out


def frame(event: str, payload: Any) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def run(
    provider: Any, reads: list[bytes], *, fast: bool
) -> tuple[list[dict[str, Any]], str | None, int, Any, int]:
    """What ``HTTPProvider.stream``'s read callback does with each read, then its ending; and how many
    reads the fast path took, and how many of those made their event's SSE frame from the read's
    bytes (``StreamBuilder.frame``, each checked against the serialized event)."""
    counter = itertools.count()
    builder = StreamBuilder(
        new_response("m", response_id="resp_1", created_at=1),
        id_factory=lambda prefix: f"{prefix}_{next(counter)}",
    )
    builder.start()
    turn = provider.translator(parse_request({"model": "m", "input": "hi"}), builder)
    dispatch = provider.dispatcher()
    apply_fast: Callable[[bytes, bytes], bool] | None = provider.fast_path(turn) if fast else None
    after: Callable[[], None] | None = provider.after_push(turn)
    decoder = SSEDecoder()
    taken = matched = 0
    last_frame = builder.frame
    error: str | None = None
    try:
        for raw in reads:
            if apply_fast is not None and (one := decoder.single(raw)) is not None and apply_fast(*one):
                taken += 1
                if builder.frame is not last_frame:
                    last_frame = builder.frame
                    assert last_frame is not None
                    assert last_frame[1] == encode_event(last_frame[0])
                    matched += 1
            else:
                for msg in decoder.feed(raw):
                    dispatch(turn, msg)
            if turn.error is not None:
                break
            if after is not None:
                after()
            if turn.done:
                break
        for msg in decoder.flush():
            dispatch(turn, msg)
    except ProviderError as exc:
        turn.fail(exc)
        error = str(exc)
    if turn.error is not None:
        error = str(turn.error)
    elif not builder.finished:
        turn.finish()
    # What the translator keeps for the Response's end (finish reason, usage) and the upstream checker's
    # verdict (logged, not sent) must agree too.
    checker = getattr(turn, "checker", None)
    state = (
        getattr(turn, "finish_reason", None),
        getattr(turn, "usage", None),
        None if checker is None else (checker.violation_count, checker.finish()),
    )
    return builder.take(), error, taken, state, matched


def _timeless(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A finished Response's completed_at is the clock's, which may tick between the two runs.
    for event in events:
        response = event.get("response")
        if isinstance(response, dict) and response.get("completed_at") is not None:
            response["completed_at"] = 0
    return events


def both_ways(provider: Any, reads: list[bytes]) -> int:
    return both_ways_matched(provider, reads)[0]


def both_ways_matched(provider: Any, reads: list[bytes]) -> tuple[int, int]:
    """The reads run with and without the fast path give the same outcome; how many reads the fast
    path took, and how many of those it matched without parsing."""
    fast_events, fast_error, taken, fast_state, matched = run(provider, reads, fast=True)
    slow_events, slow_error, _, slow_state, _ = run(provider, reads, fast=False)
    assert _timeless(fast_events) == _timeless(slow_events)
    assert fast_state == slow_state
    assert fast_error == slow_error
    return taken, matched


CHAT = list_fixtures("openai-chat__", (".sse", ".chunks.jsonl"))
RESPONSES = list_fixtures("openai-responses__", (".sse", ".chunks.jsonl"))


def chat_provider() -> OpenAIChatProvider:
    return OpenAIChatProvider(base_url="http://127.0.0.1:9/v1", api_key="sk-test")


def responses_provider() -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider(base_url="http://127.0.0.1:9/v1", api_key="sk-test")


def test_the_fast_path_takes_the_plain_text_chunks() -> None:
    head = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "system_fingerprint": None,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return frame("", {**head, "choices": [choice]})

    reads = [chunk({"role": "assistant", "content": ""})]
    reads += [chunk({"content": f"tok{i} "}) for i in range(10)]
    reads += [
        chunk({}, "stop"),
        frame("", {**head, "choices": [], "usage": {"prompt_tokens": 3}}),
        b"data: [DONE]\n\n",
    ]
    # The first text opens the message (general path); the nine after it are the fast path's.
    assert both_ways(chat_provider(), reads) == 9
    # Text with a finish reason (a server that ends on its last token): the general path's, which keeps
    # the reason for the Response's end (here: incomplete).
    last = [chunk({"content": "end"}, "length"), b"data: [DONE]\n\n"]
    assert both_ways(chat_provider(), reads[:5] + last) == 3


# A Chat Completions chunk as OpenAI writes it: a random ``obfuscation`` string in every chunk.
_OPENAI_HEAD = {
    "id": "chatcmpl-CoDWtmOB2DZI2l0bK84UVJEMpo63W",
    "object": "chat.completion.chunk",
    "created": 1766084443,
    "model": "gpt-4o-2024-08-06",
    "service_tier": "default",
    "system_fingerprint": "fp_deacdd5f6f",
}


def openai_chunk(
    delta: dict[str, Any], finish: str | None = None, *, obfuscation: str = "", **head: Any
) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    payload: dict[str, Any] = {**_OPENAI_HEAD, **head, "choices": [choice], "usage": None}
    if obfuscation:
        payload["obfuscation"] = obfuscation
    return frame("", payload)


def openai_stream(texts: list[str], **head: Any) -> list[bytes]:
    reads = [openai_chunk({"role": "assistant", "content": "", "refusal": None}, obfuscation="x9")]
    reads += [
        openai_chunk({"content": t}, obfuscation="k" * (i % 7 + 1), **head) for i, t in enumerate(texts)
    ]
    reads += [
        openai_chunk({}, "stop", obfuscation="Zq"),
        frame("", {**_OPENAI_HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}),
        b"data: [DONE]\n\n",
    ]
    return reads


# Texts whose JSON string has an escape (a quote, a backslash, a control character): parsed, never
# matched. Everything else, non-ASCII included, is written as it is.
_ESCAPED = ('say "hi"', "line\nbreak", "back\\slash", "\ttab", "bell\x07")
_PLAIN = [" is", " a", " café", " ✓", " 😀", " \u2028", " index", " gpt-4o-2024-08-06", " </s>", " end"]


def test_repeated_chunks_are_matched_without_parsing() -> None:
    # The first text opens the message (the general path); the second is parsed and learnt from; the
    # plain ones after it are matched, obfuscation strings of every length included; the escaped ones
    # are parsed, and the ones after them matched again.
    texts = ["Here", *_PLAIN, *_ESCAPED, *_PLAIN]
    taken, matched = both_ways_matched(chat_provider(), openai_stream(texts))
    assert taken == len(texts) - 1
    assert matched == 2 * len(_PLAIN) - 1


def test_a_chunk_shape_that_changes_is_learnt_again() -> None:
    # ``created`` moves on (a server that stamps each chunk with the clock): after a shape matched 16
    # chunks, the first chunk of the new one is parsed and learnt from, and the rest match again.
    first = openai_stream([f"a{i}" for i in range(20)])
    second = openai_stream([f"b{i}" for i in range(20)], created=1766084444)
    reads = first[:-3] + second[1:]
    taken, matched = both_ways_matched(chat_provider(), reads)
    assert taken == 39
    assert matched == 37
    # A shape that changes before it matched 16 chunks is not learnt again: parsed from there on.
    reads = first[:6] + second[1:]
    taken, matched = both_ways_matched(chat_provider(), reads)
    assert (taken, matched) == (24, 3)


@pytest.mark.parametrize(
    "hole",
    [
        b"\xff\xfe",  # not UTF-8
        b"\xed\xa0\x80",  # a surrogate, encoded
        b"a\x01b",  # a raw control character
        b"a\x7fb",  # DEL is no control character in JSON
        b"\\u0041",
        b'\\"',
        b'a"}}],"usage":null,"x":"',  # a quote that closes the string early and changes the structure
        b'a","content":"b',  # a key given twice
        b"",
    ],
)
def test_raw_bytes_in_a_learnt_chunk_come_out_as_parsing_makes_them(hole: bytes) -> None:
    reads = openai_stream(["Here", " is", " a"])
    learnt = openai_chunk({"content": "\x00"}, obfuscation="kk")
    head, _, tail = learnt.partition(b"\\u0000")
    reads.insert(4, head + hole + tail)
    both_ways(chat_provider(), reads)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=12))
def test_any_text_comes_out_as_parsing_makes_it(texts: list[str]) -> None:
    both_ways(chat_provider(), openai_stream(["Here", " is", *texts]))


def test_the_fast_path_takes_the_responses_text_deltas() -> None:
    counter = itertools.count()
    upstream = StreamBuilder(
        new_response("m", response_id="resp_up", created_at=1), id_factory=lambda p: f"{p}_{next(counter)}"
    )
    upstream.start()
    message = upstream.open_message()
    for i in range(10):
        upstream.text_delta(message, f"tok{i} ")
    upstream.close_message(message)
    upstream.complete()
    events = upstream.take()
    assert both_ways(responses_provider(), [frame(e["type"], e) for e in events]) == 10
    assert both_ways(responses_provider(), [frame("", e) for e in events]) == 10


def _is_text_chunk(payload: dict[str, Any]) -> bool:
    choices = payload.get("choices")
    return bool(choices) and isinstance((choices[0].get("delta") or {}).get("content"), str)


# One change at a time to a Chat Completions chunk carrying text: each must leave the outcome as the
# general path makes it (most of them send the chunk there).
_CHAT_EDITS: list[Callable[[dict[str, Any]], None]] = [
    lambda c: c.__setitem__("usage", {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
    lambda c: c.__setitem__("x_groq", {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
    lambda c: c.__setitem__("error", {"message": "boom", "type": "server_error"}),
    lambda c: c.__setitem__("choices", c["choices"] * 2),
    lambda c: c.__setitem__("choices", []),
    lambda c: c["choices"][0].__setitem__("index", 1),
    lambda c: c["choices"][0].__setitem__("index", False),
    lambda c: c["choices"][0].__setitem__("finish_reason", "stop"),
    lambda c: c["choices"][0].__setitem__("finish_reason", ""),
    lambda c: c["choices"][0].__setitem__(
        "logprobs", {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    ),
    lambda c: c["choices"][0].__setitem__("delta", {}),
    lambda c: c["choices"][0].__setitem__("delta", {"role": "assistant", "content": ""}),
    lambda c: c["choices"][0].__setitem__("delta", {"content": "x", "reasoning_content": "why"}),
    lambda c: c["choices"][0].__setitem__("delta", {"content": [{"type": "text", "text": "x"}]}),
    lambda c: c["choices"][0].__setitem__("delta", {"content": "x", "refusal": "no"}),
    lambda c: c["choices"][0].__setitem__("delta", {"content": 7}),
    lambda c: c["choices"][0].__setitem__("delta", "text"),
]


@pytest.mark.parametrize("name", CHAT)
def test_chat_streams_come_out_the_same(name: str) -> None:
    both_ways(chat_provider(), [frame(event, payload) for event, payload in recorded(name)])


def _text_chunks(events: list[Event]) -> list[int]:
    return [i for i, (event, payload) in enumerate(events) if not event and _is_text_chunk(payload)]


@pytest.mark.parametrize("edit", range(len(_CHAT_EDITS)))
@pytest.mark.parametrize("name", [n for n in CHAT if len(_text_chunks(recorded(n))) >= 3])
def test_edited_chat_chunks_come_out_the_same(name: str, edit: int) -> None:
    events = recorded(name)
    texts = _text_chunks(events)
    for position in (texts[2], texts[-1]):
        changed = copy.deepcopy(events)
        _CHAT_EDITS[edit](changed[position][1])
        both_ways(chat_provider(), [frame(event, payload) for event, payload in changed])


_DELTA = "response.output_text.delta"

_RESPONSES_EDITS: list[Callable[[dict[str, Any]], None]] = [
    lambda e: e.__setitem__("sequence_number", 10_000),
    lambda e: e.__setitem__("sequence_number", True),
    lambda e: e.__setitem__("item_id", "nope"),
    lambda e: e.__setitem__("item_id", 7),
    lambda e: e.__setitem__("output_index", 9),
    lambda e: e.__setitem__("content_index", 5),
    lambda e: e.__setitem__("delta", None),
    lambda e: e.pop("delta"),
    lambda e: e.__setitem__("logprobs", [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]),
    lambda e: e.__setitem__("obfuscation", "abc"),
]


@pytest.mark.parametrize("named", [True, False], ids=["event-lines", "data-only"])
@pytest.mark.parametrize("name", RESPONSES)
def test_responses_streams_come_out_the_same(name: str, named: bool) -> None:
    reads = [frame(str(payload.get("type")) if named else "", payload) for _, payload in recorded(name)]
    both_ways(responses_provider(), reads)


def _deltas(events: list[Event]) -> list[int]:
    return [i for i, (_, payload) in enumerate(events) if payload.get("type") == _DELTA]


@pytest.mark.parametrize("edit", range(len(_RESPONSES_EDITS)))
@pytest.mark.parametrize("name", [n for n in RESPONSES if len(_deltas(recorded(n))) >= 2])
def test_edited_responses_deltas_come_out_the_same(name: str, edit: int) -> None:
    events = recorded(name)
    deltas = _deltas(events)
    for position in (deltas[1], deltas[-1]):
        changed = copy.deepcopy(events)
        _RESPONSES_EDITS[edit](changed[position][1])
        both_ways(responses_provider(), [frame(str(p.get("type")), p) for _, p in changed])


@pytest.mark.parametrize(
    "read",
    [
        b'data: {"a":1}\n\n',
        b'event: response.output_text.delta\ndata: {"a":1}\n\n',
        b"event: \ndata: x\n\n",
        b"data: x\ndata: y\n\n",
        b"data: x\n\ndata: y\n\n",
        b"data: x\r\n\r\n",
        b"data: x\n",
        b": keepalive\n\n",
        b"id: 7\ndata: x\n\n",
        b"event: a\nid: 1\ndata: x\n\n",
        b"data:x\n\n",
        b"retry: 5\n\n",
    ],
)
def test_single_gives_what_feed_gives(read: bytes) -> None:
    """A whole event comes back as (name, data) exactly as feed would dispatch it; anything else is None."""
    decoder = SSEDecoder()
    decoder.feed(b"data: warm\n\n")  # past the byte-order-mark check, as in a stream
    one = decoder.single(read)
    messages = decoder.feed(read)
    if one is not None:
        assert len(messages) == 1
        name, data = one
        assert (name.decode() or "message", data.decode()) == (messages[0].event, messages[0].data)
        assert decoder.last_event_id is None


def test_single_waits_for_a_decoder_between_events() -> None:
    decoder = SSEDecoder()
    assert decoder.single(b"data: x\n\n") is None  # the first read may begin with a byte-order mark
    decoder.feed(b"data: x\n\n")
    assert decoder.single(b"data: y\n\n") == (b"", b"y")
    decoder.feed(b"data: part")  # an event left open by this read
    assert decoder.single(b"data: y\n\n") is None
    decoder.feed(b"ial\n\n")
    assert decoder.single(b"data: y\n\n") == (b"", b"y")
    decoder.feed(b"data: z\r")  # a CR whose LF may start the next read
    assert decoder.single(b"\ndata: y\n\n") is None


def test_single_keeps_the_event_size_limit() -> None:
    decoder = SSEDecoder(max_event_bytes=8)
    decoder.feed(b"data: x\n\n")
    assert decoder.single(b"data: 12345678\n\n") == (b"", b"12345678")
    assert decoder.single(b"data: 123456789\n\n") is None
