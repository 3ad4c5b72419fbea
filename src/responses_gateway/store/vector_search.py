"""Nearest chunks inside the database: sqlite-vec on SQLite, pgvector on PostgreSQL.

``rg_vs_chunks`` stays the record of every chunk and its vector (float32 bytes). Each back end
keeps a search table beside it, one per vector dimension, because both extensions type a column by
its dimension (stores may use embedders of different sizes):

- SQLite, ``rg_vs_vec_f32_<dim>`` or ``rg_vs_vec_bit_<dim>``: a sqlite-vec ``vec0`` virtual table
  partitioned by vector store (a KNN query reads only that store's vectors), the file id as a
  metadata column (attribute filters select files, ``file_id IN (…)`` inside the KNN). ``float32``
  is exact cosine; ``bit`` keeps one bit per dimension and rescores the ``RESCORE`` × wanted nearest
  by Hamming distance exactly from the chunks' float32 vectors.
- PostgreSQL, ``rg_vs_vec_pg_<dim>``: a ``vector(<dim>)`` column with an HNSW index (cosine) and a
  b-tree on (store, file). Stores under ``EXACT_BELOW`` chunks are exact scans (the b-tree finds the
  rows; ``+ 0`` on the distance keeps HNSW out); larger stores, filtered or not, use HNSW
  with ``hnsw.iterative_scan`` so the store's own rows keep coming until ``limit`` are found (an
  exact scan answers if it still comes back short).

The search tables are filled from ``rg_vs_chunks``, not by the writers: ``rg_vs_vec_sync`` (schema
version 7) records, per search table and store, the store's ``version`` the table last matched.
A search that finds the version moved first adds the store's new chunks and drops chunks that no
longer exist (chunk ids are never reused, a chunk's vector never changes), in one transaction. So a
database written by an instance without the extension, or before this version, is brought up to
date by the first search, and every instance sees the same rows. The tables are created on first
use (``IF NOT EXISTS``): they need the extension, which the schema migrations cannot assume.
"""

from __future__ import annotations

import logging
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

from .db import Database, Tx

__all__ = [
    "BACKENDS",
    "CHOICES",
    "EXACT_BELOW",
    "ITERATIVE",
    "PGVECTOR_PREFIX",
    "RESCORE",
    "Iterative",
    "PgvectorSearch",
    "SqliteVecSearch",
    "VectorSearch",
    "open_search",
]

log = logging.getLogger("responses_gateway.store")

# PostgreSQL: pgvector's search tables are this prefix and the dimension. Their rows of a store or
# file are deleted with its chunks by ``VectorStoreTables`` whatever back end the deleting instance
# runs (so a store deleted by a ``memory`` instance leaves none behind).
PGVECTOR_PREFIX = "rg_vs_vec_pg_"
# PostgreSQL: a store under this many chunks is scanned exactly.
EXACT_BELOW = 10_000
# PostgreSQL: HNSW's candidate list (bench/vector_backends.py --pg-variants, docs/file-search.md:
# stores of 10k and 100k near-duplicate chunks in one table, strict iterative scan, recall@5 against
# exact 0.80 at 100, 0.86-0.87 at 400, 0.95 at 1000, and 0.99-1.00 at 1000 with a filter keeping a
# tenth of the files (0.86 at 400), for about 20% more time than 400 at 100k; the exact scan took
# 3-4 times as long as 1000 at 100k chunks).
EF_SEARCH = 1000
# pgvector indexes ``vector`` columns of at most this many dimensions; larger ones are scanned exactly.
HNSW_MAX_DIMENSIONS = 2000
# SQLite ``bit``: how many times the wanted number of candidates the binary KNN returns for rescoring.
RESCORE = 8

Quantization = Literal["float32", "bit"]
# PostgreSQL: pgvector's ``hnsw.iterative_scan`` for large stores (``off``: one pass of ef_search).
Iterative = Literal["strict_order", "relaxed_order", "off"]
ITERATIVE: Iterative = "strict_order"
_ITERATIVE_MODES = {"strict_order": "strict_order", "relaxed_order": "relaxed_order", "off": "off"}


class VectorSearch(ABC):
    """Nearest chunk ids of one vector store inside the database, nearest first."""

    name: str

    prefix: str

    def __init__(self, db: Database) -> None:
        self.db = db
        # (table, store) -> the store version its rows match, as this process last saw it.
        self._synced: dict[tuple[str, str], int] = {}

    def table(self, dimensions: int) -> str:
        return f"{self.prefix}{int(dimensions)}"

    @abstractmethod
    async def _create(self, tx: Tx, dimensions: int) -> None: ...

    @abstractmethod
    async def _sync_rows(self, tx: Tx, table: str, store_id: str) -> None:
        """Add the store's chunks missing from ``table``; drop its rows whose chunk is gone."""

    @abstractmethod
    async def _nearest(
        self, tx: Tx, table: str, store_id: str, query: bytes, limit: int, file_ids: Sequence[str] | None
    ) -> list[int]: ...

    async def _lock(self, tx: Tx, table: str, store_id: str) -> None:  # noqa: B027 (optional)
        """Serialise two instances syncing the same store (SQLite's write lock already does)."""

    async def sync(self, store_id: str, dimensions: int, version: int | None = None) -> None:
        """Bring the store's rows of the search table up to the store's version."""
        table = self.table(dimensions)
        if version is not None and self._synced.get((table, store_id)) == version:
            return
        async with self.db.transaction() as tx:
            await self._create(tx, dimensions)
            await self._lock(tx, table, store_id)
            row = await tx.fetchone("SELECT version FROM rg_vector_stores WHERE id = ?", store_id)
            if row is None:
                return
            current = int(row[0])
            found = await tx.fetchone(
                "SELECT version FROM rg_vs_vec_sync WHERE search_table = ? AND vector_store_id = ?",
                table,
                store_id,
            )
            if found is None or int(found[0]) != current:
                await self._sync_rows(tx, table, store_id)
                await tx.execute(
                    "DELETE FROM rg_vs_vec_sync WHERE search_table = ? AND vector_store_id = ?",
                    table,
                    store_id,
                )
                await tx.execute(
                    "INSERT INTO rg_vs_vec_sync (search_table, vector_store_id, version) VALUES (?, ?, ?)",
                    table,
                    store_id,
                    current,
                )
        self._synced[(table, store_id)] = current

    async def nearest(
        self,
        store_id: str,
        query: bytes,
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]:
        """Chunk ids nearest ``query`` (little-endian float32 bytes) first; only ``file_ids``' when given."""
        if file_ids is not None and not file_ids:
            return []
        await self.sync(store_id, dimensions, version)
        table = self.table(dimensions)
        async with self.db.transaction() as tx:
            return await self._nearest(tx, table, store_id, query, limit, file_ids)

    async def forget(self, store_id: str) -> None:
        """Drop a deleted store's rows from every search table."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT search_table FROM rg_vs_vec_sync WHERE vector_store_id = ?", store_id
            )
            for (table,) in rows:
                if str(table).startswith(self.prefix):
                    await tx.execute(f"DELETE FROM {_ident(str(table))} WHERE vector_store_id = ?", store_id)
            await tx.execute("DELETE FROM rg_vs_vec_sync WHERE vector_store_id = ?", store_id)
        for key in [k for k in self._synced if k[1] == store_id]:
            del self._synced[key]


def _ident(name: str) -> str:
    """A search table's name, checked (it is built from a fixed prefix and an integer)."""
    if not name.replace("_", "").isalnum() or not name.startswith("rg_vs_vec_"):
        raise ValueError(f"not a search table: {name!r}")
    return name


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


class SqliteVecSearch(VectorSearch):
    """sqlite-vec's ``vec0`` tables (the extension loaded by ``store/sqlite_vec.py``)."""

    def __init__(self, db: Database, quantization: Quantization = "float32") -> None:
        super().__init__(db)
        self.quantization = quantization
        self.name = "sqlite-vec" if quantization == "float32" else "sqlite-vec-bit"
        self.prefix = "rg_vs_vec_f32_" if quantization == "float32" else "rg_vs_vec_bit_"

    async def _create(self, tx: Tx, dimensions: int) -> None:
        column = (
            f"embedding float[{int(dimensions)}] distance_metric=cosine"
            if self.quantization == "float32"
            else f"embedding bit[{int(dimensions)}]"
        )
        await tx.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table(dimensions)} USING vec0("
            f"chunk_id INTEGER PRIMARY KEY, vector_store_id TEXT PARTITION KEY, file_id TEXT, {column})"
        )

    async def _sync_rows(self, tx: Tx, table: str, store_id: str) -> None:
        # vec0 keeps each row's id in its ``<table>_rowids`` shadow table: a plain table, read here
        # instead of scanning the virtual table (which reads every vector).
        gone = await tx.fetch(
            f"SELECT rowid FROM {table}_rowids WHERE rowid NOT IN (SELECT id FROM rg_vs_chunks)"
        )
        for start in range(0, len(gone), 500):
            part = [int(r[0]) for r in gone[start : start + 500]]
            await tx.execute(f"DELETE FROM {table} WHERE chunk_id IN ({_marks(part)})", *part)
        vector = "embedding" if self.quantization == "float32" else "vec_quantize_binary(embedding)"
        await tx.execute(
            f"INSERT INTO {table} (chunk_id, vector_store_id, file_id, embedding) "
            f"SELECT id, vector_store_id, file_id, {vector} FROM rg_vs_chunks "
            # (No ORDER BY: a sorter drops the bit vector's subtype, and vec0 then refuses it.)
            f"WHERE vector_store_id = ? AND id NOT IN (SELECT rowid FROM {table}_rowids)",
            store_id,
        )

    async def _nearest(
        self, tx: Tx, table: str, store_id: str, query: bytes, limit: int, file_ids: Sequence[str] | None
    ) -> list[int]:
        files, extra = "", list(file_ids or [])
        if file_ids is not None:
            files = f" AND file_id IN ({_marks(extra)})"
        if self.quantization == "float32":
            rows = await tx.fetch(
                f"SELECT chunk_id, distance FROM {table} WHERE embedding MATCH ? AND k = ? "
                f"AND vector_store_id = ?{files}",
                query,
                limit,
                store_id,
                *extra,
            )
            # Ties by chunk id, as every back end orders them.
            return [int(r[0]) for r in sorted(rows, key=lambda r: (float(r[1]), int(r[0])))]
        rows = await tx.fetch(
            f"SELECT chunk_id FROM {table} WHERE embedding MATCH vec_quantize_binary(?) AND k = ? "
            f"AND vector_store_id = ?{files}",
            query,
            limit * RESCORE,
            store_id,
            *extra,
        )
        if not rows:
            return []
        ids = [int(r[0]) for r in rows]
        rescored = await tx.fetch(
            f"SELECT id FROM rg_vs_chunks WHERE id IN ({_marks(ids)}) "
            "ORDER BY vec_distance_cosine(embedding, ?), id LIMIT ?",
            *ids,
            query,
            limit,
        )
        return [int(r[0]) for r in rescored]


class PgvectorSearch(VectorSearch):
    """pgvector's ``vector`` type, HNSW (cosine) for large stores, exact scans for the rest."""

    name = "pgvector"
    prefix = PGVECTOR_PREFIX

    def __init__(
        self,
        db: Database,
        *,
        hnsw: bool = True,
        ef_search: int = EF_SEARCH,
        exact_below: int = EXACT_BELOW,
        iterative: Iterative = ITERATIVE,
        max_scan_tuples: int | None = None,
    ) -> None:
        super().__init__(db)
        self.hnsw = hnsw
        self.exact_below = exact_below
        self.iterative = iterative
        self.max_scan_tuples = max_scan_tuples
        # How many HNSW answers came back short and were replaced by the exact scan (the benchmark).
        self.exact_fallbacks = 0
        self.name = "pgvector" if hnsw else "pgvector-exact"
        self.ef_search = ef_search
        self._rows: dict[tuple[str, str], int] = {}

    async def _create(self, tx: Tx, dimensions: int) -> None:
        table = self.table(dimensions)
        hnsw = self.hnsw and dimensions <= HNSW_MAX_DIMENSIONS
        # The HNSW index too: a table made by a ``pgvector-exact`` instance has none.
        found = await tx.fetchone("SELECT to_regclass(?)::text, to_regclass(?)::text", table, f"{table}_hnsw")
        if found is not None and found[0] is not None and (found[1] is not None or not hnsw):
            return
        # Two instances creating the same table at once would collide in PostgreSQL's catalog even
        # with IF NOT EXISTS: the first to take this lock creates it, the other finds it made.
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", table)
        await tx.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (chunk_id BIGINT PRIMARY KEY, "
            "vector_store_id TEXT NOT NULL, file_id TEXT NOT NULL, "
            f"embedding vector({int(dimensions)}) NOT NULL)"
        )
        await tx.execute(f"CREATE INDEX IF NOT EXISTS {table}_by_file ON {table} (vector_store_id, file_id)")
        if hnsw:
            await tx.execute(
                f"CREATE INDEX IF NOT EXISTS {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)"
            )

    async def _lock(self, tx: Tx, table: str, store_id: str) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", f"{table}/{store_id}")

    async def _sync_rows(self, tx: Tx, table: str, store_id: str) -> None:
        await tx.execute(
            f"DELETE FROM {table} t WHERE t.vector_store_id = ? "
            "AND NOT EXISTS (SELECT 1 FROM rg_vs_chunks c WHERE c.id = t.chunk_id)",
            store_id,
        )
        missing = await tx.fetch(
            "SELECT c.id, c.file_id, c.embedding FROM rg_vs_chunks c WHERE c.vector_store_id = ? "
            f"AND NOT EXISTS (SELECT 1 FROM {table} t WHERE t.chunk_id = c.id) ORDER BY c.id",
            store_id,
        )
        await tx.executemany(
            f"INSERT INTO {table} (chunk_id, vector_store_id, file_id, embedding) "
            "VALUES (?, ?, ?, ?::real[]::vector)",
            [(int(r[0]), store_id, r[1], _floats(bytes(r[2]))) for r in missing],
        )

    async def sync(self, store_id: str, dimensions: int, version: int | None = None) -> None:
        table = self.table(dimensions)
        known = self._synced.get((table, store_id))
        await super().sync(store_id, dimensions, version)
        if known is None or known != self._synced.get((table, store_id)):
            async with self.db.transaction() as tx:
                row = await tx.fetchone(f"SELECT COUNT(*) FROM {table} WHERE vector_store_id = ?", store_id)
            self._rows[(table, store_id)] = int(row[0]) if row else 0

    async def _nearest(
        self, tx: Tx, table: str, store_id: str, query: bytes, limit: int, file_ids: Sequence[str] | None
    ) -> list[int]:
        files, extra = "", list[object]()
        if file_ids is not None:
            files = " AND file_id = ANY(?::text[])"
            extra = [list(file_ids)]
        rows_in_store = self._rows.get((table, store_id), 0)
        indexed = int(table[len(self.prefix) :]) <= HNSW_MAX_DIMENSIONS
        if self.hnsw and indexed and rows_in_store >= self.exact_below:
            await tx.execute(f"SET LOCAL hnsw.ef_search = {max(int(self.ef_search), int(limit))}")
            await tx.execute(f"SET LOCAL hnsw.iterative_scan = {_ITERATIVE_MODES[self.iterative]}")
            if self.max_scan_tuples is not None:
                await tx.execute(f"SET LOCAL hnsw.max_scan_tuples = {int(self.max_scan_tuples)}")
            found = await tx.fetch(
                f"SELECT chunk_id, embedding <=> ?::real[]::vector AS d FROM {table} "
                f"WHERE vector_store_id = ?{files} ORDER BY d LIMIT ?",
                _floats(query),
                store_id,
                *extra,
                limit,
            )
            # Iterative scans stop at hnsw.max_scan_tuples: a store that is a small part of a large
            # table, or a filter keeping few of its files, may come back short. Then the exact scan
            # below answers instead (over few rows, in that case).
            if len(found) >= min(limit, rows_in_store):
                return [int(r[0]) for r in sorted(found, key=lambda r: (float(r[1]), int(r[0])))]
            self.exact_fallbacks += 1
        # ``+ 0``: the ordering no longer matches the HNSW index, so the planner scans the store's
        # rows (through the b-tree) and sorts them exactly.
        rows = await tx.fetch(
            f"SELECT chunk_id FROM {table} WHERE vector_store_id = ?{files} "
            "ORDER BY (embedding <=> ?::real[]::vector) + 0, chunk_id LIMIT ?",
            store_id,
            *extra,
            _floats(query),
            limit,
        )
        return [int(r[0]) for r in rows]


def _floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


BACKENDS = ("sqlite-vec", "sqlite-vec-bit", "pgvector", "pgvector-exact")
# What ``serve --vector-index`` takes: these, ``memory`` (``retrieval.vector_index.VectorIndex``) and
# ``auto``. Here rather than beside the index so the command line reads it without loading numpy.
CHOICES = ("auto", "memory", *BACKENDS)


async def open_search(db: Database, backend: str) -> VectorSearch | str:
    """The in-database back end ``backend`` (one of :data:`BACKENDS`) on ``db``, or why it cannot run
    there (the caller falls back to the in-memory index and logs this reason once)."""
    if backend not in BACKENDS:
        return f"unknown vector back end {backend!r}"
    wanted = "sqlite" if backend.startswith("sqlite") else "postgresql"
    if db.dialect != wanted:
        return f"{backend} needs a {wanted} store; this store is {db.dialect}"
    if db.dialect == "sqlite":
        from . import sqlite_vec

        if sqlite_vec.load() is None:
            return f"sqlite-vec cannot be loaded: {sqlite_vec.failure()}"
        try:
            async with db.transaction() as tx:
                await tx.fetchone("SELECT vec_version()")
        except Exception as exc:  # the store's connection predates the extension's registration
            return f"sqlite-vec is not in the store's connection: {exc}"
        return SqliteVecSearch(db, "float32" if backend == "sqlite-vec" else "bit")
    try:
        async with db.transaction() as tx:
            row = await tx.fetchone("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    except Exception as exc:
        return f"cannot ask PostgreSQL for pgvector: {exc}"
    if row is None:
        try:
            async with db.transaction() as tx:
                await tx.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except Exception as exc:
            return f"the pgvector extension is not installed in this database ({exc})"
    return PgvectorSearch(db, hnsw=backend == "pgvector")
