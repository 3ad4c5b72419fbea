"""A real HTTP upstream on 127.0.0.1 that replays recorded streams and records what it was sent.

It runs an aiohttp.web server in a background thread with its own event loop, so tests may drive the
client side with ``asyncio.run`` (one loop per test) while the server keeps running::

    with UpstreamMock() as upstream:
        upstream.enqueue(error_reply(429, {"error": {...}}, headers={"retry-after": "3"}),
                         fixture_reply("anthropic-messages__...sse", split=True, seed=7))
        provider = AnthropicProvider(base_url=upstream.url, ...)
        ...
        assert upstream.requests[-1].json["stream"] is True

Replies are served in the order enqueued; the last one repeats for any further request. ``.sse``
recordings are replayed byte for byte; ``.chunks.jsonl`` payloads are re-framed in their vendor's wire
format (recognised from the fixture name's prefix, or given); ``.json`` bodies are served with a status.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from fixtures_loader import load_chunks, load_fixture

__all__ = [
    "WIRE_FORMATS",
    "RecordedRequest",
    "Reply",
    "UpstreamMock",
    "drive",
    "encode_chunks",
    "error_reply",
    "fixture_reply",
    "json_reply",
    "stream_reply",
    "wire_of",
]

# Fixture name prefix -> wire format of its vendor.
WIRE_FORMATS = {
    "anthropic-messages__": "anthropic",
    "openai-chat__": "openai-chat",
    "openai-responses__": "openai-responses",
    "gemini__": "gemini",
}


def wire_of(name: str) -> str:
    """The wire format of a fixture, from its name's vendor prefix."""
    for prefix, wire in WIRE_FORMATS.items():
        if name.startswith(prefix):
            return wire
    raise ValueError(f"{name}: unknown vendor prefix (expected one of {sorted(WIRE_FORMATS)})")


def encode_chunks(chunks: Iterable[dict[str, Any]], wire: str) -> bytes:
    """Frame parsed chunk payloads the way ``wire``'s vendor sends them."""
    out = bytearray()
    for chunk in chunks:
        data = orjson.dumps(chunk)
        if wire in ("anthropic", "openai-responses"):
            out += b"event: " + str(chunk.get("type", "message")).encode() + b"\ndata: " + data + b"\n\n"
        elif wire == "openai-chat":
            out += b"data: " + data + b"\n\n"
        elif wire == "gemini":
            out += b"data: " + data + b"\r\n\r\n"
        else:
            raise ValueError(f"unknown wire format {wire!r}")
    if wire == "openai-chat":
        out += b"data: [DONE]\n\n"
    return bytes(out)


@dataclass
class Reply:
    """One scripted answer.

    ``split`` cuts the body at random byte boundaries (seeded) and writes the pieces with
    ``delay`` seconds between them (``per_event``: cut after each SSE event instead, as a model's
    server writes them); ``stall_after`` stops writing after that many bytes and holds the
    connection open until the client goes away (for idle-timeout and cancellation tests).
    """

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    split: bool = False
    per_event: bool = False
    seed: int = 0
    max_piece: int = 64
    delay: float = 0.0005
    stall_after: int | None = None

    def pieces(self) -> list[bytes]:
        """The body as it will be written."""
        body = self.body if self.stall_after is None else self.body[: self.stall_after]
        if self.per_event:
            return [event + b"\n\n" for event in body.split(b"\n\n") if event]
        if not self.split:
            return [body] if body else []
        rng = random.Random(self.seed)
        out, i = [], 0
        while i < len(body):
            n = rng.randint(1, self.max_piece)
            out.append(body[i : i + n])
            i += n
        return out


def stream_reply(body: bytes, **options: Any) -> Reply:
    """An SSE body served with status 200."""
    return Reply(body=body, **options)


def fixture_reply(name: str, *, wire: str | None = None, status: int | None = None, **options: Any) -> Reply:
    """A recording served as its vendor would: ``.sse`` raw, ``.chunks.jsonl`` re-framed, ``.json`` whole."""
    if name.endswith(".chunks.jsonl"):
        return Reply(
            status=status or 200, body=encode_chunks(load_chunks(name), wire or wire_of(name)), **options
        )
    value = load_fixture(name)
    if isinstance(value, bytes):
        return Reply(status=status or 200, body=value, **options)
    # A JSON body: an error body unless a status says otherwise (the http-4xx recordings name theirs).
    return json_reply(value, status=status or _status_in_name(name), **options)


def _status_in_name(name: str) -> int:
    marker = "http-"
    at = name.find(marker)
    digits = name[at + len(marker) : at + len(marker) + 3] if at >= 0 else ""
    return int(digits) if digits.isdigit() else 200


def json_reply(body: Any, status: int = 200, **options: Any) -> Reply:
    """A JSON body with ``status``."""
    return Reply(status=status, body=orjson.dumps(body), content_type="application/json", **options)


def error_reply(status: int, body: Any = None, *, headers: dict[str, str] | None = None) -> Reply:
    """An HTTP error answer (e.g. 429 with ``retry-after``), JSON body optional."""
    payload = orjson.dumps(body) if body is not None else b""
    return Reply(status=status, body=payload, headers=headers or {}, content_type="application/json")


@dataclass(frozen=True)
class RecordedRequest:
    """What the mock received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The request body parsed as JSON."""
        return orjson.loads(self.body)


class UpstreamMock:
    """The server; use as a context manager (``url`` is valid inside it)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.disconnects = 0
        self._replies: list[Reply] = []
        self._served = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._disconnected = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *replies: Reply) -> UpstreamMock:
        """Script the next answers, in order; the last one keeps being served."""
        with self._lock:
            self._replies.extend(replies)
        return self

    def reset(self, replies: Sequence[Reply] = ()) -> None:
        """Forget recorded requests and scripted replies."""
        with self._lock:
            self.requests.clear()
            self._replies = list(replies)
            self._served = 0
            self.disconnects = 0
            self._disconnected.clear()

    def wait_disconnect(self, timeout: float = 5.0) -> bool:
        """Block until a client dropped a stalled reply; False on timeout."""
        return self._disconnected.wait(timeout)

    def _next_reply(self) -> Reply:
        with self._lock:
            if not self._replies:
                return error_reply(500, {"error": {"message": "upstream mock: no reply scripted"}})
            reply = self._replies[min(self._served, len(self._replies) - 1)]
            self._served += 1
            return reply

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
            )
        )
        reply = self._next_reply()
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        resp.content_type = reply.content_type
        await resp.prepare(request)
        try:
            for piece in reply.pieces():
                await resp.write(piece)
                if reply.split or reply.per_event:
                    await asyncio.sleep(reply.delay)
            if reply.stall_after is not None:
                while request.transport is not None and not request.transport.is_closing():
                    await asyncio.sleep(0.01)
                self.disconnects += 1
                self._disconnected.set()
                return resp
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            self._disconnected.set()
            raise
        return resp

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        self._runner = runner
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def start(self) -> UpstreamMock:
        """Start serving in a background thread."""
        self._thread = threading.Thread(target=self._serve, name="upstream-mock", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("upstream mock did not start")
        return self

    def stop(self) -> None:
        """Stop the server and its thread."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> UpstreamMock:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def drive(provider: Any, request: Any, *, close: bool = True) -> list[dict[str, Any]]:
    """Run ``provider`` for ``request`` as the server does and return every event it produced.

    ``request`` is a ResponseRequest or a request body (parsed with ``parse_request``). A ProviderError
    raised before the first yield propagates, as the server would turn it into a plain HTTP error.
    With ``close`` the provider is closed afterwards (its connection pool belongs to this loop).
    """
    from responses_gateway.protocol.builder import StreamBuilder
    from responses_gateway.protocol.request import ResponseRequest, parse_request
    from responses_gateway.protocol.response import new_response

    req = request if isinstance(request, ResponseRequest) else parse_request(request)
    builder = StreamBuilder(new_response(req.model, **req.echo()))
    builder.start()
    events = builder.take()
    try:
        async for _ in provider.stream(req, builder):
            events.extend(builder.take())
    finally:
        if close:
            await provider.aclose()
    events.extend(builder.take())
    return events
