"""What each hosted call told the model (``rg_tool_results``), for later turns on any instance.

The engine's ``ResultCatalog`` (engine/results.py): code_interpreter's logs, file_search's passages
(with the hits it cites from as ``extra``), web_search's pages. Every read and write takes ``owner``:
another owner's call is simply unknown. Rows older than 30 days are pruned as new ones are written.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .db import Database

__all__ = ["RESULT_SECONDS", "ToolResults"]

# What the model was told of a call is kept this long (seconds) after the call.
RESULT_SECONDS = 30 * 24 * 3600
_PRUNE_EVERY = 1000


class ToolResults:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._written = 0

    async def put_result(
        self, owner: str | None, item_id: str, call_id: str, text: str, extra: Any = None
    ) -> None:
        now = int(time.time())
        self._written += 1
        stored = None if extra is None else orjson.dumps(extra).decode()
        async with self.db.transaction() as tx:
            await tx.execute(
                "DELETE FROM rg_tool_results WHERE owner = ? AND item_id = ?", owner or "", item_id
            )
            await tx.execute(
                "INSERT INTO rg_tool_results (owner, item_id, call_id, result, extra, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                owner or "",
                item_id,
                call_id,
                text,
                stored,
                now,
            )
            if self._written % _PRUNE_EVERY == 1:
                await tx.execute("DELETE FROM rg_tool_results WHERE created_at < ?", now - RESULT_SECONDS)

    async def result(self, owner: str | None, item_id: str) -> tuple[str, str, Any] | None:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT call_id, result, extra FROM rg_tool_results WHERE owner = ? AND item_id = ?",
                owner or "",
                item_id,
            )
        if row is None:
            return None
        return str(row[0]), str(row[1]), None if row[2] is None else orjson.loads(row[2])
