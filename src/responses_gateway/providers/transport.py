"""The one I/O seam between providers and their upstream HTTP APIs.

Providers never touch the HTTP client directly: their base, :class:`.http_base.HTTPProvider`, calls
:meth:`Transport.post` and reads the :class:`UpstreamResponse` it returns, either whole
(:meth:`UpstreamResponse.read`) or as raw byte chunks as they arrive (:meth:`UpstreamResponse.iter_chunks`
or :meth:`UpstreamResponse.pump`, fed to an incremental SSE decoder). Tests point a provider at a local
mock server through the same seam.

Failures below HTTP (DNS, refused or reset connections, timeouts) surface as :class:`ProviderError`
with status 502 (bad gateway) or 504 (timeout), built by :mod:`.upstream_errors`. Header values are
never put into reprs, exception messages or logs, and URLs are shown without their query string
(Gemini accepts ``?key=`` there).

The client is :mod:`.http1`, a lean HTTP/1.1 client built for relaying streams (see its docstring
for why); with ``trust_env=True`` (honour ``HTTP(S)_PROXY``) it is aiohttp, which speaks to proxies
(:mod:`.proxied`, imported only then).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..protocol.sse import SSEDecoder
from . import http1
from .base import ProviderError
from .http1 import StopPumping
from .upstream_errors import redact_url, transport_error

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "StopPumping",
    "Timeouts",
    "Transport",
    "UpstreamResponse",
    "raise_open_files_limit",
    "redact_url",
]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-call limits in seconds; ``None`` disables one.

    ``read`` is an idle timeout (the longest gap between two received chunks), not a total: a long
    generation that keeps streaming is never cut, a stalled one is.
    """

    connect: float | None = 10.0
    read: float | None = 300.0
    total: float | None = None


class UpstreamResponse(Protocol):
    """An upstream HTTP response whose body has not been read yet.

    ``iter_chunks`` yields body bytes as they arrive (any sizes, split anywhere) and then releases the
    connection; ``read``/``json`` take the whole body; ``aclose`` releases the connection: back to the
    pool if the body was read to its end, else the socket is aborted, which is what makes the upstream
    stop generating (and billing) when our client went away. Failures are ``ProviderError`` (502/504).
    """

    status: int
    headers: Mapping[str, str]

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    async def pump(self, on_chunk: Callable[[bytes], Awaitable[None] | None]) -> None:
        """``on_chunk(bytes)`` for each piece of the body as it arrives, possibly from the socket's
        I/O callback itself (no task hop); it returns None or an awaitable to wait for before more is
        read, and may raise :class:`StopPumping` to stop reading. Returns when the body has ended."""
        ...

    async def read(self, limit: int | None = None) -> bytes: ...

    async def json(self) -> Any: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> UpstreamResponse: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


# The lean client's default request headers, by lower-case name (a provider's own replace them).
_LEAN_HEADERS = {
    "content-type": ("Content-Type", "application/json"),
    "user-agent": ("User-Agent", "responses-gateway"),
    "accept": ("Accept", "*/*"),
    "accept-encoding": ("Accept-Encoding", "gzip, deflate"),
}


# Defaults for what one upstream can make the gateway hold in memory (models file: ``upstream:``).
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_ERROR_BYTES = 1024 * 1024


def _event_too_large(limit: int) -> ProviderError:
    return ProviderError(
        f"The upstream sent a stream event larger than {limit} bytes (upstream.max_event_bytes); "
        "the stream was stopped.",
        status=502,
        code="server_error",
    )


class Transport:
    """A pooled HTTP client for upstream APIs, created lazily inside the running event loop.

    A streaming gateway holds one upstream connection per open stream, so the pool is unlimited by
    default (``limit=0``, ``limit_per_host=0``); a positive limit makes further requests wait for a free
    connection, for at most ``pool_timeout`` seconds (None: as long as it takes) before a 504.
    """

    def __init__(
        self,
        *,
        timeouts: Timeouts | None = None,
        limit: int = 0,
        limit_per_host: int = 0,
        keepalive: float = 60.0,
        pool_timeout: float | None = None,
        trust_env: bool = False,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_error_bytes: int = DEFAULT_MAX_ERROR_BYTES,
    ) -> None:
        if limit < 0 or limit_per_host < 0:
            raise ValueError("connection pool limits must be 0 (unlimited) or positive")
        if max_event_bytes <= 0 or max_error_bytes <= 0:
            raise ValueError("max_event_bytes and max_error_bytes must be positive")
        # What one upstream may make the gateway hold: an event still arriving, an error body.
        self.max_event_bytes = max_event_bytes
        self.max_error_bytes = max_error_bytes
        self.timeouts = timeouts or Timeouts()
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._keepalive = keepalive
        self._pool_timeout = pool_timeout
        # Honouring HTTP(S)_PROXY is opt-in: a gateway usually talks to its upstreams directly.
        self._trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http1: http1.Client | None = None

    def sse_decoder(self) -> SSEDecoder:
        """An SSE decoder for an upstream's stream, bounded by ``max_event_bytes``: an event past it
        ends the stream with a 502 ProviderError instead of growing without end."""
        return SSEDecoder(max_event_bytes=self.max_event_bytes, too_large=_event_too_large)

    def __repr__(self) -> str:
        if self._trust_env:
            open_ = self._session is not None and not self._session.closed
        else:
            open_ = self._http1 is not None and not self._http1.closed
        return f"<Transport {'open' if open_ else 'idle'}>"

    def _lean(self) -> http1.Client:
        loop = asyncio.get_running_loop()
        client = self._http1
        # A pool is bound to the loop it was made in; a new loop (tests, a restarted server) gets its
        # own. The old one's sockets belong to its loop and are dropped with it.
        if client is None or client.closed or client.loop is not loop:
            client = self._http1 = http1.Client(
                limit=self._limit,
                limit_per_host=self._limit_per_host,
                keepalive=self._keepalive,
                pool_timeout=self._pool_timeout,
            )
        return client

    def idle_connections(self) -> int:
        """Connections open in the pool and not carrying a request (0 with the aiohttp client)."""
        return self._http1.idle_connections() if self._http1 is not None else 0

    def _proxied(self) -> aiohttp.ClientSession:
        from . import proxied

        loop = asyncio.get_running_loop()
        session = self._session
        # A session is bound to the loop it was made in; a new loop (tests, a restarted server) gets
        # its own. The old one cannot be closed from here and is dropped with its loop.
        if session is None or session.closed or self._loop is not loop:
            session = self._session = proxied.session(
                limits=self.timeouts,
                limit=self._limit,
                limit_per_host=self._limit_per_host,
                keepalive=self._keepalive,
                pool_timeout=self._pool_timeout,
            )
            self._loop = loop
        return session

    async def post(
        self,
        url: str,
        headers: Mapping[str, str],
        json_body: Any,
        *,
        timeouts: Timeouts | None = None,
    ) -> UpstreamResponse:
        """POST ``json_body`` (serialized with orjson) and return once the response headers are in."""
        limits = timeouts or self.timeouts
        if not self._trust_env:
            return await self._post_lean(url, headers, json_body, limits)
        # Imported here: a gateway without proxies does not load aiohttp (~10 MB per process).
        from . import proxied

        return await proxied.post(self._proxied(), url, headers, json_body, limits, self._pool_timeout)

    async def _post_lean(
        self, url: str, headers: Mapping[str, str], json_body: Any, limits: Timeouts
    ) -> UpstreamResponse:
        # Header names are case-insensitive: the provider's own (e.g. ``accept: text/event-stream``)
        # replace these defaults rather than going out beside them. (The request's head is cached
        # per header set below, by http1's ``_request_head``.)
        named = dict(_LEAN_HEADERS)
        for name, value in headers.items():
            named[name.lower()] = (name, value)
        sent = dict(named.values())

        def reading_error(exc: BaseException) -> BaseException:
            if isinstance(exc, TimeoutError | OSError):
                return transport_error(exc, url, limits.read, reading=True)
            return exc

        try:
            return await self._lean().post(
                url,
                sent,
                orjson.dumps(json_body),
                connect_timeout=limits.connect,
                read_timeout=limits.read,
                total_timeout=limits.total,
                error=reading_error,
                label=redact_url(url),
            )
        except (TimeoutError, OSError) as exc:
            # A stalled or malformed answer is a reading failure; anything before it (connecting,
            # waiting for a pooled connection) a connecting one.
            reading = isinstance(exc, http1.ReadTimeout | http1.UpstreamProtocolError)
            limit = limits.read if reading else limits.connect
            raise transport_error(exc, url, limit, reading=reading) from None

    async def aclose(self) -> None:
        """Close the pool (idempotent)."""
        lean, self._http1 = self._http1, None
        if lean is not None and not lean.closed:
            # RuntimeError: closed from a different loop than it was made in; nothing left to release.
            with contextlib.suppress(RuntimeError):
                await lean.aclose()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            # RuntimeError: closed from a different loop than it was made in; nothing left to release.
            with contextlib.suppress(RuntimeError):
                await session.close()


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to the hard limit; the new soft limit.

    Each open stream holds two sockets (client and upstream) and the pool is unlimited by default; the
    usual soft limit of 1,024 would fail a busy gateway's connects with EMFILE long before the CPU runs
    out.
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target
