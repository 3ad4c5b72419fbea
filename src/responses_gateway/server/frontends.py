"""What the other front ends (Chat Completions, Anthropic Messages) share: a sink that hands a run's
Responses events to a dialect's translator, and the :class:`~.responses.Client` that gives it.

A front end translates its request into a Responses create body, then answers through the same
``ResponsesAPI.prepare`` and ``ResponsesAPI.run`` as ``POST /v1/responses`` (state, capability checks,
engine, provider). The rules of a run stay in ``streaming.drive``; the sink only changes what the
client reads: the dialect's SSE frames (``frames``: events → bytes, ``last`` saying the stream is
over), or one JSON body made from the finished Response (``body``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..store import Store
from .errors import HTTPError
from .streaming import SSE_HEADERS, Record, Sink, answer_whole, response_headers
from .types import Receive, Send

__all__ = ["DialectClient", "DialectSink", "Frames", "renamed", "sse_data", "sse_event"]

JSON = dict[str, Any]
Seal = Callable[[list[JSON]], list[JSON]]
# A dialect's stream: the Responses events of one delivery → the bytes the client reads.
Frames = Callable[[list[JSON]], bytes]


def _identity(events: list[JSON]) -> list[JSON]:
    return events


class DialectSink:
    """One run's client in another dialect: streamed (``frames`` given) or one JSON body (``body``).

    Streamed, it behaves as ``SSESink`` (refusable until its first bytes, the terminal events sent
    last, a stop ends the stream with the dialect's rendering of the stop) without the push path:
    the provider yields, and every delivery is one ``http.response.body`` message. While the run is
    silent, ``keepalive`` (the dialect's own: an SSE comment, Anthropic's ``ping``) goes out every
    ``interval`` seconds. Not streamed, it behaves as ``JSONSink``: a failed Response is an
    :class:`HTTPError` (the caller renders it in its dialect), anything else ``body(response)``.
    """

    detached = False

    def __init__(
        self,
        send: Send,
        receive: Receive,
        *,
        frames: Frames | None,
        body: Callable[[JSON], bytes],
        seal: Seal = _identity,
        keepalive: bytes | None = None,
        interval: float = 10.0,
    ) -> None:
        self._send = send
        self.receive: Receive | None = receive
        self._frames = frames
        self._body = body
        self._seal = seal
        self._keepalive = keepalive
        self._interval = interval
        self._builder: StreamBuilder | None = None
        self._started = False
        self._ended = False
        self._yielded = False
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._ping: asyncio.Task[None] | None = None

    @property
    def response(self) -> JSON | None:
        """The run's Response as it stands (once the run has begun)."""
        return self._builder.response if self._builder is not None else None

    @property
    def stopped_by(self) -> str | None:
        """The stop sequence that ended the run's output, if one did (``StreamBuilder.stopped_by``)."""
        return self._builder.stopped_by if self._builder is not None else None

    @property
    def refusable(self) -> bool:
        return not (self._started if self._frames is not None else self._yielded)

    @property
    def fails_refused(self) -> bool:
        return self._frames is None

    def open(self, builder: StreamBuilder, record: Record) -> None:
        self._builder = builder

    # ------------------------------------------------------------------------ streamed
    async def _write(self, body: bytes, *, more: bool = True) -> None:
        async with self._lock:
            if self._ended:
                return  # a keepalive that was waiting while the last body went out
            self._ended = not more
            if not self._started:
                self._started = True
                headers = response_headers(SSE_HEADERS, self._builder)
                await self._send({"type": "http.response.start", "status": 200, "headers": headers})
                self._arm()
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
            self._last = self._loop.time()

    def _arm(self) -> None:
        if self._keepalive is not None:
            self._timer = self._loop.call_at(self._last + self._interval, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        if now < self._last + self._interval or self._lock.locked():
            self._timer = self._loop.call_at(max(self._last + self._interval, now + 0.1), self._fire)
            return
        if self._keepalive is not None:
            self._ping = self._loop.create_task(self._write(self._keepalive))
        self._timer = self._loop.call_at(now + self._interval, self._fire)

    async def deliver(self, events: list[JSON]) -> None:
        self._yielded = True
        if self._frames is None:
            return
        data = self._frames(self._seal(events))
        if data:
            await self._write(data)

    def quiet(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def end(self, events: list[JSON]) -> None:
        if self._frames is not None:
            await self._write(self._frames(self._seal(events)), more=False)

    # ------------------------------------------------------------------------ one body
    async def done(self, error: HTTPError | None) -> None:
        if self._frames is not None:
            return
        if error is not None:
            raise error
        assert self._builder is not None
        await answer_whole(self._send, self._builder, self._seal, self._body)

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        if gone:
            return
        if self._frames is not None:
            if tail:
                with contextlib.suppress(Exception):
                    await self._write(self._frames(self._seal(tail)), more=False)
            return
        builder = self._builder
        failure = (builder.response.get("error") if builder is not None else None) or {}
        code = failure.get("code")
        raise HTTPError(
            409 if code == "response_deleted" else 400,
            failure.get("message") or "The response was stopped.",
            code=code,
        ) from None

    def close(self) -> None:
        self.quiet()
        if self._ping is not None and not self._ping.done():
            self._ping.cancel()


class DialectClient:
    """The :class:`~.responses.Client` of a front end: a :class:`DialectSink` per run; never
    background (these dialects have no such mode, and their runs are not stored)."""

    def __init__(self, make: Callable[[Seal], DialectSink]) -> None:
        self._make = make

    def sink(self, request: ResponseRequest, seal: Seal) -> Sink:
        return self._make(seal)

    async def background(
        self, request: ResponseRequest, store: Store, owner: str, rid: str, snapshot: JSON, seal: Seal
    ) -> None:
        raise HTTPError(400, "Background responses are only available through POST /v1/responses.")


def renamed(exc: HTTPError, name: Callable[[str | None], str | None]) -> HTTPError:
    """An error about a translated field named as the client sent it (``name``: the dialect's name
    for a Responses field), in its ``param`` and in its message."""
    param = name(exc.param)
    if param != exc.param and exc.param is not None and param is not None:
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{param}'")
        exc.param = param
    return exc


def sse_data(payload: JSON) -> bytes:
    """One ``data:`` frame (Chat Completions' framing: no event names)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def sse_event(name: str, payload: JSON) -> bytes:
    """One named event frame (Anthropic's framing: ``event:`` then ``data:``)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
