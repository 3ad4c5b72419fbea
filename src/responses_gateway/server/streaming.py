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
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..protocol.sse import encode_comment, encode_event
from ..providers.base import Provider, ProviderError
from .config import KeepaliveMode
from .errors import HTTPError, status_for_code
from .types import Receive, Send

__all__ = ["ClientWatch", "respond_json", "respond_stream"]

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
KEEPALIVE_COMMENT = encode_comment("keepalive")


class ClientWatch:
    """Watches ``receive()`` for ``http.disconnect`` and cancels the request task when it comes."""

    __slots__ = ("_task", "_watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self._task.cancel()
                return

    def close(self) -> None:
        """Stop watching (idempotent)."""
        self._watcher.cancel()


def _encode(events: list[dict[str, Any]]) -> bytes:
    if len(events) == 1:
        return encode_event(events[0])
    return b"".join([encode_event(e) for e in events])


class _Relay:
    """Sends SSE body messages and the keepalive between them."""

    __slots__ = (
        "_builder",
        "_interval",
        "_keepalive",
        "_loop",
        "_mode",
        "_send",
        "_sending",
        "_timer",
        "last",
    )

    def __init__(self, send: Send, builder: StreamBuilder, mode: KeepaliveMode, interval: float) -> None:
        self._send = send
        self._builder = builder
        self._mode = mode
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._sending = False
        self.last = self._loop.time()

    async def start(self, first: bytes) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self.send(first)
        if self._mode != "off":
            self._timer = self._loop.call_at(self.last + self._interval, self._fire)

    async def send(self, body: bytes, *, more: bool = True) -> None:
        if self._keepalive is not None:
            # Frames must not interleave: let a keepalive already on its way finish first.
            pending, self._keepalive = self._keepalive, None
            await pending
        self._sending = True
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._sending = False
        self.last = self._loop.time()

    def _fire(self) -> None:
        now = self._loop.time()
        due = self.last + self._interval
        if now < due or self._sending or (self._keepalive is not None and not self._keepalive.done()):
            # Something was sent since this timer was set (or is being sent): wait out the new silence.
            self._timer = self._loop.call_at(max(due, now + self._interval / 8), self._fire)
            return
        builder = self._builder
        if builder.finished:
            return
        if self._mode == "comment":
            body = KEEPALIVE_COMMENT
        else:
            builder.keepalive("ping" if self._mode == "ping" else "in_progress")
            # Events the provider emitted but has not yielded yet go first, keeping sequence order.
            body = _encode(builder.take())
        self.last = now
        self._keepalive = self._loop.create_task(self._send_keepalive(body))
        self._timer = self._loop.call_at(now + self._interval, self._fire)

    async def _send_keepalive(self, body: bytes) -> None:
        self._sending = True
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            self._sending = False

    def stop_timer(self) -> None:
        """No more keepalives; one already on its way still goes out (its sequence number is taken)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        """Stop everything (the stream is over or the client is gone)."""
        self.stop_timer()
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None


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
) -> None:
    """Stream ``provider``'s response as SSE; raise HTTPError if it fails before the first yield."""
    agen = _open(provider, request, builder)
    watch = ClientWatch(receive)
    relay = _Relay(send, builder, keepalive, keepalive_interval)
    started = ended = False

    async def end(body: bytes) -> None:
        # The terminal event goes out in the last body message. Past this point a disconnect changes
        # nothing, and once the body is complete uvicorn's receive() reports a disconnect that must
        # not cancel this task: stop watching first.
        nonlocal ended
        ended = True
        relay.stop_timer()
        watch.close()
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await relay.send(body, more=False)

    name = type(provider).__name__
    try:
        try:
            async for _ in agen:
                events = builder.take()
                if not events or ended:
                    continue
                if builder.finished:
                    # Keep iterating (without sending) so the provider runs to its natural end.
                    await end(_encode(events))
                elif started:
                    await relay.send(_encode(events))
                else:
                    started = True
                    await relay.start(_encode(events))
        except ProviderError as exc:
            if not started and not ended:
                raise HTTPError.from_provider_error(exc) from None
            log.warning("provider %s failed mid-stream: %s", name, exc.code)
            _fail(builder, exc.code or "server_error", exc.message, exc.param)
        except (asyncio.CancelledError, HTTPError):
            raise
        except Exception:
            if not started and not ended:
                raise _internal(provider) from None
            log.exception("provider %s raised mid-stream", name)
            _fail(builder, "server_error", GENERIC_FAILURE)
        else:
            if not builder.finished:
                log.error("provider %s returned without finishing the response", name)
                _fail(builder, "server_error", UNFINISHED)
        if not ended:
            await end(_encode(builder.take()))
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        # The client left: this task was cancelled only to interrupt the provider. Swallow it.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        log.info("client disconnected; stopped %s", name)
    finally:
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
    send: Send, receive: Receive, provider: Provider, request: ResponseRequest, builder: StreamBuilder
) -> None:
    """Run the same loop without sending frames, then send the final Response (or an HTTP error).

    A response that ends ``failed`` is sent as an HTTP error whose status matches its error code
    (500 for ``server_error``, 429 for ``rate_limit_exceeded``…), as OpenAI answers a failed
    synchronous request; ``completed`` and ``incomplete`` responses are 200.
    """
    agen = _open(provider, request, builder)
    watch = ClientWatch(receive)
    try:
        try:
            async for _ in agen:
                builder.take()
        except ProviderError as exc:
            raise HTTPError.from_provider_error(exc) from None
        except (asyncio.CancelledError, HTTPError):
            raise
        except Exception:
            raise _internal(provider) from None
        if not builder.finished:
            log.error("provider %s returned without finishing the response", type(provider).__name__)
            raise HTTPError(500, UNFINISHED, type="server_error", code="server_error")
        response = builder.response
        if response["status"] == "failed":
            error = response["error"] or {}
            code = error.get("code")
            status = status_for_code(code)
            # OpenAI's error types: quota and rate errors are typed by their code (as in its 429s).
            etype = {429: str(code)}.get(status, "server_error" if status >= 500 else "invalid_request_error")
            raise HTTPError(status, error.get("message") or GENERIC_FAILURE, type=etype, code=code)
        body = orjson.dumps(response)
        watch.close()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        log.info("client disconnected; stopped %s", type(provider).__name__)
    finally:
        watch.close()
        await _close(agen)
