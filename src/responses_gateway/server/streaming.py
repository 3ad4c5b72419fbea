"""Driving one provider for one request: SSE relay with keepalive, or a single JSON body.

The loop follows the contract in ``providers.base``: after each ``yield`` the events the builder holds
are drained and sent as ONE ``http.response.body`` message. Nothing is sent before the first yield, so
a failure up to then becomes a plain HTTP error (raised here as :class:`HTTPError`).

Costs on the hot path are kept to a ``take()``, one encode per event, one ``send`` per yield and a
float store for the keepalive clock: the keepalive is a single timer handle that, when it fires,
checks how long the stream has really been silent and re-arms itself, so nothing is rescheduled per
event. Client disconnects are noticed by one watcher task per request (``receive()`` returning
``http.disconnect``), which cancels the request task; the provider's generator then sees the
cancellation at its pending await and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..protocol.sse import encode_comment, encode_event
from ..providers.base import Provider, ProviderError
from .config import KeepaliveMode
from .errors import HTTPError, provider_message, status_for_code
from .types import Receive, Send

__all__ = [
    "ClientWatch",
    "Recording",
    "follow_stream",
    "respond_json",
    "respond_stream",
    "run_detached",
    "stop_all_runs",
    "stop_run",
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


class ClientWatch:
    """Cancels the request (or worker) task when the client goes away or a stop signal is set.

    ``receive`` is watched for ``http.disconnect`` (reason ``"client"``); ``stop`` (the store's cancel
    signal for a stored response: cancel or delete) gives reason ``"stopped"``. ``reason`` says which
    came first; ``None`` means the task was cancelled by something else (shutdown).
    """

    __slots__ = ("__weakref__", "_task", "_watchers", "closed", "reason")

    def __init__(self, receive: Receive | None, stop: asyncio.Event | None = None) -> None:
        self.reason: str | None = None
        self.closed = False
        _WATCHES.add(self)
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        loop = asyncio.get_running_loop()
        self._watchers: list[asyncio.Task[None]] = []
        if receive is not None:
            self._watchers.append(loop.create_task(self._watch(receive)))
        if stop is not None:
            self._watchers.append(loop.create_task(self._watch_stop(stop)))

    @property
    def gone(self) -> bool:
        """The client disconnected."""
        return self.reason == "client"

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.stop("client")
                return

    async def _watch_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
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
}

Seal = Callable[[list[JSON]], list[JSON]]


def _identity(events: list[JSON]) -> list[JSON]:
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
def _resume(coro: Generator[Any, Any, None], yielded: Any) -> Generator[Any, Any, None]:
    """Go on driving ``coro`` (an awaitable's iterator), which was stepped outside any task and
    suspended on ``yielded``."""
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return


class _Relay:
    """Sends SSE body messages and the keepalive between them.

    Two ways in: ``await send(body)`` from the request task, and ``push(body)`` from a callback (a
    provider's I/O callback through ``StreamBuilder.push``, or the keepalive timer), which sends at
    once when the server's ``send`` completes without suspending (uvicorn's does unless the client's
    socket is backed up) and otherwise finishes it in a task, queueing what is pushed meanwhile, and
    returns that task for the provider to wait on. Frames never interleave: ``send`` waits for that
    task first, and the keepalive holds off while either is under way.
    """

    __slots__ = (
        "_builder",
        "_busy",
        "_interval",
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
        seal: Seal = _identity,
    ) -> None:
        self._send = send
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
        """The response head has gone out (by ``start`` or a first ``push``)."""
        return self._started

    def _arm(self) -> None:
        if self._mode != "off":
            self._timer = self._loop.call_at(self.last + self._interval, self._fire)

    async def start(self, first: bytes) -> None:
        self._started = True
        headers = response_headers(SSE_HEADERS, self._builder)
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self.send(first)
        self._arm()

    def push(self, body: bytes) -> asyncio.Task[None] | None:
        """Send ``body`` now if possible (see the class); the task still sending, or None."""
        queue = self._queue
        if not self._started:
            self._started = True
            headers = response_headers(SSE_HEADERS, self._builder)
            queue.append({"type": "http.response.start", "status": 200, "headers": headers})
            self._arm()
        queue.append({"type": "http.response.body", "body": body, "more_body": True})
        busy = self._busy
        if busy is not None:
            return busy
        send = self._send
        while queue:
            coro = send(queue.pop(0)).__await__()
            try:
                yielded = coro.send(None)
            except StopIteration:
                continue
            busy = self._busy = self._loop.create_task(self._drain(coro, yielded))
            return busy
        self.last = self._loop.time()
        return None

    async def _drain(self, coro: Generator[Any, Any, None], yielded: Any) -> None:
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
            body = KEEPALIVE_COMMENT
        else:
            builder.keepalive("ping" if self._mode == "ping" else "in_progress")
            # Events the provider emitted but has not yielded yet go first, keeping sequence order.
            events = builder.take()
            self._record(events, None)
            body = _encode(self._seal(events))
        self.push(body)
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
    return HTTPError(500, GENERIC_FAILURE, type="server_error", code="server_error")


async def respond_stream(
    send: Send,
    receive: Receive,
    provider: Provider,
    request: ResponseRequest,
    builder: StreamBuilder,
    *,
    keepalive: KeepaliveMode,
    keepalive_interval: float,
    recording: Recording | None = None,
    seal: Seal = _identity,
) -> None:
    """Stream ``provider``'s response as SSE; raise HTTPError if it fails before the first yield.

    With ``recording`` every event also goes to the store (the same events, in the same order, the
    keepalives included); the terminal event is written before it is sent, so a client that reads
    the response right after the stream ends finds it finished. ``seal`` rewrites what the client
    sees (sealed ``encrypted_content``), never what is stored.
    """
    record = recording.add if recording is not None else _no_record
    relay = _Relay(send, builder, keepalive, keepalive_interval, record, seal)
    ended = False  # the terminal event went out (``relay.started``: the first events did)

    def push() -> asyncio.Task[None] | None:
        # A provider's "yield" from its I/O callback (StreamBuilder.push). The terminal event is left
        # for the loop below: it is written to the store before it is sent, which takes an await.
        if ended or builder.finished:
            return None
        events = builder.take()
        if not events:
            return None
        record(events, None)
        return relay.push(_encode(seal(events)))

    builder.push = push
    agen = _open(provider, request, builder)
    watch = ClientWatch(receive, recording.stop if recording is not None else None)

    async def end(events: list[JSON]) -> None:
        # The terminal event goes out in the last body message. Past this point a disconnect changes
        # nothing, and once the body is complete uvicorn's receive() reports a disconnect that must
        # not cancel this task: stop watching first.
        nonlocal ended
        ended = True
        relay.stop_timer()
        watch.close()
        await _settle(recording)
        if not relay.started:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": response_headers(SSE_HEADERS, builder),
                }
            )
        await relay.send(_encode(seal(events)), more=False)

    name = type(provider).__name__
    try:
        try:
            async for _ in agen:
                events = builder.take()
                if not events or ended:
                    continue
                record(events, None)
                if builder.finished:
                    # Keep iterating (without sending) so the provider runs to its natural end.
                    await end(events)
                elif relay.started:
                    await relay.send(_encode(seal(events)))
                else:
                    await relay.start(_encode(seal(events)))
        except ProviderError as exc:
            if not relay.started and not ended:
                raise HTTPError.from_provider_error(exc) from None
            log.warning("provider %s failed mid-stream: %s", name, exc.code)
            _fail(builder, exc.code or "server_error", provider_message(exc), exc.param)
        except (asyncio.CancelledError, HTTPError):
            raise
        except Exception:
            if not relay.started and not ended:
                raise _internal(provider) from None
            log.exception("provider %s raised mid-stream", name)
            _fail(builder, "server_error", GENERIC_FAILURE)
        else:
            if not builder.finished:
                log.error("provider %s returned without finishing the response", name)
                _fail(builder, "server_error", UNFINISHED)
        if not ended:
            events = builder.take()
            record(events, None)
            await end(events)
    except asyncio.CancelledError:
        if watch.reason is None:
            raise
        # This task was cancelled only to interrupt the provider (client gone, or the stored response
        # cancelled or deleted). Swallow it.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        relay.stop_timer()
        await _close(agen)
        log.info("%s; stopped %s", "client disconnected" if watch.gone else "response stopped", name)
        tail = await stop_run(builder, recording, watch.reason)
        if not watch.gone and tail and not ended:
            with contextlib.suppress(Exception):
                if not relay.started:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": response_headers(SSE_HEADERS, builder),
                        }
                    )
                await relay.send(_encode(seal(tail)), more=False)
    finally:
        builder.push = None
        relay.abort()
        watch.close()
        await _close(agen)


def _open(provider: Provider, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
    """Call ``provider.stream``; a provider that fails in the call itself fails like one that fails later."""
    try:
        return provider.stream(request, builder)
    except ProviderError as exc:
        raise HTTPError.from_provider_error(exc) from None
    except Exception:
        raise _internal(provider) from None


async def _close(agen: AsyncIterator[None]) -> None:
    aclose = getattr(agen, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        log.exception("closing the provider stream failed")


async def respond_json(
    send: Send,
    receive: Receive,
    provider: Provider,
    request: ResponseRequest,
    builder: StreamBuilder,
    *,
    recording: Recording | None = None,
    seal: Seal = _identity,
) -> None:
    """Run the same loop without sending frames, then send the final Response (or an HTTP error).

    A response that ends ``failed`` is sent as an HTTP error whose status matches its error code
    (500 for ``server_error``, 429 for ``rate_limit_exceeded``…), as OpenAI answers a failed
    synchronous request; ``completed`` and ``incomplete`` responses are 200.
    """
    agen = _open(provider, request, builder)
    record = recording.add if recording is not None else _no_record
    watch = ClientWatch(receive, recording.stop if recording is not None else None)
    yielded = False
    try:
        error: HTTPError | None = None
        try:
            async for _ in agen:
                yielded = True
                record(builder.take(), None)
        except ProviderError as exc:
            error = HTTPError.from_provider_error(exc)
            _fail(builder, exc.code or "server_error", provider_message(exc), exc.param)
        except (asyncio.CancelledError, HTTPError):
            raise
        except Exception:
            error = _internal(provider)
            _fail(builder, "server_error", GENERIC_FAILURE)
        if error is None and not builder.finished:
            log.error("provider %s returned without finishing the response", type(provider).__name__)
            error = HTTPError(500, UNFINISHED, type="server_error", code="server_error")
            _fail(builder, "server_error", UNFINISHED)
        watch.close()
        if yielded:
            # Nothing is stored for a request that failed before its first event (the caller drops it).
            record(builder.take(), None)
            await _settle(recording)
        if error is not None:
            raise error
        response = builder.response
        if response["status"] == "failed":
            failure = response["error"] or {}
            code = failure.get("code")
            status = status_for_code(code)
            # OpenAI's error types: quota and rate errors are typed by their code (as in its 429s).
            etype = {429: str(code)}.get(status, "server_error" if status >= 500 else "invalid_request_error")
            raise HTTPError(status, failure.get("message") or GENERIC_FAILURE, type=etype, code=code)
        sealed = seal([{"type": "response", "response": response}])[0]["response"]
        body = orjson.dumps(sealed)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": response_headers(
                    [*JSON_HEADERS, (b"content-length", str(len(body)).encode())], builder
                ),
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except asyncio.CancelledError:
        if watch.reason is None:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await _close(agen)
        log.info(
            "%s; stopped %s",
            "client disconnected" if watch.gone else "response stopped",
            type(provider).__name__,
        )
        await stop_run(builder, recording, watch.reason)
        if not watch.gone:
            code = builder.response.get("error", {}).get("code") if builder.response.get("error") else None
            raise HTTPError(
                409 if code == "response_deleted" else 400,
                (builder.response.get("error") or {}).get("message") or "The response was stopped.",
                code=code,
            ) from None
    finally:
        watch.close()
        await _close(agen)


class _Beat:
    """Keepalive events for a run no client is attached to: recorded like the others, so every
    follower gets them (``in_progress`` or ``ping``; ``comment``/``off`` add nothing to the log)."""

    __slots__ = ("_builder", "_interval", "_loop", "_mode", "_record", "_timer", "last")

    def __init__(
        self,
        builder: StreamBuilder,
        record: Callable[[list[JSON], JSON | None], None],
        mode: KeepaliveMode,
        interval: float,
    ) -> None:
        self._builder = builder
        self._record = record
        self._mode = mode
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        if mode in ("in_progress", "ping"):
            self._timer = self._loop.call_at(self.last + interval, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        due = self.last + self._interval
        if now < due:
            self._timer = self._loop.call_at(due, self._fire)
            return
        builder = self._builder
        if builder.finished:
            self._timer = None
            return
        builder.keepalive("ping" if self._mode == "ping" else "in_progress")
        # Events the provider emitted but has not yielded yet go first, keeping sequence order.
        self._record(builder.take(), None)
        self.last = now
        self._timer = self._loop.call_at(now + self._interval, self._fire)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def run_detached(
    provider: Provider,
    request: ResponseRequest,
    builder: StreamBuilder,
    recording: Recording,
    *,
    keepalive: KeepaliveMode = "off",
    keepalive_interval: float = 10.0,
) -> None:
    """Run a background response to its end, feeding only the store (no client is attached).

    A failure before the first yield fails the response like one after it. Cancel or delete (the
    store's stop signal) closes the provider at once, which aborts its upstream request; so does
    cancelling this task (shutdown). While the provider is silent, keepalive events are recorded
    every ``keepalive_interval`` seconds, so followers see them as a foreground client would.
    """
    watch = ClientWatch(None, recording.stop)
    record = recording.add
    agen: AsyncIterator[None] | None = None
    name = type(provider).__name__
    beat: _Beat | None = None
    try:
        try:
            builder.mark_in_progress()
            record(builder.take(), None)
            beat = _Beat(builder, record, keepalive, keepalive_interval)
            loop = asyncio.get_running_loop()
            agen = provider.stream(request, builder)
            async for _ in agen:
                events = builder.take()
                if events:
                    record(events, None)
                    beat.last = loop.time()
        except ProviderError as exc:
            log.warning("provider %s failed in a background response: %s", name, exc.code)
            _fail(builder, exc.code or "server_error", provider_message(exc), exc.param)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("provider %s raised in a background response", name)
            _fail(builder, "server_error", GENERIC_FAILURE)
        else:
            if not builder.finished:
                log.error("provider %s returned without finishing the response", name)
                _fail(builder, "server_error", UNFINISHED)
        watch.close()
        if beat is not None:
            beat.stop()
        record(builder.take(), None)
        await _settle(recording)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if beat is not None:
            beat.stop()
        if agen is not None:
            await _close(agen)
            agen = None
        log.info("background response stopped (%s); closed %s", watch.reason or "shutdown", name)
        await stop_run(builder, recording, watch.reason or "shutdown")
    finally:
        watch.close()
        if beat is not None:
            beat.stop()
        if agen is not None:
            await _close(agen)


async def follow_stream(
    send: Send,
    receive: Receive,
    events: AsyncIterator[JSON],
    *,
    seal: Seal = _identity,
    keepalive: bool = True,
    keepalive_interval: float = 10.0,
) -> None:
    """Send a stored response's events (replayed, then live) as SSE until it ends or the client leaves.

    The events already carry their sequence numbers, so a keepalive here is an SSE comment. A client
    that goes away stops only this follower, never the response.
    """
    watch = ClientWatch(receive)
    relay = _Relay(send, None, "comment" if keepalive else "off", keepalive_interval)
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
