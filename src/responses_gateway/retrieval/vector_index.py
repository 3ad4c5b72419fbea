"""The vector side of search: which back end finds a store's nearest chunks (``serve --vector-index``).

- ``memory`` (:class:`VectorIndex`): each store's vectors as one matrix in memory, exact cosine by
  one matrix product. The vectors live in the database with their chunks
  (``store/vector_stores.py``); a store's matrix is read on its first search and again whenever the
  store's ``version`` has moved (any instance's write or delete of its chunks bumps it). 1.5 kB of
  memory per chunk in every process (each worker of ``serve --workers N``), the least recently
  searched stores dropped past ``max_bytes``.
- ``sqlite-vec`` / ``sqlite-vec-bit`` / ``pgvector`` / ``pgvector-exact`` (:class:`DatabaseIndex`):
  the search runs in the database (``store/vector_search.py``), no vectors held in the process.

:func:`open_index` picks the back end for the store's dialect and falls back to ``memory``, with one
log line saying why, when the extension is missing; it never fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ..store.vector_search import BACKENDS, VectorSearch, open_search
from ..store.vector_stores import VectorStoreTables
from .blas import one_blas_thread

__all__ = ["AUTO", "CHOICES", "DatabaseIndex", "Index", "VectorIndex", "open_index"]

log = logging.getLogger("responses_gateway.retrieval")

# ``auto``: the back end each store dialect gets unless configured (docs/file-search.md, Measured).
AUTO = {"sqlite": "memory", "postgresql": "pgvector"}
CHOICES = ("auto", "memory", *BACKENDS)

# Above this many chunks the product runs in a worker thread rather than on the event loop.
_INLINE_ROWS = 20_000


@dataclass
class _Matrix:
    version: int
    ids: npt.NDArray[np.int64]
    files: npt.NDArray[np.int32]
    file_codes: dict[str, int]
    vectors: npt.NDArray[np.float32]

    @property
    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.ids.nbytes + self.files.nbytes)


class Index(Protocol):
    """Nearest chunks of a vector store to a query vector, best first (see :meth:`VectorIndex.search`)."""

    name: str

    async def search(
        self,
        store_id: str,
        query: npt.NDArray[np.float32],
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]: ...

    async def forget(self, store_id: str) -> None: ...

    async def prepare(self, store_id: str, dimensions: int) -> None:
        """After a write of the store's chunks: bring what the back end keeps up to date now, so the
        next search does not pay for it."""


class DatabaseIndex:
    """The search in the database: sqlite-vec or pgvector (``store/vector_search.py``)."""

    def __init__(self, search: VectorSearch) -> None:
        self._search = search
        self.name = search.name

    async def search(
        self,
        store_id: str,
        query: npt.NDArray[np.float32],
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]:
        return await self._search.nearest(
            store_id,
            query.astype("<f4", copy=False).tobytes(),
            dimensions=dimensions,
            limit=limit,
            file_ids=file_ids,
            version=version,
        )

    async def forget(self, store_id: str) -> None:
        await self._search.forget(store_id)

    async def prepare(self, store_id: str, dimensions: int) -> None:
        await self._search.sync(store_id, dimensions)


_told: set[str] = set()


async def open_index(tables: VectorStoreTables, choice: str = "auto") -> Index:
    """The vector back end ``choice`` (one of :data:`CHOICES`) for the tables' database; ``memory``
    when that is what it names, or (logged once per reason) when the extension cannot run here."""
    if choice not in CHOICES:
        raise ValueError(f"vector index must be one of {', '.join(CHOICES)}, not {choice!r}")
    backend = AUTO[tables.db.dialect] if choice == "auto" else choice
    if backend == "memory":
        return VectorIndex(tables)
    found = await open_search(tables.db, backend)
    if isinstance(found, str):
        if found not in _told:
            _told.add(found)
            log.warning("vector search: %s; using the in-memory index instead", found)
        return VectorIndex(tables)
    return DatabaseIndex(found)


class VectorIndex:
    """Nearest chunks of a vector store to a query vector, best first, from matrices in memory."""

    name = "memory"

    def __init__(self, tables: VectorStoreTables, *, max_bytes: int = 1 << 30) -> None:
        self._tables = tables
        self._max = max_bytes
        self._matrices: OrderedDict[str, _Matrix] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def _matrix(self, store_id: str, dimensions: int, version: int | None = None) -> _Matrix:
        if version is None:
            version = await self._tables.version(store_id)
        found = self._matrices.get(store_id)
        if found is not None and found.version == version:
            self._matrices.move_to_end(store_id)
            return found
        lock = self._locks.setdefault(store_id, asyncio.Lock())
        async with lock:
            found = self._matrices.get(store_id)
            if found is not None and found.version == await self._tables.version(store_id):
                return found
            version, rows = await self._tables.load_vectors(store_id)
            matrix = await asyncio.to_thread(_build, version, rows, dimensions)
            self._matrices[store_id] = matrix
            self._matrices.move_to_end(store_id)
            total = sum(m.nbytes for m in self._matrices.values())
            while total > self._max and len(self._matrices) > 1:
                _, dropped = self._matrices.popitem(last=False)
                total -= dropped.nbytes
            return matrix

    async def search(
        self,
        store_id: str,
        query: npt.NDArray[np.float32],
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]:
        """Chunk ids, nearest first (ties by id); only chunks of ``file_ids`` when given.

        ``version``: the store's version as the caller read it at the start of its search. Then a
        cached matrix of that version is used without asking the database: on SQLite the database
        is one connection, where the check would wait behind the search's BM25 query."""
        matrix = await self._matrix(store_id, dimensions, version)
        if not len(matrix.ids):
            return []
        if len(matrix.ids) > _INLINE_ROWS:
            return await asyncio.to_thread(_nearest, matrix, query, limit, file_ids)
        return _nearest(matrix, query, limit, file_ids)

    @property
    def nbytes(self) -> int:
        """The memory the matrices held now take (every process holds its own)."""
        return sum(m.nbytes for m in self._matrices.values())

    async def prepare(self, store_id: str, dimensions: int) -> None:
        """Nothing: a matrix is read on the search that needs it (in whichever process serves it)."""

    async def forget(self, store_id: str) -> None:
        self._matrices.pop(store_id, None)
        self._locks.pop(store_id, None)


def _build(version: int, rows: list[tuple[int, str, bytes]], dimensions: int) -> _Matrix:
    codes: dict[str, int] = {}
    files = np.fromiter((codes.setdefault(r[1], len(codes)) for r in rows), dtype=np.int32, count=len(rows))
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), dimensions)
    return _Matrix(version, ids, files, codes, vectors.astype(np.float32, copy=False))


def _nearest(
    matrix: _Matrix, query: npt.NDArray[np.float32], limit: int, file_ids: Sequence[str] | None
) -> list[int]:
    with one_blas_thread:
        scores = matrix.vectors @ query.astype(np.float32, copy=False)
    if file_ids is not None:
        wanted = np.array([matrix.file_codes[f] for f in file_ids if f in matrix.file_codes], dtype=np.int32)
        scores = np.where(np.isin(matrix.files, wanted), scores, -np.inf)
    count = min(limit, int(np.isfinite(scores).sum()))
    if count <= 0:
        return []
    top = np.argpartition(-scores, count - 1)[:count] if count < len(scores) else np.arange(len(scores))
    # Best first, ties by chunk id (the same order on every back end).
    order = sorted(top.tolist(), key=lambda i: (-float(scores[i]), int(matrix.ids[i])))
    return [int(matrix.ids[i]) for i in order[:count]]
