"""``POST /v1/chat/completions``: the Chat Completions front end over the Responses engine.

The body is translated (``protocol.chat_completions.chat_request``) into a Responses create body and
answered through ``ResponsesAPI.prepare``/``run``, so every back end, capability check and the engine
serve it unchanged; the events become ``chat.completion.chunk`` frames (``ChatStream``) or one
``chat.completion`` body. Errors keep OpenAI's shape (the app's ``send_error``).

``stop`` and ``seed`` go to ``prepare`` as engine options. ``n`` > 1 makes n runs of the engine at
once, each prepared and run as its own Response (one log record each); :class:`Choices` merges their
chunks into one stream (each choice's ``index``, the first choice's id, the usage chunk summed, one
``[DONE]``), or their Responses into one ``chat.completion``. With ``store: true`` only the first
choice is stored (OpenAI stores one completion too): ``chatcmpl-X`` is still ``resp_X``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import orjson

from ..protocol.chat_completions import (
    ChatOptions,
    ChatStream,
    chat_id,
    chat_param,
    chat_request,
    chat_usage,
    completion_from_response,
    completion_from_responses,
    sum_usage,
)
from ..protocol.request import RequestError
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .frontends import JSON, DialectClient, DialectSink, DialectStream, Seal, renamed, sse_data
from .http_protocol import body_writer, client_gone
from .request_log import RequestLog
from .responses import Prepared, ResponsesAPI
from .router import Router
from .streaming import KEEPALIVE_COMMENT, Sink
from .types import Message, Receive, Scope, Send

__all__ = ["ChatCompletionsAPI"]

DONE = b"data: [DONE]\n\n"


def chat_frames(options: ChatOptions) -> Callable[[list[JSON]], bytes]:
    """A run's events → Chat Completions SSE frames, ending with ``[DONE]`` (not after an error)."""
    stream = ChatStream(options)

    def frames(events: list[JSON]) -> bytes:
        out = [sse_data(chunk) for event in events for chunk in stream.feed(event)]
        if stream.done and not stream.failed:
            out.append(DONE)
        return b"".join(out)

    return frames


class Choices:
    """The n runs of one request (``n`` > 1) as one Chat Completions answer.

    Streamed, each run's :class:`DialectSink` writes through :meth:`send_for` its choice: the first
    ``http.response.start`` goes out, later ones are dropped; a run's last body does not end the
    stream until every run has ended, and the last one carries the summed usage chunk (with
    ``include_usage``) and ``[DONE]``. A run that fails ends the stream with its error chunk (no
    ``[DONE]``) and the others are cancelled. Every run watches the one client through
    :meth:`receive`, which reports its disconnect to all of them.
    """

    def __init__(self, send: Send, receive: Receive, options: ChatOptions) -> None:
        self._send = send
        self._receive = receive
        self.options = options
        self.started = False
        self.ended = False
        self._left = options.n
        self._usage: list[JSON | None] = [None] * options.n
        self._failed: set[int] = set()
        self.head: tuple[str, int] | None = None
        self._gone = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ the client
    async def receive(self) -> Message:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _read(self) -> None:
        while True:
            message = await self._receive()
            if message.get("type") == "http.disconnect":
                self._gone.set()
                return

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()

    # ------------------------------------------------------------------ the stream
    def frames(self, index: int) -> Callable[[list[JSON]], bytes]:
        """Choice ``index``'s events → its chunks (no usage chunk, no ``[DONE]``: :meth:`send_for`).
        The first choice's id is its own Response's; the others take it (``head``)."""
        assert index == 0 or self.head is not None
        stream = ChatStream(self.options, index=index, head=self.head if index else None, usage=False)

        def frames(events: list[JSON]) -> bytes:
            for event in events:
                if event.get("type") in ("response.completed", "response.incomplete"):
                    self._usage[index] = chat_usage((event.get("response") or {}).get("usage"))
            out = b"".join(sse_data(chunk) for event in events for chunk in stream.feed(event))
            if stream.failed:
                self._failed.add(index)
            return out

        return frames

    def send_for(self, index: int) -> Send:
        """The ``send`` of choice ``index``'s sink."""

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if not self.started:
                    self.started = True
                    await self._send(message)
                return
            if self.ended:
                return
            body = message.get("body", b"")
            if message.get("more_body", False):
                await self._send(message)
                return
            if index in self._failed:
                await self.abort(body)
                return
            self._left -= 1
            if self._left > 0:
                if body:
                    await self._send({"type": "http.response.body", "body": body, "more_body": True})
                return
            self.ended = True
            tail = [body]
            if self.options.include_usage:
                assert self.head is not None
                usage = {
                    "id": self.head[0],
                    "object": "chat.completion.chunk",
                    "created": self.head[1],
                    "model": self.options.model,
                    "system_fingerprint": None,
                    "choices": [],
                    "usage": sum_usage(self._usage),
                }
                tail.append(sse_data(usage))
            tail.append(DONE)
            await self._send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})

        return send

    async def abort(self, body: bytes) -> None:
        """End the stream with ``body`` (an error chunk); the other runs stop."""
        if self.ended:
            return
        self.ended = True
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class ChatCompletionsAPI:
    """``POST /v1/chat/completions`` over :class:`ResponsesAPI`."""

    def __init__(self, responses: ResponsesAPI) -> None:
        self.responses = responses
        self.app = responses.app

    def register(self, router: Router) -> None:
        router.add("/v1/chat/completions", POST=self.create)

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        line = RequestLog(app.observer, route="/v1/chat/completions")
        with line.answering():
            body = parse_json_body(await app.read_body(scope, receive))
            try:
                request_body, options = chat_request(body)
            except RequestError as exc:
                raise HTTPError.from_request_error(exc) from None
            if options.n > 1:
                await self._choices(scope, receive, send, request_body, options, line)
                return
            ready = await self._prepare(scope, request_body, options, line)
            config = app.config

            def make(seal: Seal) -> Sink:
                if options.stream:
                    return DialectStream(
                        send,
                        receive,
                        frames=chat_frames(options),
                        seal=seal,
                        keepalive=KEEPALIVE_COMMENT if config.keepalive != "off" else None,
                        interval=config.keepalive_interval,
                        direct=body_writer(scope),
                        gone=client_gone(scope),
                    )
                return DialectSink(
                    send,
                    receive,
                    body=lambda response: orjson.dumps(completion_from_response(response, options)),
                    seal=seal,
                    gone=client_gone(scope),
                )

            await self.responses.run(ready, DialectClient(make), line)

    async def _prepare(
        self, scope: Scope, request_body: JSON, options: ChatOptions, line: RequestLog
    ) -> Prepared:
        try:
            return await self.responses.prepare(
                self.app.owner_for(scope), request_body, line, stop=options.stop, seed=options.seed
            )
        except HTTPError as exc:
            raise renamed(exc, chat_param) from None

    async def _choices(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_body: JSON,
        options: ChatOptions,
        line: RequestLog,
    ) -> None:
        """``n`` > 1: n runs at once, merged into one stream or one body (see the module docstring)."""
        app = self.app
        config = app.config
        lines = [line, *(RequestLog(app.observer, route=line.route) for _ in range(options.n - 1))]
        # Every choice is prepared (and refused) before any runs; only the first one is stored.
        unstored = {**request_body, "store": False}
        readies = [
            await self._prepare(scope, request_body if i == 0 else unstored, options, lines[i])
            for i in range(options.n)
        ]
        choices = Choices(send, receive, options)
        results: list[JSON | None] = [None] * options.n
        sinks: list[DialectStream | DialectSink | None] = [None] * options.n
        first_open = asyncio.Event()

        def client(index: int) -> DialectClient:
            def keep(response: JSON) -> bytes:
                results[index] = response
                return b""

            async def discard(message: Message) -> None:
                return None

            def make(seal: Seal) -> Sink:
                sink: DialectStream | DialectSink
                if options.stream:
                    # (No lean body path: every body goes through send_for, which merges the runs.)
                    sink = DialectStream(
                        choices.send_for(index),
                        choices.receive,
                        frames=choices.frames(index),
                        seal=seal,
                        keepalive=KEEPALIVE_COMMENT if config.keepalive != "off" else None,
                        interval=config.keepalive_interval,
                    )
                else:
                    sink = DialectSink(discard, choices.receive, body=keep, seal=seal)
                sinks[index] = sink
                if index == 0:
                    first_open.set()  # drive() opens this sink before its first await
                return sink

            return DialectClient(make)

        async def run(index: int) -> None:
            if index == 0:
                await self.responses.run(readies[0], client(0), line)
                return
            with lines[index].answering():
                await self.responses.run(readies[index], client(index), lines[index])

        loop = asyncio.get_running_loop()
        first = loop.create_task(run(0))
        choices.tasks.append(first)
        try:
            opened = loop.create_task(first_open.wait())
            await asyncio.wait([first, opened], return_when=asyncio.FIRST_COMPLETED)
            opened.cancel()
            if not first_open.is_set():
                await first  # refused before it began: its error is the request's
            response = sinks[0].response if sinks[0] is not None else None
            assert response is not None
            # Every choice's chunks carry the first choice's id (the stored one with store: true).
            choices.head = (chat_id(str(response.get("id", ""))), int(response.get("created_at") or 0))
            choices.tasks += [loop.create_task(run(i)) for i in range(1, options.n)]
            await _settle(choices)
        finally:
            for task in choices.tasks:
                task.cancel()
            choices.close()
        if not options.stream:
            done = [r for r in results if r is not None]
            await send_json(send, 200, orjson.dumps(completion_from_responses(done, options)))


async def _settle(choices: Choices) -> None:
    """Wait for every run. The first error (a refusal, a failed run's HTTP error) cancels the others
    and is the request's; once the stream has begun it ends the stream as an error chunk instead."""
    pending = set(choices.tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        error = next((t.exception() for t in done if not t.cancelled() and t.exception() is not None), None)
        if error is None:
            continue
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if not (isinstance(error, HTTPError) and choices.started):
            raise error
        # The error's own body (OpenAI's shape, secrets scrubbed) as the stream's last chunk.
        with contextlib.suppress(Exception):
            await choices.abort(b"data: " + error.body() + b"\n\n")
        return
