"""Each vector back end side by side (``serve --vector-index``): latency, recall against exact,
memory in the process and space in the database.

The corpus and its ingestion are ``bench/file_search.py``'s (``pydoc_data.topics``, chunked with
the same strategy; recall of BM25/vectors/hybrid is measured there). Here: stores of 10k and 100k
chunks (the corpus's chunks repeated; each copy's vector is the original's plus a little noise,
renormalised, so neighbours stay realistic) searched with the topic titles in turn, once per vector
back end: ``memory``, ``sqlite-vec``, ``sqlite-vec-bit`` on the SQLite store and, with
``--postgres URL``, ``memory``, ``pgvector``, ``pgvector-exact`` on a PostgreSQL database (the same
chunks and vectors). Per back end: p50 and p99 of the whole hybrid ``search`` (the query's
embedding included), of the vector side alone (the query embedded beforehand), recall@5 of the
vector side against the exact top 5 (numpy over the same vectors), the first search (the matrix
read, or the search table filled), the memory each gateway process holds for it, and the database
space its search table takes.

    .venv/bin/python bench/vector_backends.py [--sizes 10000,100000] [--searches 200] [--quick]
        [--keep] [--postgres URL] [--backends memory,sqlite-vec,...] [--json FILE]

``--quick`` (the smoke test): 6 topics, a 1,000-chunk store, 10 searches.

``--pg-variants`` (with ``--postgres URL``): instead, pgvector's search settings side by side on the
same table (``store/vector_search.py``: ``hnsw.iterative_scan`` strict / relaxed / off, ``ef_search``,
the exact scan), for every store size, each store searched with no filter and with a filter keeping
a tenth of its files; recall@5 and recall@40 (the depth hybrid search reads) against the exact
answer, the vector side's p50 / p99, and how many HNSW answers came back short (replaced by the
exact scan). The stores are written first (all sizes in one table: a 10k store is then a small part
of it, the case iterative scans are for), ``--rounds`` times through every variant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from file_search import OWNER, big_store, corpus, corpus_info, ingest, machine, open_service, percentile
from responses_gateway.retrieval.vector_index import DatabaseIndex, VectorIndex
from responses_gateway.store import Store, open_store
from responses_gateway.store.vector_search import PgvectorSearch

BACKENDS = {
    "sqlite": ("memory", "sqlite-vec", "sqlite-vec-bit"),
    "postgresql": ("memory", "pgvector", "pgvector-exact"),
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="rg-bench-vb-"))
    if args.keep:
        print(f"store: {tmp}/gateway.db", flush=True)
    store: Store = await open_store(f"sqlite://{tmp}/gateway.db")
    docs = corpus(6 if args.quick else None)
    blobs = {name: body.encode() for name, _, body in docs}
    service = open_service(store, blobs, vector_index="memory")
    await service.start()
    result: dict[str, Any] = {"machine": machine(), "corpus": corpus_info(docs, blobs)}
    try:
        embedder = service.embedder("all-MiniLM-L6-v2")
        _, rows, _ = await ingest(service, docs)
        chunks = len(rows)
        result["corpus"]["chunks"] = chunks
        # ---------------------------------------------------------------- latency
        texts = [r[1] for r in rows]
        vectors = np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows])
        questions = [title for _, title, _ in docs]
        query_vectors = (await asyncio.to_thread(embedder.embed, questions)).vectors
        sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(",")]
        wanted = set(args.backends.split(",")) if args.backends else None
        stores: list[tuple[str, Store]] = [("sqlite", store)]
        if args.postgres:
            stores.append(("postgresql", await open_store(args.postgres)))
        result["latency"] = {}
        try:
            for size in sizes:
                result["latency"][str(size)] = {"chunks": size, "backends": {}}
                for dialect, where in stores:
                    big, load = await _big_store(where, blobs, size, texts, vectors)
                    for backend in BACKENDS[dialect]:
                        if wanted is not None and backend not in wanted:
                            continue
                        row = await _measure(
                            args, where, blobs, big, backend, questions, query_vectors, dialect
                        )
                        row["load_s"] = round(load, 1)
                        name = f"{dialect}/{backend}"
                        result["latency"][str(size)]["backends"][name] = row
                        print(
                            f"{size:>7} chunks {name:26s} search p50 {row['search_ms_p50']:7.1f} "
                            f"p99 {row['search_ms_p99']:7.1f} | vectors p50 {row['vector_ms_p50']:7.1f} "
                            f"p99 {row['vector_ms_p99']:7.1f} | recall@5 {row['recall_at_5']:.3f} | "
                            f"first {row['first_search_s']:6.2f} s | process {row['process_mb']:6.1f} MB "
                            f"| db {row['db_mb']:6.1f} MB",
                            flush=True,
                        )
        finally:
            for dialect, where in stores:
                if dialect != "sqlite":
                    await where.close()
    finally:
        await service.aclose()
        await store.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


async def _big_store(
    store: Store, blobs: dict[str, bytes], size: int, texts: list[str], vectors: Any
) -> tuple[str, float]:
    """``file_search.big_store`` written through a service of its own on ``store``."""
    service = open_service(store, blobs, vector_index="memory")
    await service.start()
    try:
        return await big_store(service, size, texts, vectors)
    finally:
        await service.aclose()


async def _db_mb(store: Store, dialect: str, backend: str) -> float:
    """The space the back end's search table takes in the database (0 for ``memory``)."""
    if backend == "memory":
        return 0.0
    async with store.db.transaction() as tx:
        if dialect == "postgresql":
            row = await tx.fetchone("SELECT pg_total_relation_size('rg_vs_vec_pg_384')")
            return round(int(row[0]) / 1e6, 2) if row else 0.0
        table = "rg_vs_vec_f32_384" if backend == "sqlite-vec" else "rg_vs_vec_bit_384"
        # vec0 keeps its vectors in the <table>_vector_chunks00 shadow table's blobs.
        row = await tx.fetchone(f"SELECT SUM(LENGTH(vectors)) FROM {table}_vector_chunks00")
        return round(int(row[0] or 0) / 1e6, 2) if row else 0.0


async def _measure(
    args: argparse.Namespace,
    store: Store,
    blobs: dict[str, bytes],
    big: str,
    backend: str,
    questions: list[str],
    query_vectors: Any,
    dialect: str,
) -> dict[str, Any]:
    service = open_service(store, blobs, vector_index=backend)
    await service.start()
    try:
        index = service.index
        version, stored = await service.tables.load_vectors(big)
        ids = np.array([r[0] for r in stored], dtype=np.int64)
        matrix = np.frombuffer(b"".join(r[2] for r in stored), dtype="<f4").reshape(len(stored), -1)
        del stored
        t0 = time.perf_counter()
        await index.search(big, query_vectors[0], dimensions=384, limit=40, file_ids=None)
        first = time.perf_counter() - t0
        whole: list[float] = []
        alone: list[float] = []
        found = 0
        for i in range(args.searches):
            question = questions[i % len(questions)]
            vector = query_vectors[i % len(questions)]
            t0 = time.perf_counter()
            await service.search(OWNER, big, question, max_num_results=10, filters=None, ranking_options=None)
            whole.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            got = await index.search(big, vector, dimensions=384, limit=40, file_ids=None, version=version)
            alone.append((time.perf_counter() - t0) * 1000)
            exact = set(ids[np.argsort(-(matrix @ vector), kind="stable")[:5]].tolist())
            found += len(exact & set(got[:5]))
        process = index.nbytes if isinstance(index, VectorIndex) else 0
        return {
            "backend": index.name,
            "search_ms_p50": round(statistics.median(whole), 2),
            "search_ms_p99": round(percentile(whole, 99), 2),
            "vector_ms_p50": round(statistics.median(alone), 2),
            "vector_ms_p99": round(percentile(alone, 99), 2),
            "recall_at_5": round(found / (5 * args.searches), 3),
            "first_search_s": round(first, 2),
            "process_mb": round(process / 1e6, 1),
            "db_mb": await _db_mb(store, dialect, index.name),
        }
    finally:
        await service.aclose()


# pgvector settings measured by --pg-variants: PgvectorSearch's keyword arguments.
PG_VARIANTS: dict[str, dict[str, Any]] = {
    "exact scan": {"hnsw": False},
    "HNSW one pass (iterative off), ef 400": {"iterative": "off", "ef_search": 400, "exact_below": 0},
    "strict, ef 100": {"iterative": "strict_order", "ef_search": 100, "exact_below": 0},
    "strict, ef 400": {"iterative": "strict_order", "ef_search": 400, "exact_below": 0},
    "strict, ef 1000": {"iterative": "strict_order", "ef_search": 1000, "exact_below": 0},
    "relaxed, ef 100": {"iterative": "relaxed_order", "ef_search": 100, "exact_below": 0},
    "relaxed, ef 400": {"iterative": "relaxed_order", "ef_search": 400, "exact_below": 0},
    "relaxed, ef 1000": {"iterative": "relaxed_order", "ef_search": 1000, "exact_below": 0},
}


async def run_variants(args: argparse.Namespace) -> dict[str, Any]:
    """pgvector's settings side by side (``--pg-variants``, see the module doc)."""
    tmp = Path(tempfile.mkdtemp(prefix="rg-bench-vb-"))
    store: Store = await open_store(f"sqlite://{tmp}/gateway.db")
    docs = corpus(6 if args.quick else None)
    blobs = {name: body.encode() for name, _, body in docs}
    service = open_service(store, blobs, vector_index="memory")
    await service.start()
    result: dict[str, Any] = {"machine": machine(), "corpus": corpus_info(docs, blobs), "variants": {}}
    pg = await open_store(args.postgres)
    try:
        embedder = service.embedder("all-MiniLM-L6-v2")
        _, rows, _ = await ingest(service, docs)
        texts = [r[1] for r in rows]
        vectors = np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows])
        questions = [title for _, title, _ in docs]
        query_vectors = (await asyncio.to_thread(embedder.embed, questions)).vectors
        sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(",")]
        stores: dict[int, str] = {}
        for size in sizes:
            stores[size], load = await _big_store(pg, blobs, size, texts, vectors)
            filler = PgvectorSearch(pg.db)
            t0 = time.perf_counter()
            await filler.sync(stores[size], 384)
            print(
                f"{size} chunks written in {load:.1f} s, pgvector table filled in "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
        tables = service.tables.__class__(pg.db)
        for size, big in stores.items():
            _, stored = await tables.load_vectors(big)
            ids = np.array([r[0] for r in stored], dtype=np.int64)
            files = np.array([r[1] for r in stored])
            matrix = np.frombuffer(b"".join(r[2] for r in stored), dtype="<f4").reshape(len(stored), -1)
            del stored
            names = sorted(set(files.tolist()))
            kept = names[::10]
            mask = np.isin(files, kept)
            for round_ in range(args.rounds):
                for label, options in PG_VARIANTS.items():
                    for filtered in (False, True):
                        search = PgvectorSearch(pg.db, **options)
                        index = DatabaseIndex(search)
                        await index.search(big, query_vectors[0], dimensions=384, limit=40, file_ids=None)
                        times: list[float] = []
                        at5 = at40 = 0
                        for i in range(args.searches):
                            vector = query_vectors[i % len(questions)]
                            t0 = time.perf_counter()
                            got = await index.search(
                                big, vector, dimensions=384, limit=40, file_ids=kept if filtered else None
                            )
                            times.append((time.perf_counter() - t0) * 1000)
                            scores = matrix @ vector
                            if filtered:
                                scores = np.where(mask, scores, -np.inf)
                            order = np.lexsort((ids, -scores))
                            at5 += len(set(ids[order[:5]].tolist()) & set(got[:5]))
                            at40 += len(set(ids[order[:40]].tolist()) & set(got[:40]))
                        row = {
                            "chunks": size,
                            "filtered": filtered,
                            "round": round_ + 1,
                            "recall_at_5": round(at5 / (5 * args.searches), 3),
                            "recall_at_40": round(at40 / (40 * args.searches), 3),
                            "vector_ms_p50": round(statistics.median(times), 2),
                            "vector_ms_p99": round(percentile(times, 99), 2),
                            "exact_fallbacks": search.exact_fallbacks,
                        }
                        key = f"{size}/{label}/{'filtered' if filtered else 'all'}/{round_ + 1}"
                        result["variants"][key] = row
                        print(
                            f"{size:>7} {label:40s} {'tenth of files' if filtered else 'whole store':14s} "
                            f"round {round_ + 1}: recall@5 {row['recall_at_5']:.3f} @40 "
                            f"{row['recall_at_40']:.3f} | p50 {row['vector_ms_p50']:7.2f} p99 "
                            f"{row['vector_ms_p99']:7.2f} ms | short {search.exact_fallbacks} | load "
                            f"{os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
    finally:
        await pg.close()
        await service.aclose()
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (its path is printed)")
    parser.add_argument(
        "--postgres", help="also measure on this PostgreSQL database (its tables are written)"
    )
    parser.add_argument("--backends", help="only these vector back ends (comma-separated)")
    parser.add_argument("--pg-variants", action="store_true", help="pgvector's settings side by side")
    parser.add_argument("--rounds", type=int, default=1, help="--pg-variants: passes over the variants")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.searches = 10
    if args.pg_variants and not args.postgres:
        parser.error("--pg-variants needs --postgres URL")
    result = asyncio.run(run_variants(args) if args.pg_variants else run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
