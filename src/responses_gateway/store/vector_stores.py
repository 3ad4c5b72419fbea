"""Vector stores, their files and file batches, and the chunks search reads (docs/file-search.md).

A vector store belongs to an owner; its files and batches are reached through it, so another
owner's store, file or batch is a ``NotFound`` exactly like a missing one. Chunks hold their text
and their vector (little-endian float32 bytes: ``BLOB`` / ``BYTEA``); beside them, each attachment's
BM25 postings as its ingestion tokenized them (``rg_vs_bm25``: an opaque blob the keyword index
writes and reads, ``retrieval/keyword_index.py``). Vectors are searched in memory by the retrieval
service (``retrieval/vector_index.py``), which reloads a store's when its ``version`` (bumped by
every write of its chunks) moves. A file's chunks, vectors, postings and its ``completed`` status
are written in one transaction, so a file is searchable whole or not at all; its chunks and
postings are deleted together (``_delete_chunks``, every path that deletes chunks).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence, Set
from typing import Any, NamedTuple

import orjson

from .db import Database, Tx
from .errors import FileBatchNotFound, VectorStoreExpired, VectorStoreFileNotFound, VectorStoreNotFound
from .rows import JSON, check_page_args, page
from .vector_search import PGVECTOR_PREFIX

__all__ = [
    "FILE_STATUSES",
    "ChunkRow",
    "KeywordChanges",
    "SearchContext",
    "SegmentKey",
    "StoredPostings",
    "VectorStoreTables",
]

FILE_STATUSES = ("in_progress", "completed", "cancelled", "failed")
ChunkRow = tuple[int, str, str]  # chunk id, file id, text
SegmentKey = tuple[str, int]  # an attachment's chunks: file id, the ingested_version that wrote them
# An attachment's stored postings: its key, its chunk ids (int64 little-endian bytes, file order),
# the keyword index's blob.
StoredPostings = tuple[SegmentKey, bytes, bytes]


class SearchContext(NamedTuple):
    """``VectorStoreTables.search_context``'s answer."""

    embedding_model: str
    dimensions: int
    version: int  # the store's chunk version, read with the files
    files: list[tuple[str, str, JSON]]  # completed files: file id, filename, attributes


class KeywordChanges(NamedTuple):
    """``VectorStoreTables.keyword_changes``' answer."""

    version: int  # the store's, -1 when it is gone
    keys: list[SegmentKey]  # every completed attachment
    stored: list[StoredPostings]  # the new attachments' stored postings
    rows: list[tuple[SegmentKey, int, str]]  # the chunks (key, id, text) of the new ones without


_STORE_COLUMNS = (
    "id, created_at, name, description, metadata, expires_after, last_active_at, embedding_model, "
    "dimensions, expires_at"
)
# Moves ``last_active_at`` to ``?`` (bound first) and ``expires_at`` with it, by the same amount.
_TOUCH = (
    "last_active_at = ?, expires_at = CASE WHEN expires_at IS NULL THEN NULL "
    "ELSE expires_at + (? - last_active_at) END"
)
# A use of a live store moves its last_active_at (and a relative expiry with it); parameters: now, now,
# the store's id, now, now.
_TOUCH_SQL = (
    f"UPDATE rg_vector_stores SET {_TOUCH} WHERE id = ? AND last_active_at < ? "
    "AND (expires_at IS NULL OR expires_at > ?)"
)
_FILE_COLUMNS = (
    "f.file_id, f.created_at, f.vector_store_id, f.status, f.last_error, f.attributes, "
    "f.chunking_strategy, f.usage_bytes, f.filename"
)


def _id_bytes(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _vector_file(row: tuple[Any, ...]) -> JSON:
    return {
        "id": row[0],
        "object": "vector_store.file",
        "usage_bytes": int(row[7]),
        "created_at": int(row[1]),
        "vector_store_id": row[2],
        "status": row[3],
        "last_error": _loads(row[4]),
        "chunking_strategy": _loads(row[6]),
        "attributes": _loads(row[5]),
    }


def _counts(rows: Sequence[tuple[Any, ...]]) -> JSON:
    counts = {status: 0 for status in FILE_STATUSES}
    for status, n in rows:
        counts[str(status)] = int(n)
    counts["total"] = sum(counts.values())
    return counts


def _expiry(expires_after: JSON | None, last_active_at: int) -> int | None:
    return None if not expires_after else last_active_at + int(expires_after["days"]) * 86400


class VectorStoreTables:
    """The SQL of vector stores, over ``db`` (see the module doc for which connection)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ vector stores
    async def create_store(
        self,
        owner: str,
        store_id: str,
        *,
        created_at: int,
        name: str | None,
        description: str | None,
        metadata: JSON,
        expires_after: JSON | None,
        embedding_model: str,
        dimensions: int,
    ) -> JSON:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_vector_stores (id, owner, created_at, name, description, metadata, "
                "expires_after, last_active_at, embedding_model, dimensions, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                store_id,
                owner,
                created_at,
                name,
                description,
                _dumps(metadata),
                _dumps(expires_after),
                created_at,
                embedding_model,
                dimensions,
                _expiry(expires_after, created_at),
            )
            return await self._store(tx, owner, store_id)

    async def _store(self, tx: Tx, owner: str, store_id: str) -> JSON:
        row = await tx.fetchone(
            f"SELECT {_STORE_COLUMNS} FROM rg_vector_stores WHERE id = ? AND owner = ?", store_id, owner
        )
        if row is None:
            raise VectorStoreNotFound(store_id)
        counts = await tx.fetch(
            "SELECT status, COUNT(*) FROM rg_vector_store_files WHERE vector_store_id = ? GROUP BY status",
            store_id,
        )
        usage = await tx.fetchone(
            "SELECT COALESCE(SUM(usage_bytes), 0) FROM rg_vector_store_files WHERE vector_store_id = ?",
            store_id,
        )
        return {
            "id": row[0],
            "object": "vector_store",
            "created_at": int(row[1]),
            "name": row[2],
            "description": row[3],
            "usage_bytes": int(usage[0]) if usage else 0,
            "file_counts": _counts(counts),
            "metadata": _loads(row[4]),
            "expires_after": _loads(row[5]),
            "last_active_at": int(row[6]),
            "embedding_model": row[7],
            "dimensions": int(row[8]),
            "expires_at": None if row[9] is None else int(row[9]),
        }

    async def get_store(self, owner: str, store_id: str) -> JSON:
        async with self.db.transaction() as tx:
            return await self._store(tx, owner, store_id)

    async def search_context(self, owner: str, store_id: str, now: int) -> SearchContext:
        """What a search needs before either index runs, in one transaction: the store's checks
        (``VectorStoreNotFound``, ``VectorStoreExpired``), its use (``last_active_at`` moved to
        ``now``, and a relative ``expires_at`` with it; never an expired store's: the update is
        guarded by the same condition, so a sweep deleting it and a use racing it agree), and the
        store's embedding model and dimensions, its completed files (file id, filename, attributes)
        and its chunk ``version``, read together. Three trips to the database (the store object's
        file counts and usage, which a search does not show, are not read)."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT expires_at, last_active_at, embedding_model, dimensions, version "
                "FROM rg_vector_stores WHERE id = ? AND owner = ?",
                store_id,
                owner,
            )
            if row is None:
                raise VectorStoreNotFound(store_id)
            if row[0] is not None and int(row[0]) <= now:
                raise VectorStoreExpired(store_id)
            if int(row[1]) < now:
                await self._touch(tx, store_id, now)
            files = await tx.fetch(
                "SELECT file_id, filename, attributes FROM rg_vector_store_files "
                "WHERE vector_store_id = ? AND status = 'completed' ORDER BY file_id",
                store_id,
            )
        return SearchContext(
            str(row[2]),
            int(row[3]),
            int(row[4]),
            [(f[0], f[1], orjson.loads(f[2])) for f in files],
        )

    @staticmethod
    async def _touch(tx: Tx, store_id: str, now: int) -> None:
        # Sent with the transaction's next statement or its commit.
        await tx.write(_TOUCH_SQL, now, now, store_id, now, now)

    async def expired_stores(self, now: int, limit: int) -> list[str]:
        """Up to ``limit`` ids of stores whose ``expires_at`` has passed, soonest expired first."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id FROM rg_vector_stores WHERE expires_at <= ? ORDER BY expires_at, id LIMIT ?",
                now,
                limit,
            )
        return [str(row[0]) for row in rows]

    async def any_store(self) -> bool:
        """Whether the database holds a vector store (any owner's, expired or not)."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch("SELECT 1 FROM rg_vector_stores LIMIT 1")
        return bool(rows)

    async def recent_stores(self, now: int, limit: int) -> list[tuple[str, str, int]]:
        """Up to ``limit`` stores not expired at ``now`` (every owner's), most recently active first
        (``last_active_at``, then the newest id): (id, embedding model, dimensions). The start-up
        warm-up's order."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id, embedding_model, dimensions FROM rg_vector_stores "
                "WHERE expires_at IS NULL OR expires_at > ? ORDER BY last_active_at DESC, id DESC LIMIT ?",
                now,
                limit,
            )
        return [(str(row[0]), str(row[1]), int(row[2])) for row in rows]

    async def delete_expired(self, store_id: str, now: int) -> bool:
        """Delete the store with its files, batches and chunks if it is still expired at ``now``; False
        when it is not (gone already: another instance's sweep, or a new expiry)."""
        async with self.db.transaction() as tx:
            await self._lock_files(tx, store_id, None)
            row = await tx.fetchone(
                "SELECT id FROM rg_vector_stores WHERE id = ? AND expires_at <= ?" + self.db.for_update,
                store_id,
                now,
            )
            if row is None:
                return False
            await self._delete_everything(tx, store_id)
        return True

    async def list_stores(self, owner: str, *, after: str | None, limit: int, order: str) -> JSON:
        check_page_args(limit, order)
        where, args = "owner = ?", [owner]
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        async with self.db.transaction() as tx:
            if after is not None:
                cursor = await tx.fetchone(
                    "SELECT created_at, id FROM rg_vector_stores WHERE id = ? AND owner = ?", after, owner
                )
                if cursor is None:
                    raise VectorStoreNotFound(after)
                where += f" AND (created_at {op} ? OR (created_at = ? AND id {op} ?))"
                args += [cursor[0], cursor[0], cursor[1]]
            rows = await tx.fetch(
                f"SELECT id FROM rg_vector_stores WHERE {where} "
                f"ORDER BY created_at {direction}, id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
            stores = [await self._store(tx, owner, row[0]) for row in rows]
        return page(stores, limit)

    async def update_store(self, owner: str, store_id: str, changes: JSON) -> JSON:
        async with self.db.transaction() as tx:
            found = await self._store(tx, owner, store_id)
            for column in ("name", "metadata", "expires_after"):
                if column in changes:
                    value = changes[column]
                    await tx.execute(
                        f"UPDATE rg_vector_stores SET {column} = ? WHERE id = ?",
                        value if column == "name" else _dumps(value),
                        store_id,
                    )
            if "expires_after" in changes:
                await tx.execute(
                    "UPDATE rg_vector_stores SET expires_at = ? WHERE id = ?",
                    _expiry(changes["expires_after"], found["last_active_at"]),
                    store_id,
                )
            return await self._store(tx, owner, store_id)

    async def delete_store(self, owner: str, store_id: str) -> None:
        async with self.db.transaction() as tx:
            await self._store(tx, owner, store_id)
            await self._lock_files(tx, store_id, None)
            await self._delete_everything(tx, store_id)

    async def _lock_files(self, tx: Tx, store_id: str, file_id: str | None) -> None:
        """Lock a store's attachments (or one) before anything touches the store's row: the order an
        ingestion's complete_file takes them in, so a delete and a finishing ingestion cannot deadlock
        on PostgreSQL (a no-op on SQLite, whose write transactions are serial)."""
        if not self.db.for_update:
            return
        where, args = "vector_store_id = ?", [store_id]
        if file_id is not None:
            where += " AND file_id = ?"
            args.append(file_id)
        await tx.fetch(f"SELECT file_id FROM rg_vector_store_files WHERE {where}" + self.db.for_update, *args)

    async def _delete_everything(self, tx: Tx, store_id: str) -> None:
        await self._delete_chunks(tx, store_id, None)
        if self.db.dialect == "postgresql":  # (on SQLite the sqlite-vec instance's forget reads them)
            await tx.execute("DELETE FROM rg_vs_vec_sync WHERE vector_store_id = ?", store_id)
        await tx.execute("DELETE FROM rg_vector_store_files WHERE vector_store_id = ?", store_id)
        await tx.execute("DELETE FROM rg_vector_store_batches WHERE vector_store_id = ?", store_id)
        await tx.execute("DELETE FROM rg_vector_stores WHERE id = ?", store_id)

    # ------------------------------------------------------------------ files
    async def add_file(
        self,
        owner: str,
        store_id: str,
        file_id: str,
        *,
        filename: str,
        created_at: int,
        attributes: JSON,
        chunking_strategy: JSON,
        batch_id: str | None = None,
    ) -> JSON:
        """Attach ``file_id`` as ``in_progress`` (again, if it was attached: its chunks go);
        ``VectorStoreExpired`` for an expired store."""
        async with self.db.transaction() as tx:
            found = await self._store(tx, owner, store_id)
            if found["expires_at"] is not None and found["expires_at"] <= created_at:
                raise VectorStoreExpired(store_id)
            # The attachment first, as complete_file and store_postings take it.
            await self._lock_files(tx, store_id, file_id)
            await self._delete_chunks(tx, store_id, file_id)
            await tx.execute(
                "DELETE FROM rg_vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                store_id,
                file_id,
            )
            await tx.execute(
                "INSERT INTO rg_vector_store_files (vector_store_id, file_id, filename, created_at, status, "
                "last_error, attributes, chunking_strategy, usage_bytes, batch_id) "
                "VALUES (?, ?, ?, ?, 'in_progress', NULL, ?, ?, 0, ?)",
                store_id,
                file_id,
                filename,
                created_at,
                _dumps(attributes),
                _dumps(chunking_strategy),
                batch_id,
            )
            await self._touch(tx, store_id, created_at)
            return await self._file(tx, owner, store_id, file_id)

    async def _file(self, tx: Tx, owner: str, store_id: str, file_id: str) -> JSON:
        row = await tx.fetchone(
            f"SELECT {_FILE_COLUMNS} FROM rg_vector_store_files f JOIN rg_vector_stores s "
            "ON s.id = f.vector_store_id WHERE f.vector_store_id = ? AND f.file_id = ? AND s.owner = ?",
            store_id,
            file_id,
            owner,
        )
        if row is None:
            raise VectorStoreFileNotFound(file_id)
        return _vector_file(row)

    async def get_file(self, owner: str, store_id: str, file_id: str) -> JSON:
        async with self.db.transaction() as tx:
            return await self._file(tx, owner, store_id, file_id)

    async def file_row(self, store_id: str, file_id: str) -> tuple[str, str, JSON, str, int] | None:
        """(status, filename, chunking strategy, embedding model, dimensions) of an attached file, for
        ingestion."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT f.status, f.filename, f.chunking_strategy, s.embedding_model, s.dimensions "
                "FROM rg_vector_store_files f JOIN rg_vector_stores s ON s.id = f.vector_store_id "
                "WHERE f.vector_store_id = ? AND f.file_id = ?",
                store_id,
                file_id,
            )
        return None if row is None else (row[0], row[1], orjson.loads(row[2]), row[3], int(row[4]))

    async def list_files(
        self,
        owner: str,
        store_id: str,
        *,
        status: str | None,
        batch_id: str | None,
        after: str | None,
        limit: int,
        order: str,
    ) -> JSON:
        check_page_args(limit, order)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        where, args = "f.vector_store_id = ?", [store_id]
        if status is not None:
            where += " AND f.status = ?"
            args.append(status)
        if batch_id is not None:
            where += " AND f.batch_id = ?"
            args.append(batch_id)
        async with self.db.transaction() as tx:
            await self._store(tx, owner, store_id)
            if after is not None:
                cursor = await tx.fetchone(
                    "SELECT created_at, file_id FROM rg_vector_store_files WHERE vector_store_id = ? "
                    "AND file_id = ?",
                    store_id,
                    after,
                )
                if cursor is None:
                    raise VectorStoreFileNotFound(after)
                where += f" AND (f.created_at {op} ? OR (f.created_at = ? AND f.file_id {op} ?))"
                args += [cursor[0], cursor[0], cursor[1]]
            rows = await tx.fetch(
                f"SELECT {_FILE_COLUMNS} FROM rg_vector_store_files f WHERE {where} "
                f"ORDER BY f.created_at {direction}, f.file_id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
        return page([_vector_file(row) for row in rows], limit)

    async def update_file(self, owner: str, store_id: str, file_id: str, attributes: JSON) -> JSON:
        async with self.db.transaction() as tx:
            await self._file(tx, owner, store_id, file_id)
            await tx.execute(
                "UPDATE rg_vector_store_files SET attributes = ? WHERE vector_store_id = ? AND file_id = ?",
                _dumps(attributes),
                store_id,
                file_id,
            )
            return await self._file(tx, owner, store_id, file_id)

    async def delete_file(self, owner: str, store_id: str, file_id: str) -> None:
        async with self.db.transaction() as tx:
            await self._store(tx, owner, store_id)
            await self._file(tx, owner, store_id, file_id)
            await self._lock_files(tx, store_id, file_id)
            await self._delete_chunks(tx, store_id, file_id)
            await tx.execute(
                "DELETE FROM rg_vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                store_id,
                file_id,
            )

    async def file_chunks(self, owner: str, store_id: str, file_id: str) -> list[str]:
        """The text of an attached file's chunks in file order (none until it is ``completed``)."""
        async with self.db.transaction() as tx:
            await self._file(tx, owner, store_id, file_id)
            rows = await tx.fetch(
                "SELECT text FROM rg_vs_chunks WHERE vector_store_id = ? AND file_id = ? ORDER BY position",
                store_id,
                file_id,
            )
        return [str(row[0]) for row in rows]

    async def detach_everywhere(self, tx: Tx, owner: str, file_id: str) -> list[str]:
        """Detach ``file_id`` from every store of ``owner`` that holds it (its chunks go), inside
        ``tx`` (the Files API's delete); the stores it left."""
        # Locks the attachments (not the stores) first, as an ingestion's complete_file does.
        lock = " FOR UPDATE OF f" if self.db.for_update else ""
        rows = await tx.fetch(
            "SELECT f.vector_store_id FROM rg_vector_store_files f JOIN rg_vector_stores s "
            "ON s.id = f.vector_store_id WHERE f.file_id = ? AND s.owner = ? ORDER BY f.vector_store_id"
            + lock,
            file_id,
            owner,
        )
        stores = [str(row[0]) for row in rows]
        for store_id in stores:
            await self._delete_chunks(tx, store_id, file_id)
            await tx.execute(
                "DELETE FROM rg_vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                store_id,
                file_id,
            )
        return stores

    async def fail_file(self, store_id: str, file_id: str, status: str, error: JSON | None) -> None:
        """End an in-progress file as ``failed`` or ``cancelled`` (nothing of it is searchable)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_vector_store_files SET status = ?, last_error = ? "
                "WHERE vector_store_id = ? AND file_id = ? AND status = 'in_progress'",
                status,
                _dumps(error),
                store_id,
                file_id,
            )

    async def in_progress(self) -> list[tuple[str, str]]:
        """Every (vector store, file) left in progress (by a previous process), to ingest again."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT vector_store_id, file_id FROM rg_vector_store_files WHERE status = 'in_progress' "
                "ORDER BY created_at, file_id"
            )
        return [(row[0], row[1]) for row in rows]

    async def complete_file(
        self,
        store_id: str,
        file_id: str,
        chunks: Sequence[str],
        vectors: Sequence[bytes],
        *,
        usage_bytes: int,
        postings: tuple[int, bytes] | None = None,
    ) -> bool:
        """Write a file's chunks and vectors and mark it ``completed``, in one transaction. False (and
        nothing written) when the file is no longer in progress: cancelled, detached or re-attached.
        ``postings``: (tokenizer version, blob) of the chunks' BM25 postings, stored beside them
        with the chunk ids in file order (``keyword_changes`` gives them back)."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status FROM rg_vector_store_files WHERE vector_store_id = ? AND file_id = ?"
                + self.db.for_update,
                store_id,
                file_id,
            )
            if row is None or row[0] != "in_progress":
                return False
            rows = [
                (store_id, file_id, n, text, vector)
                for n, (text, vector) in enumerate(zip(chunks, vectors, strict=True))
            ]
            # The ids are known before the insert: the stored postings name the chunks by id.
            if self.db.dialect == "sqlite":
                # Never a deleted chunk's id (schema version 9); MAX(id) too, for rows written by an
                # older gateway sharing the file.
                top = await tx.fetchone(
                    "UPDATE rg_vs_chunk_ids SET next_id = MAX(next_id, "
                    "(SELECT COALESCE(MAX(id), 0) + 1 FROM rg_vs_chunks)) + ? RETURNING next_id",
                    len(rows),
                )
                assert top is not None
                ids = list(range(int(top[0]) - len(rows), int(top[0])))
            else:
                taken = await tx.fetch(
                    "SELECT nextval(pg_get_serial_sequence('rg_vs_chunks', 'id')) FROM generate_series(1, ?)",
                    len(rows),
                )
                ids = sorted(int(r[0]) for r in taken)
            await tx.executemany(
                "INSERT INTO rg_vs_chunks (id, vector_store_id, file_id, position, text, embedding) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(chunk_id, *r) for chunk_id, r in zip(ids, rows, strict=True)],
            )
            top = await tx.fetchone(
                "UPDATE rg_vector_stores SET version = version + 1 WHERE id = ? RETURNING version", store_id
            )
            assert top is not None
            version = int(top[0])
            await tx.execute(
                "UPDATE rg_vector_store_files SET status = 'completed', usage_bytes = ?, "
                "ingested_version = ? WHERE vector_store_id = ? AND file_id = ?",
                usage_bytes,
                version,
                store_id,
                file_id,
            )
            if postings is not None:
                tokenizer, blob = postings
                await tx.execute(
                    "DELETE FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?", store_id, file_id
                )
                await tx.execute(
                    "INSERT INTO rg_vs_bm25 (vector_store_id, file_id, ingested_version, tokenizer, "
                    "chunk_ids, postings) VALUES (?, ?, ?, ?, ?, ?)",
                    store_id,
                    file_id,
                    version,
                    tokenizer,
                    _id_bytes(ids),
                    blob,
                )
        return True

    async def _delete_chunks(self, tx: Tx, store_id: str, file_id: str | None) -> None:
        if self.db.dialect == "postgresql":
            await self._delete_pgvector_rows(tx, store_id, file_id)
        where, args = "vector_store_id = ?", [store_id]
        if file_id is not None:
            where += " AND file_id = ?"
            args.append(file_id)
        await tx.execute(f"DELETE FROM rg_vs_bm25 WHERE {where}", *args)
        if await tx.execute(f"DELETE FROM rg_vs_chunks WHERE {where}", *args):
            await tx.execute("UPDATE rg_vector_stores SET version = version + 1 WHERE id = ?", store_id)

    @staticmethod
    async def _delete_pgvector_rows(tx: Tx, store_id: str, file_id: str | None) -> None:
        """The rows of the store (or of one of its files) in pgvector's search tables
        (``store/vector_search.py``), deleted with the chunks whatever vector back end this instance
        runs: ``rg_vs_vec_sync`` names the tables holding the store's rows. Under the lock a sync of
        the same table and store takes, so a sync running now cannot write them back."""
        rows = await tx.fetch(
            "SELECT search_table FROM rg_vs_vec_sync WHERE vector_store_id = ? "
            "AND to_regclass(search_table) IS NOT NULL ORDER BY search_table",
            store_id,
        )
        for (name,) in rows:
            table = str(name)
            if not (table.startswith(PGVECTOR_PREFIX) and table[len(PGVECTOR_PREFIX) :].isdigit()):
                continue
            await tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", f"{table}/{store_id}")
            if file_id is None:
                await tx.execute(f"DELETE FROM {table} WHERE vector_store_id = ?", store_id)
            else:
                await tx.execute(
                    f"DELETE FROM {table} WHERE vector_store_id = ? AND file_id = ?", store_id, file_id
                )

    # ------------------------------------------------------------------ batches
    async def create_batch(self, owner: str, store_id: str, batch_id: str, created_at: int) -> None:
        async with self.db.transaction() as tx:
            await self._store(tx, owner, store_id)
            await tx.execute(
                "INSERT INTO rg_vector_store_batches (id, vector_store_id, created_at) VALUES (?, ?, ?)",
                batch_id,
                store_id,
                created_at,
            )

    async def get_batch(self, owner: str, store_id: str, batch_id: str) -> JSON:
        async with self.db.transaction() as tx:
            return await self._batch(tx, owner, store_id, batch_id)

    async def _batch(self, tx: Tx, owner: str, store_id: str, batch_id: str) -> JSON:
        row = await tx.fetchone(
            "SELECT b.created_at, b.cancelled FROM rg_vector_store_batches b JOIN rg_vector_stores s "
            "ON s.id = b.vector_store_id WHERE b.id = ? AND b.vector_store_id = ? AND s.owner = ?",
            batch_id,
            store_id,
            owner,
        )
        if row is None:
            raise FileBatchNotFound(batch_id)
        counts = _counts(
            await tx.fetch(
                "SELECT status, COUNT(*) FROM rg_vector_store_files WHERE batch_id = ? GROUP BY status",
                batch_id,
            )
        )
        if counts["in_progress"]:
            status = "cancelling" if row[1] else "in_progress"
        elif row[1]:
            status = "cancelled"
        elif counts["failed"] and not counts["completed"]:
            status = "failed"
        else:
            status = "completed"
        return {
            "id": batch_id,
            "object": "vector_store.files_batch",
            "created_at": int(row[0]),
            "vector_store_id": store_id,
            "status": status,
            "file_counts": counts,
        }

    async def cancel_batch(self, owner: str, store_id: str, batch_id: str) -> JSON:
        async with self.db.transaction() as tx:
            await self._batch(tx, owner, store_id, batch_id)
            await tx.execute("UPDATE rg_vector_store_batches SET cancelled = 1 WHERE id = ?", batch_id)
            await tx.execute(
                "UPDATE rg_vector_store_files SET status = 'cancelled' "
                "WHERE batch_id = ? AND status = 'in_progress'",
                batch_id,
            )
            return await self._batch(tx, owner, store_id, batch_id)

    # ------------------------------------------------------------------ search
    async def version(self, store_id: str) -> int:
        """The store's chunk version: it moves with every write or delete of its chunks."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone("SELECT version FROM rg_vector_stores WHERE id = ?", store_id)
        return -1 if row is None else int(row[0])

    async def load_vectors(self, store_id: str) -> tuple[int, list[tuple[int, str, bytes]]]:
        """The store's version and every chunk's (id, file id, vector bytes), read in one transaction."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone("SELECT version FROM rg_vector_stores WHERE id = ?", store_id)
            rows = await tx.fetch(
                "SELECT id, file_id, embedding FROM rg_vs_chunks WHERE vector_store_id = ? ORDER BY id",
                store_id,
            )
        return (-1 if row is None else int(row[0])), [(int(r[0]), r[1], bytes(r[2])) for r in rows]

    async def keyword_changes(self, store_id: str, known: Set[SegmentKey], tokenizer: int) -> KeywordChanges:
        """What the keyword index needs to catch up, read in one transaction: the store's version,
        the key of every completed attachment (file id, the ``ingested_version`` that wrote its
        chunks, -1 for files completed before that column), and for the attachments not in
        ``known``: their stored postings made by tokenizer version ``tokenizer``, and for those
        without (written by an older gateway, or by another tokenizer) their chunks (key, id, text),
        ordered by id. A key names the same chunks for good."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone("SELECT version FROM rg_vector_stores WHERE id = ?", store_id)
            keys = await self._attachments(tx, store_id)
            wanted = {key for key in keys if key not in known}
            stored: list[StoredPostings] = []
            if wanted:
                query = (
                    "SELECT file_id, ingested_version, chunk_ids, postings FROM rg_vs_bm25 "
                    "WHERE vector_store_id = ? AND tokenizer = ?"
                )
                found = await self._by_file(tx, query, [store_id, tokenizer], wanted, len(keys))
                for r in sorted(found, key=lambda r: str(r[0])):
                    key = (str(r[0]), int(r[1]))
                    if key in wanted:
                        stored.append((key, bytes(r[2]), bytes(r[3])))
            texts = wanted - {key for key, _, _ in stored}
            chunks: list[Any] = []
            if texts:
                query = (
                    "SELECT c.id, c.file_id, c.text, COALESCE(f.ingested_version, -1) FROM rg_vs_chunks c "
                    "JOIN rg_vector_store_files f ON f.vector_store_id = c.vector_store_id "
                    "AND f.file_id = c.file_id WHERE c.vector_store_id = ?"
                )
                chunks = await self._by_file(tx, query, [store_id], texts, len(keys), prefix="c.")
                chunks.sort(key=lambda r: int(r[0]))
        rows = [((str(r[1]), int(r[3])), int(r[0]), str(r[2])) for r in chunks]
        return KeywordChanges((-1 if row is None else int(row[0])), keys, stored, rows)

    async def store_postings(self, store_id: str, part: StoredPostings, tokenizer: int) -> bool:
        """Store postings the keyword index made of an attachment's texts (it had none of
        ``tokenizer``'s: an older gateway's ingestion), so no process tokenizes them again. False
        (nothing written) when that attachment is gone: detached, re-attached, its store deleted."""
        (file_id, ingested), chunk_ids, blob = part
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT COALESCE(ingested_version, -1) FROM rg_vector_store_files "
                "WHERE vector_store_id = ? AND file_id = ? AND status = 'completed'" + self.db.for_update,
                store_id,
                file_id,
            )
            if row is None or int(row[0]) != ingested:
                return False
            await tx.execute(
                "DELETE FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?", store_id, file_id
            )
            await tx.execute(
                "INSERT INTO rg_vs_bm25 (vector_store_id, file_id, ingested_version, tokenizer, chunk_ids, "
                "postings) VALUES (?, ?, ?, ?, ?, ?)",
                store_id,
                file_id,
                ingested,
                tokenizer,
                chunk_ids,
                blob,
            )
        return True

    async def drop_postings(self, store_id: str, keys: Sequence[SegmentKey]) -> None:
        """Delete the stored postings of these attachments (damaged: the keyword index reads their
        texts instead, then stores them again through ``store_postings``)."""
        async with self.db.transaction() as tx:
            for file_id, ingested in keys:
                await tx.execute(
                    "DELETE FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ? "
                    "AND ingested_version = ?",
                    store_id,
                    file_id,
                    ingested,
                )

    @staticmethod
    async def _attachments(tx: Tx, store_id: str) -> list[SegmentKey]:
        """The key of every completed attachment of the store, by file id: (file id, the
        ``ingested_version`` that wrote its chunks, -1 for files completed before that column)."""
        files = await tx.fetch(
            "SELECT file_id, COALESCE(ingested_version, -1) FROM rg_vector_store_files "
            "WHERE vector_store_id = ? AND status = 'completed' ORDER BY file_id",
            store_id,
        )
        return [(str(f[0]), int(f[1])) for f in files]

    @staticmethod
    async def _by_file(
        tx: Tx, query: str, args: list[Any], wanted: Set[SegmentKey], listed: int, prefix: str = ""
    ) -> list[Any]:
        """``query``'s rows for the files of ``wanted``: the whole store's when that is every file
        listed, else by ``file_id IN`` in parts of 500."""
        if len(wanted) == listed:
            return list(await tx.fetch(query, *args))
        found: list[Any] = []
        names = sorted(file_id for file_id, _ in wanted)
        for start in range(0, len(names), 500):
            part = names[start : start + 500]
            marks = ", ".join("?" * len(part))
            found += await tx.fetch(query + f" AND {prefix}file_id IN ({marks})", *args, *part)
        return found

    async def vector_changes(
        self, store_id: str, known: Set[SegmentKey]
    ) -> tuple[int, list[SegmentKey], list[tuple[SegmentKey, int, bytes]]]:
        """What the in-memory vector index needs to catch up (``keyword_changes``' twin): the store's
        version (-1: the store is gone), the key of every completed attachment, and the chunks
        (key, id, vector bytes) of the listed attachments not in ``known``, ordered by id.

        The version is read first: on PostgreSQL each statement sees the commits made before it, so
        a write landing between the statements has moved the version past the one returned, and the
        next search catches up again. Rows are kept only for the keys listed, so what is returned
        never names an attachment the list does not."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone("SELECT version FROM rg_vector_stores WHERE id = ?", store_id)
            if row is None:
                return -1, [], []
            keys = await self._attachments(tx, store_id)
            wanted = {key for key in keys if key not in known}
            query = (
                "SELECT c.id, c.file_id, c.embedding, COALESCE(f.ingested_version, -1) FROM rg_vs_chunks c "
                "JOIN rg_vector_store_files f ON f.vector_store_id = c.vector_store_id "
                "AND f.file_id = c.file_id WHERE c.vector_store_id = ?"
            )
            found: list[Any] = []
            if wanted:
                found = await self._by_file(tx, query, [store_id], wanted, len(keys), prefix="c.")
                found.sort(key=lambda r: int(r[0]))
        rows = [((str(r[1]), int(r[3])), int(r[0]), bytes(r[2])) for r in found]
        return int(row[0]), keys, [r for r in rows if r[0] in wanted]

    async def existing(self, store_ids: Sequence[str]) -> set[str]:
        """Which of ``store_ids`` are stores now (whatever their owner)."""
        found: set[str] = set()
        async with self.db.transaction() as tx:
            for start in range(0, len(store_ids), 500):
                part = list(store_ids[start : start + 500])
                marks = ", ".join("?" * len(part))
                rows = await tx.fetch(f"SELECT id FROM rg_vector_stores WHERE id IN ({marks})", *part)
                found.update(str(r[0]) for r in rows)
        return found

    async def chunks(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        if not ids:
            return {}
        marks = ", ".join("?" * len(ids))
        async with self.db.transaction() as tx:
            rows = await tx.fetch(f"SELECT id, file_id, text FROM rg_vs_chunks WHERE id IN ({marks})", *ids)
        return {int(row[0]): (int(row[0]), row[1], row[2]) for row in rows}
