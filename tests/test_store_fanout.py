"""Two gateway instances on one PostgreSQL and one Redis: follow and cancel across instances."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.response import new_response
from responses_gateway.store import Store, open_store
from test_store_services import require, run

JSON = dict[str, Any]
OWNER = "owner-fanout"


@asynccontextmanager
async def two_instances(**options: Any) -> AsyncIterator[tuple[Store, Store]]:
    pg, redis = require("postgres"), require("redis")
    a = await open_store(pg, redis_url=redis, **options)
    b = await open_store(pg, redis_url=redis, **options)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def collect(stream: AsyncIterator[JSON]) -> list[JSON]:
    return [event async for event in stream]


def test_follow_from_another_instance_without_gap_or_duplicate() -> None:
    async def main() -> None:
        # A flushes to the database only every 10 s: what B sees live can only have come through Redis.
        async with two_instances(flush_interval=10.0, flush_events=10_000) as (a, b):
            response = new_response("m", background=True)
            builder = StreamBuilder(response)
            builder.start()
            await a.responses.create_response(OWNER, builder.snapshot(), request={}, input_items=[])
            recorder = a.recorder(response["id"])
            sent = builder.take()
            await recorder.add(sent)
            item = builder.open_message()
            for piece in "abc":
                builder.text_delta(item, piece)
            chunk = builder.take()
            sent += chunk
            await recorder.add(chunk)
            await recorder.flush()  # the database now holds sequence 0..N

            # B resumes after event 1, i.e. partly from the database, then live.
            follower = asyncio.create_task(collect(b.stream_events(OWNER, response["id"], starting_after=1)))
            live_seen: list[int] = []

            async def watch() -> None:
                async for event in b.stream_events(OWNER, response["id"], starting_after=len(sent) - 1):
                    live_seen.append(event["sequence_number"])
                    if len(live_seen) == 3:
                        return

            watcher = asyncio.create_task(watch())
            for piece in "defghij":
                builder.text_delta(item, piece)
                chunk = builder.take()
                sent += chunk
                await recorder.add(chunk)
                await asyncio.sleep(0.005)
            await asyncio.wait_for(watcher, 10)
            # Seen on B before A wrote any of them to the database.
            async with b.db.transaction() as tx:
                row = await tx.fetchone(
                    "SELECT MAX(seq) FROM rg_events WHERE response_id = ?", response["id"]
                )
            assert row is not None and row[0] < live_seen[0]

            builder.close_message(item)
            builder.complete()
            chunk = builder.take()
            sent += chunk
            await recorder.add(chunk)
            got = await asyncio.wait_for(follower, 10)
            assert [e["sequence_number"] for e in got] == list(range(2, len(sent)))
            assert got == sent[2:]
            assert (await b.responses.get_response(OWNER, response["id"]))["status"] == "completed"
            # After the end, a late follower on B is served from the database alone.
            assert await collect(b.stream_events(OWNER, response["id"])) == sent

    run(main())


def test_cancel_on_one_instance_stops_work_on_the_other() -> None:
    async def main() -> None:
        async with two_instances() as (a, b):
            response = new_response("m", background=True)
            builder = StreamBuilder(response)
            builder.start()
            await a.responses.create_response(OWNER, builder.snapshot(), request={}, input_items=[])
            recorder = a.recorder(response["id"])
            await recorder.add(builder.take())
            stop = a.cancel_event(response["id"])

            async def work_on_a() -> None:
                item = builder.open_message()
                while not stop.is_set():
                    builder.text_delta(item, ".")
                    await recorder.add(builder.take())
                    await asyncio.sleep(0.01)
                snapshot = builder.snapshot()
                snapshot["status"] = "cancelled"
                await recorder.finish(snapshot)

            worker = asyncio.create_task(work_on_a())
            await asyncio.sleep(0.1)
            result = await b.responses.cancel_response(OWNER, response["id"], wait=5)
            await asyncio.wait_for(worker, 5)
            assert result["status"] == "cancelled"
            assert (await a.responses.get_response(OWNER, response["id"]))["status"] == "cancelled"

    run(main())


def test_cancel_reaches_the_other_instance_through_the_database_without_redis() -> None:
    async def main() -> None:
        pg = require("postgres")
        a = await open_store(pg, lease_seconds=0.3)
        b = await open_store(pg, lease_seconds=0.3)
        try:
            response = new_response("m", background=True)
            builder = StreamBuilder(response)
            builder.start()
            await a.responses.create_response(OWNER, builder.snapshot(), request={}, input_items=[])
            await a.recorder(response["id"]).add(builder.take())
            stop = a.cancel_event(response["id"])
            await b.responses.cancel_response(OWNER, response["id"], wait=0)
            await asyncio.wait_for(stop.wait(), 5)  # picked up by A's heartbeat
        finally:
            await a.close()
            await b.close()

    run(main())
