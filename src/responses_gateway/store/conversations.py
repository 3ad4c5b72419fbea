"""Conversations and their items (``rg_conversations``, ``rg_conversation_items``).

:class:`Conversations` is the Conversations API's side of the store; :func:`conversation_row` and
:func:`append_conversation_items` are the two pieces the responses use inside their own transactions
(a turn in a conversation checks it exists, and a finished turn joins it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson

from ..protocol.response import new_id
from .db import Database, Tx
from .errors import ConversationNotFound, ItemNotFound
from .references import resolve_item_references
from .rows import JSON, apply_include, check_page_args, dumps, page, page_rows, with_id

__all__ = ["Conversations", "append_conversation_items", "conversation_row"]


async def conversation_row(tx: Tx, owner: str, conversation_id: str) -> tuple[Any, ...]:
    """``(id, created_at, metadata)`` of ``owner``'s conversation, else ``ConversationNotFound``."""
    row = await tx.fetchone(
        "SELECT id, created_at, metadata FROM rg_conversations WHERE id = ? AND owner = ?",
        conversation_id,
        owner,
    )
    if row is None:
        raise ConversationNotFound(conversation_id)
    return row


async def append_conversation_items(tx: Tx, conversation_id: str, items: list[JSON]) -> list[JSON]:
    """Add ``items`` at the end of the conversation (each given an id if it has none); as stored."""
    row = await tx.fetchone(
        "SELECT MAX(position) FROM rg_conversation_items WHERE conversation_id = ?", conversation_id
    )
    start = 0 if row is None or row[0] is None else int(row[0]) + 1
    stored = [with_id(item) for item in items]
    await tx.executemany(
        "INSERT INTO rg_conversation_items (conversation_id, position, id, item) VALUES (?, ?, ?, ?)",
        [(conversation_id, start + i, it["id"], dumps(it)) for i, it in enumerate(stored)],
    )
    return stored


def _conversation(row: tuple[Any, ...]) -> JSON:
    return {
        "id": row[0],
        "object": "conversation",
        "created_at": int(row[1]),
        "metadata": orjson.loads(row[2]),
    }


class Conversations:
    """The ``/v1/conversations…`` operations; every one takes ``owner`` first."""

    def __init__(self, db: Database) -> None:
        self.db = db

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
                dumps(metadata or {}),
            )
            if items:
                resolved = await resolve_item_references(self.db, owner, items)
                await append_conversation_items(tx, conversation_id, resolved)
        return {
            "id": conversation_id,
            "object": "conversation",
            "created_at": created_at,
            "metadata": metadata or {},
        }

    async def get_conversation(self, owner: str, conversation_id: str) -> JSON:
        async with self.db.transaction() as tx:
            return _conversation(await conversation_row(tx, owner, conversation_id))

    async def update_conversation(self, owner: str, conversation_id: str, metadata: JSON) -> JSON:
        """``POST /v1/conversations/{id}``: replace the metadata."""
        async with self.db.transaction() as tx:
            await conversation_row(tx, owner, conversation_id)
            await tx.execute(
                "UPDATE rg_conversations SET metadata = ? WHERE id = ?", dumps(metadata), conversation_id
            )
            return _conversation(await conversation_row(tx, owner, conversation_id))

    async def delete_conversation(self, owner: str, conversation_id: str) -> JSON:
        async with self.db.transaction() as tx:
            await conversation_row(tx, owner, conversation_id)
            await tx.execute("DELETE FROM rg_conversation_items WHERE conversation_id = ?", conversation_id)
            await tx.execute("DELETE FROM rg_conversations WHERE id = ?", conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_conversation_items(self, owner: str, conversation_id: str, items: list[JSON]) -> JSON:
        """``POST /v1/conversations/{id}/items``: the added items as a list page."""
        resolved = await resolve_item_references(self.db, owner, items)
        async with self.db.transaction() as tx:
            await tx.fetchone(
                "SELECT 1 FROM rg_conversations WHERE id = ?" + self.db.for_update, conversation_id
            )
            await conversation_row(tx, owner, conversation_id)
            stored = await append_conversation_items(tx, conversation_id, resolved)
        added = page(stored, len(stored) or 1)
        added["has_more"] = False
        return added

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
        check_page_args(limit, order)
        async with self.db.transaction() as tx:
            await conversation_row(tx, owner, conversation_id)
            rows = await page_rows(
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
        return page([apply_include(orjson.loads(text), include) for text in rows], limit)

    async def get_conversation_item(
        self, owner: str, conversation_id: str, item_id: str, include: Iterable[str] = ()
    ) -> JSON:
        async with self.db.transaction() as tx:
            await conversation_row(tx, owner, conversation_id)
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
            row = await conversation_row(tx, owner, conversation_id)
            deleted = await tx.execute(
                "DELETE FROM rg_conversation_items WHERE conversation_id = ? AND id = ?",
                conversation_id,
                item_id,
            )
        if not deleted:
            raise ItemNotFound(item_id)
        return _conversation(row)
