"""A client that reads slowly holds the upstream back; that is not the upstream being idle.

The gateway stops reading its upstream while its client's socket is full (push mode for Chat
Completions, the buffer's high-water mark for the others). The upstream's idle timeout must not count
that time: a slow reader gets the whole answer, completed, even with a short idle timeout.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from soundness import assert_sound_stream, terminal_status
from wire import answer, provider

from conftest import Gateway, start_gateway
from responses_gateway.protocol.accumulator import accumulate
from test_push_relay import stream_events
from upstream_mock import UpstreamMock, stream_reply

PIECES = [f"<{i:05d}>" + "x" * 1000 for i in range(4000)]  # ~4 MB, far more than the socket buffers


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[UpstreamMock, Gateway]]:
    with UpstreamMock() as upstream:
        backends = []
        for name in ("openai-chat", "anthropic", "gemini"):
            backend = provider(name, upstream.url, read_timeout=0.3)
            backend.name = name
            backends.append(backend)
        gw = start_gateway(backends, keepalive_interval=0.1)
        yield upstream, gw
        gw.stop()


@pytest.mark.parametrize("name", ["openai-chat", "anthropic", "gemini"])
def test_a_slow_reader_is_not_an_idle_upstream(name: str, served: tuple[UpstreamMock, Gateway]) -> None:
    upstream, gw = served
    upstream.reset([stream_reply(answer(name, PIECES), delay=0)])
    # Reads nothing for 1.5 s (five idle timeouts), then everything through a 4 KB receive buffer.
    events = [e for e in stream_events(gw.port, name, rcvbuf=4096, wait=1.5) if e["type"] != "keepalive"]
    assert_sound_stream(events)
    assert terminal_status(events) == "completed", events[-1]
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(PIECES)
