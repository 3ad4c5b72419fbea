"""The store: one facade over its parts, one implementation over both databases.

Every public read or write takes ``owner`` and filters by it, so another owner's objects are simply
not found. Writes that belong together are one transaction: a response's terminal event, final
status, output items and conversation append commit together or not at all.

:class:`Store` composes one part per aggregate and keeps the life cycle (start, heartbeat
housekeeping, retention, close):

- ``store.lease`` (store/lease.py): this instance's lease, heartbeat and crash recovery;
- ``store.responses`` (store/responses.py): responses, their input items, cancel, the input a turn is
  given;
- ``store.conversations`` (store/conversations.py): conversations and their items;
- ``store.files`` (store/files.py) and ``store.containers`` (store/containers.py): uploaded files'
  metadata; containers shared by instances (records, files);
- ``store.tool_results`` (store/tool_results.py): what each hosted call told the model;
- ``store.events`` (store/events.py): the event writer behind :class:`EventRecorder`, the reader
  behind :meth:`Store.stream_events`, compaction.

Shared helpers (statuses, JSON, ids, list pages) are in store/rows.py. A new resource (files, vector
stores, …) is one more sibling module and one more part here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from ..protocol.response import new_id
from .containers import Containers
from .conversations import Conversations
from .db import Database
from .events import DEFAULT_MAX_RESPONSE_BYTES, EventRecorder, Events, TimedEvent, Times
from .files import Files
from .history import History
from .lease import Lease
from .live import LiveLog, LocalLiveLog
from .references import resolve_item_references
from .responses import CancelSignals, Responses
from .rows import JSON, RUNNING, TERMINAL, TERMINAL_EVENTS
from .schema import migrate
from .tool_results import ToolResults

__all__ = ["RUNNING", "TERMINAL", "TERMINAL_EVENTS", "EventRecorder", "Store"]


class Store:
    """The gateway's persistence; build one with :func:`responses_gateway.store.open_store`."""

    def __init__(
        self,
        db: Database,
        live: LiveLog | None = None,
        *,
        instance_id: str | None = None,
        lease_seconds: float = 15.0,
        flush_interval: float = 0.05,
        flush_events: int = 256,
        poll_interval: float = 0.5,
        retention: float | None = None,
        expiry_interval: float = 60.0,
        max_response_bytes: int | None = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if retention is not None and retention <= 0:
            raise ValueError("retention must be positive (None keeps responses for ever)")
        self.db = db
        # Finished responses older than this many seconds are deleted (None: kept for ever).
        self.retention = retention
        self.expiry_interval = expiry_interval
        self._next_expiry = 0.0
        self.live = live or LocalLiveLog()
        # Background work (compactions, discards), finished before close() closes the database.
        self._background: set[asyncio.Task[None]] = set()
        self.cancels = CancelSignals()
        self.events = Events(
            db,
            self.live,
            self.cancels,
            background=self._background,
            flush_interval=flush_interval,
            flush_events=flush_events,
            poll_interval=poll_interval,
            max_response_bytes=max_response_bytes,
        )
        self.lease = Lease(
            db,
            self.live,
            instance_id=instance_id or new_id("inst"),
            lease_seconds=lease_seconds,
            on_cancel=self.cancels.signal,
        )
        self.responses = Responses(
            db, self.live, self.cancels, instance_id=self.lease.instance_id, background=self._background
        )
        self.conversations = Conversations(db)
        self.files = Files(db)
        self.containers = Containers(db, self.lease.instance_id)
        self.tool_results = ToolResults(db)
        self.history = History(db)

    # ------------------------------------------------------------------------------ settings
    @property
    def instance_id(self) -> str:
        return self.lease.instance_id

    @property
    def lease_seconds(self) -> float:
        return self.lease.lease_seconds

    @property
    def flush_interval(self) -> float:
        return self.events.flush_interval

    @property
    def flush_events(self) -> int:
        return self.events.flush_events

    @property
    def poll_interval(self) -> float:
        return self.events.poll_interval

    @property
    def max_response_bytes(self) -> int | None:
        return self.events.max_response_bytes

    # ------------------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        """Migrate, register this instance, fail what dead instances left running, start heartbeating."""
        await self.db.open()
        await migrate(self.db)
        await self.live.open(self.cancels.signal)
        await self.lease.register()
        await self.recover()
        self.lease.start_heartbeat(self._after_heartbeat)

    async def close(self) -> None:
        """Stop heartbeating and deregister; responses still running here are left for recovery."""
        await self.events.close()
        await self.lease.stop_heartbeat()
        # The lease expires (the row stays), so the next sweep fails what we ran.
        with contextlib.suppress(Exception):
            await self.lease.release()
        with contextlib.suppress(Exception):
            await self.retry_ends()
        if self._background:
            # Compactions and discards in flight finish (each is one short transaction).
            await asyncio.wait(set(self._background), timeout=10)
        await self.live.close()
        await self.db.close()

    async def _after_heartbeat(self) -> None:
        await self.retry_ends()
        if self.retention is not None and time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + self.expiry_interval
            await self.expire()

    async def heartbeat(self) -> None:
        """Renew this instance's lease, pick up cancel requests, fail dead instances' responses."""
        await self.lease.heartbeat()

    async def recover(self) -> list[str]:
        """Fail responses left running by dead instances; the ids failed."""
        return await self.lease.recover()

    def retry_end_later(
        self, response_id: str, events: list[JSON], final: JSON | None, times: Times | None = None
    ) -> None:
        """Keep the end of a response the database would not take (see :meth:`retry_ends`)."""
        self.events.retry_end_later(response_id, events, final, times)

    async def retry_ends(self) -> int:
        """Write the ends the database refused earlier (called by the heartbeat and at close); the
        number written. Until then such a response reads ``in_progress``; never for good."""
        return await self.events.retry_ends()

    async def expire(self, *, now: float | None = None, batch: int = 500) -> int:
        """Delete finished responses created more than ``retention`` seconds ago, with their items and
        events, a batch per transaction; the number deleted. Running ones are never touched, and
        conversations keep their own copies of their items. A later ``previous_response_id`` naming
        an expired response gets the same 404 as an unknown one, as OpenAI's expiry does."""
        if self.retention is None:
            return 0
        return await self.responses.expire(self.retention, now=now, batch=batch)

    # ------------------------------------------------------------------------------ cancellation
    def cancel_event(self, response_id: str) -> asyncio.Event:
        """Set when a cancel for ``response_id`` arrives (from any instance); the worker watches it."""
        return self.cancels.event(response_id)

    # ------------------------------------------------------------------------------ input rebuilding
    async def resolve_item_references(self, owner: str, items: list[JSON]) -> list[JSON]:
        """``items`` with each ``item_reference`` replaced by the stored item it names (see
        :func:`~.references.resolve_item_references`)."""
        return await resolve_item_references(self.db, owner, items)

    # ------------------------------------------------------------------------------ events
    def recorder(self, response_id: str) -> EventRecorder:
        """The writer of one running response's events (see :class:`EventRecorder`)."""
        return EventRecorder(self, response_id)

    def stream_events(self, owner: str, response_id: str, *, starting_after: int = -1) -> AsyncIterator[JSON]:
        """Every event after ``starting_after``, stored then live, until the response ends.

        Works from any instance: the database holds a prefix of the events, the live log (Redis when
        configured) all of them while running; sequence numbers join the two without gap or repeat.
        """
        return self._stream_events(owner, response_id, starting_after)

    async def _stream_events(self, owner: str, response_id: str, starting_after: int) -> AsyncIterator[JSON]:
        await self.responses.settled(response_id)  # a create written behind its first events
        async for event in self.events.stream_events(owner, response_id, starting_after=starting_after):
            yield event

    async def timed_events(
        self, owner: str, response_id: str, *, after: int = -1, limit: int = 1000
    ) -> tuple[list[TimedEvent], bool]:
        """The stored events of ``owner``'s response after sequence number ``after`` with their arrival
        times (at most ``limit``), and whether more follow; :class:`ResponseNotFound` otherwise."""
        await self.responses.settled(response_id)
        return await self.events.timed_events(owner, response_id, after=after, limit=limit)

    async def compact_response(self, response_id: str) -> bool:
        """Store a finished response's text once (store/compaction.py): its events refer into the
        final Response, whose output lives in its output items only. False if there was nothing to do
        (still running, gone, or done already)."""
        return await self.events.compact_response(response_id)

    def compact_soon(self, response_id: str) -> None:
        """:meth:`compact_response` in the background (a failure leaves the response whole)."""
        self.events.compact_soon(response_id)
