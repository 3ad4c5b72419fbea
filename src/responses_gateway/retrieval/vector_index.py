"""The vector side of search: which back end finds a store's nearest chunks (``serve --vector-index``).

- ``memory`` (:class:`VectorIndex`): each store's vectors as one matrix in memory, exact cosine by
  one matrix product. The vectors live in the database with their chunks
  (``store/vector_stores.py``); a store's matrix is read whole on its first search. When the store's
  ``version`` has moved (any instance's write or delete of its chunks bumps it), the index asks the
  database which attachments exist now (``VectorStoreTables.vector_changes``: file id and the
  ``ingested_version`` that wrote its chunks, as the BM25 index does) and reads the vectors of the
  new ones only: they are appended to the matrix (which keeps a quarter of its rows spare, so an
  append rarely copies it), and the rows of attachments that are gone are masked, the matrix
  rewritten without them once they pass a fifth of it. Results are exactly a fresh load's: the
  product (float32, BLAS) only picks the candidates, which are rescored in float64 row by row, so a
  row's score does not depend on where it sits in the matrix. About 1.5-1.9 kB of memory per chunk
  in every process (each worker of ``serve --workers N``), the least recently searched stores
  dropped past ``max_bytes``; a store found gone (deleted by any instance) is dropped.
- ``sqlite-vec`` / ``sqlite-vec-bit`` / ``pgvector`` / ``pgvector-exact`` (:class:`DatabaseIndex`):
  the search runs in the database (``store/vector_search.py``), no vectors held in the process.

:func:`open_index` picks the back end for the store's dialect and falls back to ``memory``, with one
log line saying why, when the extension is missing; it never fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ..store.vector_search import CHOICES, VectorSearch, open_search
from ..store.vector_stores import SegmentKey, VectorStoreTables
from .blas import one_blas_thread
from .topk import kth_largest

__all__ = ["AUTO", "CHOICES", "DatabaseIndex", "Index", "VectorIndex", "open_index"]

log = logging.getLogger("responses_gateway.retrieval")

# ``auto``: the back end each store dialect gets unless configured (docs/file-search.md, Measured).
AUTO = {"sqlite": "memory", "postgresql": "pgvector"}

# Above this many chunks the product runs in a worker thread rather than on the event loop.
_INLINE_ROWS = 20_000
# From this many rows the product is split in two halves, the second on a helper thread: on two
# cores the half-products run side by side (the product is memory-bound: ~12 ms at 100k rows).
_SPLIT_ROWS = 50_000
_helper: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def _forget_helper() -> None:
    """In a forked child: the helper's thread did not come along, so a new one is made on use."""
    global _helper, _helper_lock
    _helper, _helper_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_helper)

# A query vector, or what computes it (the query's embedding), then run in the thread that runs the
# product: one worker-thread hop for both.
Query = npt.NDArray[np.float32] | Callable[[], npt.NDArray[np.float32]]


# Spare rows kept when a matrix is (re)allocated, as a share of its rows: appends write in place.
_SPARE = 0.25
# A matrix whose masked rows (detached attachments) pass this share of it is rewritten without them.
_DEAD_SHARE = 0.2


@dataclass(frozen=True)
class _Matrix:
    """A store's vectors. ``vectors``, ``ids`` and ``attachments`` have spare rows past ``size``: a
    catch-up writes new rows there and makes a new ``_Matrix`` over the same arrays, so a search
    still running on this one (it reads rows below its ``size`` only) is not disturbed."""

    version: int
    keys: frozenset[SegmentKey]  # every attachment read (some may have no chunk)
    size: int  # rows in use, live or masked
    vectors: npt.NDArray[np.float32]  # (capacity, dimensions)
    ids: npt.NDArray[np.int64]  # chunk id per row
    attachments: npt.NDArray[np.int32]  # attachment code per row
    codes: dict[SegmentKey, int]  # live attachment -> its code
    alive: npt.NDArray[np.bool_] | None  # (size,); None: every row is live
    live: int
    norm: float  # the largest row norm (an upper bound): the float32 product's error bound
    next_code: int  # the code the next new attachment gets

    @property
    def nbytes(self) -> int:
        alive = 0 if self.alive is None else self.alive.nbytes
        return int(self.vectors.nbytes + self.ids.nbytes + self.attachments.nbytes + alive)


class Index(Protocol):
    """Nearest chunks of a vector store to a query vector, best first (see :meth:`VectorIndex.search`)."""

    name: str

    async def search(
        self,
        store_id: str,
        query: Query,
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]: ...

    def cached(self) -> list[str]:
        """The stores this process holds something of (the service drops those found gone)."""
        ...

    async def forget(self, store_id: str) -> None: ...

    async def prepare(self, store_id: str, dimensions: int) -> None:
        """After a write of the store's chunks: bring what the back end keeps up to date now, so the
        next search does not pay for it."""

    async def warm(self, store_id: str, dimensions: int, version: int) -> bool:
        """Load what the store's first search in this process would (the start-up warm-up); False
        when it was not kept (past the memory limit: the warm-up stops), True otherwise (a back end
        that holds nothing has nothing to refuse)."""
        ...


class DatabaseIndex:
    """The search in the database: sqlite-vec or pgvector (``store/vector_search.py``)."""

    def __init__(self, search: VectorSearch) -> None:
        self._search = search
        self.name = search.name

    async def search(
        self,
        store_id: str,
        query: Query,
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]:
        vector = await asyncio.to_thread(query) if callable(query) else query
        return await self._search.nearest(
            store_id,
            vector.astype("<f4", copy=False).tobytes(),
            dimensions=dimensions,
            limit=limit,
            file_ids=file_ids,
            version=version,
        )

    def cached(self) -> list[str]:
        return []

    async def forget(self, store_id: str) -> None:
        await self._search.forget(store_id)

    async def prepare(self, store_id: str, dimensions: int) -> None:
        await self._search.sync(store_id, dimensions)

    async def warm(self, store_id: str, dimensions: int, version: int) -> bool:
        return True  # the search runs in the database: nothing to load, nothing refused


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
        self._reads = 0

    @property
    def reads(self) -> int:
        """Vectors read from the database into the matrices so far (whole stores and catch-ups)."""
        return self._reads

    async def _matrix(
        self, store_id: str, dimensions: int, version: int | None = None, *, warm: bool = False
    ) -> _Matrix:
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
            known = frozenset() if found is None else found.keys
            version, listed, rows = await self._tables.vector_changes(store_id, known)
            if version < 0:  # the store is gone (deleted by this instance or another)
                self._matrices.pop(store_id, None)
                self._locks.pop(store_id, None)
                return _empty(dimensions)
            matrix = await asyncio.to_thread(_caught_up, found, version, listed, rows, dimensions)
            self._reads += len(rows)
            self._matrices[store_id] = matrix
            # Loaded by the warm-up, not searched yet: behind the searched stores, the first dropped.
            self._matrices.move_to_end(store_id, last=not (warm and found is None))
            total = sum(m.nbytes for m in self._matrices.values())
            while total > self._max and len(self._matrices) > 1:
                _, dropped = self._matrices.popitem(last=False)
                total -= dropped.nbytes
            return matrix

    async def search(
        self,
        store_id: str,
        query: Query,
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
        return [
            chunk
            for chunk, _ in await self.scored(
                store_id, query, dimensions=dimensions, limit=limit, file_ids=file_ids, version=version
            )
        ]

    async def scored(
        self,
        store_id: str,
        query: Query,
        *,
        dimensions: int,
        limit: int,
        file_ids: Sequence[str] | None = None,
        version: int | None = None,
    ) -> list[tuple[int, float]]:
        """``search``'s chunk ids with their scores (the dot product, computed in float64). A
        callable ``query`` is called (it raises what it raises) in the worker thread that then runs
        the product, or in one of its own for a store small enough to search inline."""
        matrix = await self._matrix(store_id, dimensions, version)
        if matrix.size > _INLINE_ROWS and matrix.live:
            return await asyncio.to_thread(_nearest, matrix, query, limit, file_ids)
        vector = await asyncio.to_thread(query) if callable(query) else query
        return _nearest(matrix, vector, limit, file_ids) if matrix.live else []

    @property
    def nbytes(self) -> int:
        """The memory the matrices held now take (every process holds its own)."""
        return sum(m.nbytes for m in self._matrices.values())

    def stats(self, store_id: str) -> tuple[int, int, int] | None:
        """(live rows, rows in use, capacity) of a store's matrix, or None when it is not loaded."""
        found = self._matrices.get(store_id)
        return None if found is None else (found.live, found.size, len(found.ids))

    def cached(self) -> list[str]:
        return list(self._matrices)

    async def prepare(self, store_id: str, dimensions: int) -> None:
        """Nothing: a matrix is read on the search that needs it (in whichever process serves it)."""

    async def warm(self, store_id: str, dimensions: int, version: int) -> bool:
        await self._matrix(store_id, dimensions, version, warm=True)
        return store_id in self._matrices

    async def forget(self, store_id: str) -> None:
        self._matrices.pop(store_id, None)
        self._locks.pop(store_id, None)


def _empty(dimensions: int) -> _Matrix:
    return _Matrix(
        -1,
        frozenset(),
        0,
        np.zeros((0, dimensions), dtype=np.float32),
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int32),
        {},
        None,
        0,
        0.0,
        0,
    )


def _caught_up(
    found: _Matrix | None,
    version: int,
    listed: list[SegmentKey],
    rows: list[tuple[SegmentKey, int, bytes]],
    dimensions: int,
) -> _Matrix:
    """``found`` (None: nothing yet) with the rows of attachments no longer ``listed`` masked (or
    dropped) and the new ``rows`` (attachment, chunk id, vector bytes) appended."""
    matrix = _empty(dimensions) if found is None else found
    now = frozenset(listed)
    removed = matrix.keys - now
    codes = {key: code for key, code in matrix.codes.items() if key not in removed}
    alive = matrix.alive
    live = matrix.live
    if removed:
        gone = np.array([matrix.codes[k] for k in removed if k in matrix.codes], dtype=np.int32)
        masked = np.isin(matrix.attachments[: matrix.size], gone)
        if masked.any():
            alive = ~masked if alive is None else alive & ~masked
            live = int(np.count_nonzero(alive))
    rows = [row for row in rows if row[0] not in matrix.keys]
    keys = (matrix.keys - removed) | now | {row[0] for row in rows}
    new = len(rows)
    size, vectors, ids, attachments = matrix.size, matrix.vectors, matrix.ids, matrix.attachments
    dead = size - live
    if dead > _DEAD_SHARE * size or size + new > len(ids):
        # Rewritten: without the masked rows, with spare rows for later appends.
        keep = np.flatnonzero(alive) if alive is not None else np.arange(size)
        capacity = len(keep) + new + int(_SPARE * (len(keep) + new))
        vectors = _grown(vectors[keep], capacity)
        ids = _grown(ids[keep], capacity)
        attachments = _grown(attachments[keep], capacity)
        size, alive = len(keep), None
    norm, next_code = matrix.norm, matrix.next_code
    if new:
        # A new attachment's code: past every code given so far (masked rows keep theirs).
        next_code = matrix.next_code
        for key, _, _ in rows:
            if key not in codes:
                codes[key] = next_code
                next_code += 1
        block = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(new, dimensions)
        vectors[size : size + new] = block
        ids[size : size + new] = np.fromiter((r[1] for r in rows), dtype=np.int64, count=new)
        attachments[size : size + new] = np.fromiter((codes[r[0]] for r in rows), dtype=np.int32, count=new)
        norm = max(norm, float(np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64).max())))
        if alive is not None:
            alive = np.concatenate([alive, np.ones(new, dtype=bool)])
        size += new
        live += new
    return replace(
        matrix,
        version=version,
        keys=frozenset(keys),
        size=size,
        vectors=vectors,
        ids=ids,
        attachments=attachments,
        codes=codes,
        alive=alive,
        live=live,
        norm=norm,
        next_code=next_code,
    )


_T = TypeVar("_T", bound=np.generic)


def _grown(array: npt.NDArray[_T], capacity: int) -> npt.NDArray[_T]:
    """A new array of ``capacity`` rows starting with ``array``'s."""
    out = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
    out[: len(array)] = array
    return out


def _product(vectors: npt.NDArray[np.float32], q: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``vectors @ q`` (BLAS on one thread), in two halves side by side for a large matrix."""
    global _helper
    size = len(vectors)
    with one_blas_thread:
        if size < _SPLIT_ROWS:
            return vectors @ q
        with _helper_lock:
            if _helper is None:
                _helper = ThreadPoolExecutor(1, thread_name_prefix="rg-vector-product")
        scores = np.empty(size, dtype=np.float32)
        half = size // 2
        other = _helper.submit(np.matmul, vectors[half:], q, out=scores[half:])
        np.matmul(vectors[:half], q, out=scores[:half])
        other.result()
        return scores


def _nearest(
    matrix: _Matrix, query: Query, limit: int, file_ids: Sequence[str] | None
) -> list[tuple[int, float]]:
    """The ``limit`` best rows by (float64 score, chunk id). The float32 product picks every row
    that can be among them (its error is bounded: |float32 dot - dot| <= n * 2^-24 * |q| * |row| for
    n dimensions), those are rescored in float64 and ranked: the result does not depend on a row's
    position in the matrix (nor on how the product is split), so a matrix built in pieces answers as
    one loaded at once. A callable ``query`` is called first."""
    size = matrix.size
    q = (query() if callable(query) else query).astype(np.float32, copy=False)
    scores = _product(matrix.vectors[:size], q)
    if matrix.alive is not None:
        scores[~matrix.alive] = -np.inf
    if file_ids is not None:
        names = set(file_ids)
        wanted = np.array([c for k, c in matrix.codes.items() if k[0] in names], dtype=np.int32)
        scores = np.where(np.isin(matrix.attachments[:size], wanted), scores, -np.inf)
    masked = matrix.alive is not None or file_ids is not None
    finite = int(np.count_nonzero(np.isfinite(scores))) if masked else size
    count = min(limit, finite)
    if count <= 0:
        return []
    dimensions = q.shape[0]
    # Twice the bound on one score's error (BLAS's blocking and FMA stay within it), for each side.
    error = 2.0 * (dimensions + 2) * 2.0**-24 * float(np.linalg.norm(q.astype(np.float64))) * matrix.norm
    if count < finite:
        cut = kth_largest(scores, count)
        candidates = np.flatnonzero(scores >= np.float32(cut - 2 * error))
    else:
        candidates = np.flatnonzero(np.isfinite(scores)) if masked else np.arange(size)
    exact = (matrix.vectors[candidates].astype(np.float64) * q.astype(np.float64)).sum(axis=1)
    ids = matrix.ids[candidates]
    # Best first, ties by chunk id (the same order on every back end).
    order = np.lexsort((ids, -exact))[:count]
    return [(int(ids[i]), float(exact[i])) for i in order.tolist()]
