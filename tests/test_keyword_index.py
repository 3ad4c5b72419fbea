"""The BM25 index built in pieces (retrieval/keyword_index.py): after attachments, detachments,
re-attachments that reuse chunk ids, background merges and a second instance's writes, it ranks and
scores exactly as one built at once from the same chunks' texts, and a write reads only what
changed. Attachments are loaded from the postings stored at ingestion (``rg_vs_bm25``), those
without (an older gateway's) or made by another tokenizer version from their texts: a fresh index
(a restart) tokenizes only those, and every stored row goes with its chunks. On SQLite and
PostgreSQL, through the real store (``VectorStoreTables``)."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest

from responses_gateway.retrieval import keyword_index
from responses_gateway.retrieval.keyword_index import (
    TOKENIZER,
    KeywordIndex,
    SegmentKey,
    build,
    intact,
    loaded,
    postings,
    query_terms,
)
from responses_gateway.store import database_for_url, open_store
from responses_gateway.store.db import Database
from responses_gateway.store.vector_stores import KeywordChanges, StoredPostings, VectorStoreTables
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
    """The real store, counting the chunks the index reads: texts, and stored postings."""

    read = 0
    stored = 0

    async def keyword_changes(self, store_id: str, known: Set[SegmentKey], tokenizer: int) -> KeywordChanges:
        found = await super().keyword_changes(store_id, known, tokenizer)
        self.read += len(found.rows)
        self.stored += sum(len(ids) // 8 for _, ids, _ in found.stored)
        return found


class TextsOnly(VectorStoreTables):
    """The real store as a tokenizer version nothing was stored by: every text is read."""

    async def keyword_changes(self, store_id: str, known: Set[SegmentKey], tokenizer: int) -> KeywordChanges:
        return await super().keyword_changes(store_id, known, TOKENIZER + 1000)

    async def store_postings(self, store_id: str, part: StoredPostings, tokenizer: int) -> bool:
        return False  # a reference: it leaves the database as it is


def _chunks(topic: str, size: int) -> list[str]:
    words = topics[topic].split()
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)] or [topic]


async def _attach(
    tables: VectorStoreTables,
    store_id: str,
    file_id: str,
    topic: str,
    size: int = 120,
    *,
    stored: bool = True,
) -> int:
    """Attach ``topic`` as ingestion does (its postings stored with it), or as an older gateway did."""
    await tables.add_file(
        OWNER, store_id, file_id, filename=topic, created_at=1, attributes={}, chunking_strategy={}
    )
    chunks = _chunks(topic, size)
    keywords = (TOKENIZER, postings(chunks)) if stored else None
    assert await tables.complete_file(
        store_id, file_id, chunks, [b""] * len(chunks), usage_bytes=1, postings=keywords
    )
    return len(chunks)


async def _stored_rows(db: Database, store_id: str) -> int:
    async with db.transaction() as tx:
        row = await tx.fetchone("SELECT COUNT(*) FROM rg_vs_bm25 WHERE vector_store_id = ?", store_id)
    assert row is not None
    return int(row[0])


async def _whole(tables: VectorStoreTables, store_id: str) -> list[list[tuple[int, float]]]:
    """Every question's top 20 (id, score) from one segment built at once from the store's texts."""
    fresh = KeywordIndex(TextsOnly(tables.db))
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
    fresh: KeywordIndex | None = None
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

        sizes = {}
        for n, topic in enumerate(TOPICS[:10]):
            # file-8 as an older gateway wrote it: no stored postings.
            sizes[n] = await _attach(tables, "vs_1", f"file-{n}", topic, stored=n != 8)
        # A file completed before migration 10 has no ingested_version (nor stored postings: they
        # name another key); file-9's were made by another tokenizer version.
        async with store.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_vector_store_files SET ingested_version = NULL WHERE file_id = 'file-0'"
            )
            await tx.execute("UPDATE rg_vs_bm25 SET tokenizer = ? WHERE file_id = 'file-9'", TOKENIZER - 1)
        await same()
        # Only those three were tokenized; the others' postings were loaded.
        assert index.reads == {
            "texts": sizes[0] + sizes[8] + sizes[9],
            "postings": sum(sizes.values()) - (sizes[0] + sizes[8] + sizes[9]),
        }
        assert tables.read == sizes[0] + sizes[8] + sizes[9]
        # Those three are stored now, made by this tokenizer: no process tokenizes them again.
        await index.idle()
        assert await _stored_rows(store.db, "vs_1") == 10
        async with store.db.transaction() as tx:
            versions = await tx.fetch(
                "SELECT DISTINCT tokenizer FROM rg_vs_bm25 WHERE vector_store_id = 'vs_1'"
            )
        assert list(versions) == [(TOKENIZER,)]
        # One more file: only its chunks are read, and the scores still match a whole build
        # (before the background has brought the old segment's weights to the new mean).
        tables.read = tables.stored = 0
        added = await _attach(other, "vs_1", "file-new", TOPICS[10])
        await same()
        assert (tables.read, tables.stored) == (0, added)
        tables.read = tables.stored = 0
        added = await _attach(other, "vs_1", "file-old", TOPICS[10], stored=False)
        await same()
        assert (tables.read, tables.stored) == (added, 0)
        await other.delete_file(OWNER, "vs_1", "file-old")
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
        # A restart: a fresh index tokenizes nothing (every attachment's postings are stored now) and
        # ranks the same.
        fresh = KeywordIndex(tables)
        tables.read = tables.stored = 0
        for question in QUESTIONS:
            assert await fresh.scored("vs_1", query_terms(question), limit=20) == await index.scored(
                "vs_1", query_terms(question), limit=20
            )
        assert fresh.reads == {"texts": 0, "postings": tables.stored}
        assert tables.read == 0 and tables.stored > 0
        # Restricted to some files, dead chunks never come back.
        wanted = ["file-0", "file-3", "file-12", "file-29"]
        got = await index.search("vs_1", query_terms("the statement"), limit=50, file_ids=wanted)
        rows = await tables.chunks(got)
        assert got and {rows[c][1] for c in got} <= {"file-0", "file-29"}
        # Everything detached: nothing found.
        for file_id in [f"file-{n}" for n in range(30) if n not in (3, 10, *range(12, 20))] + ["file-new"]:
            await other.delete_file(OWNER, "vs_1", file_id)
        assert await index.scored("vs_1", query_terms("the statement"), limit=5) == []
        # Every stored posting went with its chunks; a deleted store's too.
        assert await _stored_rows(store.db, "vs_1") == 0
        await _attach(other, "vs_1", "file-last", TOPICS[0])
        assert await _stored_rows(store.db, "vs_1") == 1
        await other.delete_store(OWNER, "vs_1")
        assert await _stored_rows(store.db, "vs_1") == 0
    finally:
        if fresh is not None:
            await fresh.aclose()
        await index.aclose()
        await store.close()


def test_incremental_equals_whole_sqlite(tmp_path: Path) -> None:
    asyncio.run(_scenario(f"sqlite://{tmp_path}/gateway.db"))


def test_incremental_equals_whole_postgresql() -> None:
    asyncio.run(_scenario(fresh_pg_database("rg_keyword_index")))


def test_stored_postings_hold_what_a_build_holds() -> None:
    """Several files' blobs loaded as one segment: per term, the same chunks, counts and lengths as
    ``build`` makes of the same texts (chunk ids not in file order, a file with words past 64
    characters and a stem shared by two words of a chunk)."""
    files = {
        "a": _chunks(TOPICS[0], 50),
        "b": [*_chunks(TOPICS[1], 80), "running runs run " + "x" * 70 + " ran"],
        "c": _chunks(TOPICS[2], 30),
    }
    rows, parts = [], []
    next_id = 1000
    for file_id, texts in files.items():
        ids = list(range(next_id, next_id + len(texts)))
        next_id -= 300  # later files get lower ids
        key = (file_id, 7)
        rows += [(key, chunk_id, text) for chunk_id, text in zip(ids, texts, strict=True)]
        parts.append((key, np.array(ids, dtype="<i8").tobytes(), postings(texts)))
    made, want = loaded(parts), build(rows)

    def table(segment: keyword_index.Segment) -> dict[str, set[tuple[int, int, float]]]:
        out = {}
        for term, row in segment.vocabulary.items():
            start, end = segment.offsets[row], segment.offsets[row + 1]
            docs = segment.docs[start:end]
            assert list(docs) == sorted(docs)
            out[term] = {
                (int(segment.ids[d]), int(c), float(segment.lengths[d]))
                for d, c in zip(docs, segment.counts[start:end], strict=True)
            }
        return out

    assert table(made) == table(want)
    assert (made.live, made.live_length, made.keys) == (want.live, want.live_length, want.keys)
    assert sorted(made.ids.tolist()) == sorted(want.ids.tolist())


async def _from_version_10(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database written at schema version 10 (chunks indexed by FTS5 / the tsvector column, no
    stored postings) brought to this version: FTS5 and the tsvector column are gone, and its store
    is searched, tokenized from the texts."""
    from responses_gateway.store import schema

    db = database_for_url(url)
    await db.open()
    try:
        with monkeypatch.context() as old:
            old.setattr(schema, "MIGRATIONS", [m for m in schema.MIGRATIONS if m[0] <= 10])
            old.setattr(schema, "SCHEMA_VERSION", 10)
            await schema.migrate(db)
        texts = _chunks(TOPICS[0], 80)
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_vector_stores (id, owner, created_at, metadata, last_active_at, "
                "embedding_model, dimensions, version) VALUES ('vs_old', ?, 1, '{}', 1, 'm', 3, 1)",
                OWNER,
            )
            await tx.execute(
                "INSERT INTO rg_vector_store_files (vector_store_id, file_id, filename, created_at, status, "
                "attributes, chunking_strategy, usage_bytes, ingested_version) "
                "VALUES ('vs_old', 'f', 'f', 1, 'completed', '{}', '{}', 1, 1)"
            )
            # As that version wrote them: SQLite's ids its own (and FTS5 rows), PostgreSQL's the
            # sequence's.
            for n, text in enumerate(texts):
                if db.dialect == "sqlite":
                    await tx.execute(
                        "INSERT INTO rg_vs_chunks (id, vector_store_id, file_id, position, text, embedding) "
                        "VALUES (?, 'vs_old', 'f', ?, ?, ?)",
                        n + 1,
                        n,
                        text,
                        b"",
                    )
                    await tx.execute(
                        "INSERT INTO rg_vs_fts (rowid, vector_store_id, text) VALUES (?, 'vs_old', ?)",
                        n + 1,
                        text,
                    )
                else:
                    await tx.execute(
                        "INSERT INTO rg_vs_chunks (vector_store_id, file_id, position, text, embedding) "
                        "VALUES ('vs_old', 'f', ?, ?, ?)",
                        n,
                        text,
                        b"",
                    )
        assert await schema.migrate(db) == 10
        async with db.transaction() as tx:
            if db.dialect == "sqlite":
                gone = await tx.fetch("SELECT name FROM sqlite_master WHERE name LIKE 'rg_vs_fts%'")
            else:
                gone = await tx.fetch(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'rg_vs_chunks' AND column_name = 'tsv'"
                )
            assert list(gone) == []
        index = KeywordIndex(VectorStoreTables(db))
        try:
            found = await index.scored("vs_old", query_terms("the statement"), limit=5)
            async with db.transaction() as tx:
                rows = await tx.fetch("SELECT id, text FROM rg_vs_chunks WHERE vector_store_id = 'vs_old'")
            whole = KeywordIndex(TextsOnly(db))
            try:
                assert found and found == await whole.scored("vs_old", query_terms("the statement"), limit=5)
            finally:
                await whole.aclose()
            assert len(rows) == len(texts)
            assert index.reads == {"postings": 0, "texts": len(texts)}
            await index.idle()  # what it tokenized is stored
            assert await _stored_rows(db, "vs_old") == 1
        finally:
            await index.aclose()
        # Written from now on: with its postings, chunk ids going on from the old ones.
        tables = VectorStoreTables(db)
        await _attach(tables, "vs_old", "g", TOPICS[1])
        assert await _stored_rows(db, "vs_old") == 2
        fresh, whole = KeywordIndex(tables), KeywordIndex(TextsOnly(db))
        try:
            got = await fresh.scored("vs_old", query_terms("the statement"), limit=5)
            assert got and got == await whole.scored("vs_old", query_terms("the statement"), limit=5)
            assert fresh.reads == {"postings": len(texts) + len(_chunks(TOPICS[1], 120)), "texts": 0}
        finally:
            await fresh.aclose()
            await whole.aclose()
    finally:
        await db.close()


def test_a_version_10_database_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_from_version_10(f"sqlite://{tmp_path}/old.db", monkeypatch))


def test_a_version_10_database_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_from_version_10(fresh_pg_database("rg_keyword_index_v10"), monkeypatch))


def test_a_damaged_blob_does_not_read_back() -> None:
    texts = _chunks(TOPICS[0], 40)
    ids = np.arange(len(texts), dtype="<i8").tobytes()
    blob = postings(texts)
    key = ("f", 1)
    assert intact((key, ids, blob))
    # Cut short, a byte of the header or of the counts changed, chunk ids that do not match, terms
    # that are not UTF-8: each would make ``loaded`` fail or read garbage.
    for bad_ids, bad_blob in [
        (ids, blob[:-3]),
        (ids, blob[: len(blob) // 2]),
        (ids, b"XXXX" + blob[4:]),
        (ids[:-8], blob),
        (ids, blob[:-1] + b"\xff"),
        (ids, blob[:4] + (10**6).to_bytes(4, "little") + blob[8:]),
        (ids, b""),
    ]:
        assert not intact((key, bad_ids, bad_blob))
