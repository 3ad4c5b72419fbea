"""Hybrid search's fusion: which way of merging the BM25 and vector lists gives the best recall@5,
chosen on half of a labelled question set and checked on everything else.

The labelled sets are ``bench/file_search.py``'s: the pydoc topic titles (78 questions; settings are
chosen on the 39 at even positions only, the 39 at odd positions are held out), the standard
library's module docstrings (67) and the identifier questions (``What does copytree() do?``, 277);
the last two are never used to choose. Each set is ingested through ``VectorStores`` (the same
chunking as the benchmark), then per question both lists are read 200 deep: BM25 from the store's
``KeywordIndex`` (with scores), vectors by cosine over the store's own chunk vectors (the ``memory``
index's exact order, ties by chunk id), so every candidate fusion is computed from the same lists.
The shipped fusion (``retrieval/fusion.py``) is checked against ``VectorStores.search``: the same
files in the same order for every question.

Candidates (declared before any was measured; docs/file-search.md, "Fusion"):

- ``rrf``: weighted reciprocal rank fusion, k 10–100, depth 20–80, text weight 0.25–1.5;
- ``split``: a k per side (vectors 1–60, BM25 20–100);
- ``adaptive``: BM25's weight from the query's specificity, its rarest term's IDF over the
  largest IDF the store allows (``spec`` ∈ [0, 1]): ``spec^p``, ``p·spec``, or 1 when ``spec ≥ τ``
  else 0;
- ``restrict``: RRF's order over the vector list's top M only (BM25 re-orders, never adds);
- ``protect``: the vector list's top P first, then RRF's order;
- ``mix``: cosine + λ · BM25 score normalised by the query's largest possible BM25 score
  (``abs``: (k1 + 1) · Σ IDF) or by the list's top score (``rel``);
- ``promote``: the vector list, with BM25's first chunk put at position 1, 3 or 5 when its score
  is at least τ of the largest possible.

The rule: the highest recall@5 on the even half, ties by the even half's mean reciprocal rank of the
answer's file (first 50 hits), then the first declared. Printed: the single methods, the shipped
RRF, the chosen candidate, each family's own even-half choice, the candidate the same rule picks
with the halves swapped, and how many candidates beat vectors alone on the held-out half (every
candidate's figures are in ``--json``).

    .venv/bin/python bench/file_search_fusion.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from file_search import CHUNKING, OWNER, corpus, identifier_corpus, open_service, stdlib_corpus
from responses_gateway.retrieval.fusion import RRF_K, fuse
from responses_gateway.retrieval.keyword_index import BM25_K1, query_terms, tokenize
from responses_gateway.store import open_store

DEPTH = 200  # each list read this deep; a candidate reads what it needs of it


@dataclass
class Question:
    text: str
    answer: str  # the right file
    vec: list[tuple[int, float]]  # (chunk id, cosine) best first
    bm: list[tuple[int, float]]  # (chunk id, BM25 score) best first
    spec: float  # the rarest query term's IDF over the largest IDF in the store
    bm_max: float  # the query's largest possible BM25 score: (k1 + 1) * sum of its terms' IDF


@dataclass
class LabelledSet:
    name: str
    files: dict[int, str]  # chunk id -> file id
    questions: list[Question]


Method = Callable[[Question], list[int]]


def ranked(scores: dict[int, float]) -> list[int]:
    return [c for c, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def vectors_alone(q: Question) -> list[int]:
    return [c for c, _ in q.vec]


def bm25_alone(q: Question) -> list[int]:
    return [c for c, _ in q.bm]


def rrf(k: int = RRF_K, depth: int = 40, text_weight: float | Callable[[Question], float] = 1.0) -> Method:
    def method(q: Question) -> list[int]:
        weight = text_weight(q) if callable(text_weight) else text_weight
        vec = [c for c, _ in q.vec[:depth]]
        bm = [c for c, _ in q.bm[:depth]]
        return [c for c, _ in fuse([(1.0, vec), (weight, bm)], k=k)]

    return method


def split(k_vec: int, k_text: int, depth: int = 40) -> Method:
    def method(q: Question) -> list[int]:
        scores: dict[int, float] = {}
        for k, hits in ((k_vec, q.vec[:depth]), (k_text, q.bm[:depth])):
            for rank, (c, _) in enumerate(hits, 1):
                scores[c] = scores.get(c, 0.0) + 1 / (k + rank)
        return ranked(scores)

    return method


def adaptive(form: str, p: float) -> Method:
    def weight(q: Question) -> float:
        if form == "pow":
            return q.spec**p
        if form == "lin":
            return p * q.spec
        return 1.0 if q.spec >= p else 0.0

    return rrf(text_weight=weight)


def restrict(m: int) -> Method:
    base = rrf()

    def method(q: Question) -> list[int]:
        keep = {c for c, _ in q.vec[:m]}
        return [c for c in base(q) if c in keep]

    return method


def protect(p: int) -> Method:
    base = rrf()

    def method(q: Question) -> list[int]:
        top = [c for c, _ in q.vec[:p]]
        return top + [c for c in base(q) if c not in top]

    return method


def mix(lam: float, norm: str, depth: int = 40) -> Method:
    def method(q: Question) -> list[int]:
        cos = dict(q.vec[:depth])
        bm = dict(q.bm[:depth])
        scale = q.bm_max if norm == "abs" else (q.bm[0][1] if q.bm else 1.0)
        floor = q.vec[min(depth, len(q.vec)) - 1][1] if q.vec else 0.0  # a chunk off the vector list
        return ranked({c: cos.get(c, floor) + lam * bm.get(c, 0.0) / scale for c in set(cos) | set(bm)})

    return method


def promote(position: int, tau: float) -> Method:
    def method(q: Question) -> list[int]:
        out = [c for c, _ in q.vec]
        if not q.bm or q.bm[0][1] < tau * q.bm_max:
            return out
        first = q.bm[0][0]
        out = [c for c in out if c != first]
        return [*out[: position - 1], first, *out[position - 1 :]]

    return method


def candidates() -> dict[str, tuple[str, Method]]:
    """name -> (family, method), in the declared order."""
    grid: dict[str, tuple[str, Method]] = {}
    for k in (10, 20, 40, 60, 100):
        for depth in (20, 40, 80):
            for w in (0.25, 0.5, 0.75, 1.0, 1.5):
                grid[f"rrf k={k} depth={depth} text weight={w}"] = ("rrf", rrf(k, depth, w))
    for kv in (1, 5, 10, 20, 60):
        for kt in (20, 60, 100):
            grid[f"split k vectors={kv} k BM25={kt}"] = ("split", split(kv, kt))
    for p in (0.5, 1, 2, 3):
        grid[f"adaptive spec^{p}"] = ("adaptive pow", adaptive("pow", p))
    for p in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        grid[f"adaptive spec >= {p}"] = ("adaptive gate", adaptive("gate", p))
    for p in (0.5, 1, 1.5, 2):
        grid[f"adaptive {p} * spec"] = ("adaptive lin", adaptive("lin", p))
    for m in (5, 10, 15, 20, 40):
        grid[f"restrict to vectors' top {m}"] = ("restrict", restrict(m))
    for p in (1, 2, 3):
        grid[f"protect vectors' top {p}"] = ("protect", protect(p))
    for lam in (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0):
        for norm in ("abs", "rel"):
            grid[f"mix {norm} lambda={lam}"] = (f"mix {norm}", mix(lam, norm))
    for position in (1, 3, 5):
        for tau in (0.1, 0.2, 0.3, 0.4, 0.5):
            grid[f"promote BM25 first to {position} at {tau}"] = ("promote", promote(position, tau))
    return grid


def score(data: LabelledSet, method: Method, part: str = "all") -> tuple[int, int, float]:
    """(right, questions, mean reciprocal rank of the answer's file in the first 50) on ``part``:
    ``all``, ``even`` or ``odd`` positions."""
    right, total, rr = 0, 0, 0.0
    for i, q in enumerate(data.questions):
        if (part == "even" and i % 2) or (part == "odd" and not i % 2):
            continue
        total += 1
        hits = method(q)[:50]
        rank = next((r for r, c in enumerate(hits, 1) if data.files[c] == q.answer), None)
        right += rank is not None and rank <= 5
        rr += 1 / rank if rank else 0.0
    return right, total, rr / max(total, 1)


async def labelled(
    service: Any, name: str, docs: Sequence[tuple[str, str]], questions: Sequence[tuple[str, str]]
) -> LabelledSet:
    """The set ingested into a store of its own and both lists read for every question; the shipped
    fusion checked against ``VectorStores.search``."""
    store_id = (await service.create(OWNER, {"name": name, "chunking_strategy": None}))["id"]
    for file_id, _ in docs:
        await service.attach(OWNER, store_id, file_id, attributes={}, chunking=CHUNKING)
    await service.idle()
    async with service.tables.db.transaction() as tx:
        rows = await tx.fetch(
            "SELECT id, file_id, text, embedding FROM rg_vs_chunks WHERE vector_store_id = ? ORDER BY id",
            store_id,
        )
    ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
    files = {int(r[0]): str(r[1]) for r in rows}
    matrix = np.stack([np.frombuffer(r[3], dtype=np.float32) for r in rows])
    df: dict[str, int] = {}
    for r in rows:
        for term in set(tokenize(str(r[2]))):
            df[term] = df.get(term, 0) + 1
    n = len(rows)
    top_idf = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    embedder = service.embedder("all-MiniLM-L6-v2")
    query_vectors = (await asyncio.to_thread(embedder.embed, [q for _, q in questions])).vectors
    out = []
    shipped = rrf()
    for (answer, text), qv in zip(questions, query_vectors, strict=True):
        terms = query_terms(text)
        bm = await service.keywords.scored(store_id, terms, limit=DEPTH)
        cos = matrix @ np.asarray(qv, dtype=np.float32)
        order = np.lexsort((ids, -cos))[:DEPTH]
        idf = [math.log(1 + (n - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in terms]
        q = Question(
            text,
            answer,
            [(int(ids[i]), float(cos[i])) for i in order],
            bm,
            max(idf, default=0.0) / top_idf,
            (BM25_K1 + 1) * sum(idf) or 1.0,
        )
        hits = await service.search(
            OWNER, store_id, text, max_num_results=10, filters=None, ranking_options=None
        )
        mine = [files[c] for c in shipped(q)[:10]]
        assert [h["file_id"] for h in hits] == mine, (text, [h["file_id"] for h in hits], mine)
        out.append(q)
    return LabelledSet(name, files, out)


def row(sets: dict[str, LabelledSet], method: Method) -> dict[str, Any]:
    pydoc = sets["pydoc"]
    out: dict[str, Any] = {}
    for part in ("even", "odd", "all"):
        right, total, _ = score(pydoc, method, part)
        out[part] = [right, total]
    for key in ("stdlib", "identifiers"):
        right, total, _ = score(sets[key], method)
        out[key] = [right, total]
    return out


def line(name: str, r: dict[str, Any]) -> str:
    cells = [
        f"{r[k][0] / r[k][1]:.3f} ({r[k][0]}/{r[k][1]})"
        for k in ("even", "odd", "all", "stdlib", "identifiers")
    ]
    return f"{name:46s} " + "  ".join(f"{c:16s}" for c in cells)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="rg-bench-fusion-"))
    store = await open_store(f"sqlite://{tmp}/gateway.db")
    limit = 6 if args.quick else None
    pydoc = corpus(limit)
    stdlib = stdlib_corpus(limit)
    ident_docs, ident_questions = identifier_corpus(limit)
    raw = {
        "pydoc": ([(n, b) for n, _, b in pydoc], [(n, t) for n, t, _ in pydoc]),
        "stdlib": ([(f"stdlib/{n}", b) for n, _, b in stdlib], [(f"stdlib/{n}", t) for n, t, _ in stdlib]),
        "identifiers": (
            [(f"ident/{n}", b) for n, b in ident_docs],
            [(f"ident/{n}", q) for n, q in ident_questions],
        ),
    }
    blobs = {name: body.encode() for docs, _ in raw.values() for name, body in docs}
    service = open_service(store, blobs)
    await service.start()
    try:
        sets = {key: await labelled(service, key, docs, questions) for key, (docs, questions) in raw.items()}
    finally:
        await service.aclose()
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    grid = candidates()
    pydoc_set = sets["pydoc"]

    def even_key(item: tuple[str, tuple[str, Method]]) -> tuple[int, float]:
        right, _, mrr = score(pydoc_set, item[1][1], "even")
        return right, mrr

    def odd_key(item: tuple[str, tuple[str, Method]]) -> tuple[int, float]:
        right, _, mrr = score(pydoc_set, item[1][1], "odd")
        return right, mrr

    # max() keeps the first of equal keys: the first declared.
    chosen, (_, chosen_method) = max(grid.items(), key=even_key)
    # The same rule with the halves swapped: how much choosing on 39 questions overfits.
    swapped, (_, swapped_method) = max(grid.items(), key=odd_key)
    families: dict[str, str] = {}
    for name, (family, method) in grid.items():
        if family not in families or even_key((name, (family, method))) > even_key(
            (families[family], grid[families[family]])
        ):
            families[family] = name
    vectors_odd = score(pydoc_set, vectors_alone, "odd")[0]
    beat = [name for name, (_, method) in grid.items() if score(pydoc_set, method, "odd")[0] > vectors_odd]
    result: dict[str, Any] = {
        "vectors": row(sets, vectors_alone),
        "bm25": row(sets, bm25_alone),
        "shipped rrf k=60 depth=40": row(sets, rrf()),
        "chosen": {"name": chosen, **row(sets, chosen_method)},
        "families": {families[f]: row(sets, grid[families[f]][1]) for f in families},
        "chosen_on_odd_half": {"name": swapped, **row(sets, swapped_method)},
        "every_candidate": {name: row(sets, method) for name, (_, method) in grid.items()},
        "candidates": len(grid),
        "beat_vectors_on_held_out": beat,
    }
    header = ["even (chooses)", "odd (held out)", "all", "stdlib", "identifiers"]
    print(f"{'recall@5':46s} " + "  ".join(f"{h:16s}" for h in header))
    for name in ("vectors", "bm25", "shipped rrf k=60 depth=40"):
        print(line(name, result[name]))
    print(line(f"chosen: {chosen}", result["chosen"]))
    print("each family's own choice on the even half:")
    for name, r in result["families"].items():
        print(line(f"  {name}", r))
    print(line(f"halves swapped, chosen on odd: {swapped}", result["chosen_on_odd_half"]))
    print(f"{len(beat)} of {len(grid)} candidates beat vectors alone on the held-out half: {beat}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 documents per set (the smoke test)")
    parser.add_argument("--json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
