"""The vector search back ends (``serve --vector-index``, docs/file-search.md) against running gateways
with the openai SDK: sqlite-vec (float32 and binary-quantized) and pgvector (HNSW and exact) rank the
corpus exactly as the in-memory index does, on SQLite and on PostgreSQL; their search tables follow
writes made by a gateway without them (a file attached, a file detached); a PostgreSQL that cannot
load pgvector falls back to the in-memory index with one log line, and searches still answer."""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.providers.scripted import ScriptedProvider
from serve_process import serving
from test_store_services import fresh_pg_database, require, run, service_urls
from test_vector_stores import KEY_A, KEY_B, QUESTIONS, _client, _load_corpus, _top_files

VECTORS_ONLY = {"ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}}
OLDER = {"filters": {"type": "lt", "key": "year", "value": 2022}}
EXTRA_QUESTIONS = ["anything about animals or code", "Etna", "gravity"]


def _gateways(url: str, data: Path, backends: tuple[str, ...]) -> dict[str, Gateway]:
    """One gateway per vector back end, all on the same database."""
    started: dict[str, Gateway] = {}
    for backend in backends:
        started[backend] = _start_with(url, data, backend)
    return started


def _start_with(url: str, data: Path, backend: str) -> Gateway:
    return start_gateway(
        [ScriptedProvider([{"message": ["ok"]}], name="m")],
        store_url=url,
        data_dir=str(data),
        api_keys=(KEY_A, KEY_B),
        max_file_bytes=64 * 1024,
        vector_index=backend,
    )


def _rankings(gw: Gateway, store_id: str) -> list[list[str]]:
    """Vectors-only rankings (every hit: the order of all five files) for each question, filtered too."""
    out = []
    for question in [*QUESTIONS, *EXTRA_QUESTIONS]:
        for options in (VECTORS_ONLY, {**VECTORS_ONLY, **OLDER}):
            out.append(_top_files(_client(gw), store_id, question, **options))
    return out


def _hybrid_best(gw: Gateway, store_id: str) -> list[str]:
    return [_top_files(_client(gw), store_id, q)[0] for q in QUESTIONS]


def _attach_and_detach(client: openai.OpenAI, store_id: str, file_ids: dict[str, str]) -> str:
    """Detach cats.txt, attach a new file; the new file's id."""
    client.vector_stores.files.delete(file_ids["cats.txt"], vector_store_id=store_id)
    new = client.files.create(
        file=("tides.txt", b"Tides rise and fall twice a day, pulled by the Moon's gravity on the oceans."),
        purpose="assistants",
    )
    done = client.vector_stores.files.create_and_poll(
        vector_store_id=store_id,
        file_id=new.id,
        attributes={"topic": "oceans", "year": 2018},
        poll_interval_ms=100,
    )
    assert done.status == "completed"
    return new.id


# ------------------------------------------------------------------ SQLite: sqlite-vec
@pytest.fixture(scope="module")
def sqlite_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Gateway]]]:
    data = tmp_path_factory.mktemp("vs-backends-sqlite")
    gws = _gateways(f"sqlite://{data}/gateway.db", data, ("memory", "sqlite-vec", "sqlite-vec-bit"))
    yield data, gws
    for gw in gws.values():
        gw.stop()


def _sqlite_rows(db: Path, table: str) -> int:
    """Rows of a vec0 table, read from its plain ``_rowids`` shadow table (no extension needed)."""
    with sqlite3.connect(db) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}_rowids").fetchone()[0])


def test_sqlite_vec_ranks_as_the_memory_index(sqlite_gateways: tuple[Path, dict[str, Gateway]]) -> None:
    data, gws = sqlite_gateways
    # Written by the gateway without sqlite-vec: the others' search tables are filled on first search.
    store_id, file_ids = _load_corpus(_client(gws["memory"]))
    expected = _rankings(gws["memory"], store_id)
    assert [r[0] for r in expected[::2][: len(QUESTIONS)]] == list(QUESTIONS.values())
    for backend in ("sqlite-vec", "sqlite-vec-bit"):
        assert _rankings(gws[backend], store_id) == expected, backend
        assert _hybrid_best(gws[backend], store_id) == list(QUESTIONS.values()), backend
    chunks = _sqlite_count(data / "gateway.db", store_id)
    assert _sqlite_rows(data / "gateway.db", "rg_vs_vec_f32_384") == chunks > 0
    assert _sqlite_rows(data / "gateway.db", "rg_vs_vec_bit_384") == chunks

    # A write by the gateway without the extension: the search tables follow it.
    new_id = _attach_and_detach(_client(gws["memory"]), store_id, file_ids)
    expected = _rankings(gws["memory"], store_id)
    assert all("cats.txt" not in r for r in expected) and any(r[0] == "tides.txt" for r in expected)
    for backend in ("sqlite-vec", "sqlite-vec-bit"):
        assert _rankings(gws[backend], store_id) == expected, backend
    chunks = _sqlite_count(data / "gateway.db", store_id)
    assert _sqlite_rows(data / "gateway.db", "rg_vs_vec_f32_384") == chunks
    # A deleted store leaves nothing in the search tables.
    _client(gws["sqlite-vec"]).vector_stores.delete(store_id)
    assert _sqlite_rows(data / "gateway.db", "rg_vs_vec_f32_384") == 0
    assert new_id


def _sqlite_count(db: Path, store_id: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = ?", (store_id,)
            ).fetchone()[0]
        )


# ------------------------------------------------------------------ PostgreSQL: pgvector
def _require_pgvector(url: str) -> None:
    async def available() -> bool:
        conn = await asyncpg.connect(url)
        try:
            return bool(await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"))
        finally:
            await conn.close()

    if not run(available()):
        reason = service_urls().get("RG_TEST_PGVECTOR_ERROR", "not installed in the test server")
        pytest.skip(f"SKIPPED LOUDLY: pgvector unavailable: {reason}")


@pytest.fixture(scope="module")
def pg_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Gateway]]]:
    url = fresh_pg_database("rg_vector_backends_test")
    _require_pgvector(url)
    data = tmp_path_factory.mktemp("vs-backends-pg")
    gws = _gateways(url, data, ("memory", "pgvector", "pgvector-exact"))
    yield url, gws
    for gw in gws.values():
        gw.stop()


def _pg_count(url: str, sql: str, *args: Any) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval(sql, *args))
        finally:
            await conn.close()

    return run(count())


def test_pgvector_ranks_as_the_memory_index_and_as_sqlite(
    pg_gateways: tuple[str, dict[str, Gateway]], sqlite_gateways: tuple[Path, dict[str, Gateway]]
) -> None:
    url, gws = pg_gateways
    store_id, file_ids = _load_corpus(_client(gws["memory"]))
    expected = _rankings(gws["memory"], store_id)
    for backend in ("pgvector", "pgvector-exact"):
        assert _rankings(gws[backend], store_id) == expected, backend
        assert _hybrid_best(gws[backend], store_id) == list(QUESTIONS.values()), backend
    chunks = _pg_count(url, "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = $1", store_id)
    in_table = "SELECT COUNT(*) FROM rg_vs_vec_pg_384 WHERE vector_store_id = $1"
    assert _pg_count(url, in_table, store_id) == chunks > 0
    # SQLite (sqlite-vec) and PostgreSQL (pgvector) give the same vector rankings on the same corpus.
    _, lite = sqlite_gateways
    lite_store, _ = _load_corpus(_client(lite["sqlite-vec"]))
    assert _rankings(lite["sqlite-vec"], lite_store) == expected
    _client(lite["sqlite-vec"]).vector_stores.delete(lite_store)

    _attach_and_detach(_client(gws["memory"]), store_id, file_ids)
    expected = _rankings(gws["memory"], store_id)
    assert all("cats.txt" not in r for r in expected)
    for backend in ("pgvector", "pgvector-exact"):
        assert _rankings(gws[backend], store_id) == expected, backend
    chunks = _pg_count(url, "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = $1", store_id)
    assert _pg_count(url, in_table, store_id) == chunks
    _client(gws["pgvector"]).vector_stores.delete(store_id)
    assert _pg_count(url, in_table, store_id) == 0


def test_postgresql_without_pgvector_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An operator's database where the gateway may not create the extension (a role that is not a
    superuser: pgvector is not a trusted extension) still searches, in memory, saying so once."""
    base = require("postgres")
    url = fresh_pg_database("rg_vector_fallback_test")

    async def restricted() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("DROP EXTENSION IF EXISTS vector")
            if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = 'rg_plain'"):
                await conn.execute("CREATE ROLE rg_plain LOGIN NOSUPERUSER")
            await conn.execute("GRANT CONNECT ON DATABASE rg_vector_fallback_test TO rg_plain")
            await conn.execute("GRANT USAGE, CREATE ON SCHEMA public TO rg_plain")
        finally:
            await conn.close()

    run(restricted())
    plain = url.replace("postgres@", "rg_plain@", 1)
    assert base and plain != url
    with caplog.at_level(logging.WARNING, logger="responses_gateway.retrieval"):
        gw = _start_with(plain, tmp_path, "pgvector")
        try:
            store_id, _ = _load_corpus(_client(gw))
            assert _hybrid_best(gw, store_id) == list(QUESTIONS.values())
            assert [r[0] for r in _rankings(gw, store_id)[::2][: len(QUESTIONS)]] == list(QUESTIONS.values())
        finally:
            gw.stop()
    said = [r.getMessage() for r in caplog.records if "in-memory index instead" in r.getMessage()]
    assert len(said) == 1 and "pgvector" in said[0], said
    # Nothing about the connection's secrets in it.
    assert "rg_plain@" not in said[0]


def test_pgvector_hnsw_path_agrees_with_exact(pg_gateways: tuple[str, dict[str, Gateway]]) -> None:
    """Stores this small are scanned exactly; the HNSW query (iterative scan, relaxed order re-sorted)
    is forced here on the gateway's own database and must give the exact order."""
    from responses_gateway.store import open_store
    from responses_gateway.store.vector_search import PgvectorSearch

    url, gws = pg_gateways
    store_id, file_ids = _load_corpus(_client(gws["memory"]))
    two = [file_ids["cats.txt"], file_ids["orbits.json"]]
    client = _client(gws["memory"])
    queries = [
        client.embeddings.create(model="all-MiniLM-L6-v2", input=q).data[0].embedding for q in QUESTIONS
    ]

    async def both() -> tuple[list[list[int]], list[list[int]]]:
        store = await open_store(url)
        try:
            hnsw = PgvectorSearch(store.db, exact_below=0)
            exact = PgvectorSearch(store.db, hnsw=False)
            got: tuple[list[list[int]], list[list[int]]] = ([], [])
            for vector in queries:
                data = struct.pack(f"<{len(vector)}f", *vector)
                for side, search in zip(got, (hnsw, exact), strict=True):
                    side.append(await search.nearest(store_id, data, dimensions=384, limit=5, file_ids=None))
                    # Filtered to two one-chunk files: 5 asked (HNSW's answer is short, the exact
                    # scan answers) and 1 asked (HNSW's answer stands).
                    for files, limit in ((two, 5), (two, 1)):
                        side.append(
                            await search.nearest(store_id, data, dimensions=384, limit=limit, file_ids=files)
                        )
            return got
        finally:
            await store.close()

    fast, exact = run(both())
    assert fast == exact
    assert [len(ids) for ids in exact] == [5, 2, 1] * len(QUESTIONS)


def test_serve_vector_index_flag_and_sqlite_vec_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --vector-index sqlite-vec`` as a user starts it: the search table fills; in a Python
    where the sqlite-vec package cannot be imported, the same command serves the same answers from the
    in-memory index and says why, once."""
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    script = tmp_path / "quick.yaml"
    script.write_text("model: quick\nsteps: [{message: [ok]}]\n")
    # One process: each worker of --workers N says it once.
    args = ("--no-local", "--workers", "1", "--script", str(script), "--vector-index", "sqlite-vec")
    with serving(tmp_path / "with", *args) as served:
        client = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=60)
        store_id, _ = _load_corpus(client)
        best = [_top_files(client, store_id, q)[0] for q in QUESTIONS]
        assert best == list(QUESTIONS.values())
        assert _sqlite_rows(tmp_path / "with" / "gateway.db", "rg_vs_vec_f32_384") == _sqlite_count(
            tmp_path / "with" / "gateway.db", store_id
        )
    assert "in-memory index instead" not in served.log.read_text()

    # No sqlite_vec module: ``import sqlite_vec`` raises ImportError in the gateway process.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['sqlite_vec'] = None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]))
    with serving(tmp_path / "without", *args) as served:
        client = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=60)
        store_id, _ = _load_corpus(client)
        assert [_top_files(client, store_id, q)[0] for q in QUESTIONS] == best
    log = served.log.read_text()
    said = [line for line in log.splitlines() if "in-memory index instead" in line]
    assert len(said) == 1 and "the sqlite-vec package is not installed" in said[0], log[-2000:]
    with sqlite3.connect(tmp_path / "without" / "gateway.db") as conn:
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'rg_vs_vec_f32%'").fetchall()


def test_pgvector_wide_vectors_are_scanned_exactly(pg_gateways: tuple[str, dict[str, Gateway]]) -> None:
    """pgvector's HNSW takes at most 2,000 dimensions: a 3,072-dimension store (an upstream embedder
    such as text-embedding-3-large) still gets the exact nearest chunks, even past the HNSW size."""
    import numpy as np

    from responses_gateway.store import open_store
    from responses_gateway.store.vector_search import PgvectorSearch
    from responses_gateway.store.vector_stores import VectorStoreTables

    url, _ = pg_gateways
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(30, 3072)).astype("<f4")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    async def scenario() -> tuple[list[int], list[int]]:
        store = await open_store(url)
        try:
            tables = VectorStoreTables(store.db)
            await tables.create_store(
                "wide", "vs_wide", created_at=0, name=None, description=None, metadata={},
                expires_after=None, embedding_model="wide", dimensions=3072,
            )  # fmt: skip
            strategy = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 0}}
            await tables.add_file(
                "wide", "vs_wide", "f", filename="f", created_at=0, attributes={}, chunking_strategy=strategy
            )
            await tables.complete_file(
                "vs_wide",
                "f",
                [f"chunk {i}" for i in range(30)],
                [v.tobytes() for v in vectors],
                usage_bytes=0,
            )
            _, rows = await tables.load_vectors("vs_wide")
            ids = [r[0] for r in rows]
            query = vectors[3] + 0.1 * vectors[4]
            expected = [ids[i] for i in np.argsort(-(vectors @ query), kind="stable")[:5]]
            search = PgvectorSearch(store.db, exact_below=0)
            got = await search.nearest(
                "vs_wide", query.astype("<f4").tobytes(), dimensions=3072, limit=5, file_ids=None
            )
            await search.forget("vs_wide")
            await tables.delete_store("wide", "vs_wide")
            return got, expected
        finally:
            await store.close()

    got, expected = run(scenario())
    assert got == expected


def test_sqlite_vec_never_sees_a_deleted_chunks_vector(
    sqlite_gateways: tuple[Path, dict[str, Gateway]],
) -> None:
    """Chunk ids are never reused on SQLite: a file detached (the newest chunks) and another attached
    elsewhere, both by the gateway without the extension, leave sqlite-vec's table a stale row whose
    id, were it reused, would stand for the new chunk; the new file must be found by its own vector."""
    _, gws = sqlite_gateways
    plain, vec = _client(gws["memory"]), _client(gws["sqlite-vec"])

    def attach(store_id: str, name: str, text: bytes) -> str:
        file_id = plain.files.create(file=(name, text), purpose="assistants").id
        done = plain.vector_stores.files.create_and_poll(
            vector_store_id=store_id, file_id=file_id, poll_interval_ms=100
        )
        assert done.status == "completed"
        return file_id

    first = plain.vector_stores.create(name="first").id
    waves = attach(first, "waves.txt", b"Surfers wait for the biggest waves of the winter swell at Nazare.")
    assert _top_files(vec, first, "surfing big waves", **VECTORS_ONLY) == ["waves.txt"]
    plain.vector_stores.files.delete(waves, vector_store_id=first)
    second = plain.vector_stores.create(name="second").id
    attach(second, "bread.txt", b"Sourdough needs a starter of flour and water, fed every day.")
    assert _top_files(vec, second, "baking sourdough bread", **VECTORS_ONLY) == ["bread.txt"]
    assert _top_files(vec, first, "surfing big waves", **VECTORS_ONLY) == []
