"""``item_reference`` resolution: a stored item found by id, in a response or a conversation.

Shared by the responses (a turn's input) and the conversations (items added to one), which is why it
is neither's.
"""

from __future__ import annotations

import orjson

from .db import Database
from .errors import ItemReferenceNotFound
from .rows import JSON

__all__ = ["resolve_item_references"]


async def resolve_item_references(db: Database, owner: str, items: list[JSON]) -> list[JSON]:
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
    async with db.transaction() as tx:
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
