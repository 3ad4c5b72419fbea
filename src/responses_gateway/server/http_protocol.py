"""uvicorn's httptools protocol with the limits a server exposed to a network needs.

uvicorn bounds only the idle time between keep-alive requests. A client that sends a request head a
byte at a time, or a body that never ends, holds its connection (and a file descriptor, and for a
body the request's task) for ever: a thousand such connections cost nothing to send and everything
to keep. :class:`GatewayHttpProtocol` adds:

- ``head_timeout``: from a connection's first byte (or the end of the previous response) the whole
  request head must arrive within it; else a 408 in OpenAI's error shape and the connection closes.
  A new connection that sends nothing at all is closed after the same time, silently.
- ``body_timeout``: while a body is arriving, at most this long between two pieces of it; else a
  408 and the connection closes (the request sees a disconnect). A request answered before its body
  arrived (a wrong key's 401 is sent from the head) keeps that answer: its body is read and dropped,
  a stall in it closes the connection without a second response, and once it has arrived the
  connection is idle (kept alive for uvicorn's idle limit, closed at once by a graceful shutdown).
- ``max_connections``: past this many open connections a request is answered 503 (JSON, with
  Retry-After) instead of being served; open streams are never cut. uvicorn's own limit would
  answer in plain text.
- Protocol garbage (bad framing, a bad Content-Length, both Content-Length and Transfer-Encoding,
  control characters in headers) gets a 400 in OpenAI's JSON error shape, not uvicorn's text/plain.

The timers run only while a head or a body is incomplete, one timer handle per connection checked
against the time of the last byte: nothing is added to a streamed response's per-event path.

It also offers a lean path for a streamed body: ``scope["extensions"][BODY_WRITER]`` is a
:class:`BodyWriter`, a callable that writes one body chunk straight to the connection, framed as
uvicorn's ``send`` frames it, when that ``send`` would do nothing else (the response started with
chunked framing, not complete, the client still there, the socket not backed up), and otherwise
returns False so the caller uses the ASGI ``send`` (which waits for a backed-up socket, ignores a gone
client and completes the response). Same bytes on the wire either way; per event it saves the ASGI
message, the coroutine and uvicorn's checks.

And ``scope["extensions"][CLIENT_GONE]``, a :class:`ClientGone`: a callback called when the client
disconnects before its response is complete, exactly when uvicorn's ``receive()`` would return
``http.disconnect``; it spares a request the task that would otherwise wait in ``receive()`` for it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, cast

import orjson
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .types import Receive, Scope, Send

__all__ = [
    "BODY_WRITER",
    "CLIENT_GONE",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEAD_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "BodyWriter",
    "ClientGone",
    "GatewayHttpProtocol",
    "body_writer",
    "client_gone",
]

DEFAULT_HEAD_TIMEOUT = 10.0
# At a graceful shutdown, how long a connection accepted but not yet read is given for its first request.
SHUTDOWN_GRACE = 1.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 8192

# The scope extension under which a request finds its :class:`BodyWriter`.
BODY_WRITER = "responses_gateway.body_writer"
# The scope extension under which a request finds its :class:`ClientGone`.
CLIENT_GONE = "responses_gateway.client_gone"

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


def error_response(status: int, message: str, code: str, *, extra: bytes = b"") -> bytes:
    """A complete HTTP/1.1 error response in OpenAI's shape that closes the connection."""
    body = orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    )
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
        b"%s\r\n%s" % (status, _REASONS[status], len(body), extra, body)
    )


async def _busy(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer past ``max_connections``."""
    body = orjson.dumps(
        {
            "error": {
                "message": "The gateway has too many open connections; retry shortly.",
                "type": "server_error",
                "param": None,
                "code": "server_is_overloaded",
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyWriter:
    """One request's lean path for body chunks (see the module docstring).

    ``writer(body)`` is True when ``body`` went out as one chunk, exactly the bytes uvicorn's ``send``
    writes for ``{"type": "http.response.body", "body": body, "more_body": True}``; False when the
    caller must send that message itself: before the response head, for a Content-Length response,
    after the last chunk, once the client is gone, while the socket is backed up (uvicorn's ``send``
    then waits for it to drain) or for an empty body. The last chunk always goes through ``send``,
    which completes the response (keep-alive, the next pipelined request). A HEAD request is offered
    no writer at all.

    It holds its request's cycle weakly: the scope that carries it must not keep the connection alive.
    """

    __slots__ = ("_cycle", "_flow", "_write")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._flow = cycle.flow
        self._write = cycle.transport.write

    @property
    def backed_up(self) -> bool:
        """The client's socket is backed up (uvicorn's flow control has paused writing)."""
        return bool(self._flow.write_paused)

    def __call__(self, body: bytes) -> bool:
        cycle = self._cycle()
        if (
            cycle is None
            or not cycle.chunked_encoding
            or cycle.response_complete
            or cycle.disconnected
            or self._flow.write_paused
            or not body
        ):
            return False
        self._write(b"%x\r\n%b\r\n" % (len(body), body))
        return True


def body_writer(scope: Scope) -> BodyWriter | None:
    """The lean body path the server offers this request, if it does (another ASGI server, or a HEAD
    request: None)."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    writer = extensions.get(BODY_WRITER)
    return writer if isinstance(writer, BodyWriter) else None


def _local_address(info: Any) -> tuple[str, int | None] | None:
    """The scope's ``server`` from a transport's ``sockname`` (as uvicorn's ``get_local_addr``)."""
    if isinstance(info, tuple | list) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


def _remote_address(info: Any) -> tuple[str, int] | None:
    """The scope's ``client`` from a transport's ``peername`` (as uvicorn's ``get_remote_addr``)."""
    if isinstance(info, tuple | list) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class ClientGone:
    """One request's disconnect signal, by callback (see the module docstring).

    ``watch(callback)``: ``callback()`` is called once, from the connection's ``connection_lost``, if
    the client goes away before the response is complete (when uvicorn marks the request
    disconnected and its ``receive()`` would return ``http.disconnect``), or soon (``call_soon``) if
    that already happened or the response is already complete, as ``receive()`` would answer at once.
    ``unwatch()`` drops the callback. Like :class:`BodyWriter` it holds its cycle weakly.
    """

    __slots__ = ("_callback", "_cycle")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._callback: Callable[[], object] | None = None

    def watch(self, callback: Callable[[], object]) -> None:
        self._callback = callback
        cycle = self._cycle()
        if cycle is None or cycle.disconnected or cycle.response_complete:
            asyncio.get_running_loop().call_soon(self.fire)
            return
        # What receive() does before it waits: the connection is read, so a closed socket is seen.
        cycle.flow.resume_reading()

    def unwatch(self) -> None:
        self._callback = None

    def fire(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


def client_gone(scope: Scope) -> ClientGone | None:
    """The disconnect signal the server offers this request, if it does (another ASGI server: None)."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    gone = extensions.get(CLIENT_GONE)
    return gone if isinstance(gone, ClientGone) else None


class GatewayHttpProtocol(HttpToolsProtocol):
    """See the module docstring. Settings are class attributes: :meth:`configured` makes a subclass."""

    head_timeout: float = DEFAULT_HEAD_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @classmethod
    def configured(
        cls,
        *,
        head_timeout: float = DEFAULT_HEAD_TIMEOUT,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> type[GatewayHttpProtocol]:
        if head_timeout <= 0 or body_timeout <= 0 or max_connections <= 0:
            raise ValueError("head_timeout, body_timeout and max_connections must be positive")
        attrs = {
            "head_timeout": head_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        }
        return type("GatewayHttpProtocol", (cls,), attrs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limit_timer: asyncio.TimerHandle | None = None
        # What the timer guards: "head" (waiting for a complete head), "body" (a body arriving) or None.
        self._waiting_for: str | None = None
        self._last_byte = 0.0
        self._seen_bytes = False
        # The disconnect signal of the latest request (the one uvicorn marks disconnected).
        self._gone: ClientGone | None = None
        self._served = False  # a request has been read on this connection
        # Between a request's first byte and its last: bytes then are that request's, not a new one's
        # (the tail of a body the app answered before it arrived, e.g. a 401 sent from the head).
        self._in_message = False
        # Shutting down: the request on its way is served, then the connection closes.
        self._last_request = False

    # -- timers ---------------------------------------------------------------------------------------

    def _arm(self, what: str, timeout: float) -> None:
        self._waiting_for = what
        self._last_byte = self.loop.time()
        if self._limit_timer is None:
            self._limit_timer = self.loop.call_later(timeout, self._check)

    def _disarm(self) -> None:
        self._waiting_for = None
        if self._limit_timer is not None:
            self._limit_timer.cancel()
            self._limit_timer = None

    def _check(self) -> None:
        self._limit_timer = None
        what = self._waiting_for
        if what is None or self.transport is None or self.transport.is_closing():
            return
        timeout = self.head_timeout if what == "head" else self.body_timeout
        # The head's deadline runs from its first byte; the body's from its latest piece.
        due = self._last_byte + timeout
        now = self.loop.time()
        if now < due:
            self._limit_timer = self.loop.call_at(due, self._check)
            return
        self._waiting_for = None
        if what == "head" and not self._seen_bytes:
            self.transport.close()  # a connection that never said anything
            return
        part = "request headers" if what == "head" else "request body"
        self.logger.info("closing a connection that sent its %s too slowly", part)
        if what == "body" and self.cycle is not None and self.cycle.response_complete:
            # The app answered without waiting for this body: that answer stands, no 408 after it.
            self.transport.close()
            return
        if what == "body" and self.cycle is not None:
            # The app is waiting for this body: it sees a disconnect, and what it sends is dropped (the
            # 408 is the response; ``disconnected`` makes uvicorn's ``send`` a no-op, where writing to
            # the closed transport raised in the app).
            self.cycle.response_complete = True
            self.cycle.disconnected = True
        self.transport.write(
            error_response(
                408, f"The {part} did not arrive in time (within {timeout:g} s).", "request_timeout"
            )
        )
        self.transport.close()

    # -- protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn's own, but with the two addresses read through ``get_extra_info("sockname")`` and
        # ``("peername")``: uvicorn asks for ``get_extra_info("socket")`` first, for which uvloop
        # builds a socket object per connection (~10 µs a connection against ~1.5 µs, measured). The
        # scope's ``server`` and ``client`` are the same: (host, port) of any IP family, a Unix
        # socket's path with no port for ``server``, None for what has no address.
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = _local_address(transport.get_extra_info("sockname"))
        self.client = _remote_address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)
        self._seen_bytes = False
        self._arm("head", self.head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        gone, self._gone = self._gone, None
        if gone is not None and self.cycle is not None and self.cycle.disconnected:
            gone.fire()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for == "body":
            self._last_byte = self.loop.time()
        elif self._waiting_for is None and (self.cycle is None or self.cycle.response_complete):
            self._arm("head", self.head_timeout)  # the next request on a kept-alive connection
        if not self._seen_bytes and not self._in_message:
            self._seen_bytes = True
            self._last_byte = self.loop.time()
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self._seen_bytes = True
        if self._waiting_for != "head":
            self._arm("head", self.head_timeout)

    def on_headers_complete(self) -> None:
        self._disarm()
        if len(self.connections) > self.max_connections:
            app, self.app = self.app, _busy
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        self._served = True
        cycle = self.cycle
        if cycle is not None and self._last_request:
            cycle.keep_alive = False
        if cycle is not None and cycle.scope is self.scope:
            # (The request's task has not run yet: it finds these in its scope. A HEAD answer has no
            # body, which uvicorn's send sees to even when the head says chunked: no writer.)
            scope = cast(Scope, self.scope)
            extensions = scope.setdefault("extensions", {})
            self._gone = extensions[CLIENT_GONE] = ClientGone(cycle)
            if self.scope["method"] != "HEAD":
                extensions[BODY_WRITER] = BodyWriter(cycle)
        if not self.parser.should_upgrade() and not self.pipeline:
            # (A pipelined request waits, with reading paused, for the one before it: no clock for it.)
            self._arm("body", self.body_timeout)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_message = False
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not self.pipeline:
            # Answered before its body had arrived: the connection is idle only now. uvicorn armed its
            # keep-alive limit at the response and the body's bytes cancelled it; arm it again.
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
            if not self.transport.is_closing():
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

    def shutdown(self) -> None:
        """A graceful shutdown (SIGTERM, a rolling restart): uvicorn closes every connection with no
        request in progress at once. A connection accepted just before, whose first request has not
        arrived yet (the client sends it right after connecting), or one whose next request has begun
        to arrive, would then be closed under a request the client has sent: "Server disconnected
        without sending a response". Such a connection is given :data:`SHUTDOWN_GRACE` for its
        request, which is served with ``Connection: close``; an idle kept-alive one closes at once."""
        cycle = self.cycle
        between = cycle is None or cycle.response_complete
        if self.transport.is_closing() or not between or not (self._seen_bytes or not self._served):
            super().shutdown()
            return
        self._last_request = True
        if not self._seen_bytes:
            self.loop.call_later(SHUTDOWN_GRACE, self._shutdown_grace_over)

    def _shutdown_grace_over(self) -> None:
        if not self._seen_bytes and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._seen_bytes = False

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self.transport.write(
            error_response(400, "The request is not valid HTTP/1.1 (bad framing or headers).", "invalid_http")
        )
        self.transport.close()
