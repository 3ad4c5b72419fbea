"""The store's grouped writes (one transaction for many responses), on SQLite and a real PostgreSQL.

Many responses stream at once: their events reach the database within the flush interval, in order,
each response's own; a response deleted or ended meanwhile gets nothing more; responses created at
the same moment share a transaction, and one that cannot be written fails alone.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.response import new_response
from responses_gateway.store import ItemReferenceNotFound, ResponseNotFound, Store
from responses_gateway.store.events import ENDS_PER_WRITE
from test_store_services import run
from test_store_suite import OWNER, opened, store_url, user

__all__ = ["store_url"]

JSON = dict[str, Any]


async def _stored_seqs(store: Store) -> dict[str, list[int]]:
    async with store.db.transaction() as tx:
        rows = await tx.fetch("SELECT response_id, seq FROM rg_events ORDER BY response_id, seq")
    out: dict[str, list[int]] = {}
    for rid, seq in rows:
        out.setdefault(str(rid), []).append(int(seq))
    return out


async def _start(store: Store, text: str) -> tuple[StreamBuilder, str]:
    builder = StreamBuilder(new_response("test-model"))
    builder.start()
    snapshot = builder.snapshot()
    await store.responses.create_response(OWNER, snapshot, request={"input": text}, input_items=[user(text)])
    return builder, str(snapshot["id"])


def test_many_streams_written_together_within_the_flush_interval(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url, flush_interval=0.05) as store:
            started = await asyncio.gather(*(_start(store, f"q{i}") for i in range(40)))
            recorders = [store.recorder(rid) for _, rid in started]
            for (builder, _), recorder in zip(started, recorders, strict=True):
                recorder.add_nowait(builder.take())
                builder.open_message()
                recorder.add_nowait(builder.take())
            for step in range(5):
                for (builder, _), recorder in zip(started, recorders, strict=True):
                    builder.text_delta(builder.items[-1], f"t{step} ")
                    recorder.add_nowait(builder.take())
                await asyncio.sleep(0.01)
            # The one in the middle is deleted while its events wait for the grouped write.
            victim = started[20][1]
            await store.responses.delete_response(OWNER, victim)
            await asyncio.sleep(0.2)  # several flush intervals
            seqs = await _stored_seqs(store)
            assert victim not in seqs
            for (_, rid), recorder in zip(started, recorders, strict=True):
                if rid == victim:
                    continue
                sent = recorder.recorded
                assert seqs[rid] == list(range(sent)), rid
                # Each response's own snapshot moved to in_progress with it.
                assert (await store.responses.get_response(OWNER, rid))["status"] == "in_progress"
            # The end of each still goes through its own transaction, after the grouped writes.
            builder, rid = started[0]
            builder.close_message(builder.items[-1])
            builder.complete()
            await recorders[0].add(builder.take())
            final = await store.responses.get_response(OWNER, rid)
            assert final["status"] == "completed"
            assert final["output"][0]["content"][0]["text"] == "t0 t1 t2 t3 t4 "
            assert (await _stored_seqs(store))[rid] == list(range(recorders[0].recorded))
            with pytest.raises(ResponseNotFound):
                await store.responses.get_response(OWNER, victim)

    run(main())


def test_creates_at_the_same_moment_fail_alone(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            builders = [StreamBuilder(new_response("test-model")) for _ in range(6)]
            for builder in builders:
                builder.start()
            snapshots = [b.snapshot() for b in builders]
            # The fourth reuses the second's id: the database refuses that row, and only that row.
            snapshots[3] = {**snapshots[3], "id": snapshots[1]["id"]}
            results = await asyncio.gather(
                *(
                    store.responses.create_response(
                        OWNER, snap, request={"input": "x"}, input_items=[user("x")]
                    )
                    for snap in snapshots
                ),
                return_exceptions=True,
            )
            assert [isinstance(r, Exception) for r in results] == [False, False, False, True, False, False]
            for index, snap in enumerate(snapshots):
                if index == 3:
                    continue
                stored = await store.responses.get_response(OWNER, snap["id"])
                assert stored["status"] == "in_progress"
                items = await store.responses.list_input_items(OWNER, snap["id"])
                assert [item["content"][0]["text"] for item in items["data"]] == ["x"]

    run(main())


def test_an_end_writes_status_events_and_output_items_together(store_url: str) -> None:
    """The end (one trip on SQLite): final status, every event and the output items, owned by the
    response's owner, so an item_reference to an output item resolves for that owner only."""

    async def main() -> None:
        async with opened(store_url) as store:
            builder, rid = await _start(store, "q")
            recorder = store.recorder(rid)
            recorder.add_nowait(builder.take())
            builder.message("the answer")
            builder.complete()
            await recorder.add(builder.take())
            final = await store.responses.get_response(OWNER, rid)
            assert final["status"] == "completed"
            assert (await _stored_seqs(store))[rid] == list(range(recorder.recorded))
            item_id = final["output"][0]["id"]
            resolved = await store.resolve_item_references(OWNER, [{"type": "item_reference", "id": item_id}])
            assert resolved[0]["content"][0]["text"] == "the answer"
            with pytest.raises(ItemReferenceNotFound):
                await store.resolve_item_references(
                    "someone-else", [{"type": "item_reference", "id": item_id}]
                )
            # An end for a response that is gone writes nothing (and does not fail).
            other, gone = await _start(store, "r")
            late = store.recorder(gone)
            late.add_nowait(other.take())
            await store.responses.delete_response(OWNER, gone)
            other.message("late")
            other.complete()
            await late.add(other.take())
            assert gone not in await _stored_seqs(store)

    run(main())


def test_ends_at_the_same_moment_fail_alone(tmp_path: Path) -> None:
    """On SQLite, responses ending at the same moment are written together; an end the database
    refuses fails alone: the others are stored finished with every event, and the refused one is
    written by the retry once the database takes it (until then it reads in_progress)."""

    async def main() -> None:
        async with opened(f"sqlite://{tmp_path / 'gw.db'}") as store:
            started = await asyncio.gather(*(_start(store, f"q{i}") for i in range(8)))
            recorders = [store.recorder(rid) for _, rid in started]
            refused = started[3][1]
            async with store.db.transaction() as tx:
                await tx.execute(
                    "CREATE TRIGGER refuse BEFORE UPDATE OF status ON rg_responses"
                    f" WHEN NEW.id = '{refused}' AND NEW.status = 'completed'"
                    " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                )
            for (builder, _), recorder in zip(started, recorders, strict=True):
                recorder.add_nowait(builder.take())
                builder.message(f"answer of {recorder.response_id}")
                builder.complete()
                recorder.add_nowait(builder.take())
            await asyncio.gather(*(recorder.drain() for recorder in recorders))
            seqs = await _stored_seqs(store)
            for (_, rid), recorder in zip(started, recorders, strict=True):
                stored = await store.responses.get_response(OWNER, rid)
                if rid == refused:
                    assert stored["status"] == "in_progress"
                    continue
                assert stored["status"] == "completed"
                assert stored["output"][0]["content"][0]["text"] == f"answer of {rid}"
                assert seqs[rid] == list(range(recorder.recorded))
            async with store.db.transaction() as tx:
                await tx.execute("DROP TRIGGER refuse")
            assert await store.events.retry_ends() == 1
            stored = await store.responses.get_response(OWNER, refused)
            assert stored["status"] == "completed"
            assert (await _stored_seqs(store))[refused] == list(range(recorders[3].recorded))

    run(main())


def test_ends_queued_together_are_written_a_few_at_a_time(tmp_path: Path) -> None:
    """On SQLite, ten responses ending while the database is busy are not all written (and their
    clients released) by one shared write: each write takes at most ENDS_PER_WRITE, and every
    response is stored finished."""

    async def main() -> None:
        async with opened(f"sqlite://{tmp_path / 'gw.db'}") as store:
            started = await asyncio.gather(*(_start(store, f"q{i}") for i in range(10)))
            recorders = [store.recorder(rid) for _, rid in started]
            for (builder, _), recorder in zip(started, recorders, strict=True):
                recorder.add_nowait(builder.take())
            await asyncio.gather(*(recorder.drain() for recorder in recorders))
            statements: list[str] = []  # what the database runs, from here on
            await store.db.call(lambda conn: conn.set_trace_callback(statements.append))  # type: ignore[attr-defined]
            busy = asyncio.ensure_future(store.db.call(lambda conn: time.sleep(0.2)))
            await asyncio.sleep(0.02)  # the database thread is busy: the ends queue up
            for (builder, _), recorder in zip(started, recorders, strict=True):
                builder.message(f"answer of {recorder.response_id}")
                builder.complete()
                recorder.add_nowait(builder.take())
            await asyncio.gather(busy, *(recorder.drain() for recorder in recorders))
            sizes, ends = [], 0  # responses ended by each transaction
            for sql in statements:
                if sql.startswith("UPDATE rg_responses SET status") and "cancel_requested = 0" in sql:
                    ends += 1
                elif sql == "COMMIT" and ends:
                    sizes.append(ends)
                    ends = 0
            assert sum(sizes) == 10 and max(sizes) <= ENDS_PER_WRITE and len(sizes) >= 3, sizes
            for _, rid in started:
                stored = await store.responses.get_response(OWNER, rid)
                assert stored["status"] == "completed"
                assert stored["output"][0]["content"][0]["text"] == f"answer of {rid}"

    run(main())
