"""A statement run straight against a test gateway's database (SQLite file or PostgreSQL URL), to
look at or change what the gateway stored behind its back."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any


def sql(url: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """``statement``'s rows; ``?`` placeholders on both databases."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://") :], timeout=30) as conn:
            return conn.execute(statement, args).fetchall()

    async def run() -> list[tuple[Any, ...]]:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            marked = statement
            for n in range(1, len(args) + 1):
                marked = marked.replace("?", f"${n}", 1)
            return [tuple(r) for r in await conn.fetch(marked, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())
