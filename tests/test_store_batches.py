"""store/batches.py: the one batch writer behind the SQLite store's shared creates and ends."""

from __future__ import annotations

import asyncio

import pytest

from responses_gateway.store.batches import Batches, write_batches


def test_a_failed_shared_write_is_retried_one_entry_at_a_time() -> None:
    async def run() -> dict[str, object]:
        queue = [["a", "bad", "c"]]
        settled: dict[str, object] = {}

        async def write(batch: list[str]) -> list[str]:
            if "bad" in batch:
                raise ValueError("bad row")
            return [f"{entry}!" for entry in batch]

        await write_batches(lambda: queue.pop() if queue else [], write, settled.__setitem__)
        return settled

    settled = asyncio.run(run())
    assert settled["a"] == "a!" and settled["c"] == "c!"
    assert isinstance(settled["bad"], ValueError)


def test_cancelled_while_retrying_settles_every_entry_left() -> None:
    """Shutdown cancels the writer while it retries one entry at a time: the entries not written yet,
    and those queued meanwhile, are settled with the cancellation (their callers would wait for ever)."""

    async def run() -> dict[str, object]:
        queue = [["later"], ["a", "b", "c"]]
        settled: dict[str, object] = {}
        started = asyncio.Event()

        async def write(batch: list[str]) -> list[str]:
            if len(batch) > 1:
                raise ValueError("shared write refused")
            if batch == ["b"]:
                started.set()
                await asyncio.sleep(10)
            return batch

        task = asyncio.ensure_future(
            write_batches(lambda: queue.pop() if queue else [], write, settled.__setitem__)
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return settled

    settled = asyncio.run(run())
    assert settled["a"] == "a"
    assert set(settled) == {"a", "b", "c", "later"}
    assert all(isinstance(settled[e], asyncio.CancelledError) for e in ("b", "c", "later"))


def test_a_limited_queue_writes_at_most_limit_entries_at_a_time() -> None:
    """``limit``: what queued up while a write was in flight goes in writes of at most that many,
    oldest first; every entry is settled with its own result."""

    async def run() -> tuple[list[list[int]], dict[int, object]]:
        writes: list[list[int]] = []
        settled: dict[int, object] = {}
        gate = asyncio.Event()

        async def write(batch: list[int]) -> list[int]:
            writes.append(list(batch))
            if len(writes) == 1:
                await gate.wait()  # the first write is in flight while the others queue
            return [entry * 10 for entry in batch]

        batches: Batches[int, int] = Batches(write, settled.__setitem__, "test", limit=4)
        batches.put(0)
        await asyncio.sleep(0)
        for entry in range(1, 11):
            batches.put(entry)
        gate.set()
        await batches.flushed()
        return writes, settled

    writes, settled = asyncio.run(run())
    assert writes == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert settled == {entry: entry * 10 for entry in range(11)}
    with pytest.raises(ValueError):
        Batches(lambda batch: asyncio.sleep(0, batch), lambda entry, result: None, "test", limit=0)
