"""Fallback: try the next back end when one fails before its first byte.

Safe because of the provider contract: a provider calls no builder method until its upstream accepted
the request, so an attempt that raised :class:`ProviderError` before yielding left nothing behind, and
the client sees one clean stream from whichever back end answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from ..protocol.builder import StreamBuilder
from ..protocol.request import RequestError, ResponseRequest
from .base import Provider, ProviderError

__all__ = ["RETRYABLE_STATUSES", "FallbackProvider"]

log = logging.getLogger("responses_gateway.fallback")

# Failures worth another try: rate limits, overload, upstream 5xx, and connect errors/timeouts
# (which the transport reports as 502/504).
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class FallbackProvider(Provider):
    """Runs ``chain[0]``, retrying and then falling back along ``chain`` on retryable early failures.

    ``retries`` is how many times each back end is tried again before the next one: one number for
    all, or one per chain member (a models file sets it per model).
    """

    def __init__(
        self,
        chain: Sequence[tuple[str, Provider]],
        *,
        retries: int | Sequence[int] = 2,
        backoff: float = 0.5,
        max_wait: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not chain:
            raise ValueError("a fallback chain needs at least one provider")
        self.chain = list(chain)
        if isinstance(retries, int):
            self.retries = [retries] * len(self.chain)
        else:
            self.retries = list(retries)
            if len(self.retries) != len(self.chain):
                raise ValueError("retries needs one number per chain member")
        self.backoff = backoff
        self.max_wait = max_wait
        self._sleep = sleep
        primary = self.chain[0][1]
        self.name = primary.name
        self.capabilities = primary.capabilities
        self.compacts = primary.compacts

    def check_request(self, request: ResponseRequest) -> None:
        self.chain[0][1].check_request(request)

    async def compact(self, request: ResponseRequest) -> dict[str, Any] | None:
        return await self.chain[0][1].compact(request)

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """Counted by the chain's first model (the one a request is sent to first)."""
        return await self.chain[0][1].count_input_tokens(request)

    def _usable(self, request: ResponseRequest) -> list[tuple[str, Provider, int]]:
        usable = [(*self.chain[0], self.retries[0])]
        for (name, provider), retries in zip(self.chain[1:], self.retries[1:], strict=True):
            try:
                provider.check_request(request)
            except (ProviderError, RequestError) as exc:
                log.info("fallback %s skipped for this request: %s", name, exc)
                continue
            usable.append((name, provider, retries))
        return usable

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        last: ProviderError | None = None
        for name, provider, retries in self._usable(request):
            for attempt in range(retries + 1):
                before = builder.sequence_number
                # Set before the attempt: a pushing back end sends the response head from inside it.
                builder.served_by = name
                gen = provider.stream(request, builder)
                try:
                    try:
                        await gen.__anext__()
                    except StopAsyncIteration:
                        return
                    except ProviderError as exc:
                        if exc.status not in RETRYABLE_STATUSES or builder.sequence_number != before:
                            raise
                        last = exc
                        builder.failed_attempts.append((name, exc.status, exc.code))
                        delay = exc.retry_after if exc.retry_after is not None else self.backoff * 2**attempt
                        log.warning(
                            "model %s failed before streaming (%s %s), attempt %d",
                            name,
                            exc.status,
                            exc.code,
                            attempt + 1,
                        )
                        if attempt == retries or delay > self.max_wait:
                            break  # next back end in the chain
                        await self._sleep(delay)
                        continue
                    if name != self.chain[0][0]:
                        log.info("model %s answered for %s (fallback)", name, self.chain[0][0])
                    yield
                    async for _ in gen:
                        yield
                    return
                finally:
                    # Providers are async generators; closing one makes it cancel its upstream call.
                    aclose = getattr(gen, "aclose", None)
                    if aclose is not None:
                        await aclose()
        assert last is not None
        raise last

    async def aclose(self) -> None:
        for _, provider in self.chain:
            await provider.aclose()
