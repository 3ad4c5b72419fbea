"""One large vector store's search, side by side across source trees: wall p50/p99 and CPU per search.

For profiling and before/after comparisons of the search path on this shared machine. The store is
made once as ``bench/file_search.py``'s latency stores are (the pydoc corpus's chunks repeated, each
copy's vector perturbed; the corpus from ``--corpus-cache``, ingested and saved there when the file
is missing) in a SQLite file kept at ``--db`` and reused by later runs. Then, for ``--rounds``
rounds, a child process per source tree (this worktree's ``src``, then each ``--baseline-src DIR``'s
``DIR/src``, alternating) opens the store, makes the first search (the indexes load: not timed),
and times ``--searches`` hybrid searches of the corpus's titles in turn through
``VectorStores.search``: wall p50 / p99 and the process's CPU (every thread) per search, plus a
digest of every hit (file, score, text) so trees that must answer identically can be checked to.

    .venv/bin/python bench/file_search_profile.py --db /tmp/fs100k.db --corpus-cache /tmp/corpus.npz \\
        [--size 100000] [--searches 300] [--rounds 3] [--baseline-src DIR ...] [--py-spy PATH]

``--py-spy PATH``: the py-spy binary; each child of this tree then runs under ``py-spy record``
(every thread, ``--idle`` off) and its flame graph's top frames are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OWNER = "bench"


async def _build(db: Path, cache: Path, size: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import numpy as np

    from file_search import CHUNKING, big_store, corpus, ingest, open_service
    from responses_gateway.store import open_store

    docs = corpus(None)
    store = await open_store(f"sqlite://{db}")
    service = open_service(store, {name: body.encode() for name, _, body in docs})
    await service.start()
    try:
        if cache.exists():
            saved = np.load(cache)
            texts, vectors = [str(t) for t in saved["texts"]], saved["vectors"]
        else:
            print(f"ingesting the corpus ({len(docs)} documents) into {cache}", flush=True)
            _, rows, took = await ingest(service, docs)
            texts = [str(r[1]) for r in rows]
            vectors = np.stack([np.frombuffer(bytes(r[2]), dtype=np.float32) for r in rows])
            np.savez(cache, texts=np.array(texts), vectors=vectors, seconds=took)
        t0 = time.perf_counter()
        big, _ = await big_store(service, size, texts, vectors)
        print(f"store {big}: {size} chunks written in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        await service.aclose()
        await store.close()
    return {"store": big, "size": size, "questions": [title for _, title, _ in docs], "chunking": CHUNKING}


async def _child(db: str, meta: dict[str, Any], searches: int) -> dict[str, Any]:
    from responses_gateway.retrieval.service import VectorStores
    from responses_gateway.store import open_store

    async def read(owner: str, file_id: str) -> tuple[dict[str, Any], bytes]:
        raise LookupError(file_id)

    store = await open_store(f"sqlite://{db}")
    service = VectorStores(lambda: store, read)
    await service.start()
    big, questions = meta["store"], meta["questions"]
    try:

        async def search(question: str) -> list[dict[str, Any]]:
            return await service.search(
                OWNER, big, question, max_num_results=10, filters=None, ranking_options=None
            )

        t0 = time.perf_counter()
        await search(questions[0])
        first = time.perf_counter() - t0
        warmed = getattr(service, "warmed_up", None)  # the start-up warm-up, where there is one
        if warmed is not None:
            await warmed()
        idle = getattr(service.keywords, "idle", None)
        if idle is not None:
            await idle()  # the background weights, as a long-running gateway has them
        for question in questions[:5]:
            await search(question)
        digest = hashlib.sha256()
        walls: list[float] = []
        cpu0 = time.process_time()
        for i in range(searches):
            t0 = time.perf_counter()
            hits = await search(questions[i % len(questions)])
            walls.append((time.perf_counter() - t0) * 1000)
            if i < len(questions):
                digest.update(json.dumps([(h["file_id"], h["score"], h["text"]) for h in hits]).encode())
        cpu = (time.process_time() - cpu0) * 1000 / searches
    finally:
        await service.aclose()
        await store.close()
    walls.sort()
    return {
        "first_s": round(first, 2),
        "p50_ms": round(statistics.median(walls), 2),
        "p99_ms": round(walls[min(len(walls) - 1, int(0.99 * len(walls)))], 2),
        "cpu_ms_per_search": round(cpu, 2),
        "digest": digest.hexdigest()[:16],
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the SQLite file holding the store (made when missing)")
    parser.add_argument("--corpus-cache", default=str(Path(tempfile.gettempdir()) / "rg-fs-corpus.npz"))
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-src", action="append", default=[], metavar="DIR")
    parser.add_argument("--py-spy", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    db = Path(args.db)
    meta_path = db.with_suffix(".json")
    if args.child:
        meta = json.loads(meta_path.read_text())
        print(json.dumps(asyncio.run(_child(str(db), meta, args.searches))), flush=True)
        return
    if not meta_path.exists():
        meta = asyncio.run(_build(db, Path(args.corpus_cache), args.size))
        meta_path.write_text(json.dumps(meta))
    trees = [
        ("this", HERE.parent / "src"),
        *((f"base{i}", Path(d) / "src") for i, d in enumerate(args.baseline_src)),
    ]
    size = json.loads(meta_path.read_text())["size"]
    print(f"store of {size} chunks in {db}; {args.searches} searches per child", flush=True)
    for round_ in range(args.rounds):
        for name, src in trees:
            env = {**os.environ, "PYTHONPATH": str(src)}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--db", str(db)]
            cmd += ["--searches", str(args.searches)]
            svg = None
            if args.py_spy and name == "this":
                svg = Path(tempfile.gettempdir()) / f"rg-fs-profile-{round_}.txt"
                cmd = [args.py_spy, "record", "--format", "raw", "-o", str(svg), "--threads", "--", *cmd]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode or not lines:
                print(f"round {round_} {name}: failed\n{out.stderr[-3000:]}", flush=True)
                continue
            found = json.loads(lines[-1])
            print(f"round {round_} {name:6s} {found}" + (f" profile {svg}" if svg else ""), flush=True)


if __name__ == "__main__":
    main()
