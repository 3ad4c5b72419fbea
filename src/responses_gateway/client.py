"""A client for any Responses server (this gateway, OpenAI, another gateway), sync and async.

Streams are read the tolerant way, through the protocol core: the SSE decoder, the
:class:`~responses_gateway.protocol.accumulator.Accumulator` (OpenAI's spelling and the legacy and
Open Responses dialects: ``response.function_call.arguments.delta``, ``response.text.done``,
``response.code_interpreter.*``, ``response.output_text_annotation.added``…) and the
:class:`~responses_gateway.protocol.checker.StreamChecker`, whose findings are reported, never raised::

    from responses_gateway.client import ResponsesClient

    with ResponsesClient("http://127.0.0.1:8080/v1", api_key="sk-…") as client:
        with client.stream(model="gpt-4o-mini", input="Hello") as stream:
            for step in stream:                 # one step per event
                if step.event["type"] == "response.output_text.delta":
                    print(step.event["delta"], end="")
            print(stream.response["status"], stream.violations)

Each :class:`StreamStep` carries the event, the checker's new violations and the Response
accumulated so far (``step.response``, built when read). If the connection drops before the
terminal event, the stream resumes with ``GET /responses/{id}?stream=true&starting_after=N`` where
the server keeps the response (``store`` not false) and supports it; events already seen are
skipped. A server that cannot resume ends the stream, and the Response reads ``incomplete``.
:class:`AsyncResponsesClient` is the same over asyncio. Errors the server answers with an HTTP
status raise :class:`ResponsesAPIError` (OpenAI's error fields). See docs/client.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import httpx
import orjson

from .protocol.accumulator import Accumulator
from .protocol.checker import Profile, StreamChecker, Violation
from .protocol.sse import SSEDecoder, SSEMessage, SSEPayloadError, decode_event

__all__ = [
    "AsyncResponseStream",
    "AsyncResponsesClient",
    "ResponseStream",
    "ResponsesAPIError",
    "ResponsesClient",
    "StreamStep",
    "output_text",
]

JSON = dict[str, Any]
DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
# Reconnections one stream may make after its connection dropped.
DEFAULT_MAX_RESUMES = 3
# The largest single event a stream may carry (a partial image is a few MB; the gateway's own upstream
# limit is of the same order).
MAX_EVENT_BYTES = 64 * 1024 * 1024


class ResponsesAPIError(Exception):
    """An HTTP error from the server: ``status`` and OpenAI's ``message``, ``type``, ``param``, ``code``."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        self.status = status
        self.message = str(error.get("message") or body or f"HTTP {status}")
        self.type = error.get("type")
        self.param = error.get("param")
        self.code = error.get("code")
        self.body = body
        super().__init__(f"{status} {self.code or self.type or 'error'}: {self.message}")


def output_text(response: JSON) -> str:
    """The text of a Response's output messages, joined (like the openai SDK's ``output_text``)."""
    parts: list[str] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    parts.append(str(part.get("text", "")))
    return "".join(parts)


class StreamStep:
    """One event of a stream, with what the checker found in it and the Response so far."""

    __slots__ = ("_accumulator", "_response", "event", "violations")

    def __init__(self, event: JSON, violations: list[Violation], accumulator: Accumulator) -> None:
        self.event = event
        self.violations = violations
        self._accumulator = accumulator
        self._response: JSON | None = None

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))

    @property
    def response(self) -> JSON:
        """The Response accumulated up to this event (built on first read: read it during the step)."""
        if self._response is None:
            self._response = self._accumulator.response
        return self._response

    def __repr__(self) -> str:
        return f"StreamStep({self.type!r}, violations={len(self.violations)})"


def _decoder() -> SSEDecoder:
    """The SSE decoder of one connection: one event may take at most :data:`MAX_EVENT_BYTES`
    (past it, ``SSEEventTooLarge``), so a broken server cannot take the client's memory."""
    return SSEDecoder(comments=True, max_event_bytes=MAX_EVENT_BYTES)


class _StreamState:
    """The sans-IO part of a stream, shared by the sync and async readers: bytes in, steps out."""

    def __init__(self, profile: Profile | str | None, max_resumes: int) -> None:
        self.accumulator = Accumulator()
        self.checker = StreamChecker(profile) if profile is not None else None
        self.violations: list[Violation] = []
        self.events: list[JSON] = []
        self.last_sequence = -1
        # After a resume: events up to this sequence number arrived before the drop (skipped).
        self.resumed_after = -1
        self.resumes = 0
        self.max_resumes = max_resumes
        self.decoder = _decoder()
        self.ended = False
        self.resume_error: str | None = None

    def feed(self, chunk: bytes) -> list[StreamStep]:
        return self._steps(self.decoder.feed(chunk))

    def flush(self) -> list[StreamStep]:
        steps = self._steps(self.decoder.flush())
        self.decoder = _decoder()
        return steps

    def _steps(self, messages: list[SSEMessage]) -> list[StreamStep]:
        out: list[StreamStep] = []
        for message in messages:
            try:
                event = decode_event(message)  # None: a comment (keepalive), [DONE], an empty ping
            except SSEPayloadError as exc:
                # Not JSON: reported like a checker finding, and the stream goes on.
                self.violations.append(Violation("sse.payload", self.last_sequence + 1, str(exc)))
                continue
            if event is None:
                continue
            seq = event.get("sequence_number")
            if isinstance(seq, int) and not isinstance(seq, bool):
                if seq <= self.resumed_after:
                    continue  # seen before the connection dropped
                self.resumed_after = -1
                self.last_sequence = seq
            self.events.append(event)
            # The accumulator builds its items from the events' objects: it gets its own copy, so the
            # events handed out stay as they arrived.
            self.accumulator.feed(orjson.loads(orjson.dumps(event)))
            new = self.checker.feed(event) if self.checker is not None else []
            self.violations += new
            out.append(StreamStep(event, new, self.accumulator))
        return out

    @property
    def response_id(self) -> str | None:
        snapshot = self.accumulator.snapshot
        rid = snapshot.get("id") if snapshot is not None else None
        return rid if isinstance(rid, str) else None

    def can_resume(self) -> bool:
        """Whether a dropped stream should be resumed: unfinished, known id, stored, tries left."""
        if self.accumulator.finished or self.resumes >= self.max_resumes or self.response_id is None:
            return False
        snapshot = self.accumulator.snapshot or {}
        return snapshot.get("store") is not False

    def resume_path(self) -> tuple[str, dict[str, str]]:
        self.resumes += 1
        self.resumed_after = self.last_sequence
        return (
            f"/responses/{self.response_id}",
            {"stream": "true", "starting_after": str(self.last_sequence)},
        )

    def finish(self) -> list[Violation]:
        if self.ended:
            return []
        self.ended = True
        self.accumulator.end()
        new = self.checker.finish() if self.checker is not None else []
        self.violations += new
        return new


class _StreamView:
    """What sync and async streams show of their state."""

    _state: _StreamState

    @property
    def response(self) -> JSON:
        """The Response accumulated so far (the final one once the stream ended)."""
        return self._state.accumulator.response

    @property
    def accumulator(self) -> Accumulator:
        return self._state.accumulator

    @property
    def events(self) -> list[JSON]:
        """Every event received (after a resume, without the repeated ones)."""
        return self._state.events

    @property
    def violations(self) -> list[Violation]:
        """What the checker found so far (also on each step); never raised."""
        return self._state.violations

    @property
    def resumes(self) -> int:
        """How many times the stream was resumed after its connection dropped."""
        return self._state.resumes

    @property
    def resume_error(self) -> str | None:
        """Why a dropped stream could not be resumed (None: it was not needed, or it worked)."""
        return self._state.resume_error

    @property
    def finished(self) -> bool:
        """Whether the terminal event arrived."""
        return self._state.accumulator.finished


def _error_from(response: httpx.Response, body: bytes) -> ResponsesAPIError:
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = body.decode("utf-8", "replace")[:500]
    return ResponsesAPIError(response.status_code, parsed)


def _headers(api_key: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    headers = {"accept": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    headers.update(extra or {})
    return headers


# ------------------------------------------------------------------------------------------------ sync
class ResponseStream(_StreamView):
    """A streamed Response: iterate for :class:`StreamStep` s; use as a context manager to close it."""

    def __init__(
        self, client: ResponsesClient, request: httpx.Request, profile: Profile | str | None, max_resumes: int
    ) -> None:
        self._client = client
        self._request: httpx.Request | None = request
        self._state = _StreamState(profile, max_resumes)
        self._open: httpx.Response | None = None

    def __iter__(self) -> Iterator[StreamStep]:
        state = self._state
        while self._request is not None:
            request, self._request = self._request, None
            try:
                self._open = response = self._client.http.send(request, stream=True)
                if response.status_code >= 400:
                    body = response.read()
                    if state.resumes:  # the server cannot resume: the stream ends here
                        state.resume_error = str(_error_from(response, body))
                        break
                    raise _error_from(response, body)
                for chunk in response.iter_bytes():
                    yield from state.feed(chunk)
                yield from state.flush()
            except httpx.TransportError as exc:
                yield from state.flush()
                if not state.events:
                    raise  # nothing arrived: a plain connection error
                if not state.can_resume():
                    state.resume_error = f"the stream dropped ({type(exc).__name__}) and cannot be resumed"
                    break
            finally:
                self._close_response()
            if not state.accumulator.finished and state.can_resume():
                path, params = state.resume_path()
                self._request = self._client.http.build_request("GET", path, params=params)
        state.finish()

    def until_done(self) -> JSON:
        """Read the rest of the stream; the final Response."""
        for _ in self:
            pass
        return self.response

    def _close_response(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def close(self) -> None:
        self._request = None
        self._close_response()

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ResponsesClient:
    """Synchronous client: ``create`` (one JSON Response), ``stream`` (steps), ``retrieve``, ``resume``…

    ``base_url`` ends with ``/v1`` (as the openai SDK's). ``profile`` is the checker profile the
    streams are checked against (``openai``, ``strict-spec``, ``codex``; None: not checked).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        headers: dict[str, str] | None = None,
        profile: Profile | str | None = "openai",
        max_resumes: int = DEFAULT_MAX_RESUMES,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.profile = profile
        self.max_resumes = max_resumes
        self.http = http or httpx.Client(
            base_url=self.base_url, headers=_headers(api_key, headers), timeout=timeout
        )

    def _json(self, method: str, path: str, body: JSON | None = None, params: Any = None) -> Any:
        response = self.http.request(method, path, json=body, params=params)
        if response.status_code >= 400:
            raise _error_from(response, response.content)
        return response.json()

    def create(self, **body: Any) -> JSON:
        """``POST /responses`` without streaming: the Response."""
        body.pop("stream", None)
        result: JSON = self._json("POST", "/responses", body)
        return result

    def stream(self, **body: Any) -> ResponseStream:
        """``POST /responses`` with ``stream: true``: a :class:`ResponseStream` (nothing is sent until
        it is iterated)."""
        request = self.http.build_request("POST", "/responses", json={**body, "stream": True})
        return ResponseStream(self, request, self.profile, self.max_resumes)

    def resume(self, response_id: str, starting_after: int = -1) -> ResponseStream:
        """A stored response's events from ``starting_after`` + 1, then live until it ends."""
        params = {"stream": "true", "starting_after": str(starting_after)}
        request = self.http.build_request("GET", f"/responses/{response_id}", params=params)
        return ResponseStream(self, request, None if starting_after >= 0 else self.profile, self.max_resumes)

    def retrieve(self, response_id: str) -> JSON:
        result: JSON = self._json("GET", f"/responses/{response_id}")
        return result

    def delete(self, response_id: str) -> JSON:
        result: JSON = self._json("DELETE", f"/responses/{response_id}")
        return result

    def cancel(self, response_id: str) -> JSON:
        result: JSON = self._json("POST", f"/responses/{response_id}/cancel")
        return result

    def models(self) -> list[JSON]:
        """``GET /models``: the model objects the server lists."""
        data = self._json("GET", "/models").get("data") or []
        return [m for m in data if isinstance(m, dict)]

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ResponsesClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------- async
class AsyncResponseStream(_StreamView):
    """A streamed Response over asyncio: ``async for step in stream``; ``async with`` closes it."""

    def __init__(
        self,
        client: AsyncResponsesClient,
        request: httpx.Request,
        profile: Profile | str | None,
        max_resumes: int,
    ) -> None:
        self._client = client
        self._request: httpx.Request | None = request
        self._state = _StreamState(profile, max_resumes)
        self._open: httpx.Response | None = None

    async def __aiter__(self) -> AsyncIterator[StreamStep]:
        state = self._state
        while self._request is not None:
            request, self._request = self._request, None
            try:
                self._open = response = await self._client.http.send(request, stream=True)
                if response.status_code >= 400:
                    body = await response.aread()
                    if state.resumes:
                        state.resume_error = str(_error_from(response, body))
                        break
                    raise _error_from(response, body)
                async for chunk in response.aiter_bytes():
                    for step in state.feed(chunk):
                        yield step
                for step in state.flush():
                    yield step
            except httpx.TransportError as exc:
                for step in state.flush():
                    yield step
                if not state.events:
                    raise  # nothing arrived: a plain connection error
                if not state.can_resume():
                    state.resume_error = f"the stream dropped ({type(exc).__name__}) and cannot be resumed"
                    break
            finally:
                await self._close_response()
            if not state.accumulator.finished and state.can_resume():
                path, params = state.resume_path()
                self._request = self._client.http.build_request("GET", path, params=params)
        state.finish()

    async def until_done(self) -> JSON:
        """Read the rest of the stream; the final Response."""
        async for _ in self:
            pass
        return self.response

    async def _close_response(self) -> None:
        if self._open is not None:
            await self._open.aclose()
            self._open = None

    async def aclose(self) -> None:
        self._request = None
        await self._close_response()

    async def __aenter__(self) -> AsyncResponseStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncResponsesClient:
    """The asyncio twin of :class:`ResponsesClient` (same methods, awaited)."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        headers: dict[str, str] | None = None,
        profile: Profile | str | None = "openai",
        max_resumes: int = DEFAULT_MAX_RESUMES,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.profile = profile
        self.max_resumes = max_resumes
        self.http = http or httpx.AsyncClient(
            base_url=self.base_url, headers=_headers(api_key, headers), timeout=timeout
        )

    async def _json(self, method: str, path: str, body: JSON | None = None) -> Any:
        response = await self.http.request(method, path, json=body)
        if response.status_code >= 400:
            raise _error_from(response, response.content)
        return response.json()

    async def create(self, **body: Any) -> JSON:
        body.pop("stream", None)
        result: JSON = await self._json("POST", "/responses", body)
        return result

    def stream(self, **body: Any) -> AsyncResponseStream:
        request = self.http.build_request("POST", "/responses", json={**body, "stream": True})
        return AsyncResponseStream(self, request, self.profile, self.max_resumes)

    def resume(self, response_id: str, starting_after: int = -1) -> AsyncResponseStream:
        params = {"stream": "true", "starting_after": str(starting_after)}
        request = self.http.build_request("GET", f"/responses/{response_id}", params=params)
        return AsyncResponseStream(
            self, request, None if starting_after >= 0 else self.profile, self.max_resumes
        )

    async def retrieve(self, response_id: str) -> JSON:
        result: JSON = await self._json("GET", f"/responses/{response_id}")
        return result

    async def delete(self, response_id: str) -> JSON:
        result: JSON = await self._json("DELETE", f"/responses/{response_id}")
        return result

    async def cancel(self, response_id: str) -> JSON:
        result: JSON = await self._json("POST", f"/responses/{response_id}/cancel")
        return result

    async def models(self) -> list[JSON]:
        data = (await self._json("GET", "/models")).get("data") or []
        return [m for m in data if isinstance(m, dict)]

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncResponsesClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
