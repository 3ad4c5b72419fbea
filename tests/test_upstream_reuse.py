"""The push relay keeps its upstream connection for the next request.

A pushed stream stops reading at the upstream's last event (``[DONE]``, ``response.completed``)
and the client gets its terminal event at once. The body's closing chunk (``0\\r\\n\\r\\n``) comes in
the same read or just after; the connection then goes back to the pool instead of being dropped (a
new TCP, and in production TLS, handshake per request otherwise). An upstream that never closes the
body after its last event costs the client nothing and its connection is dropped.

The upstream here is a raw HTTP/1.1 server that counts connections and says when it wrote what.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from conftest import Gateway, check_stream, start_gateway, stream_events
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider

PIECES = ["one ", "two ", "three"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def chat_events() -> list[bytes]:
    out = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n']
    out += [b'data: {"choices":[{"index":0,"delta":{"content":%s}}]}\n\n' % orjson.dumps(p) for p in PIECES]
    out.append(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    out.append(b"data: [DONE]\n\n")
    return out


class Upstream:
    """HTTP/1.1, keep-alive, chunked SSE answers; ``tail`` says when the closing chunk is written:
    ``"with"`` the last event, ``"later"`` (``delay`` seconds after it) or ``"never"``."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0
        self.tail = "with"
        self.delay = 0.5
        self.events: list[bytes] = chat_events()
        self.last_event_at = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                events = self.events
                for event in events[:-1]:
                    writer.write(_chunk(event))
                    await writer.drain()
                    await asyncio.sleep(0.005)
                last = _chunk(events[-1])
                self.last_event_at = time.monotonic()
                if self.tail == "with":
                    writer.write(last + b"0\r\n\r\n")
                    continue
                writer.write(last)
                if self.tail == "never":
                    await reader.read()  # until the gateway drops the connection
                    return
                await asyncio.sleep(self.delay)
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.closed += 1
            writer.close()

    def __enter__(self) -> Upstream:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


@pytest.fixture(scope="module")
def served(upstream: Upstream) -> Iterator[Gateway]:
    base = f"http://127.0.0.1:{upstream.port}/v1"
    chat = OpenAIChatProvider(base_url=base, api_key="sk-reuse", upstream_model="m")
    chat.name = "chat"
    passthrough = OpenAIResponsesProvider(base_url=base, api_key="sk-reuse", upstream_model="m")
    passthrough.name = "resp"
    gw = start_gateway([chat, passthrough])
    yield gw
    gw.stop()


def _stream(gw: Gateway, model: str) -> tuple[list[dict[str, Any]], float]:
    """The stream's events and when its last byte arrived (monotonic)."""
    events = stream_events(gw.url("/v1/responses"), {"model": model, "input": "hi", "stream": True})
    return events, time.monotonic()


def _use(upstream: Upstream, served: Gateway, model: str) -> None:
    """Script the upstream for ``model``'s wire format: the passthrough's upstream replays the
    gateway's own stream of the chat answer."""
    upstream.events = chat_events()
    if model == "resp":
        upstream.tail = "with"
        events, _ = _stream(served, "chat")
        upstream.events = [b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in events]


def _wait(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def _whole(events: list[dict[str, Any]]) -> None:
    check_stream(events)
    response = accumulate(events).response
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "".join(PIECES)


@pytest.mark.parametrize("model", ["chat", "resp"])
@pytest.mark.parametrize("tail", ["with", "later"])
def test_the_next_request_reuses_the_connection(
    upstream: Upstream, served: Gateway, model: str, tail: str
) -> None:
    _use(upstream, served, model)
    upstream.tail = tail
    upstream.delay = 0.5
    before = upstream.connections
    for _ in range(3):
        events, ended = _stream(served, model)
        _whole(events)
        if tail == "later":
            # The client had its whole stream well before the upstream closed the body.
            assert ended - upstream.last_event_at < upstream.delay / 2
            time.sleep(upstream.delay + 0.2)  # the closing chunk arrives; the connection is pooled
    # Three streams, at most one new connection (none when the pool already had one).
    assert upstream.connections - before <= 1


@pytest.mark.parametrize("model", ["chat", "resp"])
def test_a_body_that_never_ends_is_dropped_without_delaying_the_client(
    upstream: Upstream, served: Gateway, model: str
) -> None:
    _use(upstream, served, model)
    upstream.tail = "never"
    before_open, before_closed = upstream.connections, upstream.closed
    events, ended = _stream(served, model)
    _whole(events)
    assert ended - upstream.last_event_at < 0.5
    # The gateway drops the connection (within its 2 s linger), never pools it.
    assert _wait(lambda: upstream.closed > before_closed, 5.0)
    upstream.tail = "with"
    events, _ = _stream(served, model)
    _whole(events)
    assert upstream.connections >= before_open + 1
