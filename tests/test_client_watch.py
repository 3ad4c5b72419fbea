"""``server/streaming.py``'s ``ClientWatch``: the stop signal of a stored response, and what a closed
watch leaves behind.

Every stored response's run is watched for its stop signal (cancel or delete) by a small task. A
closed watch must leave nothing for the garbage collector: it used to leave a reference cycle per
response (the cancelled task kept its error, whose traceback held the watch), which made the
collector's gen-1 passes 3-4x longer at 100 streams with the store.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from responses_gateway.server.streaming import ClientWatch


@pytest.fixture
def no_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("watching", ["stop signal", "receive"])
def test_a_closed_watch_is_freed_without_the_garbage_collector(no_collector: None, watching: str) -> None:
    async def main() -> weakref.ref[ClientWatch]:
        stop = asyncio.Event()
        never = asyncio.Event()

        async def receive() -> dict[str, str]:
            await never.wait()
            return {"type": "http.disconnect"}

        async def run() -> weakref.ref[ClientWatch]:
            # "receive": a server without the disconnect callback.
            watch = ClientWatch(receive) if watching == "receive" else ClientWatch(None, stop)
            await asyncio.sleep(0)  # the stop watcher is waiting
            watch.close()
            return weakref.ref(watch)

        ref = await asyncio.create_task(run())
        for _ in range(3):  # the cancelled watcher finishes
            await asyncio.sleep(0)
        return ref

    ref = asyncio.run(main())
    assert ref() is None  # freed by reference counting alone: no cycle
    assert gc.collect() == 0


def test_the_stop_signal_interrupts_the_run() -> None:
    async def main() -> str | None:
        stop = asyncio.Event()

        async def run() -> str | None:
            watch = ClientWatch(None, stop)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return watch.reason
            finally:
                watch.close()
            return None

        task = asyncio.create_task(run())
        await asyncio.sleep(0)
        stop.set()
        return await asyncio.wait_for(task, 5)

    assert asyncio.run(main()) == "stopped"
