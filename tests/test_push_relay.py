"""Push relay: openai-chat and the Responses passthrough send each upstream read from the socket's
callback (``StreamBuilder.push``), not through a task hop per event. These tests hold it to what the
generator path guarantees: a slow client loses nothing and backs the upstream up instead of the
gateway's memory, keepalives keep their place in the sequence, a client that leaves closes the
upstream, and a stream through a fallback chain still goes out whole."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.native import compiled_modules
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.fallback import FallbackProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.server import streaming
from upstream_mock import Reply, UpstreamMock, stream_reply

CHUNK = 'data: {"choices":[{"index":0,"delta":{"content":%s}}]}\n\n'
END = (
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\n'
    "data: [DONE]\n\n"
)


def chat_body(pieces: list[str]) -> bytes:
    head = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    body = head + "".join(CHUNK % orjson.dumps(p).decode() for p in pieces)
    return (body + END % (len(pieces), len(pieces) + 3)).encode()


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def drains() -> list[int]:
    return [0]


@pytest.fixture(scope="module")
def served(upstream: UpstreamMock, drains: list[int]) -> Iterator[Gateway]:
    """The gateway, with _Relay._drain counted: it runs only when a send could not complete at once."""
    original = streaming._Relay._drain

    async def counted(self: Any, *args: Any) -> None:
        drains[0] += 1
        await original(self, *args)

    streaming._Relay._drain = counted  # type: ignore[method-assign]
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-push", upstream_model="m")
    chat.name = "chat"
    passthrough = OpenAIResponsesProvider(
        base_url=upstream.url + "/v1", api_key="sk-push", upstream_model="m"
    )
    passthrough.name = "resp"
    fallback = FallbackProvider(
        [
            ("chat", OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="k", upstream_model="a")),
            ("chat2", OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="k", upstream_model="b")),
        ],
        retries=0,
        sleep=lambda _: asyncio.sleep(0),
    )
    fallback.name = "chain"
    gw = start_gateway([chat, passthrough, fallback], keepalive="in_progress", keepalive_interval=0.2)
    yield gw
    gw.stop()
    streaming._Relay._drain = original  # type: ignore[method-assign]


def raw_request(port: int, model: str, *, rcvbuf: int | None = None) -> socket.socket:
    body = orjson.dumps({"model": model, "input": "hi", "stream": True})
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def stream_events(
    port: int, model: str, *, rcvbuf: int | None = None, wait: float = 0.0
) -> list[dict[str, Any]]:
    """A streamed request's events, read to the end (after ``wait`` seconds of not reading)."""
    sock = raw_request(port, model, rcvbuf=rcvbuf)
    try:
        time.sleep(wait)
        return read_sse(sock)
    finally:
        sock.close()


def read_sse(sock: socket.socket) -> list[dict[str, Any]]:
    """The events of a chunked SSE answer read to its end."""
    return decode_sse(read_body(sock))


def read_body(sock: socket.socket) -> bytes:
    """The body of a chunked 200 answer read to its end, as it came (the chunk framing taken off)."""
    received: list[bytes] = []
    sock.settimeout(30)
    tail = b""
    while not tail.endswith(b"0\r\n\r\n"):
        got = sock.recv(1 << 16)
        if not got:
            break
        received.append(got)
        tail = (tail + got)[-16:]
    data = b"".join(received)
    head, _, _ = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    pieces: list[bytes] = []
    at = len(head) + 4
    while at < len(data):
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            break
        pieces.append(data[end + 2 : end + 2 + size])
        at = end + 4 + size
    return b"".join(pieces)


def test_a_slow_client_gets_everything_in_order(
    upstream: UpstreamMock, served: Gateway, drains: list[int]
) -> None:
    # ~6 MB of text arriving as fast as the upstream can write it, to a client that reads nothing for
    # a second: the gateway's sends stop completing at once, the upstream socket is paused.
    pieces = [f"<{i:05d}>" + "x" * 1000 for i in range(6000)]
    upstream.reset([stream_reply(chat_body(pieces), delay=0)])
    before = drains[0]
    events = stream_events(served.port, "chat", rcvbuf=4096, wait=1.0)
    check_stream(events)
    response = accumulate(events).response
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "".join(pieces)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    if streaming.__name__ not in compiled_modules():
        # The path where a send could not complete at once was taken. (Were streaming compiled, _Relay
        # would call its own _drain directly and the counter would see nothing.)
        assert drains[0] > before


def test_text_taken_from_the_upstream_bytes_goes_out_as_serialized(
    upstream: UpstreamMock, served: Gateway
) -> None:
    # OpenAI's chunk shape (a random ``obfuscation`` in each), one event per upstream write: after the
    # first chunks the gateway matches the rest against their repeated bytes instead of parsing them
    # (protocol/json_holes.py). The client must get what serializing each event gives, byte for byte,
    # whatever the text holds.
    texts = ["Hi", " there", " café ✓ 😀", ' "quoted"', " line\nbreak", " back\\slash", " \u2028", " end"]
    texts *= 4
    head = (
        '{"id":"chatcmpl-CoD","object":"chat.completion.chunk","created":1766084443,"model":"gpt-4o",'
        '"service_tier":"default","system_fingerprint":"fp_d","choices":[{"index":0,"delta":'
    )
    chunks = [
        head + '{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}'
    ]
    tail = '},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"'
    chunks += [
        head + '{"content":' + orjson.dumps(text).decode() + tail + "Zq9" * (i % 5) + '"}'
        for i, text in enumerate(texts)
    ]
    chunks.append(head + '{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"a"}')
    body = "".join(f"data: {c}\n\n" for c in chunks) + "data: [DONE]\n\n"
    upstream.reset([stream_reply(body.encode(), per_event=True, delay=0.002)])
    sock = raw_request(served.port, "chat")
    try:
        raw = read_body(sock)
    finally:
        sock.close()
    events = decode_sse(raw)
    check_stream(events)
    frames = [f for f in raw.split(b"\n\n") if f.startswith(b"event: response.output_text.delta\n")]
    assert len(frames) == len(texts)
    for got in frames:
        data = got.partition(b"\ndata: ")[2]
        assert data == orjson.dumps(orjson.loads(data))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == texts
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(texts)


def test_keepalives_keep_their_place_between_pushed_events(upstream: UpstreamMock, served: Gateway) -> None:
    body = chat_body(["one ", "two ", "three"])
    first = body.index(b"two")
    cut = body.rindex(b"\n\n", 0, first) + 2
    # The upstream pauses mid-answer (0.45 s between its writes): in_progress keepalives (every
    # 0.2 s) go out meanwhile, between pushed events.
    upstream.reset([stream_reply(body, split=True, seed=1, max_piece=cut, delay=0.45)])
    events = stream_events(served.port, "chat")
    check_stream(events)
    kinds = [e["type"] for e in events]
    first_delta = kinds.index("response.output_text.delta")
    assert "response.in_progress" in kinds[first_delta:]  # a keepalive between pushed deltas
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "one two three"


def test_a_client_that_leaves_closes_the_upstream(upstream: UpstreamMock, served: Gateway) -> None:
    body = chat_body([f"t{i} " for i in range(400)])
    upstream.reset([stream_reply(body, split=True, max_piece=200, delay=0.01)])
    sock = raw_request(served.port, "chat")
    sock.settimeout(10)
    assert b"response.output_text.delta" in sock.recv(1 << 16) + sock.recv(1 << 16)
    sock.close()
    assert upstream.wait_disconnect(10.0)


def test_passthrough_and_fallback_streams_go_out_whole(upstream: UpstreamMock, served: Gateway) -> None:
    pieces = [f"p{i} " for i in range(50)]
    upstream.reset([stream_reply(chat_body(pieces), split=True, max_piece=97, delay=0)])
    events = stream_events(served.port, "chain")
    check_stream(events)
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)

    # The Responses passthrough, fed the chat gateway's own stream as its upstream's.
    upstream.reset([stream_reply(chat_body(pieces), delay=0)])
    upstream_events = stream_events(served.port, "chat")
    wire = b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in upstream_events
    )
    upstream.reset([stream_reply(wire, split=True, max_piece=333, delay=0)])
    events = stream_events(served.port, "resp")
    check_stream(events)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)


@dataclass
class OneEventPerRead(Reply):
    """The body written one SSE event at a time (``delay`` apart): each is one read of the gateway's,
    which the passthrough's fast path takes whole."""

    def pieces(self) -> list[bytes]:
        return [event + b"\n\n" for event in self.body.split(b"\n\n") if event]


def test_the_passthrough_checker_still_judges_the_deltas_sent_at_once(
    upstream: UpstreamMock, served: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    # The fast path sends a delta before the upstream checker sees it: the checker must still see every
    # one, in order, and log what it finds (here, one delta whose sequence number jumps ahead).
    counter = itertools.count()
    builder = StreamBuilder(
        new_response("m", response_id="resp_up", created_at=1), id_factory=lambda p: f"{p}_{next(counter)}"
    )
    builder.start()
    message = builder.open_message()
    pieces = [f"d{i} " for i in range(12)]
    for piece in pieces:
        builder.text_delta(message, piece)
    builder.close_message(message)
    builder.complete()

    def wire(events: list[dict[str, Any]]) -> bytes:
        return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in events)

    clean = builder.take()
    jumped = [dict(e) for e in clean]
    deltas = [i for i, e in enumerate(jumped) if e["type"] == "response.output_text.delta"]
    for i in range(deltas[5], len(jumped)):
        jumped[i]["sequence_number"] += 7  # one gap, before the sixth delta

    caplog.set_level(logging.WARNING, logger="responses_gateway.openai_responses")
    for events, violations in ((clean, []), (jumped, ["sequence.contiguous"])):
        caplog.clear()
        upstream.reset([OneEventPerRead(body=wire(events), delay=0.005)])
        out = stream_events(served.port, "resp")
        check_stream(out)
        assert accumulate(out).response["output"][0]["content"][0]["text"] == "".join(pieces)
        found = [r.getMessage() for r in caplog.records if "upstream stream violates" in r.getMessage()]
        assert [re.findall(r"\[([a-z_.]+)\]", m)[0] for m in found] == violations, found
