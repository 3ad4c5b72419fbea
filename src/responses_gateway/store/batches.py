"""Writes queued while another is in flight go together: one transaction for the lot.

The stored responses' creates (``responses.Responses``) and their ends (``events.Events``) on SQLite
are both written this way: a write waits only for the transaction in flight; under load everything
that queued up meanwhile is written by the next one, in one trip to the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batches", "write_batches"]

E = TypeVar("E")
R = TypeVar("R")


async def write_batches(
    take: Callable[[], list[E]],
    write: Callable[[list[E]], Awaitable[Sequence[R]]],
    settle: Callable[[E, R | BaseException], None],
) -> None:
    """Until ``take()`` gives nothing: ``write`` the batch it gave (one result per entry), then
    ``settle`` each entry with its result. A failed shared write is retried one entry at a time, so
    one bad row fails only its own entry. Cancelled or interrupted (shutdown), every entry of the
    batch not settled yet, and every one still queued, is settled with that exception."""
    while batch := take():
        settled = 0
        try:
            try:
                results: Sequence[R | BaseException] = await write(batch)
            except Exception as exc:
                if len(batch) == 1:
                    results = [exc]
                else:
                    for entry in batch:  # each settled as soon as its own write is done
                        try:
                            result: R | BaseException = (await write([entry]))[0]
                        except Exception as error:
                            result = error
                        settle(entry, result)
                        settled += 1
                    continue
            for entry, outcome in zip(batch, results, strict=True):
                settle(entry, outcome)
                settled += 1
        except BaseException as exc:  # cancelled (shutdown): nobody will write these
            for entry in [*batch[settled:], *take()]:
                settle(entry, exc)
            raise


class Batches(Generic[E, R]):
    """The queue of such writes: :meth:`put` queues an entry and starts a write unless one is in
    flight; each write takes everything queued by then (:func:`write_batches` with ``write`` and
    ``settle``), so an entry waits for the transaction in flight at most. With ``limit`` a write
    takes at most that many, oldest first, and the rest go in the writes after it."""

    __slots__ = ("_limit", "_name", "_queue", "_settle", "_task", "_write")

    def __init__(
        self,
        write: Callable[[list[E]], Awaitable[Sequence[R]]],
        settle: Callable[[E, R | BaseException], None],
        name: str,
        *,
        limit: int | None = None,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1 (None: no limit)")
        self._limit = limit
        self._write = write
        self._settle = settle
        self._name = name
        self._queue: list[E] = []
        self._task: asyncio.Task[None] | None = None

    def put(self, entry: E) -> None:
        self._queue.append(entry)
        if self._task is None or self._task.done():
            run = write_batches(self._take, self._write, self._settle)
            self._task = asyncio.get_running_loop().create_task(run, name=self._name)

    def withdraw(self, entry: E) -> None:
        """Forget ``entry`` if no write took it yet (its caller went away: it is never written)."""
        if entry in self._queue:
            self._queue.remove(entry)

    async def flushed(self) -> None:
        """Wait for the writes in flight and queued now."""
        task = self._task
        if task is not None and not task.done():
            await task

    def _take(self) -> list[E]:
        limit = self._limit
        if limit is not None and len(self._queue) > limit:
            batch, self._queue = self._queue[:limit], self._queue[limit:]
            return batch
        batch, self._queue = self._queue, []
        return batch
