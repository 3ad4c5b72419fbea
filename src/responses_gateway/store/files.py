"""Uploaded files' metadata (``rg_files``); their bytes live on disk (``server/files.py`` writes them).

Every operation takes ``owner`` first: another owner's file is a ``FileNotFound`` exactly like a
missing one. Pages are in ``created_at`` order, ties broken by id.
"""

from __future__ import annotations

from typing import Any

from .db import Database
from .errors import FileNotFound
from .rows import JSON, check_page_args, page
from .vector_stores import VectorStoreTables

__all__ = ["Files"]

_COLUMNS = "id, created_at, filename, purpose, bytes, expires_at"


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
                f"SELECT {_COLUMNS} FROM rg_files WHERE id = ? AND owner = ?", file_id, owner
            )
        if row is None:
            raise FileNotFound(file_id)
        return _file(row)

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, order: str
    ) -> JSON:
        check_page_args(limit, order)
        where = "owner = ?"
        args: list[Any] = [owner]
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
