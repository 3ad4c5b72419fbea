"""Vector store ingestion and search: chunks/s, search latency at 10k and 100k chunks, recall@5.

The corpus ships with Python: ``pydoc_data.topics`` (the language reference's help topics, 79
documents, about 465 kB). Each topic is one file; its first line is its title (``The "assert"
statement``, ``Boolean operations``…). The labelled question set is built from it deterministically:
the question is the title, the file is ingested *without* its title line, and the answer is right
when a chunk of that topic is among the top 5 hits (recall@5), for BM25 alone, vectors alone and
hybrid (reciprocal rank fusion), the three through the same ``VectorStores.search`` (the
``ranking_options.hybrid_search`` weights select the side).

Recall is given for every question and for the held-out half (the questions at odd positions):
the fusion's settings were chosen on the even positions only. Two more labelled sets, never used
to choose anything: the standard library's module docstrings (first line the question, the rest the
document), and questions naming an identifier (``What does copytree() do?``) over the standard
library's function docstrings, one document per module (``identifier_corpus``; its rule was written
down before any result of it was seen).

Latency: stores of 10k and 100k chunks (the corpus's chunks repeated; each copy's vector is the
original's plus a little noise, renormalised, so neighbours stay realistic) searched with the
questions in turn; then one more file of 100 chunks is attached and the first search after it
timed (BM25 alone, the whole search after another such file, the vector side alone after a third),
then the whole search after one of them is detached, and p50 / p99 of the vector side and of the
whole search once the store has taken those writes. Reported per search: p50 and p99
of the whole ``search`` call (hybrid, the
query's embedding included), of the query's embedding alone, and of each index alone: BM25 in memory
(``retrieval/keyword_index.py``, what search uses), BM25 by SQLite FTS5 (what search used before,
for comparison: the benchmark builds its own FTS5 table over the store's chunks, as the gateway
did before migration 11) and the vector product (the query embedded beforehand). Also the first
search's time (both indexes built), the first BM25 search of a fresh index (a new process: the
stored postings loaded, or the texts tokenized where there are none), the store's write rate, the
BM25 index's memory per chunk, and the disk per chunk of the stored postings and of the FTS5 table.

    .venv/bin/python bench/file_search.py [--sizes 10000,100000] [--searches 200] [--quick] [--keep]
        [--no-recall [--corpus-cache FILE.npz]] [--json FILE] [--chunking 250,50]

``--quick`` (the smoke test): 6 topics, a 1,000-chunk store, 10 searches.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from responses_gateway.retrieval import keyword_index
from responses_gateway.retrieval.chunking import chunk_text
from responses_gateway.retrieval.keyword_index import KeywordIndex, query_terms
from responses_gateway.retrieval.service import VectorStores
from responses_gateway.store import Store, open_store

OWNER = "bench"
# 250 of OpenAI's (cl100k_base) tokens with 50 overlapping: on this corpus about 300 WordPiece tokens,
# so most chunks are a bit more than one window of the model (256 with [CLS] and [SEP]) and are
# embedded as the mean of two (docs/file-search.md, Measured, "Chunks in OpenAI's tokens").
CHUNKING = {"type": "static", "static": {"max_chunk_size_tokens": 250, "chunk_overlap_tokens": 50}}
# What search left out of the FTS5 query before the in-memory index (the list of PostgreSQL's
# 'english' configuration), for the FTS5 comparison.
_STOP_TEXT = """a about above after again against all am an and any are as at be because been before being
below between both but by can did do does doing don down during each few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just me more
most my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
you your yours yourself yourselves"""
STOP_WORDS = frozenset(_STOP_TEXT.split())
SIDES = {
    "bm25": {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}},
    "vectors": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}},
    "hybrid": {"hybrid_search": {"embedding_weight": 1, "text_weight": 1}},
}


def _stdlib_sources() -> Iterator[tuple[str, Path]]:
    """Each standard library module with a source file here (``x.py`` or ``x/__init__.py``), by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for module in sorted(sys.stdlib_module_names):
        path = root / f"{module}.py"
        if not path.exists():
            path = root / module / "__init__.py"
        if path.exists():
            yield module, path


def stdlib_corpus(limit: int | None) -> list[tuple[str, str, str]]:
    """A second labelled set, never used to choose anything: the standard library's module
    docstrings (read from the source files, nothing imported). The question is a docstring's first
    line (``Heap queue algorithm (a.k.a. priority queue)``), the document the rest of it; kept when
    the first line has 3 words or more and the rest 400 characters or more."""
    seen: set[str] = set()
    out = []
    for module, path in _stdlib_sources():
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = (doc or "").strip().splitlines()
        if not lines:
            continue
        title, body = lines[0].strip().rstrip("."), "\n".join(lines[1:]).strip()
        if len(title.split()) < 3 or len(body) < 400 or title in seen:
            continue
        seen.add(title)
        out.append((f"{module}.txt", title, body))
    return out[:limit] if limit else out


def identifier_corpus(limit: int | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """A third labelled set, of another kind of question: one naming an identifier, as a model's
    file_search ``queries`` often do. Its rule was written before any result of it was seen, and it
    is never used to choose anything. Per standard library module (sources parsed, nothing
    imported): its top-level public functions (``def``/``async def``, name not starting with
    ``_``) whose docstring is 200 characters or more, the first 10 in source order; the module's
    document is, per function, ``def NAME(ARGS):`` and its docstring. One question per function
    whose name is kept in one module only: ``What does NAME() do?``, answered by that module's
    document. Returns (file name, document) and (file name, question)."""
    modules: list[tuple[str, list[tuple[str, str]]]] = []
    for module, path in _stdlib_sources():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        kept: list[tuple[str, str]] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 200:
                    kept.append((node.name, f"def {node.name}({ast.unparse(node.args)}):\n{doc}"))
            if len(kept) >= 10:
                break
        if kept:
            modules.append((module, kept))
    if limit:
        modules = modules[:limit]
    count: dict[str, int] = {}
    for _, kept in modules:
        for name, _ in kept:
            count[name] = count.get(name, 0) + 1
    docs = [(f"{m}.txt", "\n\n".join(text for _, text in kept)) for m, kept in modules]
    questions = [
        (f"{m}.txt", f"What does {name}() do?") for m, kept in modules for name, _ in kept if count[name] == 1
    ]
    return docs, questions


def corpus(limit: int | None) -> list[tuple[str, str, str]]:
    """(file name, title = the question, body without the title) per topic, in a fixed order."""
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out = []
    for key in sorted(topics):
        lines = topics[key].strip().splitlines()
        title, body = lines[0].strip(), "\n".join(lines[1:]).strip()
        if title in seen or not body:
            continue  # a title twice would be a question with two right answers
        seen.add(title)
        out.append((f"{key}.txt", title, body))
    return out[:limit] if limit else out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def open_service(store: Store, blobs: dict[str, bytes], **options: Any) -> VectorStores:
    """The vector store service over ``store``, reading the files' bytes from ``blobs``."""

    async def read(owner: str, file_id: str) -> tuple[dict[str, Any], bytes]:
        return {"filename": file_id}, blobs[file_id]

    return VectorStores(lambda: store, read, **options)


def corpus_info(docs: list[tuple[str, str, str]], blobs: dict[str, bytes]) -> dict[str, Any]:
    return {"documents": len(docs), "bytes": sum(len(b) for b in blobs.values()), "chunking": CHUNKING}


async def write_file(
    service: VectorStores, store_id: str, file_id: str, texts: list[str], vectors: list[bytes]
) -> None:
    """One file's chunks and vectors written as ingestion would, without parsing or embedding."""
    await service.tables.add_file(
        OWNER, store_id, file_id, filename=file_id, created_at=0, attributes={}, chunking_strategy=CHUNKING
    )
    encode = getattr(keyword_index, "postings", None)  # absent before the stored postings
    if encode is None:
        await service.tables.complete_file(store_id, file_id, texts, vectors, usage_bytes=0)
    else:
        keywords = (keyword_index.TOKENIZER, await asyncio.to_thread(encode, texts))
        await service.tables.complete_file(
            store_id, file_id, texts, vectors, usage_bytes=0, postings=keywords
        )


async def pages(store: Store) -> int:
    """The SQLite file's size in bytes (its pages)."""
    async with store.db.transaction() as tx:
        count = await tx.fetchone("PRAGMA page_count")
        size = await tx.fetchone("PRAGMA page_size")
    assert count is not None and size is not None
    return int(count[0]) * int(size[0])


async def fts_table(store: Store, store_id: str, name: str) -> int:
    """An FTS5 table of the store's chunks as the gateway kept one before migration 11 (external
    content over ``rg_vs_chunks``, the store's id a column, porter stemming); the bytes it added."""
    before = await pages(store)
    async with store.db.transaction() as tx:
        await tx.execute(
            f"CREATE VIRTUAL TABLE {name} USING fts5(vector_store_id, text, content='rg_vs_chunks', "
            "content_rowid='id', tokenize='porter unicode61')"
        )
        await tx.execute(
            f"INSERT INTO {name} (rowid, vector_store_id, text) "
            "SELECT id, vector_store_id, text FROM rg_vs_chunks WHERE vector_store_id = ?",
            store_id,
        )
    return await pages(store) - before


async def fts_search(store: Store, name: str, store_id: str, terms: list[str], limit: int) -> list[int]:
    """FTS5's ``bm25()`` as search ran it before the in-memory index: any term matches."""
    phrase = store_id.replace('"', '""')
    words = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
    async with store.db.transaction() as tx:
        rows = await tx.fetch(
            f"SELECT rowid FROM {name} WHERE {name} MATCH ? ORDER BY bm25({name}, 0.0, 1.0), rowid LIMIT ?",
            f'vector_store_id : "{phrase}" AND text : ({words})',
            limit,
        )
    return [int(row[0]) for row in rows]


async def stored_bytes(store: Store, store_id: str) -> int | None:
    """The stored postings' bytes (chunk ids and blobs) of a store; None before they existed."""
    async with store.db.transaction() as tx:
        table = await tx.fetchone("SELECT 1 FROM sqlite_master WHERE name = 'rg_vs_bm25'")
        if table is None:
            return None
        row = await tx.fetchone(
            "SELECT SUM(LENGTH(chunk_ids) + LENGTH(postings)) FROM rg_vs_bm25 WHERE vector_store_id = ?",
            store_id,
        )
    return int(row[0]) if row and row[0] is not None else 0


async def big_store(service: VectorStores, size: int, texts: list[str], vectors: Any) -> tuple[str, float]:
    """A store of ``size`` chunks: the corpus's repeated, each copy's vector the original's plus a
    little noise, renormalised (seeded: the same on every database). Its id and the seconds the
    writes took."""
    rng = np.random.default_rng(14)
    big = (await service.create(OWNER, {"name": f"big-{size}", "chunking_strategy": None}))["id"]
    made = 0
    start = time.perf_counter()
    while made < size:
        n = min(1000, size - made)
        idx = np.arange(made, made + n) % len(texts)
        noisy = vectors[idx] + rng.normal(0, 0.02, (n, vectors.shape[1])).astype(np.float32)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        await write_file(
            service, big, f"copy-{made}", [texts[i] for i in idx], [row.tobytes() for row in noisy]
        )
        made += n
    return big, time.perf_counter() - start


def machine() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}


async def ingest(service: VectorStores, docs: list[tuple[str, str, str]]) -> tuple[str, list[Any], float]:
    """Every document attached to a new vector store, ingestion waited for: the store's id, its chunks'
    rows (id, text, embedding) and the seconds it took."""
    vs = (await service.create(OWNER, {"name": "pydoc", "chunking_strategy": None}))["id"]
    start = time.perf_counter()
    for name, _, _ in docs:
        await service.attach(OWNER, vs, name, attributes={}, chunking=CHUNKING)
    await service.idle()
    took = time.perf_counter() - start
    found = await service.tables.get_store(OWNER, vs)
    assert found["file_counts"]["completed"] == len(docs), found["file_counts"]
    async with service.tables.db.transaction() as tx:
        rows = await tx.fetch(
            "SELECT id, text, embedding FROM rg_vs_chunks WHERE vector_store_id = ? ORDER BY id", vs
        )
    return vs, rows, took


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="rg-bench-fs-"))
    if args.keep:
        print(f"store: {tmp}/gateway.db", flush=True)
    store: Store = await open_store(f"sqlite://{tmp}/gateway.db")
    docs = corpus(6 if args.quick else None)
    second = stdlib_corpus(6 if args.quick else None)
    third_docs, third_questions = identifier_corpus(6 if args.quick else None)
    # The other labelled sets, each in a store of its own: (name, documents, (file, question)).
    others = [
        (
            "stdlib",
            "stdlib docstrings",
            [(f"stdlib/{n}", body) for n, _, body in second],
            [(f"stdlib/{n}", title) for n, title, _ in second],
        ),
        (
            "identifiers",
            "identifier questions",
            [(f"ident/{n}", body) for n, body in third_docs],
            [(f"ident/{n}", question) for n, question in third_questions],
        ),
    ]
    blobs = {name: body.encode() for name, _, body in docs}
    for _, _, other_docs, _ in others:
        blobs.update({name: body.encode() for name, body in other_docs})
    service = open_service(store, blobs)
    await service.start()
    result: dict[str, Any] = {"machine": machine(), "corpus": corpus_info(docs, blobs)}
    try:
        embedder = service.embedder("all-MiniLM-L6-v2")
        await asyncio.to_thread(embedder.embed, ["warm up"])
        # ---------------------------------------------------------------- ingestion
        # Chunking alone (cl100k_base tokens), for its share of ingestion: the corpus cut once.
        static: dict[str, int] = CHUNKING["static"]  # type: ignore[assignment]
        size, overlap = static["max_chunk_size_tokens"], static["chunk_overlap_tokens"]
        chunk_text("warm up", size=size, overlap=overlap)
        t0 = time.perf_counter()
        for _, _, body in docs:
            chunk_text(body, size=size, overlap=overlap)
        chunking = time.perf_counter() - t0
        cache = Path(args.corpus_cache) if args.corpus_cache else None
        if cache is not None and cache.exists():
            # The corpus's chunks and vectors as an earlier run ingested them (--no-recall only).
            saved = np.load(cache)
            rows = [(0, str(t), v.tobytes()) for t, v in zip(saved["texts"], saved["vectors"], strict=True)]
            vs, took = "", float(saved["seconds"])
        else:
            vs, rows, took = await ingest(service, docs)
            if cache is not None:
                vectors = np.stack([np.frombuffer(bytes(r[2]), dtype=np.float32) for r in rows])
                np.savez(cache, texts=np.array([r[1] for r in rows]), vectors=vectors, seconds=took)
        chunks = len(rows)
        result["ingestion"] = {
            "chunks": chunks,
            "seconds": round(took, 2),
            "chunks_per_s": round(chunks / took, 1),
            "chunking_seconds": round(chunking, 3),
        }
        print(
            f"ingestion: {chunks} chunks in {took:.1f} s = {chunks / took:.1f} chunks/s "
            f"(chunking alone {chunking * 1000:.0f} ms)",
            flush=True,
        )
        # ---------------------------------------------------------------- recall@5
        # Every question, and the held-out half (odd positions): the fusion's settings were chosen on
        # the even positions only (docs/file-search.md, Measured).
        recall: dict[str, dict[str, float]] = {}
        for side, options in () if args.no_recall else SIDES.items():
            right = []
            for name, title, _ in docs:
                hits = await service.search(
                    OWNER, vs, title, max_num_results=5, filters=None, ranking_options=options
                )
                right.append(any(h["file_id"] == name for h in hits))
            held = right[1::2]
            recall[side] = {
                "all": round(sum(right) / len(right), 3),
                "held_out": round(sum(held) / max(len(held), 1), 3),
            }
            print(
                f"recall@5 {side:8s} all {recall[side]['all']:.3f} ({sum(right)}/{len(right)}), "
                f"held-out half {recall[side]['held_out']:.3f} ({sum(held)}/{len(held)})",
                flush=True,
            )
        result["recall_at_5"] = recall
        # The other labelled sets (never used to choose anything), each in a store of its own.
        for key, label, other_docs, other_questions in () if args.no_recall else others:
            vs2 = (await service.create(OWNER, {"name": key, "chunking_strategy": None}))["id"]
            for name, _ in other_docs:
                await service.attach(OWNER, vs2, name, attributes={}, chunking=CHUNKING)
            await service.idle()
            found = await service.tables.get_store(OWNER, vs2)
            assert found["file_counts"]["completed"] == len(other_docs), found["file_counts"]
            result[f"recall_at_5_{key}"] = {}
            for side, options in SIDES.items():
                right = []
                for name, question in other_questions:
                    hits = await service.search(
                        OWNER, vs2, question, max_num_results=5, filters=None, ranking_options=options
                    )
                    right.append(any(h["file_id"] == name for h in hits))
                result[f"recall_at_5_{key}"][side] = round(sum(right) / len(right), 3)
                print(
                    f"recall@5 {side:8s} {label} {sum(right) / len(right):.3f} ({sum(right)}/{len(right)})",
                    flush=True,
                )
        # ---------------------------------------------------------------- latency
        texts = [r[1] for r in rows]
        vectors = np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows])
        questions = [title for _, title, _ in docs]
        sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(",")]
        result["latency"] = {}
        for size in sizes:
            big, load = await big_store(service, size, texts, vectors)
            fts = f"bench_fts_{size}"
            fts_bytes = await fts_table(store, big, fts)
            blob_bytes = await stored_bytes(store, big)
            # The first search builds the BM25 postings and reads the vectors into memory.
            t0 = time.perf_counter()
            await service.search(
                OWNER, big, questions[0], max_num_results=10, filters=None, ranking_options=None
            )
            first = time.perf_counter() - t0
            stats = service.keywords.stats(big)
            assert stats is not None
            # A fresh index over the same store, as a new process (a restart, another worker) has:
            # its first BM25 search, twice (the second with the database's pages cached).
            fresh_ms, fresh_reads = [], {}
            for _ in range(2):
                fresh = KeywordIndex(service.tables)
                t0 = time.perf_counter()
                await fresh.search(big, query_terms(questions[0]), limit=40, file_ids=None)
                fresh_ms.append((time.perf_counter() - t0) * 1000)
                fresh_reads = dict(getattr(fresh, "reads", {"texts": size}))
                await fresh.aclose()
            timings: dict[str, list[float]] = {
                "search": [],
                "embed": [],
                "bm25": [],
                "fts": [],
                "vectors": [],
            }
            for i in range(args.searches):
                question = questions[i % len(questions)]
                t0 = time.perf_counter()
                await service.search(
                    OWNER, big, question, max_num_results=10, filters=None, ranking_options=None
                )
                timings["search"].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                query_vector = (await asyncio.to_thread(embedder.embed, [question])).vectors[0]
                timings["embed"].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await service.keywords.search(big, query_terms(question), limit=40, file_ids=None)
                timings["bm25"].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                words = [w for w in re.findall(r"\w+", question.lower()) if w not in STOP_WORDS]
                await fts_search(store, fts, big, words, 40)
                timings["fts"].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await service.index.search(big, query_vector, dimensions=384, limit=40, file_ids=None)
                timings["vectors"].append((time.perf_counter() - t0) * 1000)
            row: dict[str, Any] = {
                "chunks": size,
                "load_s": round(load, 1),
                "write_chunks_per_s": round(size / load, 1),
                "first_search_s": round(first, 2),
                "fresh_bm25_first_ms": [round(t, 1) for t in fresh_ms],
                "fresh_bm25_reads": fresh_reads,
                "bm25_bytes_per_chunk": round(stats[1] / stats[0]),
                "fts5_disk_bytes_per_chunk": round(fts_bytes / size),
                "stored_postings_bytes_per_chunk": None if blob_bytes is None else round(blob_bytes / size),
            }
            for part, values in timings.items():
                row[f"{part}_ms_p50"] = round(statistics.median(values), 2)
                row[f"{part}_ms_p99"] = round(percentile(values, 99), 2)
            # One more file of 100 chunks attached, then the first search: BM25 alone after one
            # file, the whole search (vectors reloaded too) after another. Then the background work
            # the write left (segment merges, weights: keyword_index.py) and BM25's p50 after it.
            for part in ("bm25", "search"):
                file_id = f"extra-{part}"
                idx = np.arange(100) % chunks
                await write_file(
                    service, big, file_id, [texts[i] for i in idx], [vectors[i].tobytes() for i in idx]
                )
                t0 = time.perf_counter()
                if part == "bm25":
                    await service.keywords.search(big, query_terms(questions[1]), limit=40, file_ids=None)
                else:
                    await service.search(
                        OWNER, big, questions[1], max_num_results=10, filters=None, ranking_options=None
                    )
                row[f"after_write_{part}_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            # The vector side alone after a third file (the in-memory index catches up: reads that
            # file's vectors, or before issue 14's incremental vector index, the whole store's), then
            # the whole search after a detach (the file's rows masked, or everything reloaded).
            idx = np.arange(100) % chunks
            await write_file(
                service, big, "extra-vectors", [texts[i] for i in idx], [vectors[i].tobytes() for i in idx]
            )
            query_vector = (await asyncio.to_thread(embedder.embed, [questions[2]])).vectors[0]
            t0 = time.perf_counter()
            await service.index.search(big, query_vector, dimensions=384, limit=40, file_ids=None)
            row["after_write_vectors_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            await service.tables.delete_file(OWNER, big, "extra-bm25")
            t0 = time.perf_counter()
            await service.search(
                OWNER, big, questions[3], max_num_results=10, filters=None, ranking_options=None
            )
            row["after_detach_search_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            t0 = time.perf_counter()
            idle = getattr(service.keywords, "idle", None)  # absent before the incremental index
            if idle is not None:
                await idle()
            row["bm25_background_s"] = round(time.perf_counter() - t0, 2)
            again = []
            for i in range(args.searches):
                t0 = time.perf_counter()
                await service.keywords.search(
                    big, query_terms(questions[i % len(questions)]), limit=40, file_ids=None
                )
                again.append((time.perf_counter() - t0) * 1000)
            row["bm25_after_writes_ms_p50"] = round(statistics.median(again), 2)
            row["bm25_after_writes_ms_p99"] = round(percentile(again, 99), 2)
            # The vector side and the whole search once the store has taken those writes.
            after: dict[str, list[float]] = {"vectors": [], "search": []}
            for i in range(args.searches):
                question = questions[i % len(questions)]
                query_vector = (await asyncio.to_thread(embedder.embed, [question])).vectors[0]
                t0 = time.perf_counter()
                await service.index.search(big, query_vector, dimensions=384, limit=40, file_ids=None)
                after["vectors"].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await service.search(
                    OWNER, big, question, max_num_results=10, filters=None, ranking_options=None
                )
                after["search"].append((time.perf_counter() - t0) * 1000)
            for part, values in after.items():
                row[f"{part}_after_writes_ms_p50"] = round(statistics.median(values), 2)
                row[f"{part}_after_writes_ms_p99"] = round(percentile(values, 99), 2)
            result["latency"][str(size)] = row
            print(
                f"{size:>7} chunks: search p50 {row['search_ms_p50']} ms, p99 {row['search_ms_p99']} ms; "
                f"query embedding p50 {row['embed_ms_p50']} / p99 {row['embed_ms_p99']} ms, "
                f"BM25 in memory p50 {row['bm25_ms_p50']} / p99 {row['bm25_ms_p99']} ms, "
                f"BM25 FTS5 p50 {row['fts_ms_p50']} / p99 {row['fts_ms_p99']} ms, "
                f"vectors p50 {row['vectors_ms_p50']} / p99 {row['vectors_ms_p99']} ms; "
                f"first search (index builds) {first:.1f} s, BM25 {row['bm25_bytes_per_chunk']} B/chunk; "
                f"fresh index's first BM25 search {row['fresh_bm25_first_ms']} ms ({fresh_reads}); "
                f"writes {row['write_chunks_per_s']} chunks/s; disk per chunk: FTS5 "
                f"{row['fts5_disk_bytes_per_chunk']} B, stored postings "
                f"{row['stored_postings_bytes_per_chunk']} B; "
                f"after one more file: first BM25 {row['after_write_bm25_ms']} ms, first search "
                f"{row['after_write_search_ms']} ms, background {row['bm25_background_s']} s, then BM25 p50 "
                f"{row['bm25_after_writes_ms_p50']} / p99 {row['bm25_after_writes_ms_p99']} ms; "
                f"first vector search after a third file {row['after_write_vectors_ms']} ms, first "
                f"search after a detach {row['after_detach_search_ms']} ms; after the writes: vectors "
                f"p50 {row['vectors_after_writes_ms_p50']} / p99 {row['vectors_after_writes_ms_p99']} ms, "
                f"search p50 {row['search_after_writes_ms_p50']} / "
                f"p99 {row['search_after_writes_ms_p99']} ms; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    finally:
        await service.aclose()
        await store.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-recall", action="store_true", help="latency only: skip the recall@5 sets")
    parser.add_argument(
        "--corpus-cache",
        help="with --no-recall: the ingested corpus's chunks and vectors saved to (or, when it exists, "
        "read from) this .npz file, so latency runs skip the ingestion",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (its path is printed)")
    parser.add_argument("--json")
    parser.add_argument(
        "--chunking", default="250,50", help="static chunking SIZE,OVERLAP in cl100k tokens (default 250,50)"
    )
    args = parser.parse_args()
    size, overlap = (int(v) for v in args.chunking.split(","))
    CHUNKING["static"] = {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}
    if args.corpus_cache and not args.no_recall:
        parser.error("--corpus-cache needs --no-recall")
    if args.quick:
        args.searches = 10
    result = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
