"""What every part of the store shares: statuses, JSON as stored, item ids, list pages.

Pure helpers and constants (no state); the one database helper is :func:`page_rows`, the cursor
query behind every list endpoint (a response's input items, a conversation's items).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from ..protocol.response import ID_PREFIXES, new_id
from .db import Tx
from .errors import ItemNotFound

__all__ = [
    "INPUT",
    "JSON",
    "OUTPUT",
    "RUNNING",
    "TERMINAL",
    "TERMINAL_EVENTS",
    "apply_include",
    "check_page_args",
    "dumps",
    "page",
    "page_rows",
    "with_id",
]

JSON = dict[str, Any]

RUNNING = frozenset({"queued", "in_progress"})
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)

# rg_items.kind: a response's input items and its output items.
INPUT, OUTPUT = 0, 1

# Prefixes for ids the gateway gives input items that arrive without one (listing needs ids).
_EXTRA_PREFIXES = {"function_call_output": "fco", "custom_tool_call_output": "ctco", "item_reference": "ref"}


def dumps(value: Any) -> str:
    """JSON as the store keeps it (text)."""
    return orjson.dumps(value).decode()


def _item_id(item: JSON) -> str:
    kind = str(item.get("type") or "message")
    return new_id(ID_PREFIXES.get(kind) or _EXTRA_PREFIXES.get(kind) or "item")


def with_id(item: JSON) -> JSON:
    """``item``, given an id (``msg_…``, ``fc_…``, ``fco_…``) if it has none."""
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


def page(rows: list[JSON], limit: int) -> JSON:
    """``{object: "list", data, first_id, last_id, has_more}`` from up to ``limit + 1`` rows."""
    data = rows[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


def check_page_args(limit: int, order: str) -> None:
    """``ValueError`` (a 400) for a ``limit`` or ``order`` a list endpoint does not take."""
    if not 1 <= limit <= 100:
        raise ValueError("limit must be between 1 and 100")
    if order not in ("asc", "desc"):
        raise ValueError("order must be 'asc' or 'desc'")


async def page_rows(
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
