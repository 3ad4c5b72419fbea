"""The BM25 index built in pieces (retrieval/keyword_index.py): after attachments, detachments,
re-attachments that reuse chunk ids, background merges and a second instance's writes, it ranks and
scores exactly as one built at once over the same chunks, and a write reads only what changed. On
SQLite and PostgreSQL, through the real store (``VectorStoreTables``)."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from pathlib import Path
from pydoc_data.topics import topics

from responses_gateway.retrieval import keyword_index
from responses_gateway.retrieval.keyword_index import KeywordIndex, SegmentKey, query_terms
from responses_gateway.store import open_store
from responses_gateway.store.vector_stores import VectorStoreTables
from test_store_services import fresh_pg_database

OWNER = "alice"
TOPICS = sorted(topics)[:40]
QUESTIONS = [
    "the with statement",
    "boolean operations",
    "class definitions",
    "assert",
    "for loop range",
    "exception handling try except",
    "lambda",
    "import module package",
    "yield generator",
]


class CountingTables(VectorStoreTables):
    """The real store, counting the chunk texts the index reads."""

    read = 0

    async def text_changes(
        self, store_id: str, known: Set[SegmentKey]
    ) -> tuple[int, list[SegmentKey], list[tuple[SegmentKey, int, str]]]:
        version, keys, rows = await super().text_changes(store_id, known)
        self.read += len(rows)
        return version, keys, rows


def _chunks(topic: str, size: int) -> list[str]:
    words = topics[topic].split()
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)] or [topic]


async def _attach(tables: VectorStoreTables, store_id: str, file_id: str, topic: str, size: int = 120) -> int:
    await tables.add_file(
        OWNER, store_id, file_id, filename=topic, created_at=1, attributes={}, chunking_strategy={}
    )
    chunks = _chunks(topic, size)
    assert await tables.complete_file(store_id, file_id, chunks, [b""] * len(chunks), usage_bytes=1)
    return len(chunks)


async def _whole(tables: VectorStoreTables, store_id: str) -> list[list[tuple[int, float]]]:
    """Every question's top 20 (id, score) from one segment built at once over the store's chunks."""
    fresh = KeywordIndex(tables)
    try:
        results = [await fresh.scored(store_id, query_terms(q), limit=20) for q in QUESTIONS]
        assert fresh.segments(store_id) == 1
        return results
    finally:
        await fresh.aclose()


async def _scenario(url: str) -> None:
    store = await open_store(url)
    tables = CountingTables(store.db)
    index = KeywordIndex(tables)
    other = VectorStoreTables(store.db)  # another instance's writes: same database
    try:
        await tables.create_store(
            OWNER,
            "vs_1",
            created_at=1,
            name=None,
            description=None,
            metadata={},
            expires_after=None,
            embedding_model="m",
            dimensions=3,
        )

        async def same() -> None:
            mine = [await index.scored("vs_1", query_terms(q), limit=20) for q in QUESTIONS]
            whole = await _whole(other, "vs_1")
            for a, b in zip(mine, whole, strict=True):
                assert a == b, [(x, y) for x, y in zip(a, b, strict=False) if x != y]
            assert any(mine)

        for n, topic in enumerate(TOPICS[:10]):
            await _attach(tables, "vs_1", f"file-{n}", topic)
        # A file completed before migration 10 has no ingested_version.
        async with store.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_vector_store_files SET ingested_version = NULL WHERE file_id = 'file-0'"
            )
        await same()
        # One more file: only its chunks are read, and the scores still match a whole build
        # (before the background has brought the old segment's weights to the new mean).
        tables.read = 0
        added = await _attach(other, "vs_1", "file-new", TOPICS[10])
        await same()
        assert tables.read == added
        tables.read = 0
        await index.scored("vs_1", ["the"], limit=1)
        assert tables.read == 0
        most = 0
        # Many small writes: segments pile up, the background merges them, scores never move.
        for n, topic in enumerate(TOPICS[11:30]):
            await _attach(other, "vs_1", f"file-{n + 11}", topic)
            await index.scored("vs_1", ["the"], limit=1)
            most = max(most, index.segments("vs_1"))
        assert most > 1
        await same()
        await index.idle()
        assert index.segments("vs_1") <= keyword_index.MAX_SEGMENTS
        await same()
        # Detach, delete and re-attach with another chunking (SQLite reuses the top chunk ids).
        await other.delete_file(OWNER, "vs_1", "file-29")
        await _attach(other, "vs_1", "file-29", TOPICS[29], size=60)
        await other.delete_file(OWNER, "vs_1", "file-3")
        await _attach(other, "vs_1", "file-0", TOPICS[0], size=70)  # was the NULL one
        await same()
        for n in range(12, 20):
            await other.delete_file(OWNER, "vs_1", f"file-{n}")
        await same()
        await index.idle()
        await same()
        # Restricted to some files, dead chunks never come back.
        wanted = ["file-0", "file-3", "file-12", "file-29"]
        got = await index.search("vs_1", query_terms("the statement"), limit=50, file_ids=wanted)
        rows = await tables.chunks(got)
        assert got and {rows[c][1] for c in got} <= {"file-0", "file-29"}
        # Everything detached: nothing found.
        for file_id in [f"file-{n}" for n in range(30) if n not in (3, 10, *range(12, 20))] + ["file-new"]:
            await other.delete_file(OWNER, "vs_1", file_id)
        assert await index.scored("vs_1", query_terms("the statement"), limit=5) == []
    finally:
        await index.aclose()
        await store.close()


def test_incremental_equals_whole_sqlite(tmp_path: Path) -> None:
    asyncio.run(_scenario(f"sqlite://{tmp_path}/gateway.db"))


def test_incremental_equals_whole_postgresql() -> None:
    asyncio.run(_scenario(fresh_pg_database("rg_keyword_index")))
