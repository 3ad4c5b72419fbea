"""``retrieval.topk.kth_largest``, the cut both search indexes take at 100k scores: exactly
``np.partition``'s k-th largest, on arrays built to catch a sampled bound that is off by one —
ties straddling the cut, runs of equal values, infinities (the vector index's masked rows), the
largest values all outside the sample, and arrays too small to sample."""

from __future__ import annotations

import numpy as np
import pytest

from responses_gateway.retrieval.topk import STRIDE, kth_largest


def _expected(scores: np.ndarray, k: int) -> float:
    return float(-np.partition(-scores, k - 1)[k - 1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_a_full_partition(dtype: type) -> None:
    rng = np.random.default_rng(7)
    for n in (1, 5, 39, 40, 400, 2_560, 2_561, 10_000, 100_000):
        cases = [
            rng.standard_normal(n),
            rng.integers(0, 5, n).astype(float),  # few distinct values: ties everywhere
            np.zeros(n),
        ]
        masked = rng.standard_normal(n)
        masked[rng.random(n) < 0.7] = -np.inf
        cases.append(masked)
        # The largest values only where the stride does not sample.
        hidden = rng.standard_normal(n) - 10
        off = np.arange(n)[np.arange(n) % STRIDE != 0][:50]
        hidden[off] = 10 + rng.standard_normal(len(off))
        cases.append(hidden)
        for scores in cases:
            scores = scores.astype(dtype)
            finite = int(np.count_nonzero(np.isfinite(scores)))
            for k in sorted({1, 2, 10, 40, 41, 200, n} & set(range(1, n + 1))):
                if k > finite and finite:
                    continue
                assert kth_largest(scores, k) == _expected(scores, k), (n, k)


def test_refuses_k_out_of_range() -> None:
    with pytest.raises(ValueError):
        kth_largest(np.zeros(3), 0)
    with pytest.raises(ValueError):
        kth_largest(np.zeros(3), 4)
