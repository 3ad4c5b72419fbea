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
                self._limit = self._controller.limit(limits=1, user_api="blas")

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._limit is not None:
                self._limit.restore_original_limits()
                self._limit = None


one_blas_thread = OneBlasThread()
