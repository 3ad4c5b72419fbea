"""WebSocket mode on ``/v1/responses``, as OpenAI serves it (docs/websocket.md).

One connection carries responses one after another. The client sends ``response.create`` messages
whose other fields are the create body (``stream`` is implied, ``background`` is refused,
``generate: false`` prepares a response without calling the model); each response's events come
back exactly as the SSE stream has them, one JSON text message per event. A request that cannot run
(bad JSON, a bad body, an unknown model, a back end refusing before its first event) is answered
with one ``error`` message carrying its HTTP ``status`` and OpenAI's ``error`` object, and the
connection stays open.

Each response goes through :meth:`ResponsesAPI.prepare` and :meth:`ResponsesAPI.run`, the code every
front end shares; this module adds only the connection: the key checked at the handshake (a 401
before the upgrade), a reader task that notices a disconnect at once (which stops the generation
through ``drive``'s watcher), the connection's own recent responses so ``previous_response_id``
continues within the connection even with ``store: false`` (a failed continuation evicts the
response it named, as OpenAI does), a lifetime limit (``websocket_connection_limit_reached``) and a
message-size limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder, error_event
from ..protocol.request import ResponseRequest
from ..providers.base import Provider
from ..redaction import REDACTOR
from ..store import Store
from .config import KeepaliveMode
from .errors import HTTPError
from .http_protocol import ClientGone
from .request_log import RequestLog
from .responses import ResponsesAPI, Seal
from .streaming import GENERIC_FAILURE, Record, Sink
from .types import Receive, Scope, Send

__all__ = ["HISTORY", "INBOX", "PATH", "UVICORN_WS", "WebSocketAPI", "error_message"]

log = logging.getLogger("responses_gateway.server")

JSON = dict[str, Any]

PATH = "/v1/responses"
# How many of a connection's latest responses a previous_response_id may name without the store
# (OpenAI keeps the latest one in memory; a few more cost little and forgive a client that branches).
HISTORY = 4
# Messages read ahead while a response runs (the connection answers them in order afterwards); past
# this the reader stops reading and the socket pushes back.
INBOX = 8

# uvicorn's WebSocket protocol for ``serve`` and the tests. Its default (``websockets-sansio``) sends
# an upgrade's HTTP refusal (401, 404) but never marks the handshake done, so it logs "ASGI callable
# returned without completing handshake" and an error for every refused key; the ``websockets``
# protocol does not (uvicorn calls it deprecated: ``serve`` silences that one warning).
UVICORN_WS = "websockets"

_CALLS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}


def error_message(exc: HTTPError) -> JSON:
    """The ``error`` message of a request that could not run: its HTTP status and OpenAI's error
    object (the shape Codex and the Open Responses schema read), plus the top-level copies every
    ``error`` event has. It belongs to no response, so its sequence number is 0. The schema wants a
    string ``code``: an error without one carries its type there."""
    event = error_event(exc.code or exc.type, REDACTOR.scrub(exc.message), exc.param, exc.type)
    event["status"] = exc.status
    if exc.headers:
        event["headers"] = {name.decode("latin-1"): value.decode("latin-1") for name, value in exc.headers}
    return event


class WebSocketAPI:
    """The WebSocket side of ``/v1/responses`` over the app's :class:`ResponsesAPI`."""

    def __init__(self, responses: ResponsesAPI) -> None:
        self.responses = responses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            path = scope["path"]
            if path != PATH:
                raise HTTPError(
                    404,
                    f"Invalid URL (WebSocket {path[:200]}): WebSocket mode is served on {PATH}.",
                    code="not_found",
                )
            owner = self.responses.app.owner_for(scope)
        except HTTPError as exc:
            await _refuse(scope, send, exc)
            return
        await send({"type": "websocket.accept"})
        await _Connection(self.responses, owner, receive, send).run()


async def _refuse(scope: Scope, send: Send, exc: HTTPError) -> None:
    """Refuse the upgrade with an HTTP error in OpenAI's shape (or close 1008 without the extension)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
        return
    body = exc.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *exc.headers,
    ]
    await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


class _Connection:
    """One accepted connection: its messages answered in order, its recent responses kept."""

    def __init__(self, responses: ResponsesAPI, owner: str, receive: Receive, send: Send) -> None:
        self.responses = responses
        self.config = responses.app.config
        self.observer = responses.app.observer
        self.owner = owner
        self._receive = receive
        self._send = send
        self.inbox: asyncio.Queue[JSON] = asyncio.Queue(INBOX)
        self.gone = asyncio.Event()
        self.history: OrderedDict[str, list[JSON]] = OrderedDict()
        self.answered = 0  # client messages handled
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + self.config.ws_max_lifetime
        limit = self.config.ws_max_message_bytes
        self.max_message = limit if limit is not None else self.config.max_body_bytes

    # ------------------------------------------------------------------------------ the socket
    async def _read(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message["type"] == "websocket.receive":
                    await self.inbox.put(dict(message))
        finally:
            self.gone.set()

    async def disconnected(self) -> JSON:
        """``receive`` for ``drive``'s watcher: returns (as an HTTP disconnect) once the client is gone."""
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send_event(self, event: JSON) -> None:
        if self.gone.is_set():
            return
        try:
            await self._send({"type": "websocket.send", "text": orjson.dumps(event).decode()})
        except OSError:  # uvicorn's ClientDisconnected: the reader sees the disconnect next
            self.gone.set()

    async def _close(self, code: int) -> None:
        if not self.gone.is_set():
            with contextlib.suppress(Exception):
                await self._send({"type": "websocket.close", "code": code})

    # ------------------------------------------------------------------------------ the loop
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(), name="rg-websocket-reader")
        code = 1000
        log.info("WebSocket connection opened on %s", PATH)
        try:
            while not self.gone.is_set():
                remaining = self.deadline - loop.time()
                if remaining <= 0:
                    await self._limit_reached()
                    return
                message = await self._next(remaining)
                if message is not None:
                    await self._handle(message)
        except Exception:
            log.exception("WebSocket connection failed")
            code = 1011
        finally:
            await self._close(code)
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            log.info("WebSocket connection closed after %d message(s)", self.answered)

    async def _next(self, timeout: float) -> JSON | None:
        """The next client message, or None when the client left or ``timeout`` ran out."""
        if not self.inbox.empty():
            return self.inbox.get_nowait()
        loop = asyncio.get_running_loop()
        get = loop.create_task(self.inbox.get())
        gone = loop.create_task(self.gone.wait())
        try:
            await asyncio.wait((get, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        return None

    async def _limit_reached(self) -> None:
        minutes = self.config.ws_max_lifetime / 60
        await self.send_event(
            error_message(
                HTTPError(
                    400,
                    f"Responses websocket connection limit reached ({minutes:g} minutes). Create a new "
                    "websocket connection to continue.",
                    code="websocket_connection_limit_reached",
                )
            )
        )

    # ------------------------------------------------------------------------------ one message
    async def _handle(self, message: JSON) -> None:
        self.answered += 1
        line = RequestLog(self.observer, route="/v1/responses", method="WEBSOCKET")
        previous: str | None = None
        try:
            body = self._decode(message)
            kind = body.pop("type", None)
            if kind == "response.processed":
                line.written = True  # Codex's acknowledgement of a response it has handled: no answer
                return
            if kind != "response.create":
                raise HTTPError(
                    400,
                    f"Invalid value for 'type': '{str(kind)[:100]}'. This connection accepts "
                    "'response.create' messages.",
                    param="type",
                    code="invalid_value",
                )
            chained = body.get("previous_response_id")
            previous = chained if isinstance(chained, str) else None
            generate = self._options(body)
            ready = await self.responses.prepare(self.owner, body, line, local=self._local)
            line.stream = True
            _check_outputs(ready.history)
            if not generate:
                ready.provider = _NoGeneration()
            client = _Client(self)
            await self.responses.run(ready, client, line)
        except HTTPError as exc:
            line.http_status = exc.status
            self._evict(previous)
            await self.send_event(error_message(exc))
            return
        except Exception:
            line.http_status = 500
            log.exception("WebSocket response.create failed")
            self._evict(previous)
            await self.send_event(
                error_message(HTTPError(500, GENERIC_FAILURE, type="server_error", code="server_error"))
            )
            return
        finally:
            line.write()
        sink = client.current
        response = sink.builder.response if sink is not None and sink.builder is not None else None
        if response is not None and response.get("status") in ("completed", "incomplete"):
            self._remember(str(response["id"]), [*ready.history, *response.get("output", [])])
        else:
            self._evict(previous)

    def _decode(self, message: JSON) -> JSON:
        text = message.get("text")
        raw: bytes | str = text if text is not None else message.get("bytes") or b""
        size = len(raw.encode()) if isinstance(raw, str) else len(raw)
        if size > self.max_message:
            raise HTTPError(
                413,
                f"Message too large: the limit is {self.max_message} bytes.",
                code="request_too_large",
            )
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise HTTPError(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
                "sent was not valid JSON.)",
                code="invalid_json",
            ) from None
        if not isinstance(body, dict):
            raise HTTPError(
                400, "Invalid message: expected a JSON object with a 'type'.", code="invalid_type"
            )
        return body

    @staticmethod
    def _options(body: JSON) -> bool:
        """Take the WebSocket-only fields out of ``body``; whether to generate."""
        body.pop("stream", None)  # implied: every response streams its events
        if body.get("background"):
            raise HTTPError(
                400,
                "Unsupported parameter: 'background' is not supported in WebSocket mode; use "
                "POST /v1/responses.",
                param="background",
            )
        body.pop("background", None)
        generate = body.pop("generate", True)
        if not isinstance(generate, bool):
            raise HTTPError(
                400,
                f"Invalid type for 'generate': expected a boolean, but got {type(generate).__name__}.",
                param="generate",
                code="invalid_type",
            )
        return generate

    # ------------------------------------------------------------------------------ history
    def _local(self, rid: str) -> list[JSON] | None:
        context = self.history.get(rid)
        return None if context is None else list(context)

    def _remember(self, rid: str, context: list[JSON]) -> None:
        self.history[rid] = context
        self.history.move_to_end(rid)
        while len(self.history) > HISTORY:
            self.history.popitem(last=False)

    def _evict(self, rid: str | None) -> None:
        if rid is not None:
            self.history.pop(rid, None)


def _check_outputs(history: list[JSON]) -> None:
    """A tool output must answer a call in the conversation (OpenAI's 400)."""
    calls = {(item.get("type"), item.get("call_id")) for item in history}
    for item in history:
        call = _CALLS.get(str(item.get("type")))
        if call is not None and (call, item.get("call_id")) not in calls:
            raise HTTPError(
                400,
                f"No tool call found for {call.replace('_', ' ')} output with call_id "
                f"{str(item.get('call_id'))[:100]}.",
                param="input",
            )


class _NoGeneration(Provider):
    """``generate: false``: the response is created and completed without a model turn, so a later
    ``previous_response_id`` can continue from its input."""

    name = "no-generation"

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        builder.complete()
        yield


class _Client:
    """The connection as :meth:`ResponsesAPI.run`'s client."""

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.current: _Sink | None = None

    def sink(self, request: ResponseRequest, seal: Seal) -> Sink:
        config = self.connection.config
        self.current = _Sink(self.connection, seal, config.keepalive, config.keepalive_interval)
        return self.current

    async def background(
        self, request: ResponseRequest, store: Store, owner: str, rid: str, snapshot: JSON, seal: Seal
    ) -> None:
        # Refused before prepare (``_options``); kept for the protocol's sake.
        raise HTTPError(400, "'background' is not supported in WebSocket mode.", param="background")


class _Sink:
    """One response's events as WebSocket messages, and a keepalive while the model is silent
    (``in_progress`` or ``ping`` events; WebSocket has no comments, and its own ping frames keep
    proxies open, so ``comment`` and ``off`` send nothing)."""

    detached = False
    fails_refused = False
    # (The connection's end is watched through ``receive``.)
    gone: ClientGone | None = None

    def __init__(self, connection: _Connection, seal: Seal, mode: KeepaliveMode, interval: float) -> None:
        self.connection = connection
        self.seal = seal
        self.mode = mode
        self.interval = interval
        self.builder: StreamBuilder | None = None
        self._record: Record | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._pending: asyncio.Task[None] | None = None
        self._sending = False
        self._sent = False
        self.last = self._loop.time()

    @property
    def receive(self) -> Receive:
        return self.connection.disconnected

    @property
    def refusable(self) -> bool:
        return not self._sent

    def open(self, builder: StreamBuilder, record: Record) -> None:
        self.builder = builder
        self._record = record
        if self.mode in ("in_progress", "ping"):
            self._timer = self._loop.call_at(self.last + self.interval, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        due = self.last + self.interval
        builder = self.builder
        if builder is None or builder.finished:
            self._timer = None
            return
        if now < due or self._sending or self._pending is not None:
            self._timer = self._loop.call_at(max(due, now + self.interval / 4), self._fire)
            return
        builder.keepalive("ping" if self.mode == "ping" else "in_progress")
        self._sent = True  # the response has started for the client: a failure now is an event
        # Events the provider emitted but has not yielded yet go first, keeping sequence order.
        events = builder.take()
        if self._record is not None:
            self._record(events, None)
        self._pending = self._loop.create_task(self._send_all(events))
        self._pending.add_done_callback(self._sent_pending)
        self.last = now
        self._timer = self._loop.call_at(now + self.interval, self._fire)

    def _sent_pending(self, task: asyncio.Task[None]) -> None:
        if self._pending is task:
            self._pending = None

    async def _send_all(self, events: list[JSON]) -> None:
        self._sending = True
        try:
            for event in self.seal(events):
                await self.connection.send_event(event)
        finally:
            self._sending = False
            self.last = self._loop.time()

    async def deliver(self, events: list[JSON]) -> None:
        pending = self._pending
        if pending is not None:
            await pending  # a keepalive taken before these events goes first
        self._sent = True
        await self._send_all(events)

    def quiet(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def end(self, events: list[JSON]) -> None:
        await self.deliver(events)

    async def done(self, error: HTTPError | None) -> None:
        return None

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        if not gone and tail:
            with contextlib.suppress(Exception):
                await self.deliver(tail)

    def close(self) -> None:
        self.quiet()
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
