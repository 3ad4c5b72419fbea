"""How hybrid search merges its two lists: weighted reciprocal rank fusion.

``score(chunk) = Σ_side weight_side / (k + rank_side(chunk))`` over the sides whose list holds the
chunk (rank 1 = first), divided by ``Σ weight / (k + 1)``: a chunk first on every weighted list
scores exactly 1, every listed chunk scores in (0, 1], and a side weighted 0 adds nothing (its list
need not be computed). Best first, ties by chunk id (the same order on every back end).

Kept as the default after the alternatives in docs/file-search.md ("Measured", "Fusion") were
chosen on half of a labelled question set and none beat vectors alone on the other half; with
chunks in cl100k tokens the same choosing rule picks this one ("All merged, evening").
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RRF_K", "fuse"]

RRF_K = 60


def fuse(lists: Sequence[tuple[float, Sequence[int]]], *, k: int = RRF_K) -> list[tuple[int, float]]:
    """``(chunk id, score)`` best first from ``(weight, chunk ids best first)`` per side.

    Weights must be >= 0 with a positive sum; a chunk listed twice on one side counts at its best
    rank there."""
    total = sum(weight for weight, _ in lists)
    if total <= 0 or any(weight < 0 for weight, _ in lists):
        raise ValueError("fusion weights must be >= 0 with a positive sum")
    scores: dict[int, float] = {}
    for weight, ids in lists:
        if not weight:
            continue
        seen: set[int] = set()
        for rank, chunk_id in enumerate(ids, start=1):
            if chunk_id in seen:
                continue
            seen.add(chunk_id)
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (k + rank)
    best = total / (k + 1)
    return [(cid, min(1.0, s / best)) for cid, s in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]
