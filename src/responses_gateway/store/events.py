"""The event log of stored responses (``rg_events``): the writer, the reader, compaction.

:class:`EventRecorder` keeps one running response's events (live at once, in the database in
batches); :class:`Events` is the store's side of it: the group writer that writes the pending events of
every running response in one transaction, the end of a response (final status, output items and
conversation append, with :func:`~.responses.write_final`, before followers see the terminal event),
the size limit, ends kept for a retry while the database is down, ``stream_events`` (the database, then
the live log) and compaction of a finished response's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple, Protocol

import orjson

from ..protocol.builder import error_event
from .batches import Batches
from .compaction import compact, expand, has_refs
from .db import Database, Tx
from .errors import ResponseNotFound
from .live import LiveLog, LocalLiveLog
from .recovery import close_open_items
from .responses import OUTPUT_IN_ITEMS, CancelSignals, whole_response, write_final
from .rows import JSON, OUTPUT, RUNNING, TERMINAL, TERMINAL_EVENTS, dumps, with_id

__all__ = [
    "COMPACT_FROM_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "TRANSITIONS",
    "EventRecorder",
    "Events",
    "HasEvents",
    "TimedEvent",
    "Times",
]

log = logging.getLogger("responses_gateway.store")

# The statuses a response may move to from each status; anything else is ignored (a late snapshot
# from a cancelled worker must not resurrect it).
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"queued", "in_progress", *TERMINAL}),
    "in_progress": frozenset({"in_progress", *TERMINAL}),
}
_LIFECYCLE = frozenset({"response.created", "response.queued", "response.in_progress"}) | TERMINAL_EVENTS

_INSERT_EVENT_IF_RUNNING = (
    "INSERT INTO rg_events (response_id, seq, event, at_ms) SELECT ?, ?, ?, ? WHERE EXISTS"
    " (SELECT 1 FROM rg_responses WHERE id = ? AND status IN ('queued', 'in_progress'))"
)
# A response still running and in no conversation (the one-trip end on SQLite).
_INSERT_EVENT = "INSERT INTO rg_events (response_id, seq, event, at_ms) VALUES (?, ?, ?, ?)"
_RUNNING_ALONE = (
    "SELECT 1 FROM rg_responses WHERE id = ? AND status IN ('queued', 'in_progress')"
    " AND conversation_id IS NULL"
)

# Each event's arrival time (``at_ms``: milliseconds since the response's recorder started), one per
# event, in the order of the events it goes with; None where unknown.
Times = list[int | None]


class TimedEvent(NamedTuple):
    """A stored event with its sequence number and arrival time (see :meth:`Events.timed_events`)."""

    sequence_number: int
    at_ms: int | None
    event: JSON


# The most one stored response may take in the event log (serve --store-max-response-bytes).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024


# Below this much output (as JSON) a response is left whole: its copies cost little, and compacting
# (reading its events back, rewriting them) would cost every short response more than it saves.
COMPACT_FROM_BYTES = 32 * 1024


def _worth_compacting(snapshot: JSON | None) -> bool:
    output = snapshot.get("output") if snapshot is not None else None
    return bool(output) and len(dumps(output)) >= COMPACT_FROM_BYTES


def _snapshot_of(events: list[JSON]) -> JSON | None:
    """The latest lifecycle snapshot (``response.created``/``in_progress``/terminal) among ``events``."""
    for event in reversed(events):
        if event.get("type") in _LIFECYCLE and isinstance(event.get("response"), dict):
            snapshot: JSON = event["response"]
            return snapshot
    return None


# The most ends one shared end write takes. Unlimited, the writes under load carried 12-40 ends whose
# clients, released together, started their next streams together and queued behind one another
# (uvloop accepts one connection per loop turn): the store's added first-event p99 at 100 streams
# roughly halved with 4, for ~7 % more CPU per event (docs/performance.md, "ends written four at a
# time").
ENDS_PER_WRITE = 4

# A response's events to append: its id, the events, each encoded (as stored), their times.
_Batch = tuple[str, list[JSON], list[str], Times]
# An end waiting for the next shared write (see Events._ends): the response, its events, each
# encoded, its final snapshot, their times, and the future told whether it applied.
_End = tuple[str, list[JSON], list[str], JSON, Times, "asyncio.Future[bool]"]


def _settle_ended(entry: _End, outcome: bool | BaseException) -> None:
    done = entry[5]
    if done.done():
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)


class Events:
    """Writes, reads and compacts the events of stored responses (see the module's docstring)."""

    def __init__(
        self,
        db: Database,
        live: LiveLog,
        cancels: CancelSignals,
        *,
        background: set[asyncio.Task[None]],
        flush_interval: float = 0.05,
        flush_events: int = 256,
        poll_interval: float = 0.5,
        max_response_bytes: int | None = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_response_bytes is not None and max_response_bytes <= 0:
            raise ValueError("max_response_bytes must be positive (None: no limit)")
        self.db = db
        self.live = live
        self.cancels = cancels
        # The store's background tasks (awaited by Store.close): here, compactions.
        self._background = background
        self.flush_interval = flush_interval
        self.flush_events = flush_events
        self.poll_interval = poll_interval
        # The most one response may take in the event log (see _within_limit); what running ones
        # have taken, and those past it (the last sequence number stored).
        self.max_response_bytes = max_response_bytes
        self._sizes: dict[str, int] = {}
        self._over: dict[str, int] = {}
        # Ends of responses the database refused (it was down): written by the heartbeat once it is back.
        self._unwritten_ends: dict[str, tuple[list[JSON], JSON | None, Times | None]] = {}
        # Recorders with events not yet in the database, written together (see _write_group).
        self._dirty: dict[EventRecorder, None] = {}
        self._group_timer: asyncio.TimerHandle | None = None
        self._group_task: asyncio.Task[None] | None = None
        # Ends of responses waiting for the next shared write (SQLite): those that queued up while one
        # was being written go in the next, one transaction and one trip (BEGIN, the statements,
        # COMMIT), instead of a transaction (and its pages in the WAL) each; at most ENDS_PER_WRITE of
        # them, because a response's terminal event waits for its end and the clients of one write are
        # released together. A failed shared write is retried one end at a time, so one bad row fails
        # only its own response's end (_write_end_batch).
        self._ends: Batches[_End, bool] = Batches(
            self._write_end_batch, _settle_ended, "rg-store-ends", limit=ENDS_PER_WRITE
        )

    async def _write_snapshot(
        self, tx: Tx, response_id: str, snapshot: JSON, *, owner: tuple[Any, Any] | None = None
    ) -> None:
        """A lifecycle snapshot into its row: a terminal one with its output items and conversation
        append (``write_final``), any other as the status and the latest Response."""
        if snapshot["status"] in TERMINAL:
            await write_final(self.db, tx, response_id, snapshot, owner=owner)
            return
        await tx.write(
            "UPDATE rg_responses SET status = ?, response = ?, updated_at = ? WHERE id = ?",
            snapshot["status"],
            dumps(snapshot),
            time.time(),
            response_id,
        )

    async def close(self) -> None:
        """Write what is pending now, so recovery finds every event a client was sent."""
        if self._group_timer is not None:
            self._group_timer.cancel()
            self._group_timer = None
        with contextlib.suppress(Exception):
            await self._ends.flushed()
        with contextlib.suppress(Exception):
            if self._group_task is not None and not self._group_task.done():
                await self._group_task
            await self._write_group()

    # ------------------------------------------------------------------------------ ends kept for later
    def retry_end_later(
        self, response_id: str, events: list[JSON], final: JSON | None, times: Times | None = None
    ) -> None:
        """Keep the end of a response the database would not take (see :meth:`retry_ends`)."""
        self._unwritten_ends[response_id] = (events, final, times)

    async def retry_ends(self) -> int:
        """Write the ends the database refused earlier (called by the heartbeat and at close); the
        number written. Until then such a response reads ``in_progress``; never for good."""
        written = 0
        for response_id, (events, final, times) in list(self._unwritten_ends.items()):
            await self.write_events(response_id, events, final, times)
            del self._unwritten_ends[response_id]
            self.compact_soon(response_id)
            written += 1
        return written

    # ------------------------------------------------------------------------------ group writer
    def mark_dirty(self, recorder: EventRecorder) -> None:
        """``recorder`` has pending events: they go out with the next group write (``flush_interval``)."""
        self._dirty[recorder] = None
        if self._group_timer is None and (self._group_task is None or self._group_task.done()):
            loop = asyncio.get_running_loop()
            self._group_timer = loop.call_later(self.flush_interval, self._start_group)

    def _start_group(self) -> None:
        self._group_timer = None
        self._group_task = asyncio.get_running_loop().create_task(self._run_group(), name="rg-store-flush")

    async def _run_group(self) -> None:
        try:
            await self._write_group()
        except Exception:
            log.exception("writing the events of running responses failed (kept for the next write)")
        finally:
            self._group_task = None
            if self._dirty and self._group_timer is None:
                loop = asyncio.get_running_loop()
                self._group_timer = loop.call_later(self.flush_interval, self._start_group)

    async def _write_group(self) -> None:
        """Write the pending events of every running response here in ONE transaction.

        One write every ``flush_interval`` for all responses, instead of one per response: with many
        concurrent streams this is what keeps the store off the hot path. Each recorder's lock is held
        across the write, so a response's end (written under the same lock) always comes after.
        A failed write puts the events back; the next write (or the response's end) retries them.
        """
        taken: list[tuple[EventRecorder, list[JSON], Times]] = []
        dirty, self._dirty = self._dirty, {}
        for recorder in dirty:
            created = recorder._created
            if created is not None and not created.done():
                # Its row is still being written (write-behind create): its events wait for it.
                self._dirty[recorder] = None
                continue
            if recorder._lock.locked():
                # It is writing on its own (its end, or a flush): it takes its pending events itself.
                if recorder._pending:
                    self._dirty[recorder] = None
                continue
            await recorder._lock.acquire()  # free, checked just above: this does not suspend
            events, recorder._pending = recorder._pending, []
            times, recorder._pending_at = recorder._pending_at, []
            taken.append((recorder, events, times))
        try:
            batches = [(r.response_id, events, times) for r, events, times in taken if events]
            if batches:
                await self._write_batches(batches)
                self.live.flushed()
        except BaseException:
            for recorder, events, times in taken:
                recorder._pending[:0] = events
                recorder._pending_at[:0] = times
                if recorder._pending and not recorder._done:
                    self._dirty[recorder] = None
            raise
        finally:
            for recorder, _, _ in taken:
                recorder._lock.release()

    async def _write_batches(self, batches: list[tuple[str, list[JSON], Times]]) -> None:
        """Append the events of several running responses (and their in-progress snapshots) at once."""
        sizes: dict[str, int] = {}
        # Each event is encoded once: for the size limit and for its row.
        encoded: list[_Batch] = []
        for rid, events, times in batches:
            texts = [dumps(e) for e in events]
            if self.max_response_bytes is not None:
                kept, sizes[rid] = self._within_limit(rid, events, texts)
                events, texts, times = events[:kept], texts[:kept], times[:kept]
            encoded.append((rid, events, texts, times))
        await self._write_batches_within_limit(encoded)
        self._sizes.update(sizes)

    async def _write_batches_within_limit(self, batches: list[_Batch]) -> None:
        if self.db.dialect == "sqlite":
            snapshots = [_snapshot_of(events) for _, events, _, _ in batches]
            if not any(snap is not None and snap.get("status") in TERMINAL for snap in snapshots):
                await self._write_batches_sqlite(batches, snapshots)
                return
        ids = list(dict.fromkeys(rid for rid, _, _, _ in batches))
        async with self.db.transaction() as tx:
            status: dict[str, str] = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                rows = await tx.fetch(
                    f"SELECT id, status FROM rg_responses WHERE id IN ({marks})" + self.db.for_update,
                    *chunk,
                )
                status.update({str(rid): str(st) for rid, st in rows})
            rows_out: list[tuple[str, int, str, int | None]] = []
            for rid, events, texts, times in batches:
                current = status.get(rid)
                # Deleted, or already ended (cancelled while queued, failed by recovery): nothing to add.
                if current not in RUNNING:
                    continue
                rows_out.extend(
                    (rid, int(e["sequence_number"]), text, at)
                    for e, text, at in zip(events, texts, times, strict=True)
                )
                snapshot = _snapshot_of(events)
                if snapshot is not None and snapshot.get("status") in TRANSITIONS[current]:
                    await self._write_snapshot(tx, rid, snapshot)
                    if snapshot["status"] in TERMINAL:
                        status[rid] = str(snapshot["status"])
                        status[rid] = str(snapshot["status"])
            if rows_out:
                await tx.writemany(_INSERT_EVENT, rows_out)

    async def _write_batches_sqlite(self, batches: list[_Batch], snapshots: list[JSON | None]) -> None:
        """:meth:`_write_batches` in one trip to the database thread: each statement checks the status
        itself. ``BEGIN IMMEDIATE`` holds the file's write lock, so no other writer (another process
        included) can change a status between those checks and the commit."""
        async with self.db.transaction() as tx:
            rows = [
                (rid, int(e["sequence_number"]), text, at, rid)
                for rid, events, texts, times in batches
                for e, text, at in zip(events, texts, times, strict=True)
            ]
            if rows:
                # Deleted, or already ended (cancelled while queued, failed by recovery): nothing is added.
                await tx.writemany(_INSERT_EVENT_IF_RUNNING, rows)
            for (rid, _, _, _), snapshot in zip(batches, snapshots, strict=True):
                if snapshot is None:
                    continue
                status = snapshot.get("status")
                sources = [old for old, allowed in TRANSITIONS.items() if status in allowed]
                if not sources:
                    continue
                marks = ", ".join("?" * len(sources))
                await tx.write(
                    "UPDATE rg_responses SET status = ?, response = ?, updated_at = ?"
                    f" WHERE id = ? AND status IN ({marks})",
                    status,
                    dumps(snapshot),
                    time.time(),
                    rid,
                    *sources,
                )

    # ------------------------------------------------------------------------------ one response
    async def write_events(
        self, response_id: str, events: list[JSON], final: JSON | None, times: Times | None = None
    ) -> bool:
        """Append events and apply the latest lifecycle snapshot among them, in one transaction.
        ``times``: each event's arrival time (``at_ms``), None if unknown."""
        snapshot = final if final is not None else _snapshot_of(events)
        if times is None:
            times = [None] * len(events)
        # Each event is encoded once: for the size limit and for its row.
        texts = [dumps(e) for e in events]
        size = None
        if self.max_response_bytes is not None:
            # The closing events of a response past the limit get the end's time (its latest known).
            end_at = next((at for at in reversed(times) if at is not None), None)
            kept, size = self._within_limit(response_id, events, texts)
            events, texts, times = events[:kept], texts[:kept], times[:kept]
            if response_id in self._over and snapshot is not None and snapshot.get("status") in TERMINAL:
                events, snapshot = await self._end_over_limit(response_id, events, snapshot)
                texts += [dumps(e) for e in events[kept:]]
                times = [*times, *[end_at] * (len(events) - kept)]
        written = await self._write_events_within_limit(response_id, events, texts, snapshot, times)
        if size is not None:
            if snapshot is not None and snapshot.get("status") in TERMINAL:
                self._sizes.pop(response_id, None)
                self._over.pop(response_id, None)
            else:
                self._sizes[response_id] = size
        return written

    def _within_limit(self, response_id: str, events: list[JSON], texts: list[str]) -> tuple[int, int]:
        """How many of ``events`` (``texts``: each encoded) to store for ``response_id`` within
        ``max_response_bytes``, and its size after them (recorded by the caller once written, so a
        retried write is not counted twice). Past the limit nothing more of the response is stored;
        the client's stream is not affected (see :meth:`_end_over_limit` for its end)."""
        limit = self.max_response_bytes
        size = self._sizes.get(response_id, 0)
        if limit is None:
            return len(events), size
        if response_id in self._over:
            return 0, size
        whole = size + sum(map(len, texts))
        if whole <= limit:
            return len(events), whole
        for i, text in enumerate(texts):
            size += len(text)
            if size > limit:
                self._over[response_id] = int(events[i]["sequence_number"]) - 1
                return i, size
        return len(events), size

    async def _end_over_limit(
        self, response_id: str, kept: list[JSON], snapshot: JSON
    ) -> tuple[list[JSON], JSON]:
        """The stored end of a response that outgrew the store: what is stored is closed properly
        (open items end ``incomplete``, as after a crash) and followed by an ``error`` and
        ``response.failed`` saying it was not stored in full; the stored Response says the same."""
        last = self._over[response_id]
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT event FROM rg_events WHERE response_id = ? ORDER BY seq", response_id
            )
        stored = [orjson.loads(text) for (text,) in rows] + kept
        closing, output = close_open_items(stored, last + 1)
        message = (
            f"The response was larger than the store's limit ({self.max_response_bytes} bytes): the client "
            "received it whole, but it was not stored in full."
        )
        failed = {**snapshot, "status": "failed", "output": output}
        failed["error"] = {"code": "server_error", "message": message}
        failed.pop("incomplete_details", None)
        seq = last + 1 + len(closing)
        tail = [
            *closing,
            {**error_event("server_error", message), "sequence_number": seq},
            {"type": "response.failed", "sequence_number": seq + 1, "response": failed},
        ]
        return [*kept, *tail], failed

    async def _write_events_within_limit(
        self, response_id: str, events: list[JSON], texts: list[str], snapshot: JSON | None, times: Times
    ) -> bool:
        if (
            self.db.dialect == "sqlite"
            and snapshot is not None
            and snapshot.get("status") in TERMINAL
            and snapshot.get("conversation") is None
            and await self._end_shared(response_id, events, texts, snapshot, times)
        ):
            return True
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status, owner, conversation_id FROM rg_responses WHERE id = ?" + self.db.for_update,
                response_id,
            )
            # Deleted, or already ended (cancelled while queued, failed by recovery): nothing to add.
            if row is None or row[0] not in RUNNING:
                return False
            if events:
                await tx.writemany(
                    _INSERT_EVENT,
                    [
                        (response_id, int(e["sequence_number"]), text, at)
                        for e, text, at in zip(events, texts, times, strict=True)
                    ],
                )
            if snapshot is not None and snapshot.get("status") in TRANSITIONS[row[0]]:
                await self._write_snapshot(tx, response_id, snapshot, owner=(row[1], row[2]))
        return True

    # ------------------------------------------------------------------------------ shared ends (SQLite)
    async def _end_shared(
        self, response_id: str, events: list[JSON], texts: list[str], response: JSON, times: Times
    ) -> bool:
        """The end of a running response outside any conversation, written with the other ends queued
        meanwhile (see ``_ends``). False: nothing was written (the response is not running
        here any more, or is in a conversation after all): the caller goes the general way."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry: _End = (response_id, events, texts, response, times, done)
        self._ends.put(entry)
        try:
            return await done
        except asyncio.CancelledError:
            self._ends.withdraw(entry)
            raise

    async def _write_end_batch(self, batch: list[_End]) -> list[bool]:
        """What :meth:`write_events` + :func:`write_final` do for each end of ``batch``, in one
        transaction sent to the SQLite thread in one trip.

        Every statement checks for itself that its response is still running and in no conversation
        (``BEGIN IMMEDIATE`` holds the file's write lock, so that cannot change in between); each final
        UPDATE comes after its response's other statements and says whether they all applied.
        """
        deletes: list[tuple[str, str]] = []
        items: list[tuple[Any, ...]] = []
        rows: list[tuple[Any, ...]] = []
        for rid, events, texts, response, times, _ in batch:
            deletes.append((rid, rid))
            items.extend(
                (rid, OUTPUT, i, it["id"], dumps(it), rid)
                for i, it in enumerate(with_id(item) for item in response.get("output") or [])
            )
            rows.extend(
                (rid, int(e["sequence_number"]), text, at, rid)
                for e, text, at in zip(events, texts, times, strict=True)
            )
        counts: list[int] = []
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.writemany(
                "DELETE FROM rg_items WHERE response_id = ? AND kind = 1 AND EXISTS (" + _RUNNING_ALONE + ")",
                deletes,
            )
            if items:
                await tx.writemany(
                    "INSERT INTO rg_items (response_id, kind, position, id, owner, item)"
                    " SELECT ?, ?, ?, ?, owner, ? FROM rg_responses WHERE id = ?"
                    " AND status IN ('queued', 'in_progress') AND conversation_id IS NULL",
                    items,
                )
            if rows:
                await tx.writemany(
                    "INSERT INTO rg_events (response_id, seq, event, at_ms) SELECT ?, ?, ?, ? WHERE EXISTS ("
                    + _RUNNING_ALONE
                    + ")",
                    rows,
                )
            for rid, _, _, response, _, _ in batch:
                await tx.write_counted(
                    "UPDATE rg_responses SET status = ?, response = ?, updated_at = ?, cancel_requested = 0"
                    " WHERE id = ? AND status IN ('queued', 'in_progress') AND conversation_id IS NULL",
                    response["status"],
                    dumps(response),
                    now,
                    rid,
                    into=counts,
                )
        return [n > 0 for n in counts]

    # ------------------------------------------------------------------------------ reading
    async def stream_events(
        self, owner: str, response_id: str, *, starting_after: int = -1
    ) -> AsyncIterator[JSON]:
        """Every event after ``starting_after``, stored then live, until the response ends.

        Works from any instance: the database holds a prefix of the events, the live log (Redis when
        configured) all of them while running; sequence numbers join the two without gap or repeat.
        """
        last = starting_after
        status, stored = await self._events_after(owner, response_id, last)
        for event in stored:
            yield event
            last = int(event["sequence_number"])
            if event.get("type") in TERMINAL_EVENTS:
                return
        if status in TERMINAL:
            return
        while True:
            events, ended = await self.live.read(response_id, last, self.poll_interval)
            for event in events:
                seq = int(event["sequence_number"])
                if seq <= last:
                    continue
                yield event
                last = seq
                if event.get("type") in TERMINAL_EVENTS:
                    return
            if events and not ended:
                continue
            # Idle or ended: the database is the authority (a crash, or a cancel with no final event).
            try:
                status, stored = await self._events_after(owner, response_id, last)
            except ResponseNotFound:
                return
            for event in stored:
                yield event
                last = int(event["sequence_number"])
                if event.get("type") in TERMINAL_EVENTS:
                    return
            if status in TERMINAL or ended:
                return

    async def _events_after(self, owner: str, response_id: str, after: int) -> tuple[str, list[JSON]]:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner
            )
            if row is None:
                raise ResponseNotFound(response_id)
            rows = await tx.fetch(
                "SELECT event FROM rg_events WHERE response_id = ? AND seq > ? ORDER BY seq",
                response_id,
                after,
            )
            events = await _expanded(tx, response_id, [orjson.loads(text) for (text,) in rows])
        return str(row[0]), events

    async def timed_events(
        self, owner: str, response_id: str, *, after: int = -1, limit: int = 1000
    ) -> tuple[list[TimedEvent], bool]:
        """``owner``'s stored events of ``response_id`` after ``after``, with their arrival times
        (``at_ms``, None for events stored before times were kept), at most ``limit``, and whether
        more follow. Only what is in the database: a running response's latest events may not be yet."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT 1 FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner
            )
            if row is None:
                raise ResponseNotFound(response_id)
            rows = await tx.fetch(
                "SELECT seq, at_ms, event FROM rg_events WHERE response_id = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                response_id,
                after,
                limit + 1,
            )
            more = len(rows) > limit
            events = await _expanded(tx, response_id, [orjson.loads(text) for _, _, text in rows[:limit]])
        timed = [
            TimedEvent(int(seq), None if at is None else int(at), event)
            for (seq, at, _), event in zip(rows, events, strict=False)
        ]
        return timed, more

    # ------------------------------------------------------------------------------ compaction
    async def compact_response(self, response_id: str) -> bool:
        """Store a finished response's text once (store/compaction.py): its events refer into the
        final Response, whose output lives in its output items only. False if there was nothing to do
        (still running, gone, or done already)."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status, response FROM rg_responses WHERE id = ?" + self.db.for_update, response_id
            )
            if row is None or row[0] not in TERMINAL:
                return False
            response: JSON = orjson.loads(row[1])
            if not isinstance(response.get("output"), list):
                return False
            items = await tx.fetch(
                "SELECT item FROM rg_items WHERE response_id = ? AND kind = 1 ORDER BY position", response_id
            )
            rows = await tx.fetch(
                "SELECT seq, event FROM rg_events WHERE response_id = ? ORDER BY seq", response_id
            )
            events = [orjson.loads(text) for _, text in rows]
            changed = compact(events, response)
            if changed:
                await tx.writemany(
                    "UPDATE rg_events SET event = ? WHERE response_id = ? AND seq = ?",
                    [(dumps(event), response_id, rows[i][0]) for i, event in changed.items()],
                )
            if response["output"] and [orjson.loads(text) for (text,) in items] == response["output"]:
                await tx.write(
                    "UPDATE rg_responses SET response = ? WHERE id = ?",
                    dumps({**response, "output": OUTPUT_IN_ITEMS}),
                    response_id,
                )
        return True

    def compact_soon(self, response_id: str) -> None:
        """:meth:`compact_response` in the background (a failure leaves the response whole)."""

        async def run() -> None:
            try:
                await self.compact_response(response_id)
            except Exception:
                log.warning("compacting stored response %s failed", response_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class HasEvents(Protocol):
    """What an :class:`EventRecorder` is made from: the :class:`~.store.Store` (or anything holding its
    :class:`Events`)."""

    @property
    def events(self) -> Events: ...


class EventRecorder:
    """Keeps one running response's events: live at once, in the database in batches.

    ``recorder.add_nowait(builder.take())`` after each provider step queues the events without
    waiting (safe to call from any task, and from a timer callback: order is the order of the calls).
    With the in-process live log the events are published on the spot (followers see them at once)
    and the step costs a list append: no task, no future. With Redis one pump task per response
    publishes them in order. Either way the database gets them with the store's next group write
    (every ``flush_interval`` seconds, one transaction for all running responses; see
    ``Events._write_group``), or at once when ``flush_events`` are pending. A terminal event
    (``response.completed``/``incomplete``/``failed``) is written with the final status, output items
    and conversation append in one transaction before followers see it; ``final`` overrides that
    snapshot (a stopped response stored as ``cancelled``).
    ``await recorder.add(events)`` queues and waits; :meth:`drain` waits for what is queued;
    :meth:`finish` ends a response that has no terminal event to send.
    """

    __slots__ = (
        "_closed",
        "_created",
        "_done",
        "_events",
        "_flushing",
        "_local",
        "_lock",
        "_origin",
        "_outbox",
        "_pending",
        "_pending_at",
        "_pump",
        "recorded",
        "response_id",
        "store",
    )

    def __init__(self, store: HasEvents, response_id: str) -> None:
        self.store = store
        self._events = store.events
        self.response_id = response_id
        self._outbox: list[tuple[list[JSON], JSON | None, int]] = []
        self._pending: list[JSON] = []
        # Each pending event's arrival time (``at_ms``), milliseconds since ``_origin`` (this
        # recorder's start, i.e. the response's create): one clock read per add, not per event.
        self._pending_at: Times = []
        self._origin = time.monotonic()
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._flushing: asyncio.Task[None] | None = None
        live = self._events.live
        self._local = live if isinstance(live, LocalLiveLog) else None
        self._closed = False
        self._done = False
        self._created: asyncio.Future[None] | None = None
        self.recorded = 0

    def behind(self, created: asyncio.Future[None]) -> None:
        """The response's row is being written by ``created`` (``Responses.create_behind``): nothing of
        it reaches the database before that is done. Events are still published live at once."""
        self._created = created

    async def _wait_created(self) -> None:
        created = self._created
        if created is not None and not created.done():
            await asyncio.wait([created])

    @property
    def ended(self) -> bool:
        """The final state is written (or the response was gone)."""
        return self._done

    def add_nowait(self, events: list[JSON], final: JSON | None = None) -> None:
        """Queue events (in sequence order) and, with ``final``, the end of the response."""
        if self._closed or (not events and final is None):
            return
        self.recorded += len(events)
        at = int((time.monotonic() - self._origin) * 1000)
        terminal = final is not None
        if not terminal:
            for event in events:
                if event.get("type") in TERMINAL_EVENTS:
                    terminal = True
                    break
        if terminal:
            self._closed = True
        else:
            local, pump = self._local, self._pump
            if local is not None and not self._outbox and (pump is None or pump.done()):
                # The hot path: publish in place, leave the write to the store's group writer.
                local.publish_nowait(self.response_id, events)
                self._queue(events, at)
                return
        self._outbox.append((events, final, at))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run())

    def _queue(self, events: list[JSON], at: int) -> None:
        pending = self._pending
        pending.extend(events)
        if len(events) == 1:
            self._pending_at.append(at)
        else:
            self._pending_at.extend([at] * len(events))
        writer = self._events
        if len(pending) >= writer.flush_events:
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.get_running_loop().create_task(self.flush())
        elif self not in writer._dirty:
            # (Already there: the next group write, armed then, takes these too.)
            writer.mark_dirty(self)

    async def add(self, events: list[JSON], final: JSON | None = None) -> None:
        """Queue events and wait until they are published (and, at the end, written)."""
        self.add_nowait(events, final)
        await self.drain()

    async def drain(self) -> None:
        """Wait for everything queued so far; a cancelled caller does not cancel the writing."""
        while self._pump is not None and not self._pump.done():
            await asyncio.shield(self._pump)
        if self._pump is not None and self._pump.done() and not self._pump.cancelled():
            error = self._pump.exception()
            if error is not None:
                self._pump = None
                raise error

    async def _run(self) -> None:
        while self._outbox:
            events, final, at = self._outbox.pop(0)
            if final is not None or any(e.get("type") in TERMINAL_EVENTS for e in events):
                # The end is written before followers see it: whoever reads the response after its
                # terminal event finds it finished.
                self._pending.extend(events)
                self._pending_at.extend([at] * len(events))
                await self._end(final, events)
                return
            if events:
                await self._events.live.publish(self.response_id, events)
                self._queue(events, at)

    async def flush(self) -> None:
        """Write what is pending now."""
        await self._wait_created()
        async with self._lock:
            events, self._pending = self._pending, []
            times, self._pending_at = self._pending_at, []
            if events:
                try:
                    await self._events.write_events(self.response_id, events, None, times)
                except BaseException:
                    self._pending[:0] = events  # kept for the next write (or the end)
                    self._pending_at[:0] = times
                    raise
                self._events.live.flushed()

    async def finish(self, response: JSON) -> None:
        """End with ``response`` as the final snapshot (status cancelled, or any terminal status)."""
        self.add_nowait([], response)
        await self.drain()

    async def _end(self, final: JSON | None, last: list[JSON]) -> None:
        try:
            await self._wait_created()
            async with self._lock:
                events, self._pending = self._pending, []
                times, self._pending_at = self._pending_at, []
                # The end is one transaction, so a failed attempt left nothing and is simply retried:
                # a database hiccup must not leave the response "in_progress" for good.
                written = False
                for delay in (0.1, 0.5, 2.0, None):
                    try:
                        await self._events.write_events(self.response_id, events, final, times)
                        written = True
                        break
                    except Exception:
                        if delay is None:
                            # The database is down for longer: the client still gets its end, and the
                            # heartbeat writes this one as soon as the database answers again.
                            log.exception(
                                "writing the end of response %s failed; will retry", self.response_id
                            )
                            self._events.retry_end_later(self.response_id, events, final, times)
                            break
                        await asyncio.sleep(delay)
            self._done = True
            if written and _worth_compacting(final if final is not None else _snapshot_of(events)):
                self._events.compact_soon(self.response_id)
        finally:
            self._events._dirty.pop(self, None)
            try:
                if last:
                    await self._events.live.publish(self.response_id, last)
                await self._events.live.end(self.response_id)
            finally:
                self._events.cancels.forget(self.response_id)


async def _expanded(tx: Tx, response_id: str, events: list[JSON]) -> list[JSON]:
    """``events`` of ``response_id`` as sent: a compacted response's events point into its final
    Response (store/compaction.py) and are expanded from it."""
    if not any(has_refs(event) for event in events):
        return events
    stored = await tx.fetchone("SELECT response FROM rg_responses WHERE id = ?", response_id)
    assert stored is not None
    whole = await whole_response(tx, response_id, stored[0])
    return [expand(event, whole) if has_refs(event) else event for event in events]
