"""A lean HTTP/1.1 client for upstream model APIs: pooled keep-alive connections, streamed bodies.

Why not aiohttp on this path: profiling the gateway under load (docs/performance.md) put aiohttp's
client read path at the top of the gateway's own CPU per relayed event: a read-timeout timer cancelled
and re-created on every received chunk, ``StreamReader`` buffering, a flow-control call per chunk, and
five or six Python frames between the socket and the provider. Here a socket read is one protocol
callback into httptools' C parser (llhttp), whose ``on_body`` appends the decoded bytes to a list and
wakes the one waiting reader; the idle-read timeout is one timer per request that re-arms itself only
when it fires (it compares against the time of the last read), as the server's keepalive does.

What it does: ``POST`` with a body, over ``http`` or ``https`` (the system's CA store, SNI); response
bodies by ``Content-Length``, chunked, or to the connection's close, gzip/deflate decoded; a
keep-alive pool per host with optional limits (a request that finds the pool full waits, for at most
``pool_timeout``, and that wait is not charged to the connect timeout); DNS answers cached for five
minutes; a request that fails on a reused connection before any byte of its answer arrived is sent
once more on a new connection (the upstream closed an idle connection just as it was picked).
What it leaves out: proxies (``Transport(trust_env=True)`` uses aiohttp for that), HTTP/2, redirects
(never followed: the gateway does not follow them either), ``Expect: 100-continue``.

Errors: :class:`TimeoutError` for every timeout (:class:`ReadTimeout` once the request is sent),
:class:`OSError` for connection failures, :class:`UpstreamProtocolError` (an ``OSError``) for a
response that is not HTTP/1.1. ``transport.py`` turns them into 502/504 ``ProviderError``s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import ssl
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "Client",
    "ReadTimeout",
    "Response",
    "StopPumping",
    "UpstreamClosed",
    "UpstreamProtocolError",
    "json_or_none",
    "pump_iterated",
]

_PORTS = {"http": 80, "https": 443}
# Decoded body bytes held for a reader that is behind before the socket stops being read.
_HIGH_WATER = 1 << 18
# Bytes of status line and headers accepted before the response is refused.
_MAX_HEAD = 1 << 18
# After a push consumer stopped at the stream's last event: how much more of the body (the closing
# chunk, usually in the same read or the next) is read, and for how long, to keep the connection
# for the next request instead of dropping it.
_LINGER_BYTES = 1 << 16
_LINGER_SECONDS = 2.0
_DNS_TTL = 300.0

Key = tuple[str, str, int]


class UpstreamProtocolError(OSError):
    """The upstream's answer is not a well-formed HTTP/1.1 response."""


class StopPumping(Exception):
    """Raised by a :meth:`Response.pump` callback that has all it needs: the pumping ends (the
    connection is dropped, since the rest of the body was not read)."""


class ReadTimeout(TimeoutError):
    """The upstream's answer stalled (idle read timeout) or ran past the total timeout."""


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its response was complete."""


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class _Conn(asyncio.Protocol):
    """One upstream connection; parses the answer to the request in flight (one at a time)."""

    __slots__ = (
        "_head_bytes",
        "_idle_timer",
        "_loop",
        "_raw_headers",
        "_total_timer",
        "buffered",
        "busy",
        "chunks",
        "closed",
        "complete",
        "exc",
        "generation",
        "has_length",
        "headers_done",
        "idle_since",
        "keep_alive",
        "key",
        "last_read",
        "linger_timer",
        "lingering",
        "parser",
        "paused",
        "read_timeout",
        "received",
        "reused",
        "sink",
        "sink_error",
        "status",
        "transport",
        "waiter",
        "waits",
    )

    def __init__(self, key: Key, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.busy = False
        self.idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._total_timer: asyncio.TimerHandle | None = None
        self.read_timeout: float | None = None
        self.generation = 0
        self._reset()

    def _reset(self) -> None:
        self.generation += 1
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self._raw_headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self.headers_done = False
        self.has_length = False
        self.complete = False
        self.keep_alive = False
        self.received = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.last_read = 0.0
        # Push mode (Response.pump): body bytes go straight to this callback, from the I/O callback.
        self.sink: Callable[[bytes], Awaitable[None] | None] | None = None
        self.sink_error: BaseException | None = None
        self.waits = 0  # the consumer's waits not done yet (push mode)
        # Set by Client.linger: the rest of the body is read and dropped, then this is called.
        self.lingering: Callable[[_Conn], None] | None = None
        self.linger_timer: asyncio.TimerHandle | None = None

    # -- the request in flight ---------------------------------------------------------------------

    def send(self, data: bytes, read_timeout: float | None, total_timeout: float | None) -> None:
        """Start a request: write it and arm its timers."""
        self._reset()
        self.busy = True
        loop = self._loop
        self.last_read = now = loop.time()
        self.read_timeout = read_timeout
        if read_timeout is not None:
            self._idle_timer = loop.call_at(now + read_timeout, self._check_idle)
        if total_timeout is not None:
            self._total_timer = loop.call_at(now + total_timeout, self._on_total_timeout)
        assert self.transport is not None
        self.transport.write(data)

    def _check_idle(self) -> None:
        self._idle_timer = None
        timeout = self.read_timeout
        if not self.busy or self.complete or self.exc is not None or timeout is None:
            return
        now = self._loop.time()
        if self.paused:
            # We stopped reading (our client is slow): the upstream is not idle, it is held back. The
            # idle clock starts again when reading resumes.
            self.last_read = now
            self._idle_timer = self._loop.call_at(now + timeout, self._check_idle)
            return
        due = self.last_read + timeout
        if now < due:
            self._idle_timer = self._loop.call_at(due, self._check_idle)
        else:
            self.fail(ReadTimeout("idle read timeout"))

    def _on_total_timeout(self) -> None:
        self._total_timer = None
        if self.busy and not self.complete and self.exc is None:
            self.fail(ReadTimeout("total timeout"))

    def stop_timers(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._total_timer is not None:
            self._total_timer.cancel()
            self._total_timer = None

    def fail(self, exc: BaseException) -> None:
        """End the request in flight with ``exc`` and drop the connection."""
        if self.exc is None:
            self.exc = exc
        self.stop_timers()
        self.abort()
        _wake(self.waiter)

    def abort(self) -> None:
        self.closed = True
        transport = self.transport
        if transport is not None:
            self.transport = None
            transport.abort()

    async def wait(self) -> None:
        """Until the parser has something new for the reader (headers, body, end, or failure)."""
        waiter = self.waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def take(self) -> bytes:
        """The body bytes received since the last call (resuming the socket if it was paused)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.last_read = self._loop.time()
            if self.transport is not None:
                self.transport.resume_reading()
        return data

    def headers(self) -> CIMultiDictProxy[str]:
        return CIMultiDictProxy(CIMultiDict(self._raw_headers))

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.abort()  # bytes on an idle pooled connection: nothing can be trusted on it
            return
        self.last_read = self._loop.time()
        self.received = True
        error: BaseException | None = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            error = UpstreamProtocolError("the upstream switched protocols")
        except httptools.HttpParserError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, UpstreamProtocolError):
                error = cause
            else:
                error = UpstreamProtocolError(f"malformed HTTP response ({exc})")
        if self.sink is not None and self.chunks:
            # Push mode: what this read carried (every HTTP chunk of it) goes to the sink at once.
            self._push()
        if error is not None:
            self.fail(error)
        lingering = self.lingering
        if lingering is not None:
            if self.complete or self.exc is not None:
                self.lingering = None
                lingering(self)
            elif self.buffered > _LINGER_BYTES:
                self.lingering = None
                self.fail(UpstreamClosed("more body than expected after the last event"))
                lingering(self)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        lingering = self.lingering
        if lingering is not None:
            self.lingering = None
            if not self.complete and self.exc is None:
                self.fail(UpstreamClosed("the upstream closed the connection"))
            lingering(self)
            return
        if not self.busy or self.complete or self.exc is not None:
            return
        if self.headers_done and not self.has_length:
            # A body delimited by the connection's close ends here.
            self.complete = True
            self.keep_alive = False
            self.stop_timers()
            _wake(self.waiter)
            return
        self.fail(exc if exc is not None else UpstreamClosed("the upstream closed the connection"))

    # -- httptools callbacks -------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD:
            raise UpstreamProtocolError("the response headers are too large")
        self._raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (103 Early Hints): the real one follows on the same connection.
            self._raw_headers = []
            self._head_bytes = 0
            return
        self.status = status
        for name, value in self._raw_headers:
            lname = name.lower()
            if lname == "content-length" or (lname == "transfer-encoding" and "chunked" in value.lower()):
                self.has_length = True
        if status in (204, 304):
            self.has_length = True
        self.headers_done = True
        _wake(self.waiter)

    def on_body(self, body: bytes) -> None:
        if self.lingering is not None:
            self.buffered += len(body)  # dropped: the consumer has what it needed
            return
        self.chunks.append(body)
        if self.sink is not None:
            return  # pushed once the parser is done with this read (data_received)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        _wake(self.waiter)

    def _push(self) -> None:
        """Hand the body bytes of one socket read to the push sink (one call, however many HTTP
        chunks the read held: one decode and translation pass, one write to the client)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        sink = self.sink
        if sink is None or self.exc is not None:
            return
        try:
            wait = sink(data)
        except StopPumping as exc:
            # The consumer has all it needs (Response.pump then releases the connection, or lets it
            # linger for the rest of the body when the upstream has not ended it yet).
            self.sink_error = exc
            self.sink = None
            _wake(self.waiter)
            return
        except BaseException as exc:
            # Raised by the consumer: Response.pump raises it in its task.
            self.sink_error = exc
            self.fail(UpstreamClosed("the consumer stopped reading"))
            return
        if wait is not None:
            # The consumer cannot take more until ``wait`` is done (its client is slow): reading
            # stops until every such wait is.
            future = asyncio.ensure_future(wait)
            if not future.done():
                self.waits += 1
                if not self.paused and self.transport is not None:
                    self.paused = True
                    self.transport.pause_reading()
                future.add_done_callback(functools.partial(self._resume_push, self.generation))

    def _resume_push(self, generation: int, _: object) -> None:
        if generation != self.generation:
            return
        self.waits -= 1
        if self.paused and not self.waits:
            self.paused = False
            self.last_read = self._loop.time()
            if self.transport is not None:
                self.transport.resume_reading()

    def on_message_complete(self) -> None:
        if not self.headers_done:
            return  # the end of an interim (1xx) answer
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self.stop_timers()
        _wake(self.waiter)


def json_or_none(body: bytes) -> Any:
    """``body`` parsed as JSON, or None if it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def pump_iterated(
    chunks: AsyncGenerator[bytes, None], on_chunk: Callable[[bytes], Awaitable[None] | None]
) -> bool:
    """``pump`` done from the calling task, over an iterator of body chunks: False when the callback
    raised :class:`StopPumping` (the iterator is closed then; the caller drops its connection)."""
    async with contextlib.aclosing(chunks):
        try:
            async for chunk in chunks:
                wait = on_chunk(chunk)
                if wait is not None:
                    await wait
        except StopPumping:
            return False
    return True


def _same(exc: BaseException) -> BaseException:
    return exc


class Response:
    """An upstream answer whose headers are in and whose body has not been read yet.

    ``error`` maps a failure while reading (TimeoutError, OSError) to the exception raised instead.
    """

    __slots__ = ("_client", "_conn", "_decoder", "_done", "_error", "_label", "headers", "status")

    def __init__(
        self,
        client: Client,
        conn: _Conn,
        error: Callable[[BaseException], BaseException] = _same,
        label: str = "",
    ) -> None:
        self._client = client
        self._label = label
        self._conn = conn
        self._error = error
        self._done = False
        self.status: int = conn.status
        self.headers: Mapping[str, str] = conn.headers()
        encoding = self.headers.get("content-encoding", "").strip().lower()
        self._decoder: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib or raw-with-header, sniffed

    def __repr__(self) -> str:
        return f"<UpstreamResponse {self.status} {self._label}>"

    async def iter_chunks(self) -> AsyncGenerator[bytes, None]:
        """Body bytes as they arrive (any sizes), then the connection goes back to the pool.

        A failure drops the connection and raises ``error(TimeoutError | OSError)``.
        """
        conn = self._conn
        decoder = self._decoder
        try:
            while True:
                if conn.chunks:
                    data = conn.take()
                    if decoder is not None:
                        data = decoder.decompress(data)
                        if not data:
                            continue
                    yield data
                    continue
                if conn.exc is not None:
                    self.close()
                    raise self._error(conn.exc) from None
                if conn.complete:
                    break
                await conn.wait()
            if decoder is not None:
                tail = decoder.flush()
                if tail:
                    yield tail
        except zlib.error as exc:
            self.close()
            raise self._error(UpstreamProtocolError(f"the body does not decode ({exc})")) from None
        except BaseException:
            self.close()
            raise
        self._finish()

    async def pump(self, on_chunk: Callable[[bytes], Awaitable[None] | None]) -> None:
        """Call ``on_chunk`` with body bytes as they arrive, from the socket's callback (no task hop
        per chunk), until the body ends; then the connection goes back to the pool.

        ``on_chunk`` returns None, or an awaitable to wait for before more is read (the socket is
        paused meanwhile). An exception it raises aborts the connection and is raised here, except
        :class:`StopPumping`, which only ends the pumping. Failures are raised as by iter_chunks.
        """
        conn = self._conn
        if self._decoder is not None:
            # Compressed (rare for a stream): decoded in this task, from iter_chunks.
            if not await pump_iterated(self.iter_chunks(), on_chunk):
                self.close()
            return
        try:
            # What arrived before (or while waiting on the consumer) goes first; the sink takes over
            # with nothing left behind, no await between the last take and it.
            while conn.chunks:
                wait = on_chunk(conn.take())
                if wait is not None:
                    await wait
            conn.sink = on_chunk
            while not conn.complete and conn.exc is None and conn.sink_error is None:
                await conn.wait()
        except StopPumping:
            self._stopped()
            return
        except BaseException:
            self.close()
            raise
        finally:
            conn.sink = None
        error = conn.sink_error
        if error is not None:
            conn.sink_error = None
            if isinstance(error, StopPumping):
                self._stopped()
                return
            self.close()
            raise error
        if conn.exc is not None:
            self.close()
            raise self._error(conn.exc) from None
        self._finish()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; with ``limit``, at most that many bytes (the connection is then dropped if
        more was coming: an upstream's error body is read for its message, not kept whole)."""
        if limit is None:
            return b"".join([chunk async for chunk in self.iter_chunks()])
        chunks: list[bytes] = []
        size = 0
        chunk_iter = self.iter_chunks()
        async for chunk in chunk_iter:
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                await chunk_iter.aclose()
                self.close()
                break
        return b"".join(chunks)[:limit]

    async def json(self) -> Any:
        """The whole body parsed as JSON (``None`` if it is not JSON)."""
        return json_or_none(await self.read())

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _stopped(self) -> None:
        """The push consumer stopped at the stream's last event: the connection goes back to the pool
        once the upstream has ended the body (read and dropped in the background, within
        :data:`_LINGER_BYTES` and :data:`_LINGER_SECONDS`), else it is dropped."""
        if self._done:
            return
        conn = self._conn
        if conn.exc is None and not conn.complete and not conn.closed:
            self._done = True
            self._client.linger(conn)
            return
        self.close()

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._client.release(self._conn)

    def close(self) -> None:
        """Done with the answer: back to the pool if it was read to its end, else the socket is aborted.

        Aborting is what makes the upstream stop generating (and billing) when our client went away.
        """
        if self._done:
            return
        self._done = True
        conn = self._conn
        if not conn.complete or conn.exc is not None:
            conn.fail(UpstreamClosed("the response was closed before its end"))
        self._client.release(conn)


class _Host:
    """The pool for one (scheme, host, port)."""

    __slots__ = ("active", "idle")

    def __init__(self) -> None:
        self.idle: deque[_Conn] = deque()
        self.active = 0  # connecting or carrying a request


class Client:
    """A pool of HTTP/1.1 connections bound to one event loop."""

    def __init__(
        self,
        *,
        limit: int = 0,
        limit_per_host: int = 0,
        keepalive: float = 60.0,
        pool_timeout: float | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._keepalive = keepalive
        self._pool_timeout = pool_timeout
        self._hosts: dict[Key, _Host] = {}
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._dns: dict[tuple[str, int], tuple[float, list[tuple[int, str, int]]]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # Connections reading the rest of a body nobody needs before going back to the pool.
        self._lingering: set[_Conn] = set()
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def idle_connections(self) -> int:
        """Open connections waiting in the pool (for tests and stats)."""
        return sum(len(h.idle) for h in self._hosts.values())

    async def post(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
        total_timeout: float | None,
        error: Callable[[BaseException], BaseException] = _same,
        label: str = "",
    ) -> Response:
        """Send a POST and return once the answer's headers are in.

        ``error`` is the response's mapping of a failure while its body is read (see :class:`Response`);
        failures up to the headers are raised as they are. ``label`` names the request in the
        response's repr (the URL without secrets).
        """
        if self.closed:
            raise ConnectionError("the upstream client is closed")
        key, target, host_header = _parse_url(url)
        request = _request_bytes(target, host_header, headers, body)
        loop = self._loop
        deadline = None if total_timeout is None else loop.time() + total_timeout
        for attempt in (0, 1):
            # The retry of a stale pooled connection takes a new one: another pooled connection to
            # the same upstream is likely just as stale.
            conn = await self._acquire(key, connect_timeout, deadline, pooled=attempt == 0)
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                conn.send(request, read_timeout, left)
            except BaseException:
                conn.fail(UpstreamClosed("the request could not be written"))
                self.release(conn)
                raise
            while not conn.headers_done and conn.exc is None:
                try:
                    await conn.wait()
                except BaseException:
                    conn.fail(UpstreamClosed("the request was abandoned"))
                    self.release(conn)
                    raise
            exc = conn.exc
            if exc is None:
                return Response(self, conn, error, label)
            self.release(conn)
            stale = conn.reused and not conn.received and isinstance(exc, ConnectionError)
            if not (stale and attempt == 0):
                raise exc
        raise AssertionError("unreachable")

    # -- the pool ----------------------------------------------------------------------------------

    async def _acquire(
        self, key: Key, connect_timeout: float | None, deadline: float | None, *, pooled: bool = True
    ) -> _Conn:
        """A connection to ``key``: an idle pooled one if ``pooled`` and there is one, else a new one."""
        loop = self._loop
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = _Host()
        while True:
            now = loop.time()
            idle = host.idle
            while pooled and idle:
                conn = idle.pop()
                if conn.closed or now - conn.idle_since > self._keepalive:
                    conn.abort()
                    continue
                conn.reused = True
                host.active += 1
                self._active += 1
                return conn
            if self._has_room(host):
                break
            await self._wait_for_room(deadline)
        host.active += 1
        self._active += 1
        try:
            conn = await self._connect(key, connect_timeout)
        except BaseException:
            host.active -= 1
            self._active -= 1
            self._wake_one()
            raise
        return conn

    def _has_room(self, host: _Host) -> bool:
        if self._limit and self._active >= self._limit:
            return False
        return not (self._limit_per_host and host.active >= self._limit_per_host)

    async def _wait_for_room(self, deadline: float | None) -> None:
        loop = self._loop
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timeout = self._pool_timeout
        if deadline is not None:
            left = max(0.0, deadline - loop.time())
            timeout = left if timeout is None else min(timeout, left)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._wake_one()  # the room it was given goes to the next in line
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def release(self, conn: _Conn) -> None:
        """A request is over: keep its connection for the next one if it can be reused."""
        if not conn.busy:
            return
        conn.busy = False
        conn.stop_timers()
        if conn.paused:  # the body is complete; a consumer's pending wait is not the pool's concern
            conn.paused = False
            if conn.transport is not None:
                conn.transport.resume_reading()
        host = self._hosts.get(conn.key)
        if host is not None:
            host.active -= 1
        self._active -= 1
        reusable = (
            conn.complete and conn.exc is None and conn.keep_alive and not conn.closed and not self.closed
        )
        if reusable and host is not None and not conn.chunks:
            conn.idle_since = self._loop.time()
            conn.waiter = None
            host.idle.append(conn)
            if self._sweeper is None:
                self._sweeper = self._loop.call_later(self._keepalive, self._sweep)
        else:
            conn.abort()
        self._wake_one()

    def linger(self, conn: _Conn) -> None:
        """Read the rest of ``conn``'s body in the background and drop it; then release ``conn`` (to
        the pool if the body ended well). It counts as active meanwhile."""
        conn.stop_timers()
        conn.buffered = 0
        conn.chunks.clear()
        conn.lingering = self._lingered
        self._lingering.add(conn)
        timer = self._loop.call_later(_LINGER_SECONDS, self._linger_expired, conn, conn.generation)
        conn.linger_timer = timer
        if conn.paused:
            conn.paused = False
            if conn.transport is not None:
                conn.transport.resume_reading()

    def _linger_expired(self, conn: _Conn, generation: int) -> None:
        if conn.generation == generation and conn.lingering is not None:
            conn.lingering = None
            conn.linger_timer = None
            conn.fail(UpstreamClosed("the body did not end after the last event"))
            self._lingered(conn)

    def _lingered(self, conn: _Conn) -> None:
        self._lingering.discard(conn)
        timer = conn.linger_timer
        if timer is not None:
            conn.linger_timer = None
            timer.cancel()
        self.release(conn)

    def _sweep(self) -> None:
        """Close pooled connections idle for longer than the keep-alive time."""
        self._sweeper = None
        now = self._loop.time()
        left = 0
        for host in self._hosts.values():
            keep: deque[_Conn] = deque()
            for conn in host.idle:
                if not conn.closed and now - conn.idle_since <= self._keepalive:
                    keep.append(conn)
                else:
                    conn.abort()
            host.idle = keep
            left += len(keep)
        if left and not self.closed:
            self._sweeper = self._loop.call_later(self._keepalive, self._sweep)

    # -- connecting --------------------------------------------------------------------------------

    async def _connect(self, key: Key, timeout: float | None) -> _Conn:
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        addresses = await self._resolve(host, port, timeout)
        loop = self._loop
        error: BaseException | None = None
        for family, address, aport in addresses:
            conn = _Conn(key, loop)
            try:
                async with asyncio.timeout(timeout):
                    await loop.create_connection(
                        lambda conn=conn: conn,
                        address,
                        aport,
                        family=family,
                        ssl=context,
                        server_hostname=host if context is not None else None,
                    )
            except (OSError, TimeoutError) as exc:
                conn.abort()
                error = exc
                continue
            return conn
        assert error is not None
        raise error

    async def _resolve(self, host: str, port: int, timeout: float | None) -> list[tuple[int, str, int]]:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host, port)]
        now = self._loop.time()
        cached = self._dns.get((host, port))
        if cached is not None and cached[0] > now:
            return cached[1]
        async with asyncio.timeout(timeout):
            infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        seen: set[tuple[int, str, int]] = set()
        addresses: list[tuple[int, str, int]] = []
        for family, _type, _proto, _name, sockaddr in infos:
            entry = (int(family), str(sockaddr[0]), int(sockaddr[1]))
            if entry not in seen:
                seen.add(entry)
                addresses.append(entry)
        if not addresses:
            raise socket.gaierror(f"no address for {host}")
        if len(self._dns) > 1024:
            self._dns.clear()
        self._dns[(host, port)] = (now + _DNS_TTL, addresses)
        return addresses

    async def aclose(self) -> None:
        """Close every pooled connection; requests still running keep theirs until they end."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for host in self._hosts.values():
            while host.idle:
                host.idle.pop().abort()
        for conn in list(self._lingering):
            if conn.lingering is not None:
                conn.lingering = None
                conn.fail(UpstreamClosed("the upstream client is closed"))
                self._lingered(conn)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("the upstream client is closed"))
        self._waiters.clear()


@functools.lru_cache(maxsize=256)
def _parse_url(url: str) -> tuple[Key, str, str]:
    """(pool key, request target, Host header) of a URL; cached, providers post to a few URLs."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _PORTS:
        raise ValueError(f"unsupported URL scheme {scheme!r}")
    host = parts.hostname
    if not host:
        raise ValueError("the URL has no host")
    port = parts.port or _PORTS[scheme]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    shown = f"[{host}]" if ":" in host else host
    return (scheme, host, port), target, shown if port == _PORTS[scheme] else f"{shown}:{port}"


def _request_bytes(target: str, host: str, headers: Mapping[str, str], body: bytes) -> bytes:
    head = _request_head(target, host, tuple(headers.items()))
    return b"".join((head, b"%d\r\n\r\n" % len(body), body))


@functools.lru_cache(maxsize=256)
def _request_head(target: str, host: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """A POST's head up to its Content-Length value; cached: a provider sends the same few heads (a
    header that cannot be sent raises ValueError each time: exceptions are not cached)."""
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers:
        lname = name.lower()
        if lname in ("host", "content-length", "transfer-encoding", "connection"):
            continue  # ours to set
        if "\r" in name or "\n" in name or ":" in name or "\r" in value or "\n" in value:
            raise ValueError(f"invalid header {name!r}")  # the value is never shown: it may be a key
        lines.append(f"{name}: {value}")
    lines.append("Content-Length: ")
    return "\r\n".join(lines).encode()
