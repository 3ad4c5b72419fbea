"""SQLite transactions a request waits on before its first event (``first=True``) go ahead of queued ones.

Real SQLite file, real database thread: a transaction is held open, others queue behind it, and the
order in which they then run (each writes a row) is read back from the table.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from responses_gateway.store.db import SqliteDatabase


async def _order(path: Path, cancel_one: bool) -> list[str]:
    db = SqliteDatabase(path)
    await db.open()
    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE t (n INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)")
        release = asyncio.Event()

        async def holder() -> None:
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO t (name) VALUES (?)", "holder")
                await release.wait()

        async def writer(name: str, first: bool) -> None:
            async with db.transaction(first=first) as tx:
                await tx.execute("INSERT INTO t (name) VALUES (?)", name)

        hold = asyncio.create_task(holder())
        await asyncio.sleep(0.05)
        tasks = {}
        for name, first in (("end-1", False), ("create-1", True), ("end-2", False), ("create-2", True)):
            tasks[name] = asyncio.create_task(writer(name, first))
            await asyncio.sleep(0.01)
        if cancel_one:
            tasks["create-1"].cancel()
            await asyncio.sleep(0.01)
        release.set()
        await hold
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        async with db.transaction() as tx:
            rows = await tx.fetch("SELECT name FROM t ORDER BY n")
        return [str(r[0]) for r in rows]
    finally:
        await db.close()


def test_first_lane_goes_ahead_of_queued_transactions(tmp_path: Path) -> None:
    order = asyncio.run(_order(tmp_path / "a.db", cancel_one=False))
    assert order == ["holder", "create-1", "create-2", "end-1", "end-2"]


def test_a_cancelled_waiter_leaves_the_queue_and_the_rest_run(tmp_path: Path) -> None:
    order = asyncio.run(_order(tmp_path / "b.db", cancel_one=True))
    assert order == ["holder", "create-2", "end-1", "end-2"]
