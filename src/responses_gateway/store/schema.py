"""Versioned schema migrations, run in order at start-up inside one transaction.

A migration is appended, never edited: an installed database records the highest version it ran in
``rg_schema``. Types are written once and spelled per dialect (``{float}``).
"""

from __future__ import annotations

from .db import Database

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

_TYPES = {
    "sqlite": {"float": "REAL"},
    "postgresql": {"float": "DOUBLE PRECISION"},
}

# (version, statements). JSON columns are TEXT: the store reads and writes whole documents. A
# statement only one dialect runs is a dict from dialect to SQL.
MIGRATIONS: list[tuple[int, list[str | dict[str, str]]]] = [
    (
        1,
        [
            """CREATE TABLE rg_instances (
                id TEXT PRIMARY KEY,
                host TEXT NOT NULL,
                pid BIGINT NOT NULL,
                started_at {float} NOT NULL,
                heartbeat_at {float} NOT NULL
            )""",
            """CREATE TABLE rg_responses (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                status TEXT NOT NULL,
                background INTEGER NOT NULL,
                previous_response_id TEXT,
                conversation_id TEXT,
                request TEXT NOT NULL,
                response TEXT NOT NULL,
                instance_id TEXT,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                updated_at {float} NOT NULL
            )""",
            "CREATE INDEX rg_responses_running ON rg_responses (status, instance_id)",
            # kind 0 = input item, 1 = output item; position is the index within that list.
            """CREATE TABLE rg_items (
                response_id TEXT NOT NULL,
                kind INTEGER NOT NULL,
                position INTEGER NOT NULL,
                id TEXT NOT NULL,
                owner TEXT NOT NULL,
                item TEXT NOT NULL,
                PRIMARY KEY (response_id, kind, position)
            )""",
            "CREATE INDEX rg_items_by_id ON rg_items (owner, id)",
            """CREATE TABLE rg_events (
                response_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                event TEXT NOT NULL,
                PRIMARY KEY (response_id, seq)
            )""",
            """CREATE TABLE rg_conversations (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                metadata TEXT NOT NULL
            )""",
            """CREATE TABLE rg_conversation_items (
                conversation_id TEXT NOT NULL,
                position BIGINT NOT NULL,
                id TEXT NOT NULL,
                item TEXT NOT NULL,
                PRIMARY KEY (conversation_id, position)
            )""",
            "CREATE INDEX rg_conversation_items_by_id ON rg_conversation_items (conversation_id, id)",
        ],
    ),
    # Retention (serve --store-retention) deletes the oldest finished responses.
    (2, ["CREATE INDEX rg_responses_created ON rg_responses (created_at)"]),
    # Files (/v1/files): metadata here, the bytes on disk under the data directory.
    (
        3,
        [
            """CREATE TABLE rg_files (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                filename TEXT NOT NULL,
                purpose TEXT NOT NULL,
                bytes BIGINT NOT NULL,
                expires_at BIGINT
            )""",
            "CREATE INDEX rg_files_by_owner ON rg_files (owner, created_at, id)",
        ],
    ),
    # Containers (code_interpreter) shared by the gateway's instances: the record, the files (their
    # bytes, so another instance can restore them) and what each call told the model.
    (
        4,
        [
            """CREATE TABLE rg_containers (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                name TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                last_active_at BIGINT NOT NULL,
                idle_minutes BIGINT NOT NULL,
                holder TEXT NOT NULL
            )""",
            "CREATE INDEX rg_containers_by_owner ON rg_containers (owner, created_at, id)",
            """CREATE TABLE rg_container_files (
                container_id TEXT NOT NULL,
                id TEXT NOT NULL,
                path TEXT NOT NULL,
                source TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                data BYTEA NOT NULL,
                PRIMARY KEY (container_id, id)
            )""",
            """CREATE TABLE rg_tool_results (
                owner TEXT NOT NULL,
                item_id TEXT NOT NULL,
                call_id TEXT NOT NULL,
                result TEXT NOT NULL,
                extra TEXT,
                created_at BIGINT NOT NULL,
                PRIMARY KEY (owner, item_id)
            )""",
            "CREATE INDEX rg_tool_results_created ON rg_tool_results (created_at)",
        ],
    ),
    # Vector stores (store/vector_stores.py, docs/file-search.md). Chunks carry their text and vector
    # (float32 bytes); the BM25 index is FTS5 on SQLite, a tsvector column on PostgreSQL; ``version``
    # moves with every write of a store's chunks (the in-memory vector index reloads on it).
    # Version 5: main's version 4 is the containers' tables (merged beside this one).
    (
        5,
        [
            """CREATE TABLE rg_vector_stores (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                name TEXT,
                description TEXT,
                metadata TEXT NOT NULL,
                expires_after TEXT,
                last_active_at BIGINT NOT NULL,
                embedding_model TEXT NOT NULL,
                dimensions INTEGER NOT NULL,
                version BIGINT NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX rg_vector_stores_by_owner ON rg_vector_stores (owner, created_at, id)",
            """CREATE TABLE rg_vector_store_files (
                vector_store_id TEXT NOT NULL,
                file_id TEXT NOT NULL,
                filename TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                status TEXT NOT NULL,
                last_error TEXT,
                attributes TEXT NOT NULL,
                chunking_strategy TEXT NOT NULL,
                usage_bytes BIGINT NOT NULL,
                batch_id TEXT,
                PRIMARY KEY (vector_store_id, file_id)
            )""",
            "CREATE INDEX rg_vector_store_files_by_batch ON rg_vector_store_files (batch_id)",
            """CREATE TABLE rg_vector_store_batches (
                id TEXT PRIMARY KEY,
                vector_store_id TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                cancelled INTEGER NOT NULL DEFAULT 0
            )""",
            {
                "sqlite": """CREATE TABLE rg_vs_chunks (
                    id INTEGER PRIMARY KEY,
                    vector_store_id TEXT NOT NULL,
                    file_id TEXT NOT NULL,
                    position INTEGER NOT NULL,
                    text TEXT NOT NULL,
                    embedding BLOB NOT NULL
                )""",
                "postgresql": """CREATE TABLE rg_vs_chunks (
                    id BIGSERIAL PRIMARY KEY,
                    vector_store_id TEXT NOT NULL,
                    file_id TEXT NOT NULL,
                    position INTEGER NOT NULL,
                    text TEXT NOT NULL,
                    embedding BYTEA NOT NULL,
                    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
                )""",
            },
            "CREATE INDEX rg_vs_chunks_by_file ON rg_vs_chunks (vector_store_id, file_id)",
            {
                # The store's id is a column too: a search intersects it in the index itself.
                "sqlite": "CREATE VIRTUAL TABLE rg_vs_fts USING fts5(vector_store_id, text, "
                "content='rg_vs_chunks', content_rowid='id', tokenize='porter unicode61')",
                "postgresql": "CREATE INDEX rg_vs_chunks_tsv ON rg_vs_chunks USING GIN (tsv)",
            },
        ],
    ),
    # Each event's arrival time (store/events.py): milliseconds since the response's recorder started
    # (its create), so a stored response can be replayed at the pace it streamed. NULL for events
    # written before this version, and for the closing events recovery adds after a crash.
    (6, ["ALTER TABLE rg_events ADD COLUMN at_ms BIGINT"]),
    # A vector store's expiry as a column (``last_active_at`` + ``expires_after.days``, NULL without
    # a policy), kept by every write that moves ``last_active_at``, so the sweep that deletes expired
    # stores (retrieval/service.py) finds them by index; the files' sweep likewise.
    (
        7,
        [
            "ALTER TABLE rg_vector_stores ADD COLUMN expires_at BIGINT",
            {
                "sqlite": "UPDATE rg_vector_stores SET expires_at = last_active_at + "
                "86400 * CAST(json_extract(expires_after, '$.days') AS INTEGER) "
                "WHERE expires_after IS NOT NULL",
                "postgresql": "UPDATE rg_vector_stores SET expires_at = last_active_at + "
                "86400 * CAST(CAST(expires_after AS json)->>'days' AS BIGINT) "
                "WHERE expires_after IS NOT NULL",
            },
            "CREATE INDEX rg_vector_stores_expiry ON rg_vector_stores (expires_at)",
            # Uploaded files' expires_after (POST /v1/files), swept the same way.
            "CREATE INDEX rg_files_expiry ON rg_files (expires_at)",
        ],
    ),
    # The in-database vector search tables (store/vector_search.py: sqlite-vec's vec0, pgvector's
    # vector(dim)) are created on first use, since they need the extension; this records, per search
    # table and store, the store's ``version`` its rows match (a search syncs them when it moved).
    (
        8,
        [
            """CREATE TABLE rg_vs_vec_sync (
                search_table TEXT NOT NULL,
                vector_store_id TEXT NOT NULL,
                version BIGINT NOT NULL,
                PRIMARY KEY (search_table, vector_store_id)
            )""",
            "CREATE INDEX rg_vs_vec_sync_by_store ON rg_vs_vec_sync (vector_store_id)",
        ],
    ),
    # SQLite numbers chunks itself (their FTS5 rows need the ids before the insert): the next id is
    # kept here so a deleted chunk's id is never given again (``MAX(id) + 1`` reused the ids of the
    # newest chunks once they were deleted, and a search table keyed by chunk id then kept the old
    # vector for the new chunk). PostgreSQL's identity column never reuses one; the row is unused there.
    (
        9,
        [
            "CREATE TABLE rg_vs_chunk_ids (next_id BIGINT NOT NULL)",
            "INSERT INTO rg_vs_chunk_ids (next_id) SELECT COALESCE(MAX(id), 0) + 1 FROM rg_vs_chunks",
        ],
    ),
    # The store's ``version`` the ingestion that wrote an attachment's chunks set (complete_file):
    # with the file id it names those chunks for good (a re-attachment gets a new one), so the BM25
    # index (retrieval/keyword_index.py) reads only what changed. NULL for files completed before
    # this version.
    (10, ["ALTER TABLE rg_vector_store_files ADD COLUMN ingested_version BIGINT"]),
    # Issue 14, stored BM25 postings (feat-bm25p): each attachment's tokenized chunks as written by
    # its ingestion (``complete_file``, same transaction; deleted with the chunks), so a process's
    # first search of a store loads them instead of tokenizing every text
    # (retrieval/keyword_index.py). ``tokenizer`` is the tokenizer's version that made them: another
    # version's are ignored and the texts tokenized again. ``chunk_ids``: the chunks' ids, int64
    # little-endian, in file order; ``postings``: the index's own encoding. FTS5 and the tsvector
    # column, which nothing searched any more, are dropped.
    (
        11,
        [
            """CREATE TABLE rg_vs_bm25 (
                vector_store_id TEXT NOT NULL,
                file_id TEXT NOT NULL,
                ingested_version BIGINT NOT NULL,
                tokenizer INTEGER NOT NULL,
                chunk_ids BYTEA NOT NULL,
                postings BYTEA NOT NULL,
                PRIMARY KEY (vector_store_id, file_id)
            )""",
            {
                "sqlite": "DROP TABLE IF EXISTS rg_vs_fts",
                "postgresql": "DROP INDEX IF EXISTS rg_vs_chunks_tsv",
            },
            {"postgresql": "ALTER TABLE rg_vs_chunks DROP COLUMN IF EXISTS tsv"},
        ],
    ),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]


async def migrate(db: Database) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; the version found before (0 for a new database)."""
    types = _TYPES[db.dialect]
    async with db.transaction() as tx:
        if db.dialect == "postgresql":
            # Instances starting together must not both run a migration; the lock ends with the
            # transaction.
            await tx.execute("SELECT pg_advisory_xact_lock(7263541)")
        await tx.execute("CREATE TABLE IF NOT EXISTS rg_schema (version INTEGER NOT NULL)")
        row = await tx.fetchone("SELECT MAX(version) FROM rg_schema")
        found = int(row[0]) if row and row[0] is not None else 0
        if found > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database schema is version {found}, newer than this gateway's {SCHEMA_VERSION}"
            )
        for version, statements in MIGRATIONS:
            if version <= found:
                continue
            for statement in statements:
                sql = statement.get(db.dialect) if isinstance(statement, dict) else statement
                if sql is not None:
                    await tx.execute(sql.format(**types))
            await tx.execute("INSERT INTO rg_schema (version) VALUES (?)", version)
    return found
