"""The gateway's own endpoints under ``/v1/gateway/`` (not part of OpenAI's API), used by the web UI.

==========================================  =====================================================
``POST /v1/gateway/check``                  run the stream checker (``protocol/checker.py``) over a
                                            list of events or raw SSE text; the violations name the
                                            index of the event they refer to
``GET /v1/gateway/responses``               the caller's stored responses, newest first: ``model``,
                                            ``status``, ``created_after``/``created_before`` (Unix
                                            seconds, inclusive), ``after``, ``limit``, ``order``
``GET /v1/gateway/conversations``           the caller's conversations (with their item counts):
                                            ``created_after``/``created_before``, ``after``,
                                            ``limit``, ``order``
``GET /v1/gateway/responses/{id}/events``   a stored response's events as stored, each with its
                                            arrival time (``at_ms`` since the response was created,
                                            null if not recorded): ``after`` (a sequence number),
                                            ``limit`` (1 to 1,000, default 1,000); ``has_more``
==========================================  =====================================================

Both read and write as the caller's owner (``owner_for``), like every other endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..protocol.checker import PROFILES, RULES, StreamChecker, Violation
from ..protocol.sse import EventStreamDecoder, SSEEventTooLarge, SSEPayloadError
from ..store import NotFound, Store
from ..store.history import STATUSES
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .query import ListQuery, invalid
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["MAX_CHECK_EVENTS", "MAX_EVENTS_PAGE", "GatewayAPI", "check_events"]

# The most events one check takes (the body limit bounds their size).
MAX_CHECK_EVENTS = 100_000

# The most stored events one page of ``/v1/gateway/responses/{id}/events`` returns.
MAX_EVENTS_PAGE = 1000

JSON = dict[str, Any]


def _violation(v: Violation, index: int | None) -> JSON:
    return {
        "rule": v.rule,
        "sequence_number": v.sequence_number,
        "index": index,
        "message": v.message,
        "meaning": RULES.get(v.rule, ((), ""))[1],
    }


def check_events(events: list[Any], profile: str = "openai") -> JSON:
    """The checker's verdict on ``events``; each violation with the index of the event it names.

    A violation found while an event is fed names that event, unless its sequence number is another
    event's seen so far (``error.not_failed`` names the earlier ``error``); one found at the end
    (a missing terminal event, items never done) names no event (``index: null``).
    """
    checker = StreamChecker(profile)
    by_seq: dict[int, int] = {}
    out: list[JSON] = []
    for index, event in enumerate(events):
        seq = event.get("sequence_number") if isinstance(event, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            by_seq.setdefault(seq, index)
        for v in checker.feed(event):
            own = seq == v.sequence_number or v.sequence_number not in by_seq
            out.append(_violation(v, index if own else by_seq[v.sequence_number]))
    for v in checker.finish():
        out.append(_violation(v, None))
    return {
        "object": "gateway.check",
        "profile": profile,
        "events": len(events),
        "ok": not out,
        "violations": out,
    }


def _events_from_body(body: Any) -> tuple[list[Any], str]:
    if not isinstance(body, dict):
        raise HTTPError(400, "The body must be a JSON object with 'events' or 'sse'.")
    profile = body.get("profile", "openai")
    if profile not in PROFILES:
        allowed = ", ".join(f"'{p}'" for p in PROFILES)
        raise invalid(
            f"Invalid value: '{str(profile)[:40]}'. Supported values are: {allowed}.",
            "profile",
            "invalid_value",
        )
    has_events, has_sse = "events" in body, "sse" in body
    if has_events == has_sse:
        raise HTTPError(
            400,
            "Send exactly one of 'events' (a list of event objects) or 'sse' (text).",
            param="events",
            code="missing_required_parameter",
        )
    if has_events:
        events = body["events"]
        if not isinstance(events, list):
            raise invalid("Invalid type for 'events': expected an array.", "events", "invalid_type")
    else:
        text = body["sse"]
        if not isinstance(text, str):
            raise invalid("Invalid type for 'sse': expected a string.", "sse", "invalid_type")
        decoder = EventStreamDecoder()
        try:
            events = decoder.feed(text.encode()) + decoder.flush()
        except (SSEPayloadError, SSEEventTooLarge) as exc:
            raise invalid(f"Invalid 'sse': {exc}", "sse", "invalid_value") from None
    if len(events) > MAX_CHECK_EVENTS:
        raise invalid(
            f"Too many events: the limit is {MAX_CHECK_EVENTS}.", "events", "array_above_max_length"
        )
    return events, str(profile)


class GatewayAPI:
    """``/v1/gateway/…`` over the app's store and owner rules."""

    def __init__(
        self,
        store: Callable[[], Store | None],
        owner_for: Callable[[Scope], str],
        read_body: Callable[[Scope, Receive], Awaitable[bytes]],
    ) -> None:
        self._get_store = store
        self._owner_for = owner_for
        self._read_body = read_body

    def register(self, router: Router) -> None:
        router.add("/v1/gateway/check", POST=self._check)
        router.add("/v1/gateway/responses", GET=self._list)
        router.add("/v1/gateway/conversations", GET=self._conversations)
        router.add("/v1/gateway/responses/{rid}/events", GET=self._events)

    async def _check(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._owner_for(scope)
        events, profile = _events_from_body(parse_json_body(await self._read_body(scope, receive)))
        await send_json(send, 200, orjson.dumps(check_events(events, profile)))

    def _store(self) -> Store:
        store = self._get_store()
        if store is None:
            raise HTTPError(
                404,
                "This gateway keeps no responses (it runs without a store: serve --store none).",
                code="not_found",
            )
        return store

    async def _conversations(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = self._owner_for(scope)
        store = self._store()
        query = ListQuery(scope)
        try:
            result = await store.history.list_conversations(
                owner,
                created_after=_timestamp(query, "created_after"),
                created_before=_timestamp(query, "created_before"),
                after=query.after(),
                limit=query.limit(),
                order=query.order(),
            )
        except NotFound as exc:
            raise HTTPError(404, str(exc), param="after", code="not_found") from None
        await send_json(send, 200, orjson.dumps(result))

    async def _events(self, scope: Scope, receive: Receive, send: Send, rid: str) -> None:
        owner = self._owner_for(scope)
        store = self._store()
        query = ListQuery(scope)
        text = query.last("after")
        after = -1
        if text:
            if not text.isascii() or not text.isdigit() or len(text) > 12:
                raise invalid(
                    f"Invalid type for 'after': expected a sequence number (an integer), but got "
                    f"'{text[:40]}' instead.",
                    "after",
                    "invalid_type",
                )
            after = int(text)
        limit = query.limit(default=MAX_EVENTS_PAGE, maximum=MAX_EVENTS_PAGE)
        try:
            timed, more = await store.timed_events(owner, rid, after=after, limit=limit)
        except NotFound as exc:
            raise HTTPError(404, str(exc), code="not_found") from None
        data = [{"sequence_number": t.sequence_number, "at_ms": t.at_ms, "event": t.event} for t in timed]
        await send_json(send, 200, orjson.dumps({"object": "list", "data": data, "has_more": more}))

    async def _list(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = self._owner_for(scope)
        store = self._store()
        query = ListQuery(scope)
        status = query.last("status") or None
        if status is not None and status not in STATUSES:
            allowed = ", ".join(f"'{s}'" for s in STATUSES)
            raise invalid(
                f"Invalid value: '{status[:40]}'. Supported values are: {allowed}.", "status", "invalid_value"
            )
        try:
            result = await store.history.list_responses(
                owner,
                model=query.last("model") or None,
                status=status,
                created_after=_timestamp(query, "created_after"),
                created_before=_timestamp(query, "created_before"),
                after=query.after(),
                limit=query.limit(),
                order=query.order(),
            )
        except NotFound as exc:
            raise HTTPError(404, str(exc), param="after", code="not_found") from None
        await send_json(send, 200, orjson.dumps(result))


def _timestamp(query: ListQuery, name: str) -> int | None:
    text = query.last(name)
    if text is None or text == "":
        return None
    if not text.isascii() or not text.lstrip("-").isdigit() or len(text) > 12:
        raise invalid(
            f"Invalid type for '{name}': expected Unix seconds (an integer), but got '{text[:40]}' instead.",
            name,
            "invalid_type",
        )
    return int(text)
