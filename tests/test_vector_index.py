"""The in-memory vector index kept up to date in pieces (retrieval/vector_index.py), on SQLite and
PostgreSQL through the real store (``VectorStoreTables``): after attachments by another instance,
detachments, re-attachments and a deleted store, it answers every query exactly as a fresh load of
the same chunks (ids and scores), reads only the new attachments' vectors, appends without copying
the matrix each time and drops what detachments left once it is a fifth of the matrix.

Over HTTP with the openai SDK, two gateways on one database (SQLite and PostgreSQL): one attaches and
detaches, the other's next search sees exactly that and answers as a fresh gateway; a store deleted
by one is dropped from the other's memory. On PostgreSQL, a gateway running the in-memory index
deletes the pgvector rows of what it deletes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Set
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.retrieval.vector_index import VectorIndex
from responses_gateway.store import open_store
from responses_gateway.store.vector_stores import SegmentKey, VectorStoreTables
from test_store_services import fresh_pg_database
from test_vector_backends import (
    OLDER,
    VECTORS_ONLY,
    _attach_and_detach,
    _pg_count,
    _require_pgvector,
)
from test_vector_stores import CORPUS, KEY_A, KEY_B, QUESTIONS, _client, _load_corpus, _top_files

OWNER = "alice"
DIMS = 384
RNG = np.random.default_rng(7)
# Directions the files' vectors cluster around, and the queries: near one of them, between two, and
# near TIE, which every file's first chunk is, scaled by 1 + k * 1e-7 (near ties at many positions of
# the matrix: a float32 product alone ranks them by where they sit).
CENTRES = RNG.normal(size=(6, DIMS)).astype(np.float32)
TIE = RNG.normal(size=DIMS).astype(np.float32)
QUERIES = [*CENTRES, *(CENTRES[:-1] + CENTRES[1:]), TIE + RNG.normal(0, 0.01, DIMS).astype(np.float32)]


class CountingTables(VectorStoreTables):
    """The real store, counting the vectors the index reads."""

    read = 0

    async def vector_changes(
        self, store_id: str, known: Set[SegmentKey]
    ) -> tuple[int, list[SegmentKey], list[tuple[SegmentKey, int, bytes]]]:
        version, keys, rows = await super().vector_changes(store_id, known)
        self.read += len(rows)
        return version, keys, rows


def _vectors(n: int, centre: int) -> list[bytes]:
    """``n`` vectors near a centre; the first is a near tie (``TIE``), the second the first again (a
    tie, broken by chunk id)."""
    rows = CENTRES[centre] + RNG.normal(0, 0.3, size=(n, DIMS)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows[0] = TIE * np.float32(1 + RNG.integers(0, 4) * 1e-7)
    if n > 1:
        rows[1] = rows[0]
    return [row.astype("<f4").tobytes() for row in rows]


async def _attach(tables: VectorStoreTables, store_id: str, file_id: str, n: int, centre: int) -> int:
    await tables.add_file(
        OWNER, store_id, file_id, filename=file_id, created_at=1, attributes={}, chunking_strategy={}
    )
    vectors = _vectors(n, centre)
    texts = [f"{file_id} chunk {i}" for i in range(n)]
    assert await tables.complete_file(store_id, file_id, texts, vectors, usage_bytes=1)
    return n


async def _fresh(
    tables: VectorStoreTables, store_id: str, files: list[str] | None
) -> list[list[tuple[int, float]]]:
    """Every query's top 30 (id, score) from an index loaded at once over the store's vectors."""
    fresh = VectorIndex(tables)
    results = [await fresh.scored(store_id, q, dimensions=DIMS, limit=30, file_ids=files) for q in QUERIES]
    stats = fresh.stats(store_id)
    assert stats is not None and stats[0] == stats[1]  # one load: no masked row
    return results


async def _scenario(url: str) -> None:
    store = await open_store(url)
    tables = CountingTables(store.db)
    index = VectorIndex(tables)
    other = VectorStoreTables(store.db)  # another instance's writes: same database
    try:
        for store_id in ("vs_1", "vs_2"):
            await tables.create_store(
                OWNER,
                store_id,
                created_at=1,
                name=None,
                description=None,
                metadata={},
                expires_after=None,
                embedding_model="m",
                dimensions=DIMS,
            )

        async def same(files: list[str] | None = None) -> None:
            mine = [await index.scored("vs_1", q, dimensions=DIMS, limit=30, file_ids=files) for q in QUERIES]
            whole = await _fresh(other, "vs_1", files)
            for a, b in zip(mine, whole, strict=True):
                assert a == b, [(x, y) for x, y in zip(a, b, strict=False) if x != y]
            assert any(mine)

        for n in range(8):
            # 21 rows: a detached file's gap shifts the rows after it by other than a multiple of 4
            # (BLAS's float32 product handles rows in groups: a row's score depends on its place).
            await _attach(tables, "vs_1", f"file-{n}", 21, n % 6)
        # A file completed before migration 10 has no ingested_version.
        async with store.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_vector_store_files SET ingested_version = NULL WHERE file_id = 'file-0'"
            )
        await same()
        assert tables.read == 168
        capacity = index.stats("vs_1")
        assert capacity is not None and capacity[2] >= 168

        # One more file: only its vectors are read; appended in place (the spare rows), same answers.
        tables.read = 0
        added = await _attach(other, "vs_1", "file-new", 13, 2)
        await same()
        assert tables.read == added
        stats = index.stats("vs_1")
        assert stats is not None and stats[:2] == (181, 181) and stats[2] == capacity[2]
        # No write: nothing is read.
        tables.read = 0
        await index.scored("vs_1", QUERIES[0], dimensions=DIMS, limit=1)
        assert tables.read == 0

        # Many small writes: the matrix grows by a quarter at a time (a copy), not at every write.
        capacities = set()
        for n in range(8, 40):
            await _attach(other, "vs_1", f"file-{n}", 5, n % 6)
            await index.scored("vs_1", QUERIES[0], dimensions=DIMS, limit=1)
            stats = index.stats("vs_1")
            assert stats is not None
            capacities.add(stats[2])
        assert len(capacities) <= 4, capacities  # 32 writes, 181 -> 341 rows: 1.25^3 > 341 / 181
        await same()
        await same(["file-0", "file-3", "file-new", "file-39"])

        # Detach one file: its rows are masked (a few: kept in place), the answers match a fresh load.
        tables.read = 0
        await other.delete_file(OWNER, "vs_1", "file-3")
        await same()
        assert tables.read == 0
        stats = index.stats("vs_1")
        assert stats is not None and stats[0] == stats[1] - 21
        # Re-attached with other vectors (a new ingested_version), and the NULL-version file too.
        await _attach(other, "vs_1", "file-3", 9, 5)
        await _attach(other, "vs_1", "file-0", 7, 1)
        await same()
        await same(["file-0", "file-3", "file-5"])
        # Detached past a fifth of the matrix: rewritten without the masked rows.
        for n in range(8, 30):
            await other.delete_file(OWNER, "vs_1", f"file-{n}")
        await same()
        stats = index.stats("vs_1")
        assert stats is not None and stats[0] == stats[1], stats
        # Restricted to files, detached ones never come back.
        got = await index.search("vs_1", QUERIES[3], dimensions=DIMS, limit=50, file_ids=["file-9", "file-4"])
        rows = await tables.chunks(got)
        assert got and {rows[c][1] for c in got} == {"file-4"}

        # Another store's writes are not read for this one.
        tables.read = 0
        await _attach(other, "vs_2", "file-x", 10, 0)
        await same()
        assert tables.read == 0

        # The store deleted by another instance: the next lookup finds it gone and drops it.
        await other.delete_store(OWNER, "vs_1")
        assert await index.scored("vs_1", QUERIES[0], dimensions=DIMS, limit=5) == []
        assert index.stats("vs_1") is None and "vs_1" not in index.cached()
    finally:
        await store.close()


def test_incremental_equals_fresh_load_sqlite(tmp_path: Path) -> None:
    asyncio.run(_scenario(f"sqlite://{tmp_path}/gateway.db"))


def test_incremental_equals_fresh_load_postgresql() -> None:
    asyncio.run(_scenario(fresh_pg_database("rg_vector_index")))


# ------------------------------------------------------------------ over HTTP: two gateways, one database
def _start(url: str, data: Path, backend: str, **config: Any) -> Gateway:
    return start_gateway(
        [ScriptedProvider([{"message": ["ok"]}], name="m")],
        store_url=url,
        data_dir=str(data),
        api_keys=(KEY_A, KEY_B),
        max_file_bytes=64 * 1024,
        vector_index=backend,
        **config,
    )


class Pair:
    """Two gateways on one database with the in-memory vector index: ``writer`` writes, ``reader``
    (sweeping every 0.2 s) searches; ``url``/``data`` to start more."""

    def __init__(self, url: str, data: Path) -> None:
        self.url, self.data = url, data
        self.writer = _start(url, data, "memory")
        self.reader = _start(url, data, "memory", expiry_sweep_interval=0.2)

    def stop(self) -> None:
        self.writer.stop()
        self.reader.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data = tmp_path_factory.mktemp(f"vector-index-{request.param}")
    url = (
        f"sqlite://{data}/gateway.db"
        if request.param == "sqlite"
        else fresh_pg_database("rg_vector_index_http")
    )
    both = Pair(url, data)
    yield both
    both.stop()


def _hits(gw: Gateway, store_id: str) -> list[list[tuple[str, float, str]]]:
    """Every question's vectors-only hits (file, score, text), whole store and filtered."""
    out = []
    for question in [*QUESTIONS, "gravity"]:
        for options in (VECTORS_ONLY, {**VECTORS_ONLY, **OLDER}):
            page = _client(gw).vector_stores.search(store_id, query=question, max_num_results=20, **options)
            out.append([(h.filename, h.score, h.content[0].text) for h in page.data])
    return out


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_another_instances_writes_reach_the_next_search(pair: Pair) -> None:
    """One gateway attaches and detaches; the other's next search sees exactly that, reading only
    the new file (the detached rows are masked, not reloaded), and answers as a gateway that loads
    the store fresh. A store the first deletes is dropped from the second's memory by its sweep."""
    store_id, file_ids = _load_corpus(_client(pair.writer))
    before = _hits(pair.reader, store_id)
    assert [r[0][0] for r in before[::2][: len(QUESTIONS)]] == list(QUESTIONS.values())
    index = pair.reader.app.vector_stores.index
    assert isinstance(index, VectorIndex)
    loaded = index.stats(store_id)
    assert loaded is not None and loaded[0] == loaded[1] == len(CORPUS)

    _attach_and_detach(_client(pair.writer), store_id, file_ids)
    after = _hits(pair.reader, store_id)
    assert all(name != "cats.txt" for hits in after for name, _, _ in hits)
    assert _top_files(_client(pair.reader), store_id, "gravity", **VECTORS_ONLY)[0] == "tides.txt"
    # Exactly the change: the other files keep their order (scores are ranks, so they move).
    unchanged = [[h[::2] for h in hits if h[0] != "cats.txt"] for hits in before]
    assert [[h[::2] for h in hits if h[0] != "tides.txt"] for hits in after] == unchanged
    # Caught up in place: cats.txt's row masked (1 of 5: under a fifth), tides.txt's appended in the
    # spare row (a reload would hold neither).
    assert index.stats(store_id) == (len(CORPUS), len(CORPUS) + 1, loaded[2])
    fresh = _start(pair.url, pair.data, "memory")
    try:
        assert _hits(fresh, store_id) == after
    finally:
        fresh.stop()

    _client(pair.writer).vector_stores.delete(store_id)
    _wait_for(lambda: store_id not in index.cached(), "the reader's sweep drops the deleted store")
    assert pair.reader.app.vector_stores.keywords.stats(store_id) is None
    with pytest.raises(openai.NotFoundError):
        _client(pair.reader).vector_stores.search(store_id, query="lava")


def test_a_search_of_a_store_deleted_elsewhere_drops_it(pair: Pair) -> None:
    """The 404 of a store another instance deleted also drops what this one held of it."""
    store_id, _ = _load_corpus(_client(pair.writer))
    index = pair.writer.app.vector_stores.index
    assert _top_files(_client(pair.writer), store_id, "lava", **VECTORS_ONLY)[0] == "volcanoes.md"
    assert store_id in index.cached()
    _client(pair.reader).vector_stores.delete(store_id)  # the writer sweeps once a minute only
    with pytest.raises(openai.NotFoundError):
        _client(pair.writer).vector_stores.search(store_id, query="lava")
    assert store_id not in index.cached()
    assert pair.writer.app.vector_stores.keywords.stats(store_id) is None


# ------------------------------------------------------------------ pgvector rows deleted by any instance
def test_deletes_by_a_memory_instance_empty_pgvector_rows(tmp_path: Path) -> None:
    """On PostgreSQL, a gateway running the in-memory index deletes the pgvector rows of what it
    detaches or deletes (a vector store file, a Files API file, a store, an expired store), in the
    same transaction; the pgvector gateway's next search agrees."""
    url = fresh_pg_database("rg_vector_index_pg_rows")
    _require_pgvector(url)
    memory = _start(url, tmp_path, "memory", expiry_sweep_interval=0.2)
    pgvector = _start(url, tmp_path, "pgvector")
    try:
        rows = "SELECT COUNT(*) FROM rg_vs_vec_pg_384 WHERE vector_store_id = $1"
        of_file = rows + " AND file_id = $2"
        chunks = "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = $1"
        synced = "SELECT COUNT(*) FROM rg_vs_vec_sync WHERE vector_store_id = $1"
        stores = [_load_corpus(_client(memory)) for _ in range(3)]
        for store_id, _ in stores:
            assert _top_files(_client(pgvector), store_id, "lava", **VECTORS_ONLY)[0] == "volcanoes.md"
            assert _pg_count(url, rows, store_id) == _pg_count(url, chunks, store_id) == len(CORPUS)

        (first, files), (second, _), (third, _) = stores
        client = _client(memory)
        client.vector_stores.files.delete(files["cats.txt"], vector_store_id=first)
        assert _pg_count(url, of_file, first, files["cats.txt"]) == 0
        assert _pg_count(url, rows, first) == len(CORPUS) - 1
        client.files.delete(files["volcanoes.md"])  # the Files API: detached everywhere
        assert _pg_count(url, of_file, first, files["volcanoes.md"]) == 0
        assert _pg_count(url, rows, first) == _pg_count(url, chunks, first) == len(CORPUS) - 2
        found = _top_files(_client(pgvector), first, "Why does my kitten purr?", **VECTORS_ONLY)
        assert "cats.txt" not in found and "volcanoes.md" not in found and len(found) == len(CORPUS) - 2

        client.vector_stores.delete(second)
        assert _pg_count(url, rows, second) == _pg_count(url, synced, second) == 0

        client.vector_stores.update(third, expires_after={"anchor": "last_active_at", "days": 1})
        _pg_count(
            url,
            "WITH aged AS (UPDATE rg_vector_stores SET last_active_at = last_active_at - 2 * 86400, "
            "expires_at = expires_at - 2 * 86400 WHERE id = $1 RETURNING 1) SELECT COUNT(*) FROM aged",
            third,
        )
        _wait_for(lambda: _pg_count(url, chunks, third) == 0, "the memory instance's sweep")
        assert _pg_count(url, rows, third) == _pg_count(url, synced, third) == 0
        with pytest.raises(openai.NotFoundError):
            _client(pgvector).vector_stores.search(third, query="lava")
    finally:
        memory.stop()
        pgvector.stop()
