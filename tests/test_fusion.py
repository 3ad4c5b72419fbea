"""Hybrid search's fusion (retrieval/fusion.py) on constructed lists: the order, a side weighted 0,
the score range and the score of a chunk first on both lists. The end-to-end behaviour (through the
gateway, SQLite and PostgreSQL alike) is in tests/test_vector_stores.py."""

from __future__ import annotations

import random

import pytest

from responses_gateway.retrieval.fusion import fuse


def test_order_on_constructed_lists() -> None:
    vectors = [10, 11, 12, 13]
    text = [12, 20, 10]
    fused = fuse([(1.0, vectors), (1.0, text)])
    ids = [cid for cid, _ in fused]
    # On both lists beats on one; among those, the better ranks win: 10 (1st, 3rd) vs 12 (3rd, 1st)
    # tie and go by id; then the single-list chunks by rank, a tie (11 and 20 both 2nd) by id.
    assert ids == [10, 12, 11, 20, 13]
    scores = dict(fused)
    assert scores[10] == pytest.approx((1 / 61 + 1 / 63) / (2 / 61))
    assert scores[11] == scores[20] == pytest.approx((1 / 62) / (2 / 61))


def test_weights_move_the_order() -> None:
    vectors, text = [1, 2], [2, 3]
    assert [cid for cid, _ in fuse([(1.0, vectors), (3.0, text)])] == [2, 3, 1]
    # A strong vector weight: vectors' first (on one list, 5/61 = 0.0820) still comes after the
    # chunk on both lists (5/62 + 1/61 = 0.0970), ahead of text's second (1/62).
    assert [cid for cid, _ in fuse([(5.0, vectors), (1.0, text)])] == [2, 1, 3]


def test_a_side_weighted_zero_is_the_other_alone() -> None:
    vectors, text = [5, 3, 9, 1], [1, 7, 3]
    assert [cid for cid, _ in fuse([(1.0, vectors), (0.0, text)])] == vectors
    assert [cid for cid, _ in fuse([(0.0, vectors), (2.0, text)])] == text
    # Alone, the first scores 1 and the rest 61 / (60 + rank).
    alone = fuse([(0.0, vectors), (1.0, text)])
    assert [s for _, s in alone] == pytest.approx([1.0, 61 / 62, 61 / 63])
    # An empty side weighted 0 changes nothing; nothing listed gives nothing.
    assert fuse([(1.0, []), (0.0, [])]) == []


def test_first_on_both_scores_one_and_every_score_is_in_range() -> None:
    rng = random.Random(14)
    for _ in range(200):
        pool = list(range(60))
        vectors = rng.sample(pool, rng.randint(0, 40))
        text = rng.sample(pool, rng.randint(0, 40))
        weights = (rng.choice([0.0, 0.3, 1.0, 2.5]), rng.choice([0.0, 0.5, 1.0, 4.0]))
        if sum(weights) == 0:
            continue
        fused = fuse([(weights[0], vectors), (weights[1], text)])
        assert all(0 < s <= 1 for _, s in fused)
        scores = [s for _, s in fused]
        assert scores == sorted(scores, reverse=True)
        listed = {c for w, ids in zip(weights, (vectors, text), strict=True) if w for c in ids}
        assert {c for c, _ in fused} == listed
        both_first = vectors and text and vectors[0] == text[0]
        if both_first or (weights[1] == 0 and vectors) or (weights[0] == 0 and text):
            assert fused[0][1] == 1.0


def test_a_chunk_repeated_on_one_side_counts_once() -> None:
    assert fuse([(1.0, [4, 4, 5])]) == [(4, 1.0), (5, pytest.approx(61 / 63))]


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError):
        fuse([(0.0, [1]), (0.0, [2])])
    with pytest.raises(ValueError):
        fuse([(-1.0, [1]), (2.0, [2])])
