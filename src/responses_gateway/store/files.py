"""Uploaded files' metadata (``rg_files``); their bytes live on disk (``server/files.py`` writes them).

Every operation takes ``owner`` first: another owner's file is a ``FileNotFound`` exactly like a
missing one, and so is an expired one (``expires_at`` passed) until the sweep deletes it. Pages are
in ``created_at`` order, ties broken by id.
"""

from __future__ import annotations

import time
from typing import Any

from .db import Database
from .errors import FileNotFound
from .rows import JSON, check_page_args, page
from .vector_stores import VectorStoreTables

__all__ = ["MAX_PAGE", "Files"]

# OpenAI's Files list: ``limit`` from 1 to 10,000 (its default).
MAX_PAGE = 10_000

_COLUMNS = "id, created_at, filename, purpose, bytes, expires_at"
_LIVE = "(expires_at IS NULL OR expires_at > ?)"


def _file(row: tuple[Any, ...]) -> JSON:
    return {
        "id": row[0],
        "object": "file",
        "bytes": int(row[4]),
        "created_at": int(row[1]),
        "expires_at": None if row[5] is None else int(row[5]),
        "filename": row[2],
        "purpose": row[3],
        "status": "processed",
        "status_details": None,
    }


class Files:
    """The ``/v1/files`` operations."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_file(
        self,
        owner: str,
        file_id: str,
        *,
        filename: str,
        purpose: str,
        size: int,
        created_at: int,
        expires_at: int | None = None,
    ) -> JSON:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_files (id, owner, created_at, filename, purpose, bytes, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                file_id,
                owner,
                created_at,
                filename,
                purpose,
                size,
                expires_at,
            )
        return _file((file_id, created_at, filename, purpose, size, expires_at))

    async def get_file(self, owner: str, file_id: str) -> JSON:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                f"SELECT {_COLUMNS} FROM rg_files WHERE id = ? AND owner = ? AND {_LIVE}",
                file_id,
                owner,
                int(time.time()),
            )
        if row is None:
            raise FileNotFound(file_id)
        return _file(row)

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, order: str
    ) -> JSON:
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
        check_page_args(1, order)
        where = f"owner = ? AND {_LIVE}"
        args: list[Any] = [owner, int(time.time())]
        if purpose is not None:
            where += " AND purpose = ?"
            args.append(purpose)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        async with self.db.transaction() as tx:
            if after is not None:
                cursor = await tx.fetchone(
                    "SELECT created_at, id FROM rg_files WHERE id = ? AND owner = ?", after, owner
                )
                if cursor is None:
                    raise FileNotFound(after)
                where += f" AND (created_at {op} ? OR (created_at = ? AND id {op} ?))"
                args += [cursor[0], cursor[0], cursor[1]]
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM rg_files WHERE {where} "
                f"ORDER BY created_at {direction}, id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
        return page([_file(row) for row in rows], limit)

    async def delete_file(self, owner: str, file_id: str) -> list[str]:
        """Delete the file and, in the same transaction, detach it from every vector store holding it
        (its chunks are no longer searchable), as OpenAI does; the vector stores it left."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone("SELECT id FROM rg_files WHERE id = ? AND owner = ?", file_id, owner)
            if row is None:
                raise FileNotFound(file_id)
            await tx.execute("DELETE FROM rg_files WHERE id = ?", file_id)
            return await VectorStoreTables(self.db).detach_everywhere(tx, owner, file_id)

    async def expired_files(self, now: int, limit: int) -> list[str]:
        """Up to ``limit`` ids of files whose ``expires_at`` has passed, soonest expired first."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id FROM rg_files WHERE expires_at <= ? ORDER BY expires_at, id LIMIT ?", now, limit
            )
        return [str(row[0]) for row in rows]

    async def delete_expired(self, file_id: str, now: int) -> bool:
        """Delete the file if it is still there and expired at ``now``, detaching it from the vector
        stores that hold it (like :meth:`delete_file`); False when another sweep was first."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT owner FROM rg_files WHERE id = ? AND expires_at <= ?" + self.db.for_update,
                file_id,
                now,
            )
            if row is None:
                return False
            await tx.execute("DELETE FROM rg_files WHERE id = ?", file_id)
            await VectorStoreTables(self.db).detach_everywhere(tx, str(row[0]), file_id)
        return True
