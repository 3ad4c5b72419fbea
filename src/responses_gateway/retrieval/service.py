"""The vector stores service: create and attach (ingestion in the background), hybrid search.

Search runs per vector store: BM25 over the chunks' text and nearest vectors to the query's
embedding, each ``max(4 × max_num_results, 40)`` deep, merged by reciprocal rank fusion
(``fusion.fuse``: ``score = Σ weight / (60 + rank)``, scaled so a chunk first on both lists
scores 1). A search over several stores (the file_search tool) merges their hits by that score.
``filters`` select files by their attributes before either index is read, so a filter never
empties a page the index filled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import documents
from ..store import NotFound, Store
from ..store.errors import VectorStoreExpired
from ..store.vector_stores import VectorStoreTables
from .chunking import TokenizerUnavailable, chunk_text
from .embedder import LOCAL_MODEL, Embedder, EmbedderUnavailable, local_embedder
from .filters import FilterError, check_filter, matches
from .fusion import fuse

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .keyword_index import KeywordIndex
    from .vector_index import Index

# The indexes (``keyword_index``, ``vector_index``) and numpy are imported when the indexes are
# opened (:meth:`VectorStores._open`): at start when the database holds a vector store, else on the
# first one. A gateway whose clients never use vector stores does not load them (docs/performance.md,
# "What a process holds at start").

__all__ = ["RetrievalError", "VectorStores", "extract_text"]

log = logging.getLogger("responses_gateway.retrieval")

JSON = dict[str, Any]
FileReader = Callable[[str, str], Awaitable[tuple[JSON, bytes]]]

MAX_RESULTS = 50
MAX_CHUNKS_PER_FILE = 20_000
MAX_QUERY_CHARS = 4096
MAX_ATTRIBUTES = 16
# The most stores the start-up warm-up loads (the indexes' memory limits may stop it sooner).
WARM_STORES = 1000


class RetrievalError(ValueError):
    """A request the vector stores refuse: a 400 naming ``param`` with OpenAI's ``code``."""

    def __init__(
        self, message: str, param: str | None = None, code: str = "invalid_value", status: int = 400
    ):
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def extract_text(data: bytes, filename: str, content_type: str | None = None) -> str:
    """A document's text (``documents.extract_text``: text, Markdown, HTML, JSON, code, PDF), or
    :class:`RetrievalError` naming why there is none: ``unsupported_file`` for a type it cannot
    read, ``invalid_file`` for an empty, corrupt or textless one."""
    try:
        text = documents.extract_text(data, filename, content_type)
    except documents.DocumentError as exc:
        code = "unsupported_file" if exc.reason in ("unsupported_type", "undecodable") else "invalid_file"
        raise RetrievalError(str(exc), "file_id", code) from None
    if not text.strip():
        raise RetrievalError(f"The file '{filename}' has no text to index.", "file_id", "invalid_file")
    return text


def check_attributes(value: Any, param: str = "attributes") -> JSON:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ATTRIBUTES:
        raise RetrievalError(f"'{param}' must be an object of at most {MAX_ATTRIBUTES} keys.", param)
    for key, item in value.items():
        if len(key) > 64:
            raise RetrievalError(f"'{param}' keys must be at most 64 characters.", param)
        if isinstance(item, str) and len(item) > 512:
            raise RetrievalError(f"'{param}.{key}' must be at most 512 characters.", param)
        if not isinstance(item, (str, int, float, bool)):
            raise RetrievalError(f"'{param}.{key}' must be a string, number or boolean.", param)
    return value


class VectorStores:
    """Vector stores over the store's database, for the HTTP API and the file_search tool."""

    def __init__(
        self,
        store: Callable[[], Store | None],
        read_file: FileReader,
        remote: Callable[[str], Embedder | None] | None = None,
        vector_index: str = "auto",
        warm: bool = True,
    ) -> None:
        self._store = store
        self._read_file = read_file
        # The local model, then the models file's embeddings upstreams (``remote``), made on first use.
        self.embedders: dict[str, Embedder] = {LOCAL_MODEL: local_embedder()}
        self._remote = remote
        self._tables: VectorStoreTables | None = None
        self._index: Index | None = None
        self._index_choice = vector_index
        self._keywords: KeywordIndex | None = None
        self._open_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ingest_lock = asyncio.Lock()
        # Stores searched by this process (their indexes may be held): checked by drop_gone.
        self._searched: set[str] = set()
        # Load the stores' indexes in the background after start (``warm``; ``serve --no-warm-indexes``).
        self._warm = warm
        self._warming: asyncio.Task[None] | None = None
        self.warmed = {"stores": 0, "chunks": 0}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open the vector stores on the store's database and resume ingestions left in progress."""
        store = self._store()
        if store is None:
            return
        tables = self._tables = VectorStoreTables(store.db)
        if not await tables.any_store():
            return  # opened with the first store (``_open``); nothing to resume or warm
        await self._open()
        for store_id, file_id in await tables.in_progress():
            self._spawn(self._ingest(store_id, file_id, None))
        if self._warm:
            self._warming = asyncio.ensure_future(self._warm_up())

    async def _open(self) -> None:
        """Open the indexes, once (the first caller opens them, the others wait for it)."""
        if self._index is not None or self._tables is None:
            return
        async with self._open_lock:
            tables = self._tables
            if self._index is not None or tables is None:
                return
            from .keyword_index import KeywordIndex
            from .vector_index import open_index

            index = await open_index(tables, self._index_choice)
            if self._tables is not tables:  # closed meanwhile
                return
            self._keywords = KeywordIndex(tables)
            self._index = index

    async def _warm_up(self, limit: int = WARM_STORES) -> None:
        """Load the indexes of the existing stores (BM25, and the vector back end's when it holds
        one in memory) one store after another, most recently active first, skipping expired ones,
        until ``limit`` stores or an index's memory limit: what each store's first search in this
        process would load, loaded before it. A search meanwhile waits only for its own store's
        load, if that one is running (each index loads a store once, under that store's lock)."""
        from .vector_index import VectorIndex

        tables, keywords, index = self.tables, self.keywords, self.index
        started = time.monotonic()
        embedder_loaded = False
        try:
            for store_id, model, dimensions in await tables.recent_stores(int(time.time()), limit):
                version = await tables.version(store_id)
                if version < 0:  # deleted meanwhile
                    continue
                if model == LOCAL_MODEL and not embedder_loaded:
                    # The first search would load the local embedding model too (once per process).
                    embedder_loaded = True
                    try:
                        await asyncio.to_thread(self.embedders[LOCAL_MODEL].embed, ["warm-up"])
                    except EmbedderUnavailable as exc:
                        log.warning("the local embedding model did not load: %s", exc)
                # (No vectors read for a store whose BM25 index did not fit: the warm-up stops there.)
                kept = await keywords.warm(store_id, version)
                if not kept or not await index.warm(store_id, dimensions, version):
                    log.info("warm-up of the file search indexes stopped at %s: their memory limit", store_id)
                    break
                self._searched.add(store_id)
                self.warmed["stores"] += 1
                stats = keywords.stats(store_id)
                self.warmed["chunks"] += 0 if stats is None else stats[0]
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("warming the file search indexes failed (searches load them instead)")
        log.info(
            "file search indexes of %d vector store(s) loaded (%d chunks, %s) in %.2f s",
            self.warmed["stores"],
            self.warmed["chunks"],
            "BM25" if not isinstance(index, VectorIndex) else "BM25 and vectors",
            time.monotonic() - started,
        )

    async def warmed_up(self) -> None:
        """Wait for the start-up warm-up to end (tests, the benchmark)."""
        if self._warming is not None:
            await asyncio.gather(self._warming, return_exceptions=True)

    async def sweep(self, now: int | None = None, *, batch: int = 100) -> int:
        """Delete the stores whose ``expires_after`` has passed, with their files and chunks; the
        number deleted (the gateway calls it every ``expiry_sweep_interval`` seconds). Each store
        goes in its own transaction that checks it is still expired, so instances (and ``serve
        --workers``) sweeping the same database at once delete each store once and never one a
        search has just kept alive."""
        tables = self.tables
        when = int(time.time()) if now is None else now
        deleted = 0
        while True:
            found = await tables.expired_stores(when, batch)
            for store_id in found:
                if await tables.delete_expired(store_id, when):
                    deleted += 1
                await self._forget(store_id)
            if len(found) < batch:
                break
        await self.drop_gone()
        return deleted

    async def drop_gone(self, store_ids: Sequence[str] | None = None) -> list[str]:
        """Drop from this process's indexes the stores (``store_ids``, or every store they hold)
        that no longer exist: deleted by another gateway instance, whose deletes this one does not
        see otherwise. The sweep calls it; the ids dropped."""
        if self._tables is None or self._index is None:
            return []  # not opened: this process holds no store
        held = list(self._searched | set(self.index.cached())) if store_ids is None else list(store_ids)
        if not held:
            return []
        existing = await self._tables.existing(held)
        gone = [store_id for store_id in held if store_id not in existing]
        for store_id in gone:
            await self._forget(store_id)
        return gone

    async def aclose(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
            self._warming = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._keywords is not None:
            await self._keywords.aclose()
        self._tables = None
        self._index = None
        self._keywords = None

    @property
    def tables(self) -> VectorStoreTables:
        if self._tables is None:
            raise RetrievalError(
                "This gateway keeps no vector stores (it runs without a store: serve --store none).",
                None,
                "not_found",
                404,
            )
        return self._tables

    def embedder(self, name: str) -> Embedder:
        embedder = self.embedders.get(name)
        if embedder is None and self._remote is not None:
            embedder = self._remote(name)
            if embedder is not None:
                self.embedders[name] = embedder
        if embedder is None:
            raise RetrievalError(
                f"The embedding model '{name[:100]}' is not served here. Served: "
                + ", ".join(self.embedders)
                + ".",
                "model",
                "model_not_found",
                404,
            )
        return embedder

    async def idle(self) -> None:
        """Wait for the ingestions running now (tests and the benchmark)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ------------------------------------------------------------------ stores and files
    async def create(self, owner: str, body: JSON) -> JSON:
        model = body.get("embedding_model", LOCAL_MODEL)
        if not isinstance(model, str):
            raise RetrievalError("'embedding_model' must be a string.", "embedding_model")
        embedder = self.embedder(model)
        if not embedder.dimensions:
            try:
                await asyncio.to_thread(embedder.probe)
            except EmbedderUnavailable as exc:
                raise RetrievalError(str(exc), "embedding_model", "upstream_error", 502) from None
        store_id = f"vs_{time.time_ns():016x}{os.urandom(8).hex()}"
        created = await self.tables.create_store(
            owner,
            store_id,
            created_at=int(time.time()),
            name=body.get("name"),
            description=body.get("description"),
            metadata=body.get("metadata") or {},
            expires_after=body.get("expires_after"),
            embedding_model=embedder.name,
            dimensions=embedder.dimensions,
        )
        for file_id in body.get("file_ids") or []:
            await self.attach(owner, store_id, file_id, attributes={}, chunking=body["chunking_strategy"])
        return await self.tables.get_store(owner, store_id) if body.get("file_ids") else created

    async def attach(
        self,
        owner: str,
        store_id: str,
        file_id: str,
        *,
        attributes: JSON,
        chunking: JSON,
        batch_id: str | None = None,
    ) -> JSON:
        """Attach an uploaded file; for a single file, its text is read now (a bad file is a 400 and
        nothing is attached), for a batch during ingestion (a bad file ends ``failed``)."""
        await self.usable(owner, store_id)
        meta, data = await self._read_file(owner, file_id)
        text: str | None = None
        if batch_id is None:
            text = await asyncio.to_thread(extract_text, data, str(meta["filename"]))
        try:
            found = await self.tables.add_file(
                owner,
                store_id,
                file_id,
                filename=str(meta["filename"]),
                created_at=int(time.time()),
                attributes=attributes,
                chunking_strategy=chunking,
                batch_id=batch_id,
            )
        except VectorStoreExpired as exc:
            raise _expired(exc) from None
        self._spawn(self._ingest(store_id, file_id, owner, text, data))
        return found

    async def delete(self, owner: str, store_id: str) -> None:
        await self.tables.delete_store(owner, store_id)
        await self._forget(store_id)

    async def _forget(self, store_id: str) -> None:
        """Drop a deleted store from both indexes (and its in-database vector rows)."""
        await self._open()  # another process's store: its in-database rows go too
        if self._index is not None:
            await self._index.forget(store_id)
        if self._keywords is not None:
            self._keywords.forget(store_id)
        self._searched.discard(store_id)

    @property
    def index(self) -> Index:
        if self._index is None:
            self.tables  # noqa: B018 (raises the 404 saying why)
            raise RuntimeError("no vector index")
        return self._index

    def keyword_reads(self) -> dict[str, int]:
        """``KeywordIndex.reads`` (nothing before ``start``): the metrics read it."""
        return {} if self._keywords is None else self._keywords.reads

    def vector_reads(self) -> int:
        """``VectorIndex.reads``: vectors the in-memory index read (0 for the in-database back
        ends, which hold none): the metrics read it."""
        if self._index is None:
            return 0
        from .vector_index import VectorIndex

        return self._index.reads if isinstance(self._index, VectorIndex) else 0

    def warm_up(self) -> dict[str, int]:
        """The start-up warm-up so far: ``stores`` and ``chunks`` loaded, and ``running`` (1 while
        it runs): the metrics read it."""
        running = self._warming is not None and not self._warming.done()
        return {**self.warmed, "running": int(running)}

    @property
    def keywords(self) -> KeywordIndex:
        if self._keywords is None:
            self.tables  # noqa: B018 (raises the 404 saying why)
            raise RuntimeError("no keyword index")
        return self._keywords

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ingest(
        self,
        store_id: str,
        file_id: str,
        owner: str | None,
        text: str | None = None,
        data: bytes | None = None,
    ) -> None:
        tables = self.tables
        await self._open()
        async with self._ingest_lock:  # CPU-bound: one file at a time
            row = await tables.file_row(store_id, file_id)
            if row is None or row[0] != "in_progress":
                return
            _, filename, strategy, model, dimensions = row
            try:
                if text is None:
                    if data is None:
                        store = self._store()
                        owner_row = None if store is None else await _owner_of(tables, store_id)
                        if owner_row is None:
                            raise RetrievalError("The vector store is gone.", None, "server_error")
                        _, data = await self._read_file(owner_row, file_id)
                    text = await asyncio.to_thread(extract_text, data, filename)
                embedder = self.embedder(model)
                static = strategy["static"]
                chunks = await asyncio.to_thread(
                    chunk_text,
                    text,
                    size=int(static["max_chunk_size_tokens"]),
                    overlap=int(static["chunk_overlap_tokens"]),
                )
                if len(chunks) > MAX_CHUNKS_PER_FILE:
                    raise RetrievalError(
                        f"The file has more than {MAX_CHUNKS_PER_FILE} chunks.", "file_id", "invalid_file"
                    )
                vectors = (await asyncio.to_thread(embedder.embed, chunks)).vectors
                if vectors.shape[1] != dimensions:
                    raise RetrievalError(
                        f"The vector store holds {dimensions}-dimension vectors; '{model}' now gives "
                        f"{vectors.shape[1]}.",
                        None,
                        "embedding_mismatch",
                    )
                rows = [row.astype("<f4").tobytes() for row in vectors]
                usage = sum(len(c.encode("utf-8")) for c in chunks)
                # Tokenized once, here: every process's BM25 index loads these postings.
                from .keyword_index import TOKENIZER, postings

                keywords = (TOKENIZER, await asyncio.to_thread(postings, chunks))
                if await tables.complete_file(
                    store_id, file_id, chunks, rows, usage_bytes=usage, postings=keywords
                ):
                    # The in-database search table takes the new chunks now, not at the next search.
                    await self.index.prepare(store_id, dimensions)
            except asyncio.CancelledError:
                raise
            except RetrievalError as exc:
                await tables.fail_file(store_id, file_id, "failed", {"code": exc.code, "message": str(exc)})
            except (EmbedderUnavailable, TokenizerUnavailable) as exc:
                await tables.fail_file(
                    store_id, file_id, "failed", {"code": "server_error", "message": str(exc)}
                )
            except Exception:
                log.exception("ingesting %s into %s failed", file_id, store_id)
                await tables.fail_file(
                    store_id, file_id, "failed", {"code": "server_error", "message": "Ingestion failed."}
                )

    # ------------------------------------------------------------------ search
    async def search(
        self,
        owner: str,
        store_id: str,
        query: str | Sequence[str],
        *,
        max_num_results: int,
        filters: JSON | None,
        ranking_options: JSON | None,
    ) -> list[JSON]:
        """The hits of one vector store, best first."""
        try:
            # The store checked and used, its files and version: one transaction. The version is
            # read now, so neither index need ask the database again while the other side runs.
            context = await self.tables.search_context(owner, store_id, int(time.time()))
        except NotFound:
            await self.drop_gone([store_id])  # another instance may have deleted it
            raise
        except VectorStoreExpired as exc:
            raise _expired(exc) from None
        await self._open()
        from .keyword_index import query_terms

        self._searched.add(store_id)
        text = query if isinstance(query, str) else " ".join(query)
        weights, threshold = _options(filters, ranking_options)
        embedder = self.embedder(context.embedding_model)
        dimensions, files, version = context.dimensions, context.files, context.version
        allowed = [f for f in files if filters is None or matches(filters, f[2])]
        if not allowed:
            return []
        restrict = None if len(allowed) == len(files) else [f[0] for f in allowed]
        depth = max(max_num_results * 4, 40)
        w_vec, w_text = weights
        # BM25 (in memory, a worker thread for large stores) runs while the query is embedded and
        # the vectors searched: the two sides overlap. A side weighted 0 is not computed.
        text_side = asyncio.ensure_future(
            self.keywords.search(store_id, query_terms(text), limit=depth, file_ids=restrict, version=version)
            if w_text
            else _nothing()
        )
        try:
            vector_ids = (
                await self._nearest(embedder, store_id, text, dimensions, depth, restrict, version)
                if w_vec
                else []
            )
        except BaseException:
            text_side.cancel()
            await asyncio.gather(text_side, return_exceptions=True)
            raise
        text_ids = await text_side
        fused = fuse([(w_vec, vector_ids), (w_text, text_ids)])
        ranked = [(cid, s) for cid, s in fused if s >= threshold][:max_num_results]
        chunks = await self.tables.chunks([cid for cid, _ in ranked])
        names = {f[0]: (f[1], f[2]) for f in files}
        hits = []
        for chunk_id, score in ranked:
            _, file_id, chunk = chunks[chunk_id]
            filename, attributes = names[file_id]
            hits.append(
                {
                    "file_id": file_id,
                    "filename": filename,
                    "score": round(score, 6),
                    "attributes": attributes,
                    "text": chunk,
                }
            )
        return hits

    async def usable(self, owner: str, store_id: str) -> JSON:
        """The store, refused (400 ``vector_store_expired``) once expired. (A search moves its
        ``last_active_at``, the anchor of ``expires_after``: ``VectorStoreTables.search_context``.)"""
        found = await self.tables.get_store(owner, store_id)
        if found["expires_at"] is not None and found["expires_at"] <= time.time():
            raise _expired(VectorStoreExpired(store_id))
        return found

    async def _nearest(
        self,
        embedder: Embedder,
        store_id: str,
        text: str,
        dimensions: int,
        depth: int,
        restrict: list[str] | None,
        version: int,
    ) -> list[int]:

        def embedded() -> npt.NDArray[np.float32]:
            try:
                vector: npt.NDArray[np.float32] = embedder.embed([text]).vectors[0]
            except EmbedderUnavailable as exc:
                raise RetrievalError(str(exc), None, "upstream_error", 502) from None
            if vector.shape[0] != dimensions:
                raise RetrievalError(
                    f"The vector store was built with {dimensions}-dimension vectors; "
                    f"'{embedder.name}' now gives {vector.shape[0]}.",
                    "vector_store_id",
                    "embedding_mismatch",
                )
            return vector

        # Embedded in the worker thread that then runs the in-memory product: one hop for both.
        return await self.index.search(
            store_id, embedded, dimensions=dimensions, limit=depth, file_ids=restrict, version=version
        )

    async def search_for_tool(
        self,
        owner: str | None,
        vector_store_ids: Sequence[str],
        query: str,
        *,
        max_num_results: int,
        filters: dict[str, Any] | None,
        ranking_options: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """Hits across ``vector_store_ids``, best first; ``LookupError(id)`` for a store the owner
        does not have. The ``/v1/vector_stores/{id}/search`` endpoint runs the same code."""
        hits: list[JSON] = []
        for store_id in vector_store_ids:
            if owner is None:
                raise LookupError(store_id)
            try:
                hits += await self.search(
                    owner,
                    store_id,
                    query,
                    max_num_results=max_num_results,
                    filters=filters,
                    ranking_options=ranking_options,
                )
            except NotFound:
                raise LookupError(store_id) from None
        hits.sort(key=lambda h: -float(h["score"]))
        return hits[:max_num_results]

    async def check_for_tool(
        self,
        owner: str | None,
        vector_store_ids: Sequence[str],
        *,
        filters: dict[str, Any] | None,
        ranking_options: dict[str, Any] | None,
    ) -> None:
        """What :meth:`search_for_tool` would refuse, found without searching (no query embedded):
        ``LookupError(id)`` for a store the owner does not have, ``RetrievalError`` for a bad filter or
        ranking option."""
        _options(filters, ranking_options)
        for at, store_id in enumerate(vector_store_ids):
            if owner is None:
                raise LookupError(store_id)
            try:
                await self.usable(owner, store_id)
            except NotFound:
                raise LookupError(store_id) from None
            except RetrievalError as exc:
                exc.param = f"vector_store_ids[{at}]"
                raise


def _expired(exc: VectorStoreExpired) -> RetrievalError:
    return RetrievalError(str(exc), "vector_store_id", "vector_store_expired")


def _options(filters: JSON | None, ranking_options: JSON | None) -> tuple[tuple[float, float], float]:
    """The weights and threshold of ``ranking_options``, once ``filters`` are checked too."""
    if filters is not None:
        try:
            check_filter(filters)
        except FilterError as exc:
            raise RetrievalError(str(exc), "filters") from None
    return _ranking(ranking_options)


async def _nothing() -> list[int]:
    return []


async def _owner_of(tables: VectorStoreTables, store_id: str) -> str | None:
    async with tables.db.transaction() as tx:
        row = await tx.fetchone("SELECT owner FROM rg_vector_stores WHERE id = ?", store_id)
    return None if row is None else str(row[0])


def _ranking(options: JSON | None) -> tuple[tuple[float, float], float]:
    """(embedding weight, text weight) and the score threshold of ``ranking_options``."""
    if options is None:
        return (1.0, 1.0), 0.0
    if not isinstance(options, dict):
        raise RetrievalError("'ranking_options' must be an object.", "ranking_options")
    ranker = options.get("ranker", "auto")
    if ranker not in ("auto", "default-2024-11-15", "none"):
        raise RetrievalError(
            "'ranking_options.ranker' must be 'auto', 'default-2024-11-15' or 'none'.",
            "ranking_options.ranker",
        )
    threshold = options.get("score_threshold", 0.0)
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 <= threshold <= 1:
        raise RetrievalError(
            "'ranking_options.score_threshold' must be a number from 0 to 1.",
            "ranking_options.score_threshold",
        )
    hybrid = options.get("hybrid_search") or {}
    if not isinstance(hybrid, dict):
        raise RetrievalError(
            "'ranking_options.hybrid_search' must be an object.", "ranking_options.hybrid_search"
        )
    weights = []
    for key in ("embedding_weight", "text_weight"):
        value = hybrid.get(key, 1.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise RetrievalError(
                f"'ranking_options.hybrid_search.{key}' must be a number >= 0.",
                f"ranking_options.hybrid_search.{key}",
            )
        weights.append(float(value))
    if weights[0] + weights[1] <= 0:
        raise RetrievalError(
            "At least one hybrid_search weight must be above 0.", "ranking_options.hybrid_search"
        )
    return (weights[0], weights[1]), float(threshold)
