"""``retrieval.blas.one_blas_thread``: BLAS on one thread in whichever thread the embedder or the
vector index runs (asyncio's executor threads take turns), and the process's own setting back
afterwards. With threadpoolctl 3.8 only the first thread to set a limit could change OpenBLAS's,
so in every other worker thread the limit was silently not applied."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from responses_gateway.retrieval.blas import one_blas_thread

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [int(i["num_threads"]) for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_one_thread_in_every_worker_thread() -> None:
    before = _blas_threads()
    if not before or max(before) == 1:
        pytest.skip("no multi-threaded BLAS library threadpoolctl can see")

    def inside() -> list[int]:
        with one_blas_thread:
            return _blas_threads()

    seen = []
    for _ in range(3):  # several executors: a new thread each time, as asyncio's pool may give
        with ThreadPoolExecutor(1) as pool:
            seen.append(pool.submit(inside).result())
    seen.append(inside())  # and the calling thread
    assert all(threads == [1] * len(before) for threads in seen), seen
    assert _blas_threads() == before

    # Nested across threads: held while any user is inside, restored when the last leaves.
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with one_blas_thread:
            entered.set()
            leave.wait(10)

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold)
        assert entered.wait(10)
        assert inside() == [1] * len(before)
        assert _blas_threads() == [1] * len(before)
        leave.set()
        held.result()
    assert _blas_threads() == before
