"""A second connection to the store's SQLite file that can load extensions (sqlite-vec).

Python's own ``sqlite3`` is often built without ``enable_load_extension`` (pyenv's and many
distributions' are), so the vector tables are reached through ``apsw``, whose wheel bundles a
SQLite that loads them. Same file, same WAL: the vector stores' tables live next to the rest of the
store; only this connection touches the ``vec0`` tables. It has the :class:`Database` interface, so
the vector store code is written once for SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from .db import Database, Row, Tx

__all__ = ["ExtensionSqliteDatabase", "extensions_unavailable"]

T = TypeVar("T")


def extensions_unavailable() -> str | None:
    """None when apsw and sqlite-vec are installed, else what is missing."""
    try:
        import apsw  # noqa: F401
        import sqlite_vec  # noqa: F401
    except ImportError as exc:
        return f"the vector index needs the 'apsw' and 'sqlite-vec' packages ({exc})"
    return None


class _Tx(Tx):
    def __init__(self, db: ExtensionSqliteDatabase) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> int:
        def run(conn: Any) -> int:
            conn.execute(sql, args)
            return int(conn.changes())

        return await self._db.call(run)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.call(lambda conn: conn.executemany(sql, [tuple(r) for r in rows]))

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return await self._db.call(lambda conn: [tuple(r) for r in conn.execute(sql, args)])


class ExtensionSqliteDatabase(Database):
    """``path`` opened with apsw and sqlite-vec loaded; one thread, one transaction at a time."""

    dialect = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rg-sqlite-vec")
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def call(self, fn: Callable[[Any], T]) -> T:
        if self._conn is None:
            raise RuntimeError("the vector index is not open")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, self._conn)

    async def open(self) -> None:
        def connect() -> Any:
            import apsw
            import sqlite_vec

            conn = apsw.Connection(self.path)
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            return conn

        self._conn = await asyncio.get_running_loop().run_in_executor(self._thread, connect)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, conn.close)
        self._thread.shutdown(wait=True)

    @asynccontextmanager
    async def transaction(self, *, first: bool = False) -> AsyncIterator[Tx]:
        async with self._lock:
            await self.call(lambda conn: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield _Tx(self)
                await self.call(lambda conn: conn.execute("COMMIT"))
            except BaseException:
                await asyncio.shield(self.call(_rollback))
                raise


def _rollback(conn: Any) -> None:
    if not conn.getautocommit():
        conn.execute("ROLLBACK")
