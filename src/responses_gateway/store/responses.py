"""Stored responses (``rg_responses``, ``rg_items``): create, read, delete, cancel, input items, the
input a turn is given (``previous_response_id`` chains, conversations, ``item_reference``), expiry.

:func:`write_final` is the end of a turn (final status, output items, conversation append), shared by
the event writer (store/events.py) and crash recovery (store/lease.py) inside their transactions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import orjson

from .batches import Batches
from .compaction import MARK
from .conversations import append_conversation_items, conversation_row
from .db import Database, Tx
from .errors import PreviousResponseNotFound, ResponseNotFound
from .live import LiveLog
from .references import resolve_item_references
from .rows import (
    INPUT,
    JSON,
    OUTPUT,
    RUNNING,
    TERMINAL,
    apply_include,
    check_page_args,
    dumps,
    page,
    page_rows,
    with_id,
)

__all__ = ["OUTPUT_IN_ITEMS", "CancelSignals", "Responses", "whole_response", "write_final"]

log = logging.getLogger("responses_gateway.store")

_INSERT_RESPONSE = (
    "INSERT INTO rg_responses (id, owner, created_at, status, background, previous_response_id,"
    " conversation_id, request, response, instance_id, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_ITEM = "INSERT INTO rg_items (response_id, kind, position, id, owner, item) VALUES (?, ?, ?, ?, ?, ?)"

# A compacted response's ``output`` in rg_responses: the output items (rg_items, kind 1) hold it.
OUTPUT_IN_ITEMS = {MARK: "items"}

_Create = tuple[tuple[Any, ...], list[tuple[Any, ...]], "asyncio.Future[None]"]


async def whole_response(tx: Tx, response_id: str, text: str) -> JSON:
    """The stored Response, its output read back from the output items if it was compacted."""
    response: JSON = orjson.loads(text)
    if response.get("output") == OUTPUT_IN_ITEMS:
        rows = await tx.fetch(
            "SELECT item FROM rg_items WHERE response_id = ? AND kind = 1 ORDER BY position", response_id
        )
        response["output"] = [orjson.loads(item) for (item,) in rows]
    return response


async def write_final(
    db: Database, tx: Tx, response_id: str, response: JSON, *, owner: tuple[Any, Any] | None = None
) -> None:
    """Final status, output items and the conversation append of a finished turn.

    ``owner``: the response's (owner, conversation_id) when the caller has read them already.
    """
    await tx.write(
        "UPDATE rg_responses SET status = ?, response = ?, updated_at = ?, cancel_requested = 0 WHERE id = ?",
        response["status"],
        dumps(response),
        time.time(),
        response_id,
    )
    row = owner
    if row is None:
        row = await tx.fetchone("SELECT owner, conversation_id FROM rg_responses WHERE id = ?", response_id)
        if row is None:
            return
    owner_id, conversation_id = row
    outputs = [with_id(item) for item in response.get("output") or []]
    await tx.write("DELETE FROM rg_items WHERE response_id = ? AND kind = 1", response_id)
    await tx.writemany(
        _INSERT_ITEM,
        [(response_id, OUTPUT, i, it["id"], owner_id, dumps(it)) for i, it in enumerate(outputs)],
    )
    # Only turns that produced an answer join the conversation (as OpenAI does).
    if conversation_id is not None and response["status"] in ("completed", "incomplete"):
        inputs = await tx.fetch(
            "SELECT item FROM rg_items WHERE response_id = ? AND kind = 0 ORDER BY position", response_id
        )
        turn = [orjson.loads(text) for (text,) in inputs] + outputs
        if await tx.fetchone("SELECT 1 FROM rg_conversations WHERE id = ?" + db.for_update, conversation_id):
            await append_conversation_items(tx, conversation_id, turn)


class CancelSignals:
    """One ``asyncio.Event`` per running response, set when a cancel for it arrives from any instance
    (the live log's broadcast, or the heartbeat's ``cancel_requested`` sweep); its worker watches it."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, response_id: str) -> asyncio.Event:
        event = self._events.get(response_id)
        if event is None:
            event = self._events[response_id] = asyncio.Event()
        return event

    def signal(self, response_id: str) -> None:
        """A cancel arrived: wake the worker of ``response_id`` if it runs here."""
        event = self._events.get(response_id)
        if event is not None:
            event.set()

    def forget(self, response_id: str) -> None:
        """The response ended (or never began): nothing watches it any more."""
        self._events.pop(response_id, None)


class Responses:
    """The Responses API's side of the store; every public read or write takes ``owner`` first."""

    def __init__(
        self,
        db: Database,
        live: LiveLog,
        cancels: CancelSignals,
        *,
        instance_id: str,
        background: set[asyncio.Task[None]],
    ) -> None:
        self.db = db
        self.live = live
        self.cancels = cancels
        self.instance_id = instance_id
        # The store's background tasks (awaited by Store.close): here, discards of abandoned creates.
        self._background = background
        # Creates waiting for the next shared transaction: everything that queued up while one was being
        # written goes in the next (one trip to the database for all the responses starting meanwhile).
        # If a shared write fails, each is retried alone so one bad row fails only its own request; a
        # create whose caller went away while it was being written is discarded again (_created).
        self._creates: Batches[_Create, None] = Batches(
            self._insert_batch, self._settle_created, "rg-store-create"
        )
        # Creates written behind the first events (create_behind), by response id, until done.
        self._behind: dict[str, asyncio.Future[None]] = {}

    # ------------------------------------------------------------------------------ create
    async def create_response(
        self, owner: str, response: JSON, *, request: JSON, input_items: list[JSON]
    ) -> None:
        """Record a new (queued or in-progress) response run by this instance, with its input items.

        ``input_items`` are this turn's items with references already resolved (see
        :meth:`resolve_input`); items without an ``id`` get one. ``response`` is the snapshot from
        ``new_response``; its ``previous_response_id`` and ``conversation`` link the turn.
        """
        row, items = self._rows(owner, response, request, input_items)
        conversation_id = row[6]
        if conversation_id is not None:
            async with self.db.transaction() as tx:
                await conversation_row(tx, owner, conversation_id)
                await tx.write(_INSERT_RESPONSE, *row)
                await tx.writemany(_INSERT_ITEM, items)
            return
        entry = self._queue_create(row, items)
        try:
            await entry[2]
        except asyncio.CancelledError:
            self._creates.withdraw(entry)
            raise

    def _rows(
        self, owner: str, response: JSON, request: JSON, input_items: list[JSON]
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        """The ``rg_responses`` row and the ``rg_items`` rows of a new response."""
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
            dumps(request),
            dumps(response),
            self.instance_id,
            time.time(),
        )
        items = [
            (rid, INPUT, i, it["id"], owner, dumps(it)) for i, it in enumerate(map(with_id, input_items))
        ]
        return row, items

    def _queue_create(self, row: tuple[Any, ...], items: list[tuple[Any, ...]]) -> _Create:
        """Queue a create for the next shared transaction (see ``_creates``)."""
        entry: _Create = (row, items, asyncio.get_running_loop().create_future())
        self._creates.put(entry)
        return entry

    def create_behind(
        self, owner: str, response: JSON, *, request: JSON, input_items: list[JSON]
    ) -> asyncio.Future[None]:
        """:meth:`create_response` without waiting: the returned future is done once the row is
        written (or holds why it was not), so the caller can send its first events meanwhile (the
        store's added first-event latency under load was this wait). Until it is done, this
        instance's reads of the response wait for it (:meth:`settled`); its recorder must be told
        (``EventRecorder.behind``) so no event is written before the row. Another instance asking in
        that window (a few ms) does not find the response yet. Not for a conversation's turn (its
        create checks the conversation first; callers await :meth:`create_response`)."""
        row, items = self._rows(owner, response, request, input_items)
        if row[6] is not None:
            raise ValueError("a conversation's turn is created with create_response")
        rid = str(row[0])
        done = self._queue_create(row, items)[2]
        self._behind[rid] = done
        done.add_done_callback(lambda _: self._behind.pop(rid, None))
        return done

    async def settled(self, response_id: str) -> None:
        """Wait for a create of ``response_id`` still being written here (see :meth:`create_behind`)."""
        task = self._behind.get(response_id)
        if task is not None:
            await asyncio.wait([task])

    async def _insert_batch(self, batch: list[_Create]) -> list[None]:
        await self._insert_responses(batch)
        return [None] * len(batch)

    def _settle_created(self, entry: _Create, outcome: BaseException | None) -> None:
        if isinstance(outcome, BaseException):
            if not entry[2].done():
                entry[2].set_exception(outcome)
        else:
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

    # ------------------------------------------------------------------------------ read, delete
    async def get_response(self, owner: str, response_id: str, include: Iterable[str] = ()) -> JSON:
        """The stored Response object; encrypted reasoning and logprobs only if ``include`` asks."""
        await self.settled(response_id)
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT response FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner
            )
            if row is None:
                raise ResponseNotFound(response_id)
            response = await whole_response(tx, response_id, row[0])
        include = tuple(include)
        response["output"] = [apply_include(item, include) for item in response.get("output") or []]
        return response

    async def delete_response(self, owner: str, response_id: str) -> JSON:
        """Delete a response with its items and events; a running one is also told to stop."""
        await self.settled(response_id)
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
        await self.settled(response_id)
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM rg_items WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_events WHERE response_id = ?", response_id)
            await tx.execute("DELETE FROM rg_responses WHERE id = ?", response_id)
        self.cancels.forget(response_id)

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
        await self.settled(response_id)
        check_page_args(limit, order)
        async with self.db.transaction() as tx:
            if (
                await tx.fetchone("SELECT 1 FROM rg_responses WHERE id = ? AND owner = ?", response_id, owner)
                is None
            ):
                raise ResponseNotFound(response_id)
            rows = await page_rows(
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
        return page([apply_include(orjson.loads(text), include) for text in rows], limit)

    # ------------------------------------------------------------------------------ cancellation
    async def cancel_response(self, owner: str, response_id: str, *, wait: float = 5.0) -> JSON:
        """Ask the response to stop (wherever it runs); its snapshot once cancelled or after ``wait`` s."""
        await self.settled(response_id)
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
                await write_final(self.db, tx, response_id, response)
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
            await self.settled(previous_response_id)
            context = await self._chain_items(owner, previous_response_id)
        elif conversation_id is not None:
            async with self.db.transaction() as tx:
                await conversation_row(tx, owner, conversation_id)
                rows = await tx.fetch(
                    "SELECT item FROM rg_conversation_items WHERE conversation_id = ? ORDER BY position",
                    conversation_id,
                )
            context = [orjson.loads(text) for (text,) in rows]
        return context, await resolve_item_references(self.db, owner, input_items)

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

    # ------------------------------------------------------------------------------ retention
    async def expire(self, retention: float, *, now: float | None = None, batch: int = 500) -> int:
        """Delete finished responses created more than ``retention`` seconds ago, with their items and
        events, a batch per transaction; the number deleted (see ``Store.expire``)."""
        cutoff = int((time.time() if now is None else now) - retention)
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
