"""Writes queued while another is in flight go together: one transaction for the lot.

The stored responses' creates (``responses.Responses``) and their ends (``events.Events``) on SQLite
are both written this way: a write waits only for the transaction in flight; under load everything
that queued up meanwhile is written by the next one, in one trip to the database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

__all__ = ["write_batches"]

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
