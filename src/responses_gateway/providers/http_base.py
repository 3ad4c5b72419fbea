"""The HTTP glue every upstream-API back end shares: :class:`HTTPProvider`.

A back end that talks to a vendor's HTTP API (openai-chat, anthropic, gemini, the Responses
passthrough) keeps only its translation: the request body (``build_body``), the endpoint and headers,
and a translator that turns the upstream's events into :class:`StreamBuilder` calls. Everything between
is here, written once:

- the POST through the shared :class:`Transport` (one per provider when none is given, closed with it);
- an HTTP error status becomes a :class:`ProviderError` (:func:`upstream_errors.from_http`) before any
  event exists, so the client gets a plain HTTP error and a fallback can act on it;
- the reply is read as SSE, or as one JSON body when the server ignored ``stream: true``;
- SSE is read by push (``UpstreamResponse.pump``: decoded, translated and sent from the upstream
  socket's I/O callback, no task hop per read) when the provider opts in (``push_relay``) and the server
  set ``builder.push``; else by iterating the body and yielding after each read that made events;
- a failure while reading ends the response (``translator.fail``); an error that was the stream's first
  payload is raised instead (nothing was sent: still an HTTP error); the upstream is always closed;
- follow-up requests of one response (Anthropic's ``pause_turn`` continuations: :meth:`follow_up`).

The translator is read through plain attributes after each upstream read (:class:`StreamTranslator`),
never through a call: the per-read work is the provider's ``dispatch`` per SSE message and three
attribute tests, as when each provider had its own copy of this loop.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ..protocol.builder import StreamBuilder
from ..protocol.request import JSON, ResponseRequest
from ..protocol.sse import SSEMessage
from ..redaction import credentials
from .base import Provider, ProviderError
from .transport import StopPumping, Timeouts, Transport, UpstreamResponse
from .upstream_errors import from_http, redact_url

__all__ = ["HTTPProvider", "StreamTranslator", "replied_json"]


class StreamTranslator(Protocol):
    """What :class:`HTTPProvider` needs of a provider's translator (upstream events in, builder calls out).

    The three attributes are read after every upstream read, in this order: ``error`` (set: stop
    reading at once, send nothing more from here), ``dirty`` (builder calls since the last send: send
    them, then the glue sets it False), ``done`` (the upstream's last event arrived: stop reading, whether
    or not the upstream closes the connection).
    """

    dirty: bool
    done: bool
    error: ProviderError | None

    def fail(self, exc: ProviderError) -> None:
        """End the response with ``exc`` (a failure after the upstream accepted the request); may raise
        ``exc`` instead when nothing has been sent yet and it should stay an HTTP error."""
        ...

    def finish(self) -> None:
        """The upstream is done: close what is open and emit the terminal event."""
        ...


T = TypeVar("T", bound=StreamTranslator)


def replied_json(resp: UpstreamResponse) -> bool:
    """Whether the upstream answered with one JSON body instead of an event stream (a server or proxy
    that ignored ``stream: true``)."""
    return "json" in resp.headers.get("content-type", "")


class HTTPProvider(Provider, Generic[T]):
    """A back end behind an HTTP API: the POST, error mapping, SSE-or-JSON, push or yield, closing.

    Subclasses provide :meth:`endpoint`, :meth:`headers`, :meth:`build_body`, :meth:`translator`,
    :meth:`replay` (a whole JSON reply) and :meth:`dispatcher` (one SSE message); ``push_relay`` says
    whether the SSE path may run from the socket's callback (``builder.push``).
    """

    # Read the stream by push when the server offers it (see base.py); else yield after each read.
    push_relay: ClassVar[bool] = False

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        upstream_model: str | None,
        transport: Transport | None,
        timeouts: Timeouts | None,
        extra_headers: dict[str, str] | None,
        upstream_name: str,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.upstream_model = upstream_model
        self._transport = transport or Transport()
        self._owns_transport = transport is None
        self._timeouts = timeouts
        self._extra_headers = dict(extra_headers or {})
        # How error messages name the upstream ("Anthropic failed (HTTP 500): ...").
        self._upstream_name = upstream_name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_url(self.base_url)} model={self.upstream_model!r}>"

    # ------------------------------------------------------------------ what a provider supplies
    @abstractmethod
    def endpoint(self, request: ResponseRequest) -> str:
        """The URL ``request`` is posted to."""

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """Request headers (the key among them: never log this)."""

    @abstractmethod
    def build_body(self, request: ResponseRequest) -> JSON:
        """The upstream request body."""

    @abstractmethod
    def translator(self, request: ResponseRequest, builder: StreamBuilder) -> T:
        """A fresh translator for one response (made once the upstream accepted the request)."""

    @abstractmethod
    def replay(self, turn: T, body: Any) -> None:
        """Drive ``turn`` from a whole JSON reply (``body`` as parsed; None if it was not JSON)."""

    @abstractmethod
    def dispatcher(self) -> Callable[[T, SSEMessage], None]:
        """The function applying one SSE message to a translator (called per event: keep it a plain
        function, not a bound method or a wrapper)."""

    def fast_path(self, turn: T) -> Callable[[bytes, bytes], bool] | None:
        """The translator's fast path for one whole upstream event, if it has one: called with the
        event's name and raw data (``SSEDecoder.single``), True when it applied the event, False (with
        nothing changed) when the decoder and :meth:`dispatcher` must take it."""
        return None

    def after_push(self, turn: T) -> Callable[[], None] | None:
        """What the translator does once a read's events have been handed to the client, if it has
        such work: called after each read (and its push, when it made events), before the next read.
        Work that changes no event goes there rather than before the client's write (the passthrough's
        upstream checker, whose verdict is only logged)."""
        return None

    async def follow_up(self, turn: T, body: JSON) -> tuple[UpstreamResponse, JSON] | None:
        """After a reply was read: the next request of the same response and its (accepted) answer, or
        None when the response is complete (the default). A ProviderError raised here ends the response
        through ``turn.fail``."""
        return None

    async def count_with(self, url: str, body: JSON, field: str) -> int:
        """POST ``body`` to an upstream counting endpoint; the integer its JSON answer has in ``field``."""
        resp = await self.open(url, body)
        try:
            answer = await resp.json()
        finally:
            await resp.aclose()
        value = answer.get(field) if isinstance(answer, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProviderError(
                f"{self._upstream_name}'s token count answer has no integer '{field}'.",
                status=502,
                code="server_error",
            )
        return value

    # ------------------------------------------------------------------ the glue
    async def open(self, url: str, body: JSON) -> UpstreamResponse:
        """POST ``body``; an HTTP error status is raised as the ProviderError a client should see."""
        resp = await self._transport.post(url, self.headers(), body, timeouts=self._timeouts)
        if resp.status >= 400:
            raw = await resp.read(self._transport.max_error_bytes)
            raise from_http(
                resp.status, resp.headers, raw, upstream=self._upstream_name, secrets=self.secrets()
            )
        return resp

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        body = self.build_body(request)
        resp = await self.open(self.endpoint(request), body)
        turn = self.translator(request, builder)
        dispatch = self.dispatcher()
        push = builder.push if self.push_relay else None
        # One decoder for every reply of this response (``flush`` readies it for the next one).
        decoder = self._transport.sse_decoder()
        feed = decoder.feed
        single = decoder.single
        fast = self.fast_path(turn)
        after = self.after_push(turn)
        start = builder.sequence_number
        while True:
            try:
                if replied_json(resp):
                    self.replay(turn, await resp.json())
                else:
                    if push is not None:
                        # The server sends as we go: each upstream read is translated and sent from
                        # the socket's callback, with no task hop per event.
                        def on_chunk(raw_chunk: bytes) -> Awaitable[None] | None:
                            if fast is None or (one := single(raw_chunk)) is None or not fast(*one):
                                for msg in feed(raw_chunk):
                                    dispatch(turn, msg)
                            if turn.error is not None:
                                raise StopPumping
                            wait = None
                            if turn.dirty:
                                turn.dirty = False
                                wait = push()
                            if after is not None:
                                after()
                            if turn.done:
                                raise StopPumping
                            return wait

                        await resp.pump(on_chunk)
                    else:
                        async for raw_chunk in resp.iter_chunks():
                            if fast is None or (one := single(raw_chunk)) is None or not fast(*one):
                                for msg in feed(raw_chunk):
                                    dispatch(turn, msg)
                            if turn.error is not None:
                                break
                            if turn.dirty:
                                turn.dirty = False
                                yield
                            if after is not None:
                                after()
                            if turn.done:
                                break
                    for msg in decoder.flush():
                        dispatch(turn, msg)
            except ProviderError as exc:
                turn.fail(exc)
                yield
                return
            finally:
                await resp.aclose()
            try:
                following = await self.follow_up(turn, body)
            except ProviderError as exc:
                turn.fail(exc)
                yield
                return
            if following is None:
                break
            resp, body = following
        if turn.error is not None and builder.sequence_number == start:
            # The stream's first payload was an error: nothing has been sent, so it is still an HTTP
            # error, which a fallback can act on (as for Anthropic's overloaded_error over HTTP 200).
            raise turn.error
        turn.finish()
        yield

    def secrets(self) -> tuple[str, ...]:
        """The API key and credential headers this provider sends (see redaction.py)."""
        return credentials(self._api_key, self._extra_headers)

    async def aclose(self) -> None:
        if self._owns_transport:
            await self._transport.aclose()
