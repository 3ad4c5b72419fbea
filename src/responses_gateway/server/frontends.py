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

from ..protocol.request import ResponseRequest
from ..store import Store
from .errors import HTTPError
from .http_protocol import ClientGone
from .streaming import Direct, Frames, JSONSink, Sink, SSESink, unsealed
from .types import Receive, Send

__all__ = ["DialectClient", "DialectSink", "DialectStream", "Frames", "renamed", "sse_data", "sse_event"]

JSON = dict[str, Any]
Seal = Callable[[list[JSON]], list[JSON]]


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
        seal: Seal = unsealed,
        keepalive: bytes | None = None,
        interval: float = 10.0,
        direct: Direct | None = None,
        gone: ClientGone | None = None,
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
            gone=gone,
        )


class DialectSink(JSONSink):
    """One run's client in another dialect, not streamed: :class:`~.streaming.JSONSink` with the
    dialect's ``body(response)`` for the one body; a failed Response is an :class:`HTTPError` (the
    caller renders it in its dialect)."""

    __slots__ = ()

    def __init__(
        self,
        send: Send,
        receive: Receive,
        *,
        body: Callable[[JSON], bytes],
        seal: Seal = unsealed,
        gone: ClientGone | None = None,
    ) -> None:
        super().__init__(send, receive, seal=seal, body=body, gone=gone)


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
