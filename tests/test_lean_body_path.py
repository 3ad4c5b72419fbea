"""The lean body path (``http_protocol.BodyWriter``, offered in ``scope["extensions"]``): a streamed
response's chunks written straight to the connection instead of one ASGI message each. Held, against
a real gateway over HTTP, to what uvicorn's ``send`` does: the same bytes on the wire, a slow reader
that loses nothing (the writer stands aside while the socket is backed up), a client that leaves
stopping the upstream read, and a kept-alive connection that goes on serving (HEAD, pipelined
requests) after a stream."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import orjson
import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.server import http_protocol, responses
from test_push_relay import chat_body
from upstream_mock import UpstreamMock, stream_reply


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def writes() -> dict[str, int]:
    """What the writer answered: ``lean`` chunks it wrote, ``declined`` calls it left to ``send``,
    ``paused`` of those because the client's socket was backed up."""
    return {"lean": 0, "declined": 0, "paused": 0}


@pytest.fixture(scope="module")
def served(upstream: UpstreamMock, writes: dict[str, int]) -> Iterator[Gateway]:
    original = http_protocol.BodyWriter.__call__

    def counted(self: http_protocol.BodyWriter, body: bytes) -> bool:
        done = original(self, body)
        if done:
            writes["lean"] += 1
        else:
            writes["declined"] += 1
            if self.backed_up:
                writes["paused"] += 1
        return done

    http_protocol.BodyWriter.__call__ = counted  # type: ignore[method-assign]
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-lean", upstream_model="m")
    chat.name = "chat"
    gw = start_gateway([chat], keepalive="off")
    yield gw
    gw.stop()
    http_protocol.BodyWriter.__call__ = original  # type: ignore[method-assign]


def request_bytes(model: str = "chat", *, stream: bool = True) -> bytes:
    body = orjson.dumps({"model": model, "input": "hi", "stream": stream})
    return (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def read_response(sock: socket.socket, buffered: bytearray) -> tuple[bytes, list[bytes]]:
    """One chunked response from ``sock`` (``buffered``: bytes already read past the previous one,
    updated with what is read past this one): its head and its chunks, the framing checked."""
    sock.settimeout(30)

    def need(n: int) -> None:
        while len(buffered) < n:
            got = sock.recv(1 << 16)
            assert got, "the connection closed mid-response"
            buffered.extend(got)

    def line() -> bytes:
        while b"\r\n" not in buffered:
            need(len(buffered) + 1)
        end = buffered.index(b"\r\n")
        out = bytes(buffered[:end])
        del buffered[: end + 2]
        return out

    while b"\r\n\r\n" not in buffered:
        need(len(buffered) + 1)
    end = buffered.index(b"\r\n\r\n")
    head = bytes(buffered[:end])
    del buffered[: end + 4]
    assert b"\r\ntransfer-encoding: chunked" in head.lower(), head
    chunks: list[bytes] = []
    while True:
        size_line = line()
        assert re.fullmatch(rb"[0-9a-f]+", size_line), size_line  # lowercase hex, no extensions
        size = int(size_line, 16)
        if size == 0:
            assert line() == b""  # no trailers: the last chunk is exactly 0\r\n\r\n
            return head, chunks
        need(size + 2)
        chunks.append(bytes(buffered[:size]))
        assert buffered[size : size + 2] == b"\r\n"
        del buffered[: size + 2]


def normalized(body: bytes) -> bytes:
    """A stream's bytes with what differs between two runs of it (ids, times) blanked."""
    body = re.sub(rb"\b(resp|msg|rs|fc)_[0-9a-f]{24}\b", rb"\1_X", body)
    return re.sub(rb'"(created_at|completed_at)":\d+', rb'"\1":0', body)


def stream_once(port: int) -> tuple[bytes, list[bytes]]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_bytes())
        return read_response(sock, bytearray())


def test_the_lean_path_and_the_asgi_send_give_the_same_bytes(
    upstream: UpstreamMock, served: Gateway, writes: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = [f"w{i} " for i in range(40)]
    reply = stream_reply(chat_body(pieces), split=True, seed=3, max_piece=120, delay=0.002)

    upstream.reset([reply])
    before = writes["lean"]
    lean_head, lean_chunks = stream_once(served.port)
    assert writes["lean"] - before >= 10  # the deltas went out the lean way

    # The same stream with the writer not offered to the endpoint: every chunk through ASGI send.
    monkeypatch.setattr(responses, "body_writer", lambda scope: None)
    upstream.reset([reply])
    before = writes["lean"] + writes["declined"]
    plain_head, plain_chunks = stream_once(served.port)
    assert writes["lean"] + writes["declined"] == before  # the writer was not asked at all

    def without_date(head: bytes) -> bytes:
        return re.sub(rb"\r\ndate: [^\r]*", b"", head)

    assert without_date(lean_head) == without_date(plain_head)
    assert normalized(b"".join(lean_chunks)) == normalized(b"".join(plain_chunks))
    events = decode_sse(b"".join(lean_chunks))
    check_stream(events)
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)
    # Every chunk is whole SSE frames (one upstream read's events), as through send.
    for chunks in (lean_chunks, plain_chunks):
        assert all(c.endswith(b"\n\n") for c in chunks)


@pytest.mark.parametrize("size", [1, 15, 16, 255, 4096, 70_000])
def test_the_writer_frames_a_chunk_as_uvicorn_does(size: int) -> None:
    """Byte for byte, per chunk: the writer's frame and uvicorn's ``send`` of the same message."""

    class Recorder(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.out: list[bytes] = []

        def write(self, data: bytes | bytearray | memoryview) -> None:
            self.out.append(bytes(data))

        def is_closing(self) -> bool:
            return False

    async def frames() -> tuple[list[bytes], list[bytes]]:
        body = bytes(range(256)) * (size // 256) + b"e" * (size % 256)
        results = []
        for lean in (True, False):
            transport = Recorder()
            cycle = RequestResponseCycle(
                scope={"type": "http", "method": "POST", "http_version": "1.1"},  # type: ignore[typeddict-item]
                transport=transport,
                flow=FlowControl(transport),
                logger=None,  # type: ignore[arg-type]
                access_logger=None,  # type: ignore[arg-type]
                access_log=False,
                default_headers=[],
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=True,
                on_response=lambda: None,
            )
            await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
            if lean:
                assert http_protocol.BodyWriter(cycle)(body)
            else:
                await cycle.send({"type": "http.response.body", "body": body, "more_body": True})
            results.append(transport.out)
        return results[0], results[1]

    lean, plain = asyncio.run(frames())
    assert lean == plain


def test_a_slow_reader_gets_everything_in_order(
    upstream: UpstreamMock, served: Gateway, writes: dict[str, int]
) -> None:
    # ~4 MB as fast as the upstream writes it, to a client that reads nothing for a second: the
    # socket backs up, the writer stands aside (uvicorn's send waits for the drain), nothing is lost.
    pieces = [f"<{i:05d}>" + "y" * 1000 for i in range(4000)]
    upstream.reset([stream_reply(chat_body(pieces), delay=0)])
    lean, paused = writes["lean"], writes["paused"]
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", served.port))
        sock.sendall(request_bytes())
        sock.settimeout(30)
        time.sleep(1.0)
        _, chunks = read_response(sock, bytearray())
    events = decode_sse(b"".join(chunks))
    check_stream(events)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)
    assert writes["paused"] > paused  # the backed-up socket was left to send's flow control
    assert writes["lean"] > lean  # and the lean path resumed once it drained


def test_a_client_that_leaves_mid_stream_stops_the_upstream_read(
    upstream: UpstreamMock, served: Gateway, writes: dict[str, int]
) -> None:
    body = chat_body([f"t{i} " for i in range(2000)])
    # The upstream writes a third of the answer, then holds the connection until the gateway drops it.
    upstream.reset([stream_reply(body, split=True, max_piece=200, delay=0.005, stall_after=len(body) // 3)])
    before = writes["lean"]
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.sendall(request_bytes())
    sock.settimeout(10)
    got = b""
    while got.count(b"response.output_text.delta") < 20:
        piece = sock.recv(1 << 16)
        assert piece
        got += piece
    assert writes["lean"] > before
    sock.close()
    assert upstream.wait_disconnect(10.0)


def test_the_connection_serves_on_after_a_stream(upstream: UpstreamMock, served: Gateway) -> None:
    pieces = [f"k{i} " for i in range(30)]
    upstream.reset([stream_reply(chat_body(pieces), split=True, max_piece=90, delay=0.001)])
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        buffered = bytearray()
        for _ in range(2):  # two streams one after the other on one kept-alive connection
            sock.sendall(request_bytes())
            head, chunks = read_response(sock, buffered)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"connection: close" not in head.lower()
            events = decode_sse(b"".join(chunks))
            check_stream(events)
            assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)
        assert not buffered

        # A HEAD on the same connection: a head, no body, and the connection still in step.
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        while b"\r\n\r\n" not in buffered:
            buffered.extend(sock.recv(1 << 16))
        head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 ")
        assert rest == b""
        buffered.clear()

        # Two streams pipelined in one write: each gets its own answer, in order, framed whole.
        sock.sendall(request_bytes() + request_bytes())
        for _ in range(2):
            head, chunks = read_response(sock, buffered)
            assert head.startswith(b"HTTP/1.1 200")
            events = decode_sse(b"".join(chunks))
            check_stream(events)
            assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)

        # And a plain JSON answer after them.
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        while b"\r\n\r\n" not in buffered:
            buffered.extend(sock.recv(1 << 16))
        head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
        body = bytearray(rest)
        while len(body) < length:
            body.extend(sock.recv(1 << 16))
        assert orjson.loads(bytes(body))["status"] == "ok"


class _Steps:
    """An awaitable's iterator that is not a generator (no ``send``/``throw``), as granian's is."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self._inner = inner

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        return next(self._inner)


class _PlainAwaitable:
    def __init__(self, coro: Awaitable[None]) -> None:
        self._coro = coro

    def __await__(self) -> Iterator[Any]:
        return _Steps(self._coro.__await__())


class _AnotherServer:
    """The gateway's app as another ASGI server runs it: no lean body path in the scope, and a
    ``send`` that returns a plain awaitable rather than a coroutine."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope = {k: v for k, v in scope.items() if k != "extensions"}
        await self.app(scope, receive, lambda message: _PlainAwaitable(send(message)))


def test_a_server_without_the_lean_path_streams_through_any_awaitable_send(
    upstream: UpstreamMock, served: Gateway, writes: dict[str, int]
) -> None:
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-lean", upstream_model="m")
    chat.name = "chat"
    gw = start_gateway([chat], keepalive="off")
    try:
        config = gw.server.config
        config.loaded_app = _AnotherServer(config.loaded_app)  # what new connections are served by
        # A slow reader too, so that a send suspends and is finished by the relay's own task.
        pieces = [f"<{i:05d}>" + "z" * 1000 for i in range(3000)]
        upstream.reset([stream_reply(chat_body(pieces), delay=0)])
        asked = writes["lean"] + writes["declined"]
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", gw.port))
            sock.sendall(request_bytes())
            time.sleep(0.5)
            _, chunks = read_response(sock, bytearray())
        events = decode_sse(b"".join(chunks))
        check_stream(events)
        assert accumulate(events).response["output"][0]["content"][0]["text"] == "".join(pieces)
        assert writes["lean"] + writes["declined"] == asked  # no writer was offered
    finally:
        gw.stop()
