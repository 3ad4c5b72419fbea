"""The one I/O seam between providers and their upstream HTTP APIs.

Providers never touch aiohttp directly: they call :meth:`Transport.post` and read the
:class:`UpstreamResponse` it returns, either whole (:meth:`UpstreamResponse.read`) or as raw byte chunks
as they arrive (:meth:`UpstreamResponse.iter_chunks`, fed to an incremental SSE decoder). Tests point a
provider at a local mock server through the same seam.

Failures below HTTP (DNS, refused or reset connections, timeouts) surface as :class:`ProviderError`
with status 502 (bad gateway) or 504 (timeout), built by :mod:`.upstream_errors`. Header values are
never put into reprs, exception messages or logs, and URLs are shown without their query string
(Gemini accepts ``?key=`` there).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from .upstream_errors import redact_url, transport_error

__all__ = ["Timeouts", "Transport", "UpstreamResponse", "raise_open_files_limit", "redact_url"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-call limits in seconds; ``None`` disables one.

    ``read`` is an idle timeout (the longest gap between two received chunks), not a total: a long
    generation that keeps streaming is never cut, a stalled one is.
    """

    connect: float | None = 10.0
    read: float | None = 300.0
    total: float | None = None

    def client_timeout(self, pool_timeout: float | None = None) -> aiohttp.ClientTimeout:
        """The aiohttp equivalent.

        ``connect`` bounds the socket connect only (aiohttp's ``sock_connect``): aiohttp's own
        ``connect`` also counts the wait for a free pooled connection, and charging that wait to the
        connect timeout turned a busy pool into 504s. The pool wait is bounded by ``pool_timeout``
        (plus the connect itself) or, when it is None, not at all.
        """
        pooled = None if pool_timeout is None else pool_timeout + (self.connect or 0.0)
        return aiohttp.ClientTimeout(
            total=self.total, connect=pooled, sock_connect=self.connect, sock_read=self.read
        )


class UpstreamResponse:
    """An upstream HTTP response whose body has not been read yet."""

    __slots__ = ("_done", "_resp", "_timeouts", "_url", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, url: str, timeouts: Timeouts) -> None:
        self._resp = resp
        self._url = url
        self._timeouts = timeouts
        self._done = False
        self.status: int = resp.status
        self.headers: Mapping[str, str] = resp.headers

    def __repr__(self) -> str:
        return f"<UpstreamResponse {self.status} {redact_url(self._url)}>"

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive (any sizes, split anywhere), then release the connection."""
        try:
            async for chunk in self._resp.content.iter_any():
                if chunk:
                    yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            await self.aclose()
            raise transport_error(exc, self._url, self._timeouts.read, reading=True) from None
        self._done = True
        await self.aclose()

    async def read(self) -> bytes:
        """The whole body."""
        try:
            body = await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            await self.aclose()
            raise transport_error(exc, self._url, self._timeouts.read, reading=True) from None
        self._done = True
        await self.aclose()
        return body

    async def json(self) -> Any:
        """The whole body parsed as JSON (``None`` if it is not JSON)."""
        body = await self.read()
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None

    async def aclose(self) -> None:
        """Release the connection: back to the pool if the body was consumed, else abort the socket.

        Aborting is what makes the upstream stop generating (and billing) when our client went away.
        """
        if self._done:
            self._resp.release()
        else:
            self._resp.close()
        self._done = True

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


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
    ) -> None:
        if limit < 0 or limit_per_host < 0:
            raise ValueError("connection pool limits must be 0 (unlimited) or positive")
        self.timeouts = timeouts or Timeouts()
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._keepalive = keepalive
        self._pool_timeout = pool_timeout
        # Honouring HTTP(S)_PROXY is opt-in: a gateway usually talks to its upstreams directly.
        self._trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        state = "open" if self._session is not None and not self._session.closed else "idle"
        return f"<Transport {state}>"

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        # A session is bound to the loop it was made in; a new loop (tests, a restarted server) gets
        # its own. The old one cannot be closed from here and is dropped with its loop.
        if session is None or session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=self._limit_per_host,
                keepalive_timeout=self._keepalive,
                ttl_dns_cache=300,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeouts.client_timeout(self._pool_timeout),
                trust_env=self._trust_env,
                skip_auto_headers=("User-Agent",),
            )
            self._session = session
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
        session = self._client()
        sent = {"Content-Type": "application/json", "User-Agent": "responses-gateway"}
        sent.update(headers)
        try:
            resp = await session.post(
                url,
                data=orjson.dumps(json_body),
                headers=sent,
                timeout=limits.client_timeout(self._pool_timeout),
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, url, limits.connect, reading=False) from None
        return UpstreamResponse(resp, url, limits)

    async def aclose(self) -> None:
        """Close the pool (idempotent)."""
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
