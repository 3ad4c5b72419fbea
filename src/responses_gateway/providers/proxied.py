"""The proxy-aware upstream client: aiohttp, for ``Transport(trust_env=True)`` (``HTTP(S)_PROXY``).

:mod:`.transport` imports this module only when a transport honours proxies, so a gateway that talks
to its upstreams directly (the default) never loads aiohttp. Failures are the same ``ProviderError``
(502/504) as the lean client's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from . import http1
from .upstream_errors import redact_url, transport_error

if TYPE_CHECKING:
    from .transport import Timeouts

__all__ = ["AiohttpResponse", "client_timeout", "post", "session"]


def client_timeout(limits: Timeouts, pool_timeout: float | None = None) -> aiohttp.ClientTimeout:
    """``limits`` as aiohttp's timeouts.

    ``connect`` bounds the socket connect only (aiohttp's ``sock_connect``): aiohttp's own
    ``connect`` also counts the wait for a free pooled connection, and charging that wait to the
    connect timeout turned a busy pool into 504s. The pool wait is bounded by ``pool_timeout``
    (plus the connect itself) or, when it is None, not at all.
    """
    pooled = None if pool_timeout is None else pool_timeout + (limits.connect or 0.0)
    return aiohttp.ClientTimeout(
        total=limits.total, connect=pooled, sock_connect=limits.connect, sock_read=limits.read
    )


def session(
    *, limits: Timeouts, limit: int, limit_per_host: int, keepalive: float, pool_timeout: float | None
) -> aiohttp.ClientSession:
    """A pooled aiohttp session that honours ``HTTP(S)_PROXY`` (bound to the running loop)."""
    connector = aiohttp.TCPConnector(
        limit=limit, limit_per_host=limit_per_host, keepalive_timeout=keepalive, ttl_dns_cache=300
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=client_timeout(limits, pool_timeout),
        trust_env=True,
        skip_auto_headers=("User-Agent",),
    )


async def post(
    client: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    json_body: Any,
    limits: Timeouts,
    pool_timeout: float | None,
) -> AiohttpResponse:
    """POST ``json_body`` (serialized with orjson); the response once its headers are in."""
    sent = {"Content-Type": "application/json", "User-Agent": "responses-gateway"}
    sent.update(headers)
    try:
        resp = await client.post(
            url,
            data=orjson.dumps(json_body),
            headers=sent,
            timeout=client_timeout(limits, pool_timeout),
            allow_redirects=False,
        )
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise transport_error(exc, url, limits.connect, reading=False) from None
    return AiohttpResponse(resp, url, limits)


class AiohttpResponse:
    """An aiohttp response behind the :class:`UpstreamResponse` interface (the proxy-aware path)."""

    __slots__ = ("_done", "_resp", "_timeouts", "_url", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, url: str, timeouts: Timeouts) -> None:
        self._resp = resp
        self._url = url
        self._timeouts = timeouts
        self._done = False
        self.status: int = resp.status
        self.headers: Mapping[str, str] = resp.headers

    def __repr__(self) -> str:
        return f"<AiohttpResponse {self.status} {redact_url(self._url)}>"

    async def iter_chunks(self) -> AsyncGenerator[bytes, None]:
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

    async def pump(self, on_chunk: Callable[[bytes], Awaitable[None] | None]) -> None:
        """As :meth:`UpstreamResponse.pump`, from this task (aiohttp has no callback for its body)."""
        if not await http1.pump_iterated(self.iter_chunks(), on_chunk):
            await self.aclose()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (at most ``limit`` bytes of it: see ``http1.Response.read``)."""
        try:
            if limit is None:
                body = await self._resp.read()
                self._done = True
            else:
                body = await self._resp.content.read(limit)
                self._done = self._resp.content.at_eof()
        except (TimeoutError, aiohttp.ClientError) as exc:
            await self.aclose()
            raise transport_error(exc, self._url, self._timeouts.read, reading=True) from None
        await self.aclose()
        return body

    async def json(self) -> Any:
        """The whole body parsed as JSON (``None`` if it is not JSON)."""
        return http1.json_or_none(await self.read())

    async def aclose(self) -> None:
        """Release the connection: back to the pool if the body was consumed, else abort the socket.

        Aborting is what makes the upstream stop generating (and billing) when our client went away.
        """
        if self._done:
            self._resp.release()
        else:
            self._resp.close()
        self._done = True

    async def __aenter__(self) -> AiohttpResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
