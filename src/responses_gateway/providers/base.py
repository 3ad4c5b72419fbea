"""The provider contract: one small interface every back end implements.

A provider translates a :class:`ResponseRequest` for its back end and drives the
:class:`StreamBuilder`; it never assembles events itself.

The server calls ``builder.start()`` and then iterates ``provider.stream(request, builder)``. Each
``yield`` means "the builder has events ready": the server drains ``builder.take()`` and sends them.
Nothing reaches the client before the first ``yield``, so a provider that raises
:class:`ProviderError` before yielding produces a plain HTTP error (the right status, OpenAI's error
shape); one raised after that ends the stream with ``response.failed``. A provider calls no builder
method until its upstream has accepted the request (so a failed attempt leaves the builder untouched and
another provider can be tried: see ``providers.fallback``). A provider must finish the
builder (``complete``/``incomplete``/``fail``) before it returns. When the client goes away the server
closes the generator (``GeneratorExit`` at the pending ``yield``): the provider must stop its work.

Push (optional, for the hot path): when ``builder.push`` is set (the server does so for streamed
responses), a provider may call it instead of yielding, typically from its upstream's I/O callback
(``UpstreamResponse.pump``); each call counts as a yield (the first one starts the stream). It returns
None, or an awaitable to let finish before reading more (the client is slow). A provider that never
calls it needs no change: yields work as before, and the terminal events always go through a yield.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a back end can honour; the server rejects what it cannot (HTTP 400 naming the param)."""

    streaming: bool = True
    tools: bool = True
    parallel_tool_calls: bool = True
    reasoning: bool = False
    structured_output: bool = False
    images: bool = False
    tool_types: frozenset[str] = field(default_factory=lambda: frozenset({"function"}))
    # How it reads ``input_file`` parts (engine/input_files.py): "native" (as sent; file ids resolved),
    # "documents" (a PDF as data, other documents as their text), "media" (documents, plus images,
    # audio and video as data) or "text" (extracted text only).
    file_inputs: str = "text"


class ProviderError(Exception):
    """A failure with the status and OpenAI error code a client should see."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 500,
        code: str | None = "server_error",
        type: str = "server_error",
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.type = type
        self.param = param
        self.retry_after = retry_after


class Provider(ABC):
    """One back end. Subclasses declare ``name`` and ``capabilities``."""

    name: str = ""
    capabilities: Capabilities = Capabilities()
    # Reads compaction items another server made (its own): the OpenAI passthrough.
    compacts: bool = False

    def check_request(self, request: ResponseRequest) -> None:  # noqa: B027 - optional hook
        """Raise ProviderError(status=400, param=...) for anything this back end cannot honour."""

    @abstractmethod
    def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        """Drive ``builder`` for ``request``; yield whenever events are ready to send."""

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """The tokens the model would read for ``request`` (``POST /v1/responses/input_tokens``), from
        the back end's own tokenizer or counting endpoint. A back end with neither refuses (never a
        guess)."""
        raise ProviderError(
            f"Counting input tokens is not available for this model: its back end ({self.name}) offers "
            "no way to count them without generating.",
            status=400,
            code="unsupported_model",
            type="invalid_request_error",
            param="model",
        )

    async def compact(self, request: ResponseRequest) -> dict[str, Any] | None:
        """A back end that compacts conversations itself (``POST /v1/responses/compact``) returns the
        ``response.compaction`` object; the default None lets the gateway compact (engine/compaction.py).
        Compaction items this back end made are passed to it untouched."""
        return None

    def secrets(self) -> tuple[str, ...]:
        """The credentials this back end sends upstream. The model registry registers them with
        ``redaction.REDACTOR``, which scrubs them from every error, stored response and log line."""
        return ()

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections, models, threads."""


class Wrapper(Provider):
    """A provider in front of another (the engine's turns, server-side compaction): it drives
    ``inner`` its own way in ``stream``; everything else is ``inner``'s."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.compacts = inner.compacts

    def check_request(self, request: ResponseRequest) -> None:
        self.inner.check_request(request)

    def secrets(self) -> tuple[str, ...]:
        return self.inner.secrets()

    async def compact(self, request: ResponseRequest) -> dict[str, Any] | None:
        return await self.inner.compact(request)

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        return await self.inner.count_input_tokens(request)
