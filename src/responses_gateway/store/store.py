"""The store: responses, their items and events, conversations; one implementation over both databases.

Every public read or write takes ``owner`` and filters by it, so another owner's objects are simply
not found. Writes that belong together are one transaction: a response's terminal event, final
status, output items and conversation append commit together or not at all.

Running responses belong to an *instance* (one gateway process) that heartbeats in ``rg_instances``.
An instance whose heartbeat is older than the lease, or whose process is gone from this host, is dead:
its running responses are failed by whoever notices first (start-up, then every heartbeat), with the
events it had written kept and a ``response.failed`` appended so followers see an end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson

from ..protocol.builder import error_event
from ..protocol.response import ID_PREFIXES, new_id
from .compaction import MARK, compact, expand, has_refs
from .db import Database, Tx
from .errors import (
    ConversationNotFound,
    ItemNotFound,
    ItemReferenceNotFound,
    PreviousResponseNotFound,
    ResponseNotFound,
)
from .live import LiveLog, LocalLiveLog
from .recovery import close_open_items
from .schema import migrate

__all__ = ["RUNNING", "TERMINAL", "TERMINAL_EVENTS", "EventRecorder", "Store"]

log = logging.getLogger("responses_gateway.store")

JSON = dict[str, Any]

RUNNING = frozenset({"queued", "in_progress"})
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)
# The statuses a response may move to from each status; anything else is ignored (a late snapshot
# from a cancelled worker must not resurrect it).
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"queued", "in_progress", *TERMINAL}),
    "in_progress": frozenset({"in_progress", *TERMINAL}),
}
_LIFECYCLE = frozenset({"response.created", "response.queued", "response.in_progress"}) | TERMINAL_EVENTS

# Prefixes for ids the gateway gives input items that arrive without one (listing needs ids).
_EXTRA_PREFIXES = {"function_call_output": "fco", "custom_tool_call_output": "ctco", "item_reference": "ref"}
_INPUT, _OUTPUT = 0, 1
_INSERT_RESPONSE = (
    "INSERT INTO rg_responses (id, owner, created_at, status, background, previous_response_id,"
    " conversation_id, request, response, instance_id, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_EVENT_IF_RUNNING = (
    "INSERT INTO rg_events (response_id, seq, event) SELECT ?, ?, ? WHERE EXISTS"
    " (SELECT 1 FROM rg_responses WHERE id = ? AND status IN ('queued', 'in_progress'))"
)
# A response still running and in no conversation (the one-trip end on SQLite).
_RUNNING_ALONE = (
    "SELECT 1 FROM rg_responses WHERE id = ? AND status IN ('queued', 'in_progress')"
    " AND conversation_id IS NULL"
)
_INSERT_ITEM = "INSERT INTO rg_items (response_id, kind, position, id, owner, item) VALUES (?, ?, ?, ?, ?, ?)"
_CRASH_MESSAGE = "The gateway instance running this response stopped before it finished."


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _item_id(item: JSON) -> str:
    kind = str(item.get("type") or "message")
    return new_id(ID_PREFIXES.get(kind) or _EXTRA_PREFIXES.get(kind) or "item")


def _with_id(item: JSON) -> JSON:
    if isinstance(item.get("id"), str) and item["id"]:
        return item
    return {"id": _item_id(item), **item}


def apply_include(item: JSON, include: Iterable[str]) -> JSON:
    """An item as a read without those ``include`` values shows it (stored items keep everything)."""
    wanted = set(include)
    if item.get("type") == "reasoning" and "reasoning.encrypted_content" not in wanted:
        if "encrypted_content" in item:
            item = {k: v for k, v in item.items() if k != "encrypted_content"}
    elif item.get("type") == "message" and "message.output_text.logprobs" not in wanted:
        content = item.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("logprobs") for p in content):
            parts = [
                {**p, "logprobs": []} if isinstance(p, dict) and p.get("logprobs") else p for p in content
            ]
            item = {**item, "content": parts}
    return item


def _page(rows: list[JSON], limit: int) -> JSON:
    data = rows[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


def _check_page_args(limit: int, order: str) -> None:
    if not 1 <= limit <= 100:
        raise ValueError("limit must be between 1 and 100")
    if order not in ("asc", "desc"):
        raise ValueError("order must be 'asc' or 'desc'")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The most one stored response may take in the event log (serve --store-max-response-bytes).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024


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
        if max_response_bytes is not None and max_response_bytes <= 0:
            raise ValueError("max_response_bytes must be positive (None: no limit)")
        # The most one response may take in the event log (see _within_limit); what running ones
        # have taken, and those past it (the last sequence number stored).
        self.max_response_bytes = max_response_bytes
        self._sizes: dict[str, int] = {}
        self._over: dict[str, int] = {}
        # Ends of responses the database refused (it was down): written by the heartbeat once it is back.
        self._unwritten_ends: dict[str, tuple[list[JSON], JSON | None]] = {}
        self.live = live or LocalLiveLog()
        self.instance_id = instance_id or new_id("inst")
        self.lease_seconds = lease_seconds
        self.flush_interval = flush_interval
        self.flush_events = flush_events
        self.poll_interval = poll_interval
        self._host = socket.gethostname()
        self._cancel: dict[str, asyncio.Event] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        # Recorders with events not yet in the database, written together (see _write_group).
        self._dirty: dict[EventRecorder, None] = {}
        self._group_timer: asyncio.TimerHandle | None = None
        self._group_task: asyncio.Task[None] | None = None
        # Creates waiting for the next shared transaction (see _write_creates).
        self._creates: list[_Create] = []
        self._creator: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        """Migrate, register this instance, fail what dead instances left running, start heartbeating."""
        await self.db.open()
        await migrate(self.db)
        await self.live.open(self._on_cancel)
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_instances (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
                self.instance_id,
                self._host,
                os.getpid(),
                now,
                now,
            )
        await self.recover()
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="rg-store-heartbeat")

    async def close(self) -> None:
        """Stop heartbeating and deregister; responses still running here are left for recovery."""
        if self._group_timer is not None:
            self._group_timer.cancel()
            self._group_timer = None
        with contextlib.suppress(Exception):
            # What is pending is written, so recovery finds every event a client was sent.
            if self._group_task is not None and not self._group_task.done():
                await self._group_task
            await self._write_group()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        with contextlib.suppress(Exception):
            async with self.db.transaction() as tx:
                # Expiring the lease (rather than deleting the row) lets the next sweep fail what we ran.
                await tx.execute("UPDATE rg_instances SET heartbeat_at = 0 WHERE id = ?", self.instance_id)
        with contextlib.suppress(Exception):
            await self.retry_ends()
        if self._background:
            # Compactions and discards in flight finish (each is one short transaction).
            await asyncio.wait(set(self._background), timeout=10)
        await self.live.close()
        await self.db.close()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.heartbeat()
                await self.retry_ends()
                if self.retention is not None and time.monotonic() >= self._next_expiry:
                    self._next_expiry = time.monotonic() + self.expiry_interval
                    await self.expire()
            except Exception:  # a database hiccup must not end the loop; the next beat retries
                continue

    def retry_end_later(self, response_id: str, events: list[JSON], final: JSON | None) -> None:
        """Keep the end of a response the database would not take (see :meth:`retry_ends`)."""
        self._unwritten_ends[response_id] = (events, final)

    async def retry_ends(self) -> int:
        """Write the ends the database refused earlier (called by the heartbeat and at close); the
        number written. Until then such a response reads ``in_progress``; never for good."""
        written = 0
        for response_id, (events, final) in list(self._unwritten_ends.items()):
            await self._write_events(response_id, events, final)
            del self._unwritten_ends[response_id]
            self.compact_soon(response_id)
            written += 1
        return written

    async def expire(self, *, now: float | None = None, batch: int = 500) -> int:
        """Delete finished responses created more than ``retention`` seconds ago, with their items and
        events, a batch per transaction; the number deleted. Running ones are never touched, and
        conversations keep their own copies of their items. A later ``previous_response_id`` naming
        an expired response gets the same 404 as an unknown one, as OpenAI's expiry does."""
        if self.retention is None:
            return 0
        cutoff = int((time.time() if now is None else now) - self.retention)
        deleted = 0
        while True:
            async with self.db.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT id FROM rg_responses WHERE created_at < ?"
                    " AND status NOT IN ('queued', 'in_progress') ORDER BY created_at LIMIT ?",
                    cutoff,
                    batch,
                )
                ids = [str(rid) for (rid,) in rows]
                if not ids:
                    return deleted
                marks = ", ".join("?" * len(ids))
                for table, column in (
                    ("rg_events", "response_id"),
                    ("rg_items", "response_id"),
                    ("rg_responses", "id"),
                ):
                    await tx.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", *ids)
            deleted += len(ids)
            log.info("expired %d stored responses older than the retention period", len(ids))
            if len(ids) < batch:
                return deleted

    async def heartbeat(self) -> None:
        """Renew this instance's lease, pick up cancel requests, fail dead instances' responses."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_instances SET heartbeat_at = ? WHERE id = ?", time.time(), self.instance_id
            )
            # Without Redis this is how a cancel made on another instance reaches this one.
            rows = await tx.fetch(
                "SELECT id FROM rg_responses WHERE instance_id = ? AND cancel_requested = 1"
                " AND status IN ('queued', 'in_progress')",
                self.instance_id,
            )
        for (response_id,) in rows:
            self._on_cancel(response_id)
        await self.recover()

    async def recover(self) -> list[str]:
        """Fail responses left running by dead instances; the ids failed."""
        now = time.time()
        async with self.db.transaction() as tx:
            instances = await tx.fetch("SELECT id, host, pid, heartbeat_at FROM rg_instances")
            alive = {
                iid
                for iid, host, pid, beat in instances
                if iid == self.instance_id
                or (beat >= now - self.lease_seconds and (host != self._host or _pid_alive(int(pid))))
            }
            dead = {iid for iid, *_ in instances} - alive
            orphans = [
                rid
                for rid, iid in await tx.fetch(
                    "SELECT id, instance_id FROM rg_responses WHERE status IN ('queued', 'in_progress')"
                )
                if iid not in alive
            ]
        failed = [rid for rid in orphans if await self._fail_orphan(rid, alive)]
        if dead:
            async with self.db.transaction() as tx:
                for iid in dead:
                    still = await tx.fetchone(
                        "SELECT 1 FROM rg_responses WHERE instance_id = ?"
                        " AND status IN ('queued', 'in_progress')",
                        iid,
                    )
                    if still is None:
                        await tx.execute("DELETE FROM rg_instances WHERE id = ?", iid)
        return failed

    async def _fail_orphan(self, response_id: str, alive: set[str]) -> bool:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status, instance_id, response FROM rg_responses WHERE id = ?" + self.db.for_update,
                response_id,
            )
            if row is None or row[0] not in RUNNING or row[1] in alive:
                return False
            response: JSON = orjson.loads(row[2])
            rows = await tx.fetch(
                "SELECT seq, event FROM rg_events WHERE response_id = ? ORDER BY seq", response_id
            )
            stored = [orjson.loads(text) for _seq, text in rows]
            last = int(rows[-1][0]) if rows else -1
            # What the crash left open is closed (incomplete) first, as a live failure would do.
            closing, output = close_open_items(stored, last + 1)
            response.update(
                status="failed",
                error={"code": "server_error", "message": _CRASH_MESSAGE},
                output=output,
            )
            last += len(closing)
            tail = [
                *closing,
                {
                    "type": "error",
                    "sequence_number": last + 1,
                    "code": "server_error",
                    "message": _CRASH_MESSAGE,
                    "param": None,
                    "error": {
                        "type": "server_error",
                        "code": "server_error",
                        "message": _CRASH_MESSAGE,
                        "param": None,
                    },
                },
                {"type": "response.failed", "sequence_number": last + 2, "response": response},
            ]
            await tx.executemany(
                "INSERT INTO rg_events (response_id, seq, event) VALUES (?, ?, ?)",
                [(response_id, e["sequence_number"], _dumps(e)) for e in tail],
            )
            await self._write_final(tx, response_id, response)
        await self.live.publish(response_id, tail)
        await self.live.end(response_id)
        return True

    # ------------------------------------------------------------------------------ cancellation
    def _on_cancel(self, response_id: str) -> None:
        event = self._cancel.get(response_id)
        if event is not None:
            event.set()

    def cancel_event(self, response_id: str) -> asyncio.Event:
        """Set when a cancel for ``response_id`` arrives (from any instance); the worker watches it."""
        event = self._cancel.get(response_id)
        if event is None:
            event = self._cancel[response_id] = asyncio.Event()
        return event

    async def cancel_response(self, owner: str, response_id: str, *, wait: float = 5.0) -> JSON:
        """Ask the response to stop (wherever it runs); its snapshot once cancelled or after ``wait`` s."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status, response FROM rg_responses WHERE id = ? AND owner = ?" + self.db.for_update,
                response_id,
                owner,
            )
            if row is None:
                raise ResponseNotFound(response_id)
            status, text = row
            if status == "queued":
                # No worker has it yet: cancelling is a status change.
                response: JSON = orjson.loads(text)
                response["status"] = "cancelled"
                await self._write_final(tx, response_id, response)
            elif status == "in_progress":
                await tx.execute("UPDATE rg_responses SET cancel_requested = 1 WHERE id = ?", response_id)
        if status == "queued":
            await self.live.end(response_id)
            await self.live.broadcast_cancel(response_id)
            return response
        if status == "in_progress":
            await self.live.broadcast_cancel(response_id)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                snapshot = await self.get_response(owner, response_id)
                if snapshot["status"] in TERMINAL:
                    return snapshot
                await asyncio.sleep(0.05)
        return await self.get_response(owner, response_id)

    # ------------------------------------------------------------------------------ responses
    async def create_response(
        self, owner: str, response: JSON, *, request: JSON, input_items: list[JSON]
    ) -> None:
        """Record a new (queued or in-progress) response run by this instance, with its input items.

        ``input_items`` are this turn's items with references already resolved (see
        :meth:`resolve_input`); items without an ``id`` get one. ``response`` is the snapshot from
        ``new_response``; its ``previous_response_id`` and ``conversation`` link the turn.
        """
        conversation = response.get("conversation")
        conversation_id = conversation.get("id") if isinstance(conversation, dict) else None
        rid = response["id"]
        row = (
            rid,
            owner,
            int(response["created_at"]),
            response["status"],
            1 if response.get("background") else 0,
            response.get("previous_response_id"),
            conversation_id,
            _dumps(request),
            _dumps(response),
            self.instance_id,
            time.time(),
        )
        items = [
            (rid, _INPUT, i, it["id"], owner, _dumps(it)) for i, it in enumerate(map(_with_id, input_items))
        ]
        if conversation_id is not None:
            async with self.db.transaction() as tx:
                await self._conversation_row(tx, owner, conversation_id)
                await tx.write(_INSERT_RESPONSE, *row)
                await tx.writemany(_INSERT_ITEM, items)
            return
        # Responses created at the same moment share one transaction (see _write_creates).
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (row, items, done)
        self._creates.append(entry)
        if self._creator is None or self._creator.done():
            self._creator = asyncio.get_running_loop().create_task(
                self._write_creates(), name="rg-store-create"
            )
        try:
            await done
        except asyncio.CancelledError:
            if entry in self._creates:
                self._creates.remove(entry)  # not written yet: it never will be
            raise

    async def _write_creates(self) -> None:
        """Write the queued creates, all that queued up meanwhile in one transaction.

        A create waits only for the transaction in flight, if any; under load, the responses starting
        during one write are all recorded by the next, one trip to the database for all of them. If a
        shared write fails, each is retried alone so one bad row fails only its own request. A create
        whose caller went away while it was being written is discarded again.
        """
        while self._creates:
            batch, self._creates = self._creates, []
            try:
                await self._insert_responses(batch)
            except Exception as exc:
                if len(batch) == 1:
                    _settle_create(batch[0][2], exc)
                    continue
                for entry in batch:
                    try:
                        await self._insert_responses([entry])
                    except Exception as one:
                        _settle_create(entry[2], one)
                    else:
                        self._created(entry)
                continue
            except BaseException as exc:  # shutdown: nobody will write these
                for _, _, done in batch + self._creates:
                    _settle_create(done, exc)
                raise
            for entry in batch:
                self._created(entry)

    async def _insert_responses(self, batch: list[_Create]) -> None:
        # Requests wait on this before their first event: it goes ahead of queued ends and group
        # writes (none of which can concern a response not created yet).
        async with self.db.transaction(first=True) as tx:
            await tx.writemany(_INSERT_RESPONSE, [row for row, _, _ in batch])
            items = [item for _, rows, _ in batch for item in rows]
            if items:
                await tx.writemany(_INSERT_ITEM, items)

    def _created(self, entry: _Create) -> None:
        done = entry[2]
        if done.cancelled():
            rid = str(entry[0][0])
            task = asyncio.get_running_loop().create_task(self.discard_response(rid))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        elif not done.done():
            done.set_result(None)

    async def get_response(self, owner: str, response_id: str, include: Iterable[str] = ()) -> JSON:
        """The stored Response object; encrypted reasoning and logprobs only if ``include`` asks."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT response FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner
            )
            if row is None:
                raise ResponseNotFound(response_id)
            response = await _whole_response(tx, response_id, row[0])
        include = tuple(include)
        response["output"] = [apply_include(item, include) for item in response.get("output") or []]
        return response

    async def delete_response(self, owner: str, response_id: str) -> JSON:
        """Delete a response with its items and events; a running one is also told to stop."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status FROM rg_responses WHERE id = ? AND owner = ?" + self.db.for_update,
                response_id,
                owner,
            )
            if row is None:
                raise ResponseNotFound(response_id)
            await tx.execute("DELETE FROM rg_items WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_events WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_responses WHERE id = ?", response_id)
        if row[0] in RUNNING:
            await self.live.broadcast_cancel(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def discard_response(self, response_id: str) -> None:
        """Remove a response that never got an event (its request was refused before it began)."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM rg_items WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_events WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_responses WHERE id = ?", response_id)
        self._cancel.pop(response_id, None)

    async def list_input_items(
        self,
        owner: str,
        response_id: str,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: str = "desc",
        include: Iterable[str] = (),
    ) -> JSON:
        """``GET /v1/responses/{id}/input_items``: ``{object: "list", data, first_id, last_id, has_more}``."""
        _check_page_args(limit, order)
        async with self.db.transaction() as tx:
            if (
                await tx.fetchone("SELECT 1 FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner)
                is None
            ):
                raise ResponseNotFound(response_id)
            rows = await self._page_rows(
                tx,
                "SELECT position, item FROM rg_items WHERE response_id = ? AND kind = 0",
                "SELECT position FROM rg_items WHERE response_id = ? AND kind = 0 AND id = ?",
                response_id,
                after=after,
                before=before,
                limit=limit,
                order=order,
            )
        include = tuple(include)
        return _page([apply_include(orjson.loads(text), include) for text in rows], limit)

    async def _page_rows(
        self,
        tx: Tx,
        select: str,
        cursor_sql: str,
        scope: str,
        *,
        after: str | None,
        before: str | None,
        limit: int,
        order: str,
    ) -> list[str]:
        """Up to ``limit + 1`` item texts of one list in ``order``, strictly between the cursors."""
        where = ""
        args: list[Any] = [scope]
        for cursor, asc_op, desc_op in ((after, ">", "<"), (before, "<", ">")):
            if cursor is None:
                continue
            row = await tx.fetchone(cursor_sql, scope, cursor)
            if row is None:
                raise ItemNotFound(cursor)
            where += f" AND position {asc_op if order == 'asc' else desc_op} ?"
            args.append(row[0])
        direction = "ASC" if order == "asc" else "DESC"
        rows = await tx.fetch(f"{select}{where} ORDER BY position {direction} LIMIT ?", *args, limit + 1)
        return [text for _pos, text in rows]

    # ------------------------------------------------------------------------------ input rebuilding
    async def resolve_input(
        self,
        owner: str,
        input_items: list[JSON],
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
    ) -> tuple[list[JSON], list[JSON]]:
        """``(context, turn)``: what precedes this turn, and this turn's items with references resolved.

        The upstream gets ``context + turn``. ``context`` follows ``previous_response_id`` back to the
        start of the chain, oldest turn first, each turn's inputs then its outputs (reasoning, tool
        calls and their outputs included, in order); or, for a conversation, its items. ``turn`` is
        what :meth:`create_response` stores.
        """
        context: list[JSON] = []
        if previous_response_id is not None:
            context = await self._chain_items(owner, previous_response_id)
        elif conversation_id is not None:
            async with self.db.transaction() as tx:
                await self._conversation_row(tx, owner, conversation_id)
                rows = await tx.fetch(
                    "SELECT item FROM rg_conversation_items WHERE conversation_id = ? ORDER BY position",
                    conversation_id,
                )
            context = [orjson.loads(text) for (text,) in rows]
        return context, await self.resolve_item_references(owner, input_items)

    async def _chain_items(self, owner: str, response_id: str) -> list[JSON]:
        async with self.db.transaction() as tx:
            if (
                await tx.fetchone("SELECT 1 FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner)
                is None
            ):
                raise PreviousResponseNotFound(response_id)
            # One query walks the whole chain; depth orders turns oldest first.
            rows = await tx.fetch(
                "WITH RECURSIVE chain (id, prev, depth) AS ("
                " SELECT id, previous_response_id, 0 FROM rg_responses WHERE id = ? AND owner = ?"
                " UNION ALL"
                " SELECT r.id, r.previous_response_id, c.depth + 1 FROM rg_responses r"
                " JOIN chain c ON r.id = c.prev WHERE r.owner = ? AND c.depth < 100000)"
                " SELECT i.item FROM chain c JOIN rg_items i ON i.response_id = c.id"
                " ORDER BY c.depth DESC, i.kind ASC, i.position ASC",
                response_id,
                owner,
                owner,
            )
        return [orjson.loads(text) for (text,) in rows]

    async def resolve_item_references(self, owner: str, items: list[JSON]) -> list[JSON]:
        """``items`` with each ``item_reference`` replaced by the stored item it names.

        A reasoning item sent back with its id but without its state (``encrypted_content``), as
        clients do that keep only ids, is replaced by the stored item of that id when there is one,
        so the upstream gets its thinking (and signature) back; an unknown id leaves it as sent.
        """
        wanted = [(i, item["id"]) for i, item in enumerate(items) if item.get("type") == "item_reference"]
        bare = [
            (i, item["id"])
            for i, item in enumerate(items)
            if item.get("type") == "reasoning"
            and isinstance(item.get("id"), str)
            and not item.get("encrypted_content")
        ]
        if not wanted and not bare:
            return items
        found: dict[str, JSON] = {}
        async with self.db.transaction() as tx:
            for _index, item_id in wanted + bare:
                if item_id in found:
                    continue
                row = await tx.fetchone(
                    "SELECT item FROM rg_items WHERE owner = ? AND id = ? ORDER BY kind DESC LIMIT 1",
                    owner,
                    item_id,
                )
                if row is None:
                    row = await tx.fetchone(
                        "SELECT ci.item FROM rg_conversation_items ci JOIN rg_conversations c"
                        " ON c.id = ci.conversation_id WHERE c.owner = ? AND ci.id = ? LIMIT 1",
                        owner,
                        item_id,
                    )
                if row is not None:
                    found[item_id] = orjson.loads(row[0])
        out = list(items)
        for index, item_id in wanted:
            if item_id not in found:
                raise ItemReferenceNotFound(item_id, index)
            out[index] = found[item_id]
        for index, item_id in bare:
            stored = found.get(item_id)
            if stored is not None and stored.get("type") == "reasoning":
                out[index] = stored
        return out

    # ------------------------------------------------------------------------------ events
    def recorder(self, response_id: str) -> EventRecorder:
        """The writer of one running response's events (see :class:`EventRecorder`)."""
        return EventRecorder(self, response_id)

    def _mark_dirty(self, recorder: EventRecorder) -> None:
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
        taken: list[tuple[EventRecorder, list[JSON]]] = []
        dirty, self._dirty = self._dirty, {}
        for recorder in dirty:
            if recorder._lock.locked():
                # It is writing on its own (its end, or a flush): it takes its pending events itself.
                if recorder._pending:
                    self._dirty[recorder] = None
                continue
            await recorder._lock.acquire()  # free, checked just above: this does not suspend
            events, recorder._pending = recorder._pending, []
            taken.append((recorder, events))
        try:
            batches = [(r.response_id, events) for r, events in taken if events]
            if batches:
                await self._write_batches(batches)
        except BaseException:
            for recorder, events in taken:
                recorder._pending[:0] = events
                if recorder._pending and not recorder._done:
                    self._dirty[recorder] = None
            raise
        finally:
            for recorder, _ in taken:
                recorder._lock.release()

    async def _write_batches(self, batches: list[tuple[str, list[JSON]]]) -> None:
        """Append the events of several running responses (and their in-progress snapshots) at once."""
        sizes: dict[str, int] = {}
        if self.max_response_bytes is not None:
            limited = []
            for rid, events in batches:
                kept, _, sizes[rid] = self._within_limit(rid, events, None)
                limited.append((rid, kept))
            batches = limited
        await self._write_batches_within_limit(batches)
        self._sizes.update(sizes)

    async def _write_batches_within_limit(self, batches: list[tuple[str, list[JSON]]]) -> None:
        if self.db.dialect == "sqlite":
            snapshots = [_snapshot_of(events) for _, events in batches]
            if not any(snap is not None and snap.get("status") in TERMINAL for snap in snapshots):
                await self._write_batches_sqlite(batches, snapshots)
                return
        ids = list(dict.fromkeys(rid for rid, _ in batches))
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
            rows_out: list[tuple[str, int, str]] = []
            for rid, events in batches:
                current = status.get(rid)
                # Deleted, or already ended (cancelled while queued, failed by recovery): nothing to add.
                if current not in RUNNING:
                    continue
                rows_out.extend((rid, int(e["sequence_number"]), _dumps(e)) for e in events)
                snapshot = _snapshot_of(events)
                if snapshot is not None and snapshot.get("status") in TRANSITIONS[current]:
                    if snapshot["status"] in TERMINAL:
                        await self._write_final(tx, rid, snapshot)
                        status[rid] = str(snapshot["status"])
                    else:
                        await tx.write(
                            "UPDATE rg_responses SET status = ?, response = ?, updated_at = ? WHERE id = ?",
                            snapshot["status"],
                            _dumps(snapshot),
                            time.time(),
                            rid,
                        )
                        status[rid] = str(snapshot["status"])
            if rows_out:
                await tx.writemany(
                    "INSERT INTO rg_events (response_id, seq, event) VALUES (?, ?, ?)", rows_out
                )

    async def _write_batches_sqlite(
        self, batches: list[tuple[str, list[JSON]]], snapshots: list[JSON | None]
    ) -> None:
        """:meth:`_write_batches` in one trip to the database thread: each statement checks the status
        itself. ``BEGIN IMMEDIATE`` holds the file's write lock, so no other writer (another process
        included) can change a status between those checks and the commit."""
        async with self.db.transaction() as tx:
            rows = [
                (rid, int(e["sequence_number"]), _dumps(e), rid) for rid, events in batches for e in events
            ]
            if rows:
                # Deleted, or already ended (cancelled while queued, failed by recovery): nothing is added.
                await tx.writemany(_INSERT_EVENT_IF_RUNNING, rows)
            for (rid, _), snapshot in zip(batches, snapshots, strict=True):
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
                    _dumps(snapshot),
                    time.time(),
                    rid,
                    *sources,
                )

    async def _write_events(self, response_id: str, events: list[JSON], final: JSON | None) -> bool:
        """Append events and apply the latest lifecycle snapshot among them, in one transaction."""
        snapshot = final if final is not None else _snapshot_of(events)
        size = None
        if self.max_response_bytes is not None:
            events, snapshot, size = self._within_limit(response_id, events, snapshot)
            if response_id in self._over and snapshot is not None and snapshot.get("status") in TERMINAL:
                events, snapshot = await self._end_over_limit(response_id, events, snapshot)
        written = await self._write_events_within_limit(response_id, events, snapshot)
        if size is not None:
            if snapshot is not None and snapshot.get("status") in TERMINAL:
                self._sizes.pop(response_id, None)
                self._over.pop(response_id, None)
            else:
                self._sizes[response_id] = size
        return written

    def _within_limit(
        self, response_id: str, events: list[JSON], snapshot: JSON | None
    ) -> tuple[list[JSON], JSON | None, int]:
        """The events to store for ``response_id`` within ``max_response_bytes``, and its size after
        them (recorded by the caller once written, so a retried write is not counted twice). Past the
        limit nothing more of the response is stored; the client's stream is not affected (see
        :meth:`_end_over_limit` for its end)."""
        limit = self.max_response_bytes
        size = self._sizes.get(response_id, 0)
        if limit is None:
            return events, snapshot, size
        if response_id in self._over:
            return [], snapshot, size
        for i, event in enumerate(events):
            size += len(_dumps(event))
            if size > limit:
                self._over[response_id] = int(event["sequence_number"]) - 1
                return events[:i], snapshot, size
        return events, snapshot, size

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
        self, response_id: str, events: list[JSON], snapshot: JSON | None
    ) -> bool:
        async with self.db.transaction() as tx:
            if (
                self.db.dialect == "sqlite"
                and snapshot is not None
                and snapshot.get("status") in TERMINAL
                and await self._end_in_one_trip(tx, response_id, events, snapshot)
            ):
                return True
            row = await tx.fetchone(
                "SELECT status, owner, conversation_id FROM rg_responses WHERE id = ?" + self.db.for_update,
                response_id,
            )
            # Deleted, or already ended (cancelled while queued, failed by recovery): nothing to add.
            if row is None or row[0] not in RUNNING:
                return False
            if events:
                await tx.writemany(
                    "INSERT INTO rg_events (response_id, seq, event) VALUES (?, ?, ?)",
                    [(response_id, int(e["sequence_number"]), _dumps(e)) for e in events],
                )
            if snapshot is not None and snapshot.get("status") in TRANSITIONS[row[0]]:
                if snapshot["status"] in TERMINAL:
                    await self._write_final(tx, response_id, snapshot, owner=(row[1], row[2]))
                else:
                    await tx.write(
                        "UPDATE rg_responses SET status = ?, response = ?, updated_at = ? WHERE id = ?",
                        snapshot["status"],
                        _dumps(snapshot),
                        time.time(),
                        response_id,
                    )
        return True

    async def _end_in_one_trip(self, tx: Tx, response_id: str, events: list[JSON], response: JSON) -> bool:
        """The end of a running response outside any conversation, as one trip to the SQLite thread.

        What :meth:`_write_events` + :meth:`_write_final` do, with every statement checking for itself
        that the response is still running and in no conversation (``BEGIN IMMEDIATE`` holds the file's
        write lock, so that cannot change in between); the final UPDATE comes last and says whether it
        all applied. False: nothing was written (the caller goes the general way, same transaction).
        """
        args = (response_id,)
        outputs = [_with_id(item) for item in response.get("output") or []]
        await tx.write(
            "DELETE FROM rg_items WHERE response_id = ? AND kind = 1 AND EXISTS (" + _RUNNING_ALONE + ")",
            response_id,
            *args,
        )
        if outputs:
            await tx.writemany(
                "INSERT INTO rg_items (response_id, kind, position, id, owner, item)"
                " SELECT ?, ?, ?, ?, owner, ? FROM rg_responses WHERE id = ?"
                " AND status IN ('queued', 'in_progress') AND conversation_id IS NULL",
                [
                    (response_id, _OUTPUT, i, it["id"], _dumps(it), response_id)
                    for i, it in enumerate(outputs)
                ],
            )
        if events:
            await tx.writemany(
                "INSERT INTO rg_events (response_id, seq, event) SELECT ?, ?, ? WHERE EXISTS ("
                + _RUNNING_ALONE
                + ")",
                [(response_id, int(e["sequence_number"]), _dumps(e), response_id) for e in events],
            )
        changed = await tx.execute(
            "UPDATE rg_responses SET status = ?, response = ?, updated_at = ?, cancel_requested = 0"
            " WHERE id = ? AND status IN ('queued', 'in_progress') AND conversation_id IS NULL",
            response["status"],
            _dumps(response),
            time.time(),
            response_id,
        )
        return changed > 0

    async def _write_final(
        self, tx: Tx, response_id: str, response: JSON, *, owner: tuple[Any, Any] | None = None
    ) -> None:
        """Final status, output items and the conversation append of a finished turn.

        ``owner``: the response's (owner, conversation_id) when the caller has read them already.
        """
        await tx.write(
            "UPDATE rg_responses SET status = ?, response = ?, updated_at = ?, cancel_requested = 0"
            " WHERE id = ?",
            response["status"],
            _dumps(response),
            time.time(),
            response_id,
        )
        row = owner
        if row is None:
            row = await tx.fetchone(
                "SELECT owner, conversation_id FROM rg_responses WHERE id = ?", response_id
            )
            if row is None:
                return
        owner_id, conversation_id = row
        outputs = [_with_id(item) for item in response.get("output") or []]
        await tx.write("DELETE FROM rg_items WHERE response_id = ? AND kind = 1", response_id)
        await tx.writemany(
            _INSERT_ITEM,
            [(response_id, _OUTPUT, i, it["id"], owner_id, _dumps(it)) for i, it in enumerate(outputs)],
        )
        # Only turns that produced an answer join the conversation (as OpenAI does).
        if conversation_id is not None and response["status"] in ("completed", "incomplete"):
            inputs = await tx.fetch(
                "SELECT item FROM rg_items WHERE response_id = ? AND kind = 0 ORDER BY position", response_id
            )
            turn = [orjson.loads(text) for (text,) in inputs] + outputs
            if await tx.fetchone(
                "SELECT 1 FROM rg_conversations WHERE id = ?" + self.db.for_update, conversation_id
            ):
                await self._append_conversation(tx, conversation_id, turn)

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
            events = [orjson.loads(text) for (text,) in rows]
            if any(has_refs(event) for event in events):
                # A compacted response: its events point into the final Response.
                stored = await tx.fetchone("SELECT response FROM rg_responses WHERE id = ?", response_id)
                assert stored is not None
                whole = await _whole_response(tx, response_id, stored[0])
                events = [expand(event, whole) if has_refs(event) else event for event in events]
        return str(row[0]), events

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
                    [(_dumps(event), response_id, rows[i][0]) for i, event in changed.items()],
                )
            if response["output"] and [orjson.loads(text) for (text,) in items] == response["output"]:
                await tx.write(
                    "UPDATE rg_responses SET response = ? WHERE id = ?",
                    _dumps({**response, "output": OUTPUT_IN_ITEMS}),
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

    # ------------------------------------------------------------------------------ conversations
    async def _conversation_row(self, tx: Tx, owner: str, conversation_id: str) -> tuple[Any, ...]:
        row = await tx.fetchone(
            "SELECT id, created_at, metadata FROM rg_conversations WHERE id = ? AND owner = ?",
            conversation_id,
            owner,
        )
        if row is None:
            raise ConversationNotFound(conversation_id)
        return row

    @staticmethod
    def _conversation(row: tuple[Any, ...]) -> JSON:
        return {
            "id": row[0],
            "object": "conversation",
            "created_at": int(row[1]),
            "metadata": orjson.loads(row[2]),
        }

    async def _append_conversation(self, tx: Tx, conversation_id: str, items: list[JSON]) -> list[JSON]:
        row = await tx.fetchone(
            "SELECT MAX(position) FROM rg_conversation_items WHERE conversation_id = ?", conversation_id
        )
        start = 0 if row is None or row[0] is None else int(row[0]) + 1
        stored = [_with_id(item) for item in items]
        await tx.executemany(
            "INSERT INTO rg_conversation_items (conversation_id, position, id, item) VALUES (?, ?, ?, ?)",
            [(conversation_id, start + i, it["id"], _dumps(it)) for i, it in enumerate(stored)],
        )
        return stored

    async def create_conversation(
        self, owner: str, *, items: list[JSON] | None = None, metadata: JSON | None = None
    ) -> JSON:
        """``POST /v1/conversations``: a new conversation, optionally seeded with items."""
        conversation_id = new_id("conv")
        created_at = int(time.time())
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_conversations (id, owner, created_at, metadata) VALUES (?, ?, ?, ?)",
                conversation_id,
                owner,
                created_at,
                _dumps(metadata or {}),
            )
            if items:
                resolved = await self.resolve_item_references(owner, items)
                await self._append_conversation(tx, conversation_id, resolved)
        return {
            "id": conversation_id,
            "object": "conversation",
            "created_at": created_at,
            "metadata": metadata or {},
        }

    async def get_conversation(self, owner: str, conversation_id: str) -> JSON:
        async with self.db.transaction() as tx:
            return self._conversation(await self._conversation_row(tx, owner, conversation_id))

    async def update_conversation(self, owner: str, conversation_id: str, metadata: JSON) -> JSON:
        """``POST /v1/conversations/{id}``: replace the metadata."""
        async with self.db.transaction() as tx:
            await self._conversation_row(tx, owner, conversation_id)
            await tx.execute(
                "UPDATE rg_conversations SET metadata = ? WHERE id = ?", _dumps(metadata), conversation_id
            )
            return self._conversation(await self._conversation_row(tx, owner, conversation_id))

    async def delete_conversation(self, owner: str, conversation_id: str) -> JSON:
        async with self.db.transaction() as tx:
            await self._conversation_row(tx, owner, conversation_id)
            await tx.execute("DELETE FROM rg_conversation_items WHERE conversation_id = ?", conversation_id)
            await tx.execute("DELETE FROM rg_conversations WHERE id = ?", conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_conversation_items(self, owner: str, conversation_id: str, items: list[JSON]) -> JSON:
        """``POST /v1/conversations/{id}/items``: the added items as a list page."""
        resolved = await self.resolve_item_references(owner, items)
        async with self.db.transaction() as tx:
            await tx.fetchone(
                "SELECT 1 FROM rg_conversations WHERE id = ?" + self.db.for_update, conversation_id
            )
            await self._conversation_row(tx, owner, conversation_id)
            stored = await self._append_conversation(tx, conversation_id, resolved)
        page = _page(stored, len(stored) or 1)
        page["has_more"] = False
        return page

    async def list_conversation_items(
        self,
        owner: str,
        conversation_id: str,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: str = "desc",
        include: Iterable[str] = (),
    ) -> JSON:
        """``GET /v1/conversations/{id}/items``."""
        _check_page_args(limit, order)
        async with self.db.transaction() as tx:
            await self._conversation_row(tx, owner, conversation_id)
            rows = await self._page_rows(
                tx,
                "SELECT position, item FROM rg_conversation_items WHERE conversation_id = ?",
                "SELECT position FROM rg_conversation_items WHERE conversation_id = ? AND id = ?",
                conversation_id,
                after=after,
                before=before,
                limit=limit,
                order=order,
            )
        include = tuple(include)
        return _page([apply_include(orjson.loads(text), include) for text in rows], limit)

    async def get_conversation_item(
        self, owner: str, conversation_id: str, item_id: str, include: Iterable[str] = ()
    ) -> JSON:
        async with self.db.transaction() as tx:
            await self._conversation_row(tx, owner, conversation_id)
            row = await tx.fetchone(
                "SELECT item FROM rg_conversation_items WHERE conversation_id = ? AND id = ?"
                " ORDER BY position LIMIT 1",
                conversation_id,
                item_id,
            )
        if row is None:
            raise ItemNotFound(item_id)
        return apply_include(orjson.loads(row[0]), include)

    async def delete_conversation_item(self, owner: str, conversation_id: str, item_id: str) -> JSON:
        """``DELETE /v1/conversations/{id}/items/{item_id}``: the conversation, as OpenAI answers."""
        async with self.db.transaction() as tx:
            row = await self._conversation_row(tx, owner, conversation_id)
            deleted = await tx.execute(
                "DELETE FROM rg_conversation_items WHERE conversation_id = ? AND id = ?",
                conversation_id,
                item_id,
            )
        if not deleted:
            raise ItemNotFound(item_id)
        return self._conversation(row)


_Create = tuple[tuple[Any, ...], list[tuple[Any, ...]], "asyncio.Future[None]"]


# A compacted response's ``output`` in rg_responses: the output items (rg_items, kind 1) hold it.
OUTPUT_IN_ITEMS = {MARK: "items"}


async def _whole_response(tx: Tx, response_id: str, text: str) -> JSON:
    """The stored Response, its output read back from the output items if it was compacted."""
    response: JSON = orjson.loads(text)
    if response.get("output") == OUTPUT_IN_ITEMS:
        rows = await tx.fetch(
            "SELECT item FROM rg_items WHERE response_id = ? AND kind = 1 ORDER BY position", response_id
        )
        response["output"] = [orjson.loads(item) for (item,) in rows]
    return response


# Below this much output (as JSON) a response is left whole: its copies cost little, and compacting
# (reading its events back, rewriting them) would cost every short response more than it saves.
COMPACT_FROM_BYTES = 32 * 1024


def _worth_compacting(snapshot: JSON | None) -> bool:
    output = snapshot.get("output") if snapshot is not None else None
    return bool(output) and len(_dumps(output)) >= COMPACT_FROM_BYTES


def _settle_create(done: asyncio.Future[None], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


def _snapshot_of(events: list[JSON]) -> JSON | None:
    """The latest lifecycle snapshot (``response.created``/``in_progress``/terminal) among ``events``."""
    for event in reversed(events):
        if event.get("type") in _LIFECYCLE and isinstance(event.get("response"), dict):
            snapshot: JSON = event["response"]
            return snapshot
    return None


class EventRecorder:
    """Keeps one running response's events: live at once, in the database in batches.

    ``recorder.add_nowait(builder.take())`` after each provider step queues the events without
    waiting (safe to call from any task, and from a timer callback: order is the order of the calls).
    With the in-process live log the events are published on the spot (followers see them at once)
    and the step costs a list append: no task, no future. With Redis one pump task per response
    publishes them in order. Either way the database gets them with the store's next group write
    (every ``flush_interval`` seconds, one transaction for all running responses; see
    ``Store._write_group``), or at once when ``flush_events`` are pending. A terminal event
    (``response.completed``/``incomplete``/``failed``) is written with the final status, output items
    and conversation append in one transaction before followers see it; ``final`` overrides that
    snapshot (a stopped response stored as ``cancelled``).
    ``await recorder.add(events)`` queues and waits; :meth:`drain` waits for what is queued;
    :meth:`finish` ends a response that has no terminal event to send.
    """

    __slots__ = (
        "_closed",
        "_done",
        "_flushing",
        "_local",
        "_lock",
        "_outbox",
        "_pending",
        "_pump",
        "recorded",
        "response_id",
        "store",
    )

    def __init__(self, store: Store, response_id: str) -> None:
        self.store = store
        self.response_id = response_id
        self._outbox: list[tuple[list[JSON], JSON | None]] = []
        self._pending: list[JSON] = []
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._flushing: asyncio.Task[None] | None = None
        live = store.live
        self._local = live if isinstance(live, LocalLiveLog) else None
        self._closed = False
        self._done = False
        self.recorded = 0

    @property
    def ended(self) -> bool:
        """The final state is written (or the response was gone)."""
        return self._done

    def add_nowait(self, events: list[JSON], final: JSON | None = None) -> None:
        """Queue events (in sequence order) and, with ``final``, the end of the response."""
        if self._closed or (not events and final is None):
            return
        self.recorded += len(events)
        terminal = final is not None or any(e.get("type") in TERMINAL_EVENTS for e in events)
        if terminal:
            self._closed = True
        elif self._local is not None and not self._outbox and (self._pump is None or self._pump.done()):
            # The hot path: publish in place, leave the write to the store's group writer.
            self._local.publish_nowait(self.response_id, events)
            self._queue(events)
            return
        self._outbox.append((events, final))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run())

    def _queue(self, events: list[JSON]) -> None:
        self._pending.extend(events)
        if len(self._pending) >= self.store.flush_events:
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.get_running_loop().create_task(self.flush())
        else:
            self.store._mark_dirty(self)

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
            events, final = self._outbox.pop(0)
            if final is not None or any(e.get("type") in TERMINAL_EVENTS for e in events):
                # The end is written before followers see it: whoever reads the response after its
                # terminal event finds it finished.
                self._pending.extend(events)
                await self._end(final, events)
                return
            if events:
                await self.store.live.publish(self.response_id, events)
                self._queue(events)

    async def flush(self) -> None:
        """Write what is pending now."""
        async with self._lock:
            events, self._pending = self._pending, []
            if events:
                try:
                    await self.store._write_events(self.response_id, events, None)
                except BaseException:
                    self._pending[:0] = events  # kept for the next write (or the end)
                    raise

    async def finish(self, response: JSON) -> None:
        """End with ``response`` as the final snapshot (status cancelled, or any terminal status)."""
        self.add_nowait([], response)
        await self.drain()

    async def _end(self, final: JSON | None, last: list[JSON]) -> None:
        try:
            async with self._lock:
                events, self._pending = self._pending, []
                # The end is one transaction, so a failed attempt left nothing and is simply retried:
                # a database hiccup must not leave the response "in_progress" for good.
                written = False
                for delay in (0.1, 0.5, 2.0, None):
                    try:
                        await self.store._write_events(self.response_id, events, final)
                        written = True
                        break
                    except Exception:
                        if delay is None:
                            # The database is down for longer: the client still gets its end, and the
                            # heartbeat writes this one as soon as the database answers again.
                            log.exception(
                                "writing the end of response %s failed; will retry", self.response_id
                            )
                            self.store.retry_end_later(self.response_id, events, final)
                            break
                        await asyncio.sleep(delay)
            self._done = True
            if written and _worth_compacting(final if final is not None else _snapshot_of(events)):
                self.store.compact_soon(self.response_id)
        finally:
            self.store._dirty.pop(self, None)
            try:
                if last:
                    await self.store.live.publish(self.response_id, last)
                await self.store.live.end(self.response_id)
            finally:
                self.store._cancel.pop(self.response_id, None)
