"""What the other front ends (Chat Completions, Anthropic Messages) share: a sink that hands a run's
Responses events to a dialect's translator, and the :class:`~.responses.Client` that gives it.

A front end translates its request into a Responses create body, then answers through the same
``ResponsesAPI.prepare`` and ``ResponsesAPI.run`` as ``POST /v1/responses`` (state, capability checks,
engine, provider). The rules of a run stay in ``streaming.drive``; the sink only changes what the
client reads: the dialect's SSE frames (:class:`DialectStream`, ``frames``: events → bytes, on the
same push and lean body paths as a Responses stream), or one JSON body made from the finished
Response (:class:`DialectSink`, ``body``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..store import Store
from .errors import HTTPError
from .streaming import Direct, Frames, Record, Sink, SSESink, answer_whole
from .types import Receive, Send

__all__ = ["DialectClient", "DialectSink", "DialectStream", "Frames", "renamed", "sse_data", "sse_event"]

JSON = dict[str, Any]
Seal = Callable[[list[JSON]], list[JSON]]


def _identity(events: list[JSON]) -> list[JSON]:
    return events


class DialectStream(SSESink):
    """A streamed run's client in another dialect: :class:`~.streaming.SSESink` (the push path, the
    lean body path, refusable until its first bytes, the terminal events sent last, a stop ends the
    stream with the dialect's rendering of it) with the dialect's ``frames`` in place of Responses
    SSE. While the run is silent, ``keepalive`` (the dialect's own bytes: an SSE comment, Anthropic's
    ``ping``; None: none) goes out every ``interval`` seconds."""

    __slots__ = ()

    def __init__(
        self,
        send: Send,
        receive: Receive,
        *,
        frames: Frames,
        seal: Seal = _identity,
        keepalive: bytes | None = None,
        interval: float = 10.0,
        direct: Direct | None = None,
    ) -> None:
        super().__init__(
            send,
            receive,
            keepalive="comment" if keepalive is not None else "off",
            keepalive_interval=interval,
            seal=seal,
            direct=direct,
            frames=frames,
            keepalive_body=keepalive or b"",
        )


class DialectSink:
    """One run's client in another dialect, not streamed: it behaves as ``JSONSink``: a failed
    Response is an :class:`HTTPError` (the caller renders it in its dialect), anything else one body,
    ``body(response)``."""

    detached = False
    fails_refused = True

    def __init__(
        self, send: Send, receive: Receive, *, body: Callable[[JSON], bytes], seal: Seal = _identity
    ) -> None:
        self._send = send
        self.receive: Receive | None = receive
        self._body = body
        self._seal = seal
        self._builder: StreamBuilder | None = None
        self._yielded = False

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
        return not self._yielded

    def open(self, builder: StreamBuilder, record: Record) -> None:
        self._builder = builder

    async def deliver(self, events: list[JSON]) -> None:
        self._yielded = True

    def quiet(self) -> None:
        return None

    async def end(self, events: list[JSON]) -> None:
        return None

    async def done(self, error: HTTPError | None) -> None:
        if error is not None:
            raise error
        assert self._builder is not None
        await answer_whole(self._send, self._builder, self._seal, self._body)

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        if gone:
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
        return None


class DialectClient:
    """The :class:`~.responses.Client` of a front end: a :class:`DialectStream` or :class:`DialectSink`
    per run; never
    background (these dialects have no such mode, and their runs are not stored)."""

    def __init__(self, make: Callable[[Seal], Sink]) -> None:
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
