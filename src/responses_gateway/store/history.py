"""One owner's stored responses and conversations, listed (``GET /v1/gateway/responses`` and
``GET /v1/gateway/conversations``, the gateway's own extensions).

OpenAI has no endpoint listing responses or conversations; the web UI's history needs them. A page
of responses is a summary per response (id, times, status, model, usage, chain), newest first by
default, filtered by status and a ``created_at`` range in SQL and by model in Python: the model is
inside the stored Response, and the schema has no column for it, so a page scans rows in batches
until it has ``limit + 1`` matches. A page of conversations gives each one's metadata and item count.
"""

from __future__ import annotations

from typing import Any

import orjson

from .db import Database
from .errors import ConversationNotFound, ResponseNotFound
from .rows import JSON, check_page_args, page

__all__ = ["STATUSES", "History"]

STATUSES = ("queued", "in_progress", "completed", "incomplete", "failed", "cancelled")

# Rows read per query while a model filter skips rows.
_BATCH = 200


def summary(row: tuple[Any, ...]) -> JSON:
    """A response row as the history lists it; nothing of its content but a short preview."""
    rid, created_at, status, background, previous, conversation, text = row
    try:
        response = orjson.loads(text)
    except orjson.JSONDecodeError:
        response = {}
    if not isinstance(response, dict):
        response = {}
    error = response.get("error")
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created_at),
        "completed_at": response.get("completed_at"),
        "status": status,
        "model": response.get("model"),
        "background": bool(background),
        "previous_response_id": previous,
        "conversation_id": conversation,
        "usage": response.get("usage"),
        "error": error if isinstance(error, dict) else None,
    }


class History:
    """Listing stored responses by owner."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def list_responses(
        self,
        owner: str,
        *,
        model: str | None = None,
        status: str | None = None,
        created_after: int | None = None,
        created_before: int | None = None,
        after: str | None = None,
        limit: int = 20,
        order: str = "desc",
    ) -> JSON:
        """One page of ``owner``'s responses in ``created_at`` order (ties by id), after the cursor
        ``after`` (a response id); ``created_after``/``created_before`` are inclusive Unix seconds."""
        check_page_args(limit, order)
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        where = "owner = ?"
        args: list[Any] = [owner]
        if status is not None:
            where += " AND status = ?"
            args.append(status)
        if created_after is not None:
            where += " AND created_at >= ?"
            args.append(created_after)
        if created_before is not None:
            where += " AND created_at <= ?"
            args.append(created_before)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        found: list[JSON] = []
        async with self.db.transaction() as tx:
            cursor: tuple[Any, Any] | None = None
            if after is not None:
                row = await tx.fetchone(
                    "SELECT created_at, id FROM rg_responses WHERE id = ? AND owner = ?", after, owner
                )
                if row is None:
                    raise ResponseNotFound(after)
                cursor = (row[0], row[1])
            while len(found) <= limit:
                batch_where, batch_args = where, list(args)
                if cursor is not None:
                    batch_where += f" AND (created_at {op} ? OR (created_at = ? AND id {op} ?))"
                    batch_args += [cursor[0], cursor[0], cursor[1]]
                size = limit + 1 if model is None else _BATCH
                rows = await tx.fetch(
                    "SELECT id, created_at, status, background, previous_response_id, conversation_id, "
                    f"response FROM rg_responses WHERE {batch_where} "
                    f"ORDER BY created_at {direction}, id {direction} LIMIT ?",
                    *batch_args,
                    size,
                )
                for row in rows:
                    item = summary(tuple(row))
                    if model is None or item["model"] == model:
                        found.append(item)
                if len(rows) < size:
                    break
                cursor = (rows[-1][1], rows[-1][0])
        return page(found[: limit + 1], limit)

    async def list_conversations(
        self,
        owner: str,
        *,
        created_after: int | None = None,
        created_before: int | None = None,
        after: str | None = None,
        limit: int = 20,
        order: str = "desc",
    ) -> JSON:
        """One page of ``owner``'s conversations in ``created_at`` order (ties by id), each with its
        metadata and how many items it holds."""
        check_page_args(limit, order)
        where = "c.owner = ?"
        args: list[Any] = [owner]
        if created_after is not None:
            where += " AND c.created_at >= ?"
            args.append(created_after)
        if created_before is not None:
            where += " AND c.created_at <= ?"
            args.append(created_before)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        async with self.db.transaction() as tx:
            if after is not None:
                row = await tx.fetchone(
                    "SELECT created_at, id FROM rg_conversations WHERE id = ? AND owner = ?", after, owner
                )
                if row is None:
                    raise ConversationNotFound(after)
                where += f" AND (c.created_at {op} ? OR (c.created_at = ? AND c.id {op} ?))"
                args += [row[0], row[0], row[1]]
            rows = await tx.fetch(
                "SELECT c.id, c.created_at, c.metadata, (SELECT COUNT(*) FROM rg_conversation_items i"
                f" WHERE i.conversation_id = c.id) FROM rg_conversations c WHERE {where}"
                f" ORDER BY c.created_at {direction}, c.id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
        found = [
            {
                "id": row[0],
                "object": "conversation",
                "created_at": int(row[1]),
                "metadata": orjson.loads(row[2]),
                "items": int(row[3]),
            }
            for row in rows
        ]
        return page(found, limit)
