"""BLAS on one thread for the retrieval code's numpy work (see :class:`OneBlasThread`)."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["OneBlasThread", "one_blas_thread"]


class OneBlasThread:
    """BLAS on one thread while any of the gateway's numpy work runs (counted, so concurrent users
    nest): the embedder's forward pass and the vector index's product.

    The forward pass is many small matrix products (per head: 256×32 by 32×256); a multi-threaded
    OpenBLAS synchronises its threads on each, which on a shared or busy machine cost more than the
    products themselves (a batch of 32 windows: 9 s with two threads under load, 6 s with one; the
    attention products alone 3.3 s against 0.5 s). One thread per embedding also leaves the other
    cores to the requests being served. And an OpenBLAS thread spins for a while after each
    product: after the vector index's 100k-row product it slowed the next query embedding from
    ~8 ms to 40-80 ms on two busy cores."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._controller: Any = None
        self._limit: Any = None

    def __enter__(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                try:
                    from threadpoolctl import ThreadpoolController
                except ImportError:  # then BLAS keeps its threads: slower, same vectors
                    return
                if self._controller is None:
                    self._controller = ThreadpoolController()
                _release_openblas()
                self._limit = self._controller.limit(limits=1, user_api="blas")

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._limit is not None:
                _release_openblas()
                self._limit.restore_original_limits()
                self._limit = None


def _release_openblas() -> None:
    """Let this thread set OpenBLAS's (process-wide) thread count. threadpoolctl 3.8 lets only
    its "controlling thread" — the first to set a limit, until a ``with threadpool_limits()``
    block clears it — change a pthreads OpenBLAS's limit, and silently ignores every other
    thread. The limit here is set and restored by whichever worker thread runs the embedder or
    the index (asyncio's executor), so without this only the first one had BLAS on one thread:
    every other ran it on two, its helper spinning (measured 2-4x the CPU of a search at 100k
    chunks, docs/file-search.md). Entries and exits are serialised by ``_lock``."""
    try:
        from threadpoolctl import OpenBLASController
    except ImportError:  # older threadpoolctl: any thread may set the limit
        return
    clear = getattr(OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


one_blas_thread = OneBlasThread()
