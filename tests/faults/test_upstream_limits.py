"""What one upstream can make the gateway hold is bounded: an event that never ends and an error body
the size of a disk are cut at their limit, the stream fails cleanly and the upstream is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from soundness import assert_sound_stream, terminal_status
from wire import BACKENDS, answer, provider

from conftest import Gateway, decode_sse, start_gateway
from responses_gateway.config import parse_config
from responses_gateway.protocol.sse import SSEDecoder, SSEEventTooLarge
from responses_gateway.providers.transport import Transport
from upstream_mock import Reply, UpstreamMock, stream_reply

LIMIT = 256 * 1024


def test_the_decoder_refuses_an_event_past_its_limit_whatever_its_shape() -> None:
    # One endless line, fed in 64 KB reads: refused within one read of the limit.
    decoder = SSEDecoder(max_event_bytes=LIMIT)
    fed = 0
    with pytest.raises(SSEEventTooLarge):
        while fed < 64 * 1024 * 1024:
            decoder.feed(b"x" * 65536 if fed else b"data: " + b"x" * 65530)
            fed += 65536
    assert fed <= LIMIT + 65536
    # Many data lines without the blank line that ends the event.
    decoder = SSEDecoder(max_event_bytes=LIMIT)
    with pytest.raises(SSEEventTooLarge):
        for _ in range(1000):
            decoder.feed(b"data: " + b"y" * 1000 + b"\n")
    # Events under the limit, however many, pass.
    decoder = SSEDecoder(max_event_bytes=LIMIT)
    events = [m for _ in range(2000) for m in decoder.feed(b"data: " + b"z" * 1000 + b"\n\n")]
    assert len(events) == 2000


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[UpstreamMock, Gateway, Transport]]:
    with UpstreamMock() as upstream:
        transport = Transport(max_event_bytes=LIMIT, max_error_bytes=4096)
        backends = []
        for name in BACKENDS:
            backend = provider(name, upstream.url, transport=transport)
            backend.name = name
            backends.append(backend)
        gw = start_gateway(backends)
        yield upstream, gw, transport
        gw.stop()


def request(name: str) -> dict[str, object]:
    return {"model": name, "input": "hi", "stream": True}


def endless(name: str) -> bytes:
    """A good start, then a text delta that never ends (16 MB and no newline)."""
    start = answer(name, ["Hello", "World"])
    cut = start.index(b"World")
    head = start[: max(start.rfind(b"\n\n", 0, cut) + 2, start.rfind(b"\r\n\r\n", 0, cut) + 4)]
    return head + b"data: " + b"x" * (16 * 1024 * 1024)


@pytest.mark.parametrize("name", BACKENDS)
def test_an_endless_event_fails_the_stream_and_drops_the_upstream(
    name: str, served: tuple[UpstreamMock, Gateway, Transport]
) -> None:
    upstream, gw, _ = served
    upstream.reset([Reply(body=endless(name), split=True, max_piece=65536, delay=0.0005)])
    got = httpx.post(gw.url("/v1/responses"), json=request(name), timeout=30)
    if got.status_code == 200:
        events = decode_sse(got.content)
        assert_sound_stream(events)
        assert terminal_status(events) == "failed"
        message = events[-1]["response"]["error"]["message"]
    else:  # nothing had been sent yet (the passthrough's head is only response.created)
        assert got.status_code == 502, got.text
        message = got.json()["error"]["message"]
    assert "max_event_bytes" in message
    assert upstream.wait_disconnect(10.0), "the upstream kept streaming into the gateway"


@pytest.mark.parametrize("name", BACKENDS)
def test_a_huge_error_body_is_read_only_to_its_limit(
    name: str, served: tuple[UpstreamMock, Gateway, Transport]
) -> None:
    upstream, gw, _ = served
    body = b'{"error": {"message": "' + b"e" * (64 * 1024 * 1024) + b'"}}'
    upstream.reset(
        [Reply(status=500, body=body, content_type="application/json", split=True, max_piece=65536)]
    )
    got = httpx.post(gw.url("/v1/responses"), json=request(name), timeout=30)
    assert got.status_code >= 500
    assert len(got.content) < 8192, "the error body was relayed whole"
    assert got.json()["error"]["message"]
    assert upstream.wait_disconnect(10.0), "the gateway read the whole error body"


def test_limits_come_from_the_models_file() -> None:
    config = parse_config(
        "upstream:\n  max_event_bytes: 1000\n  max_error_body_bytes: 200\nmodels: []\n", "m.yaml"
    )
    assert (config.upstream.max_event_bytes, config.upstream.max_error_body_bytes) == (1000, 200)
    with pytest.raises(Exception, match="max_event_bytes"):
        parse_config("upstream:\n  max_event_bytes: 0\nmodels: []\n", "m.yaml")


def test_normal_streams_pass_under_the_limits(served: tuple[UpstreamMock, Gateway, Transport]) -> None:
    upstream, gw, _ = served
    for name in BACKENDS:
        upstream.reset([stream_reply(answer(name, ["a" * 100_000, "b" * 100_000]))])
        got = httpx.post(
            gw.url("/v1/responses"), json={"model": name, "input": "hi", "stream": True}, timeout=30
        )
        events = decode_sse(got.content)
        assert_sound_stream(events)
        assert terminal_status(events) == "completed"
