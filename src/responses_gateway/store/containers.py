"""Containers shared by the gateway's instances (``rg_containers``, ``rg_container_files``).

A container's kernel (its Python variables) lives in one gateway process, its *holder*; its record and
its files' bytes live here, so that another instance given a request for the container restores its
files and takes it over (engine/tools/containers.py, docs/hosted-tools.md). What each call told the
model is in store/tool_results.py. This module is the engine's ``Catalog`` over the store.

Reads that take ``owner`` filter by it: another owner's container is simply not found.
"""

from __future__ import annotations

from typing import Any

from .db import Database
from .rows import JSON

__all__ = ["Containers"]

_COLUMNS = "id, name, created_at, last_active_at, idle_minutes, holder"


def _record(row: tuple[Any, ...]) -> JSON:
    return {
        "id": row[0],
        "name": row[1],
        "created_at": int(row[2]),
        "last_active_at": int(row[3]),
        "idle_minutes": int(row[4]),
        "holder": row[5],
    }


class Containers:
    """The containers' records and files, written by the instance ``instance_id``."""

    def __init__(self, db: Database, instance_id: str) -> None:
        self.db = db
        self.instance_id = instance_id

    # ------------------------------------------------------------------ records
    async def put(
        self,
        owner: str | None,
        cid: str,
        *,
        name: str,
        created_at: int,
        last_active_at: int,
        idle_minutes: int,
    ) -> None:
        """Record a new container, held by this instance."""
        async with self.db.transaction() as tx:
            await tx.execute(
                f"INSERT INTO rg_containers (owner, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                owner or "",
                cid,
                name,
                created_at,
                last_active_at,
                idle_minutes,
                self.instance_id,
            )

    async def get(self, owner: str | None, cid: str) -> JSON | None:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                f"SELECT {_COLUMNS} FROM rg_containers WHERE id = ? AND owner = ?", cid, owner or ""
            )
        return None if row is None else _record(row)

    async def owned(self, owner: str | None) -> list[JSON]:
        """``owner``'s containers, oldest first."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM rg_containers WHERE owner = ? ORDER BY created_at, id", owner or ""
            )
        return [_record(row) for row in rows]

    async def claim(self, cid: str, last_active_at: int) -> None:
        """This instance holds ``cid`` from now on (it restored it)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_containers SET holder = ?, last_active_at = ? WHERE id = ?",
                self.instance_id,
                last_active_at,
                cid,
            )

    async def touch(self, cid: str, last_active_at: int) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE rg_containers SET last_active_at = ? WHERE id = ?", last_active_at, cid)

    async def delete(self, cid: str) -> None:
        """The record and its files."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM rg_container_files WHERE container_id = ?", cid)
            await tx.execute("DELETE FROM rg_containers WHERE id = ?", cid)

    # ------------------------------------------------------------------ files
    async def put_file(
        self, cid: str, fid: str, *, path: str, source: str, created_at: int, data: bytes
    ) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM rg_container_files WHERE container_id = ? AND id = ?", cid, fid)
            await tx.execute(
                "INSERT INTO rg_container_files (container_id, id, path, source, created_at, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                cid,
                fid,
                path,
                source,
                created_at,
                data,
            )

    async def delete_file(self, cid: str, fid: str) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM rg_container_files WHERE container_id = ? AND id = ?", cid, fid)

    async def files(self, cid: str) -> list[JSON]:
        """A container's files with their bytes, oldest first."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id, path, source, created_at, data FROM rg_container_files "
                "WHERE container_id = ? ORDER BY created_at, id",
                cid,
            )
        return [
            {"id": r[0], "path": r[1], "source": r[2], "created_at": int(r[3]), "data": bytes(r[4])}
            for r in rows
        ]
