"""Driving one provider for one request: ONE loop (:func:`drive`) and the sinks its events go to.

:func:`drive` follows the contract in ``providers.base`` and holds every rule of a run: after each
``yield`` the events the builder holds are taken, recorded (the store's :class:`Recording`) and
delivered to one client sink; nothing is sent before the first events, so a failure up to then
becomes a plain HTTP error (raised here as :class:`HTTPError`); a later one, or a provider that returns
unfinished, becomes one terminal event; a client that leaves, a stop signal or shutdown closes the
provider and ends the run with :func:`stop_run`'s events.

The sinks each do one thing: :class:`SSESink` (a streamed response: SSE frames, one
``http.response.body`` message per yield, keepalive, the push path), :class:`JSONSink` (one JSON body
or an HTTP error) and :class:`DetachedSink` (a background run: no client, keepalives recorded).

Costs on the hot path are kept to a ``take()``, one record, one encode per event, one ``send`` per
yield (or, when the server offers its lean body path, ``http_protocol.BodyWriter``, one framed socket
write with no ASGI message; ``send`` still carries the head, the last chunk and anything the writer
declines) and a float store for the keepalive clock: the keepalive is a single timer handle that, when it
fires, checks how long the stream has really been silent and re-arms itself, so nothing is rescheduled
per event. A client disconnect cancels the request task: told by the server's callback
(``http_protocol.ClientGone``) where it offers one, else noticed by a watcher task per request
(``receive()`` returning ``http.disconnect``); the provider's generator then sees the cancellation at
its pending await and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.native import mypyc_attr
from ..protocol.request import ResponseRequest
from ..protocol.sse import encode_comment, encode_event
from ..providers.base import Provider, ProviderError
from .config import KeepaliveMode
from .errors import HTTPError, provider_message, status_for_code
from .http_protocol import ClientGone
from .types import Receive, Send

__all__ = [
    "ClientWatch",
    "DetachedSink",
    "Direct",
    "Frames",
    "JSONSink",
    "Recording",
    "SSESink",
    "Sink",
    "answer_whole",
    "drive",
    "follow_stream",
    "stop_all_runs",
    "stop_run",
    "unsealed",
]

JSON = dict[str, Any]

log = logging.getLogger("responses_gateway.server")

GENERIC_FAILURE = "The server had an error while processing your request. Sorry about that!"
UNFINISHED = "The model stopped before finishing the response."

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # Reverse proxies (nginx) buffer responses unless told not to; a buffered stream is not a stream.
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]


def response_headers(
    base: list[tuple[bytes, bytes]], builder: StreamBuilder | None
) -> list[tuple[bytes, bytes]]:
    """``base``, plus ``x-gateway-model`` when a fallback chain chose the model that answered."""
    served = builder.served_by if builder is not None else None
    if served is None:
        return base
    return [*base, (b"x-gateway-model", served.encode("utf-8", "replace"))]


KEEPALIVE_COMMENT = encode_comment("keepalive")


@mypyc_attr(native_class=False)  # (held in a WeakSet: mypyc's native classes take no weak references)
class ClientWatch:
    """Cancels the request (or worker) task when the client goes away or a stop signal is set.

    The client's leaving (reason ``"client"``) is told by ``gone`` (the server's callback,
    ``http_protocol.ClientGone``) when there is one; else ``receive`` is watched for
    ``http.disconnect`` by a task. ``stop`` (the store's cancel signal for a stored response: cancel or
    delete) gives reason ``"stopped"``. ``reason`` says which came first; ``None`` means the task was
    cancelled by something else (shutdown).
    """

    __slots__ = ("__weakref__", "_gone", "_task", "_watchers", "closed", "reason")

    def __init__(
        self, receive: Receive | None, stop: asyncio.Event | None = None, gone: ClientGone | None = None
    ) -> None:
        self.reason: str | None = None
        self.closed = False
        _WATCHES.add(self)
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._watchers: list[asyncio.Task[None]] = []
        self._gone = gone
        if gone is not None:
            gone.watch(self._client_gone)
        elif receive is not None:
            self._watchers.append(asyncio.get_running_loop().create_task(self._watch(receive)))
        if stop is not None:
            self._watchers.append(asyncio.get_running_loop().create_task(self._watch_stop(stop)))

    def _client_gone(self) -> None:
        self.stop("client")

    @property
    def gone(self) -> bool:
        """The client disconnected."""
        return self.reason == "client"

    async def _watch(self, receive: Receive) -> None:
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.stop("client")
                    return
        except asyncio.CancelledError:
            return  # closed: see _watch_stop

    async def _watch_stop(self, stop: asyncio.Event) -> None:
        try:
            await stop.wait()
        except asyncio.CancelledError:
            # Closed (the run ended). Returning, not raising: a task cancelled out of ``wait`` keeps
            # the error, whose traceback holds this frame, which holds this watch, which holds the
            # task: a cycle per stored response, thousands of objects that only the garbage
            # collector could free, in gen-1 collections of 7-15 ms at 100 streams (3-4 times the
            # storeless ones; docs/performance.md, "the stop watch's reference cycle").
            return
        self.stop("stopped")

    def stop(self, reason: str) -> None:
        """Interrupt the task (once, and not after :meth:`close`)."""
        if self.reason is None and not self.closed:
            self.reason = reason
            self._task.cancel()

    def close(self) -> None:
        """Stop watching (idempotent)."""
        self.closed = True
        _WATCHES.discard(self)
        if self._gone is not None:
            self._gone.unwatch()
            self._gone = None
        for watcher in self._watchers:
            watcher.cancel()


# Every run still going (foreground streams and background workers), for a graceful shutdown.
_WATCHES: weakref.WeakSet[ClientWatch] = weakref.WeakSet()


def stop_all_runs(reason: str = "shutdown") -> int:
    """End every run still going with ``reason`` (each stream gets its terminal event); how many."""
    watches = list(_WATCHES)
    for watch in watches:
        watch.stop(reason)
    return len(watches)


@dataclass(slots=True)
class Recording:
    """Where a stored response's events go besides the client (see ``store.EventRecorder``).

    ``add(events, final)`` queues events in order without waiting (``final`` overrides the terminal
    snapshot written, e.g. status ``cancelled``); ``commit()`` waits until what was queued is written;
    ``stop`` is set when the response is cancelled or deleted; ``cause()`` then says which.
    """

    add: Callable[[list[JSON], JSON | None], None]
    commit: Callable[[], Awaitable[None]]
    stop: asyncio.Event
    cause: Callable[[], Awaitable[str]]


# Why a run stopped -> the error code and message its stream ends with, and the status stored.
STOPS: dict[str, tuple[str, str, str | None]] = {
    "client": ("response_cancelled", "The client disconnected before the response finished.", "cancelled"),
    "cancelled": ("response_cancelled", "The response was cancelled.", "cancelled"),
    "deleted": ("response_deleted", "The response was deleted before it finished.", None),
    "shutdown": ("server_error", "The gateway shut down before the response finished.", None),
    "unstored": ("server_error", "The response could not be stored.", None),
}

Seal = Callable[[list[JSON]], list[JSON]]
# A stream's events -> the bytes its client reads (``_encode``: Responses SSE; or a dialect's frames).
Frames = Callable[[list[JSON]], bytes]
# The server's lean body path (``http_protocol.BodyWriter``): writes one non-final body chunk and
# says True, or says False and the ASGI ``send`` is used.
Direct = Callable[[bytes], bool]


def unsealed(events: list[JSON]) -> list[JSON]:
    """The :data:`Seal` that shows events as they are (no ``include`` asks for sealed content)."""
    return events


def _no_record(events: list[JSON], final: JSON | None = None) -> None:
    return None


async def _settle(recording: Recording | None) -> None:
    """Wait for the recorder; a store failure is logged, never fatal to the client's stream."""
    if recording is None:
        return
    try:
        await recording.commit()
    except Exception:
        log.exception("writing the stored response failed")


async def stop_run(builder: StreamBuilder, recording: Recording | None, reason: str) -> list[JSON]:
    """End a run stopped for ``reason``: the events that end its stream, recorded with the right status."""
    if recording is not None and reason == "stopped":
        try:
            reason = await recording.cause()
        except Exception:
            log.exception("reading the stored response failed")
            reason = "cancelled"
    code, message, status = STOPS.get(reason, STOPS["shutdown"])
    ended_here = not builder.finished
    if ended_here:
        builder.fail(code, message)
    events = builder.take()
    if recording is not None:
        final = None
        if status is not None and ended_here:
            final = {**builder.snapshot(), "status": status, "error": None, "completed_at": None}
        recording.add(events, final)
        await _settle(recording)
    return events


def _encode(events: list[dict[str, Any]]) -> bytes:
    if len(events) == 1:
        return encode_event(events[0])
    return b"".join([encode_event(e) for e in events])


@types.coroutine
def _resume(coro: Iterator[Any], yielded: Any) -> Generator[Any, Any, None]:
    """Go on driving ``coro`` (an awaitable's iterator), which was stepped outside any task and
    suspended on ``yielded``. A coroutine's iterator is a generator; another server's ``send`` may
    return an awaitable whose iterator is a plain iterator (granian's), stepped with ``next``."""
    step = getattr(coro, "send", None)
    throw = getattr(coro, "throw", None)
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:
            if throw is None:
                raise
            try:
                yielded = throw(exc)
            except StopIteration:
                return
        else:
            try:
                yielded = step(sent) if step is not None else next(coro)
            except StopIteration:
                return


@mypyc_attr(allow_interpreted_subclasses=True)
class _Relay:
    """Sends SSE body messages and the keepalive between them.

    Two ways in: ``await send(body)`` from the request task, and ``write(body)`` from a callback (a
    provider's I/O callback through ``StreamBuilder.push``, or the keepalive timer), which sends at
    once when the server's ``send`` completes without suspending (uvicorn's does unless the client's
    socket is backed up) and otherwise finishes it in a task, queueing what is pushed meanwhile, and
    returns that task for the provider to wait on. Frames never interleave: ``send`` waits for that
    task first, and the keepalive holds off while either is under way.
    """

    __slots__ = (
        "_builder",
        "_busy",
        "_direct",
        "_frames",
        "_interval",
        "_keepalive_body",
        "_loop",
        "_mode",
        "_queue",
        "_record",
        "_seal",
        "_send",
        "_sending",
        "_started",
        "_timer",
        "last",
    )

    def __init__(
        self,
        send: Send,
        builder: StreamBuilder | None,
        mode: KeepaliveMode,
        interval: float,
        record: Callable[[list[JSON], JSON | None], None] = _no_record,
        seal: Seal = unsealed,
        direct: Direct | None = None,
        frames: Frames | None = None,
        keepalive_body: bytes = KEEPALIVE_COMMENT,
    ) -> None:
        self._send = send
        self._direct = direct
        # Events -> the bytes the client reads: Responses SSE, or another dialect's frames.
        self._frames: Frames = frames if frames is not None else _encode
        self._keepalive_body = keepalive_body
        self._builder = builder
        self._record = record
        self._seal = seal
        self._mode = mode
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._busy: asyncio.Task[None] | None = None
        self._queue: list[dict[str, Any]] = []
        self._sending = False
        self._started = False
        self.last = self._loop.time()

    @property
    def started(self) -> bool:
        """The response head has gone out (by ``start`` or a first ``write``)."""
        return self._started

    def _arm(self) -> None:
        if self._mode != "off":
            self._timer = self._loop.call_at(self.last + self._interval, self._fire)

    def _head(self) -> dict[str, Any]:
        headers = response_headers(SSE_HEADERS, self._builder)
        return {"type": "http.response.start", "status": 200, "headers": headers}

    async def start(self, first: bytes) -> None:
        self._started = True
        await self._send(self._head())
        await self.send(first)
        self._arm()

    def write(self, body: bytes) -> asyncio.Task[None] | None:
        """Send ``body`` now if possible (see the class); the task still sending, or None."""
        queue = self._queue
        if not self._started:
            self._started = True
            queue.append(self._head())
            self._arm()
        elif self._busy is None and self._direct is not None and self._direct(body):
            # The lean path: one framed write, no ASGI message (http_protocol.BodyWriter).
            self.last = self._loop.time()
            return None
        queue.append({"type": "http.response.body", "body": body, "more_body": True})
        busy = self._busy
        if busy is not None:
            return busy
        send = self._send
        while queue:
            coro = send(queue.pop(0)).__await__()
            try:
                yielded = next(coro)  # (a generator's send(None); any awaitable's iterator has it)
            except StopIteration:
                continue
            busy = self._busy = self._loop.create_task(self._drain(coro, yielded))
            return busy
        self.last = self._loop.time()
        return None

    async def _drain(self, coro: Iterator[Any], yielded: Any) -> None:
        """Finish the send that suspended, then what was pushed meanwhile."""
        try:
            await _resume(coro, yielded)
            queue = self._queue
            while queue:
                await self._send(queue.pop(0))
        finally:
            self._busy = None
            self.last = self._loop.time()

    async def send(self, body: bytes, *, more: bool = True) -> None:
        while self._busy is not None:
            await self._busy  # what was pushed (events, a keepalive) goes first
        if more and self._direct is not None and self._direct(body):
            self.last = self._loop.time()
            return
        self._sending = True
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._sending = False
        self.last = self._loop.time()

    def _fire(self) -> None:
        now = self._loop.time()
        due = self.last + self._interval
        if now < due or self._sending or self._busy is not None:
            # Something was sent since this timer was set (or is being sent): wait out the new silence.
            self._timer = self._loop.call_at(max(due, now + self._interval / 8), self._fire)
            return
        builder = self._builder
        if builder is not None and builder.finished:
            return
        if self._mode == "comment" or builder is None:
            body = self._keepalive_body
        else:
            builder.keepalive("ping" if self._mode == "ping" else "in_progress")
            # Events the provider emitted but has not yielded yet go first, keeping sequence order.
            events = builder.take()
            self._record(events, None)
            body = self._frames(self._seal(events))
        self.write(body)
        self._timer = self._loop.call_at(now + self._interval, self._fire)

    def stop_timer(self) -> None:
        """No more keepalives; one already on its way still goes out (its sequence number is taken)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        """Stop everything (the stream is over or the client is gone)."""
        self.stop_timer()
        if self._busy is not None:
            self._busy.cancel()
            self._busy = None
        self._queue.clear()


def _fail(builder: StreamBuilder, code: str, message: str, param: str | None = None) -> None:
    if not builder.finished:
        builder.fail(code, message, param=param)


def _internal(provider: Provider) -> HTTPError:
    log.exception("provider %s raised", type(provider).__name__)
    return _server_error(GENERIC_FAILURE)


def _server_error(message: str) -> HTTPError:
    return HTTPError(500, message, type="server_error", code="server_error")


Record = Callable[[list[JSON], JSON | None], None]


class Sink(Protocol):
    """Where one run's events go besides the store: the client side of :func:`drive`.

    The driver calls, in this order: ``open`` once; ``deliver`` for each yield's events (never the
    terminal ones); then, once the response is finished, ``quiet``, and ``end`` with the terminal
    events (after they are stored); ``done`` when the provider has returned; or, when the run was
    stopped (client gone, response cancelled or deleted, shutdown), ``quiet`` and ``stopped``;
    ``close`` always, last.
    """

    @property
    def receive(self) -> Receive | None:
        """Watched for ``http.disconnect`` (None: no client), unless ``gone`` tells it."""

    @property
    def gone(self) -> ClientGone | None:
        """The server's disconnect callback for this client (None: watch ``receive``)."""

    @property
    def detached(self) -> bool:
        """No client owns the task: a cancellation nobody explained (shutdown) ends the run instead of
        propagating."""

    @property
    def refusable(self) -> bool:
        """A failure now is still a plain HTTP error: nothing was sent (nor stored) yet."""

    @property
    def fails_refused(self) -> bool:
        """A refused request still marks the builder failed (what the request log reports)."""

    def open(self, builder: StreamBuilder, record: Record) -> None:
        """Bind to the run before the provider is called (``record`` feeds the store)."""

    async def deliver(self, events: list[JSON]) -> None:
        """One yield's events (already recorded). The hot path: keep it to one send."""

    def quiet(self) -> None:
        """No more keepalives."""

    async def end(self, events: list[JSON]) -> None:
        """The terminal events, stored (and committed) before this is called."""

    async def done(self, error: HTTPError | None) -> None:
        """The provider returned; ``error`` is the failure it ended with, if any."""

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        """The run was stopped; ``tail`` ends its stream (``gone``: the client left)."""

    def close(self) -> None:
        """Release everything (idempotent)."""


async def drive(
    provider: Provider,
    request: ResponseRequest,
    builder: StreamBuilder,
    sink: Sink,
    recording: Recording | None = None,
) -> None:
    """Run ``provider`` for ``request`` to its end, sending its events to ``sink`` and ``recording``.

    The one provider loop (see ``providers.base``); every rule of a run lives here:

    - after each yield the builder's events are taken, recorded, then delivered; the terminal events
      are recorded and committed before ``sink.end`` sends them, and the provider is still iterated to
      its natural end;
    - a failure while ``sink.refusable`` (nothing sent yet) is raised as a plain :class:`HTTPError`;
      later it becomes one terminal event (``builder.fail``), and a provider that returns unfinished is
      failed with ``server_error``;
    - a client that leaves, a stop signal (cancel or delete of a stored response) or, for a detached
      run, shutdown closes the provider at once and ends the run with the events of :func:`stop_run`.
    """
    record = recording.add if recording is not None else _no_record
    take = builder.take
    deliver = sink.deliver
    name = type(provider).__name__
    sink.open(builder, record)
    watch = ClientWatch(sink.receive, recording.stop if recording is not None else None, sink.gone)
    agen: AsyncIterator[None] | None = None
    ended = False
    stopped = False  # cancelled only to interrupt the provider: see the handler
    error: HTTPError | None = None

    async def finish(events: list[JSON]) -> None:
        # Past this point a disconnect changes nothing, and once the body is complete uvicorn's
        # receive() reports a disconnect that must not cancel this task: stop watching first.
        nonlocal ended
        ended = True
        sink.quiet()
        watch.close()
        await _settle(recording)
        await sink.end(events)

    try:
        try:
            try:
                agen = provider.stream(request, builder)
                async for _ in agen:
                    events = take()
                    if not events or ended:
                        continue
                    record(events, None)
                    if builder.finished:
                        await finish(events)
                    else:
                        await deliver(events)
            except ProviderError as exc:
                if not ended and sink.refusable:
                    if sink.fails_refused:
                        _fail(builder, exc.code or "server_error", provider_message(exc), exc.param)
                    raise HTTPError.from_provider_error(exc) from None
                log.warning("provider %s failed mid-stream: %s", name, exc.code)
                error = HTTPError.from_provider_error(exc)
                _fail(builder, exc.code or "server_error", provider_message(exc), exc.param)
            except (asyncio.CancelledError, HTTPError):
                raise
            except Exception:
                if not ended and sink.refusable:
                    if sink.fails_refused:
                        _fail(builder, "server_error", GENERIC_FAILURE)
                    raise _internal(provider) from None
                log.exception("provider %s raised mid-stream", name)
                error = _server_error(GENERIC_FAILURE)
                _fail(builder, "server_error", GENERIC_FAILURE)
            else:
                if not builder.finished:
                    log.error("provider %s returned without finishing the response", name)
                    error = _server_error(UNFINISHED)
                    _fail(builder, "server_error", UNFINISHED)
            if not ended:
                events = take()
                record(events, None)
                await finish(events)
            await sink.done(error)
        except asyncio.CancelledError:
            if watch.reason is None and not sink.detached:
                raise
            # This task was cancelled only to interrupt the provider (client gone, the stored response
            # cancelled or deleted, or a detached run shut down). Swallow it.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            stopped = True
        if stopped:
            # Ended here, after the handler: compiled by mypyc, a coroutine that awaited inside an
            # ``except`` block and suspended there raised the handled exception again after it
            # (docs/performance.md, "The compiled hot path adopted"). And no ``return`` in the ``try``:
            # compiled, one there followed by the ``finally``'s await raised "TypeError: None object
            # expected; got async_generator" (WebSocket turns).
            reason = watch.reason or "shutdown"
            sink.quiet()
            if agen is not None:
                await _close(agen)
                agen = None
            why = "client disconnected" if watch.gone else f"response stopped ({reason})"
            log.info("%s; stopped %s", why, name)
            tail = await stop_run(builder, recording, reason)
            await sink.stopped(tail, watch.gone)
    finally:
        sink.close()
        watch.close()
        if agen is not None:
            await _close(agen)


async def _close(agen: AsyncIterator[None]) -> None:
    aclose = getattr(agen, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        log.exception("closing the provider stream failed")


@mypyc_attr(allow_interpreted_subclasses=True)
class SSESink(_Relay):
    """A streamed response's client: SSE frames, one body message per yield, keepalive, push.

    ``builder.push`` is set to :meth:`push`, which the provider calls from its upstream's I/O callback:
    it takes the events, records them and writes them at once (``_Relay.write``). The terminal events
    never go that way: they are stored before they are sent, which takes an await.

    ``frames`` (default: Responses SSE) turns events into the client's bytes; another dialect's
    stream (``frontends.DialectStream``) gives its own, and events that make no bytes send nothing
    (the response head included: the request stays refusable until its first bytes).
    """

    __slots__ = ("gone", "receive")

    detached = False
    fails_refused = False

    def __init__(
        self,
        send: Send,
        receive: Receive,
        *,
        keepalive: KeepaliveMode,
        keepalive_interval: float,
        seal: Seal = unsealed,
        direct: Direct | None = None,
        frames: Frames | None = None,
        keepalive_body: bytes = KEEPALIVE_COMMENT,
        gone: ClientGone | None = None,
    ) -> None:
        super().__init__(
            send,
            None,
            keepalive,
            keepalive_interval,
            seal=seal,
            direct=direct,
            frames=frames,
            keepalive_body=keepalive_body,
        )
        self.receive: Receive | None = receive
        self.gone = gone

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
        return not self._started

    def open(self, builder: StreamBuilder, record: Record) -> None:
        self._builder = builder
        self._record = record
        builder.push = self.push

    def push(self) -> asyncio.Task[None] | None:
        """A provider's "yield" from its I/O callback (``StreamBuilder.push``)."""
        builder = self._builder
        if builder is None or builder.finished:
            return None
        events = builder.take()
        if not events:
            return None
        # Per read of the upstream: the default recorder, seal and frames are skipped, not called.
        record = self._record
        if record is not _no_record:
            record(events, None)
        seal = self._seal
        if seal is not unsealed:
            events = seal(events)
        frames = self._frames
        if frames is not _encode or len(events) != 1:
            body = frames(events)
        else:
            # One event: its frame as the builder made it (a text delta), or serialized here.
            event = events[0]
            frame = builder.frame
            if frame is not None and frame[0] is event and seal is unsealed:
                body = frame[1]
            else:
                body = encode_event(event)
        if not body:
            return None
        return self.write(body)

    async def deliver(self, events: list[JSON]) -> None:
        body = self._frames(self._seal(events))
        if not body:
            return
        if not self._started:
            await self.start(body)
            return
        await self.send(body)

    def quiet(self) -> None:
        self.stop_timer()

    async def end(self, events: list[JSON]) -> None:
        # The terminal event goes out in the last body message.
        if not self._started:
            await self._send(self._head())
        await self.send(self._frames(self._seal(events)), more=False)

    async def done(self, error: HTTPError | None) -> None:
        return None

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        if gone or not tail:
            return
        with contextlib.suppress(Exception):
            if not self._started:
                await self._send(self._head())
            await self.send(self._frames(self._seal(tail)), more=False)

    def close(self) -> None:
        if self._builder is not None:
            self._builder.push = None
        self.abort()


def failure_error(response: JSON) -> HTTPError | None:
    """A failed Response as the HTTP error a one-body answer gives in its place (None: not failed)."""
    if response["status"] != "failed":
        return None
    failure = response["error"] or {}
    code = failure.get("code")
    status = status_for_code(code)
    # OpenAI's error types: quota and rate errors are typed by their code (as in its 429s).
    etype = {429: str(code)}.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return HTTPError(status, failure.get("message") or GENERIC_FAILURE, type=etype, code=code)


async def answer_whole(
    send: Send, builder: StreamBuilder, seal: Seal, encode: Callable[[JSON], bytes]
) -> None:
    """A finished Response as one body (``encode``: OpenAI's JSON, or a dialect's), presented by
    ``seal``; a failed one is raised as its HTTP error instead."""
    failed = failure_error(builder.response)
    if failed is not None:
        raise failed
    sealed = seal([{"type": "response", "response": builder.response}])[0]["response"]
    await send_body(send, encode(sealed), builder)


async def send_body(send: Send, body: bytes, builder: StreamBuilder) -> None:
    """A whole JSON answer (its headers name the response, like the stream's)."""
    headers = response_headers([*JSON_HEADERS, (b"content-length", str(len(body)).encode())], builder)
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


@mypyc_attr(allow_interpreted_subclasses=True)
class JSONSink:
    """A synchronous response's client: nothing per yield, then one JSON body (or an HTTP error).

    A response that ends ``failed`` is sent as an HTTP error whose status matches its error code
    (500 for ``server_error``, 429 for ``rate_limit_exceeded``…), as OpenAI answers a failed
    synchronous request; ``completed`` and ``incomplete`` responses are 200. Until the first events
    a failure is refused outright, and nothing is stored.
    """

    __slots__ = ("_body", "_builder", "_seal", "_send", "_yielded", "gone", "receive")

    detached = False
    fails_refused = True

    def __init__(
        self,
        send: Send,
        receive: Receive,
        *,
        seal: Seal = unsealed,
        body: Callable[[JSON], bytes] = orjson.dumps,
        gone: ClientGone | None = None,
    ) -> None:
        self._send = send
        self.receive: Receive | None = receive
        self.gone = gone
        self._seal = seal
        self._body = body
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
        builder = self._builder
        if gone or builder is None:
            return
        failure = builder.response.get("error") or {}
        code = failure.get("code")
        raise HTTPError(
            409 if code == "response_deleted" else 400,
            failure.get("message") or "The response was stopped.",
            code=code,
        ) from None

    def close(self) -> None:
        return None


class DetachedSink:
    """A background run's side: no client, only the store (``recording``).

    ``open`` marks the response in progress. While the provider is silent, keepalive events are
    recorded every ``keepalive_interval`` seconds (``in_progress`` or ``ping``; ``comment``/``off``
    add nothing to the log), so followers see them as a foreground client would. A failure before
    the first yield fails the response like one after it; shutdown ends it like a stop signal.
    """

    __slots__ = ("_builder", "_interval", "_loop", "_mode", "_record", "_timer", "last")

    receive: Receive | None = None
    gone: ClientGone | None = None
    detached = True
    refusable = False
    fails_refused = False

    def __init__(self, *, keepalive: KeepaliveMode = "off", keepalive_interval: float = 10.0) -> None:
        self._mode = keepalive
        self._interval = keepalive_interval
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._builder: StreamBuilder | None = None
        self._record: Record = _no_record

    def open(self, builder: StreamBuilder, record: Record) -> None:
        self._builder = builder
        self._record = record
        builder.mark_in_progress()
        record(builder.take(), None)
        self.last = self._loop.time()
        if self._mode in ("in_progress", "ping"):
            self._timer = self._loop.call_at(self.last + self._interval, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        due = self.last + self._interval
        if now < due:
            self._timer = self._loop.call_at(due, self._fire)
            return
        builder = self._builder
        if builder is None or builder.finished:
            self._timer = None
            return
        builder.keepalive("ping" if self._mode == "ping" else "in_progress")
        # Events the provider emitted but has not yielded yet go first, keeping sequence order.
        self._record(builder.take(), None)
        self.last = now
        self._timer = self._loop.call_at(now + self._interval, self._fire)

    async def deliver(self, events: list[JSON]) -> None:
        self.last = self._loop.time()

    def quiet(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def end(self, events: list[JSON]) -> None:
        return None

    async def done(self, error: HTTPError | None) -> None:
        return None

    async def stopped(self, tail: list[JSON], gone: bool) -> None:
        return None

    def close(self) -> None:
        self.quiet()


async def follow_stream(
    send: Send,
    receive: Receive,
    events: AsyncIterator[JSON],
    *,
    seal: Seal = unsealed,
    keepalive: bool = True,
    keepalive_interval: float = 10.0,
    direct: Direct | None = None,
    gone: ClientGone | None = None,
) -> None:
    """Send a stored response's events (replayed, then live) as SSE until it ends or the client leaves.

    The events already carry their sequence numbers, so a keepalive here is an SSE comment. A client
    that goes away stops only this follower, never the response.
    """
    watch = ClientWatch(receive, gone=gone)
    relay = _Relay(send, None, "comment" if keepalive else "off", keepalive_interval, direct=direct)
    try:
        await relay.start(b"")
        async for event in events:
            await relay.send(_encode(seal([event])))
        relay.stop_timer()
        watch.close()
        await relay.send(b"", more=False)
    except asyncio.CancelledError:
        if watch.reason is None:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
    finally:
        relay.abort()
        watch.close()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
