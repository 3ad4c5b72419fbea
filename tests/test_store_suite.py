"""The store contract, run identically against SQLite and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from conftest import check_stream
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.response import new_response
from responses_gateway.store import (
    ConversationNotFound,
    ItemNotFound,
    ItemReferenceNotFound,
    PreviousResponseNotFound,
    ResponseNotFound,
    Store,
    open_store,
)
from responses_gateway.store.live import LocalLiveLog
from test_store_services import require, run

JSON = dict[str, Any]
OWNER, OTHER = "owner-a", "owner-b"
_pg_reset = False


def _pg_url() -> str:
    global _pg_reset
    url = require("postgres")
    if not _pg_reset:
        # Start every session from an empty database so the migrations run from version 0.
        async def reset() -> None:
            conn = await asyncpg.connect(url)
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
            await conn.close()

        run(reset())
        _pg_reset = True
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/data/gateway.db"
    return _pg_url()


@asynccontextmanager
async def opened(url: str, **options: Any) -> AsyncIterator[Store]:
    store = await open_store(url, **options)
    try:
        yield store
    finally:
        await store.close()


def user(text: str) -> JSON:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def turn(
    store: Store,
    input_items: list[JSON],
    *,
    owner: str = OWNER,
    previous: str | None = None,
    conversation: str | None = None,
    script: Callable[[StreamBuilder], None] | None = None,
) -> tuple[JSON, list[JSON]]:
    """Run one stored turn the way the server will; the final Response and every event."""
    _context, resolved = await store.responses.resolve_input(
        owner, input_items, previous_response_id=previous, conversation_id=conversation
    )
    response = new_response(
        "test-model", previous_response_id=previous, conversation=conversation and {"id": conversation}
    )
    builder = StreamBuilder(response)
    builder.start()
    await store.responses.create_response(
        owner, builder.snapshot(), request={"input": input_items}, input_items=resolved
    )
    recorder = store.recorder(response["id"])
    events = builder.take()
    await recorder.add(events)
    if script is None:
        builder.message(f"answer to {len(resolved)} items")
    else:
        script(builder)
    builder.set_usage(10, 5)
    more = builder.take()
    await recorder.add(more)
    builder.complete()
    last = builder.take()
    await recorder.add(last)
    return builder.response, events + more + last


def rich(builder: StreamBuilder) -> None:
    reasoning = builder.open_reasoning(encrypted_content="sealed-state")
    builder.open_summary_part(reasoning)
    builder.summary_delta(reasoning, "thinking about it")
    builder.close_reasoning(reasoning)
    builder.function_call("lookup", '{"q": "x"}', call_id="call_1")
    builder.message("done")


async def collect(stream: AsyncIterator[JSON]) -> list[JSON]:
    return [event async for event in stream]


# ---------------------------------------------------------------------------------------------- tests
def test_round_trip_with_every_item_type(store_url: str) -> None:
    inputs = [
        {"role": "developer", "content": "be brief"},
        user("hi"),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
        {"type": "reasoning", "id": "rs_prev", "summary": [], "encrypted_content": "abc"},
        {"type": "function_call", "call_id": "c0", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": "42"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    ]

    async def main() -> None:
        async with opened(store_url) as store:
            final, events = await turn(store, inputs, script=rich)
            got = await store.responses.get_response(
                OWNER, final["id"], include=["reasoning.encrypted_content"]
            )
            assert got == final
            assert got["status"] == "completed" and got["usage"]["total_tokens"] == 15
            plain = await store.responses.get_response(OWNER, final["id"])
            assert "encrypted_content" not in plain["output"][0]
            assert [o["type"] for o in plain["output"]] == ["reasoning", "function_call", "message"]
            page = await store.responses.list_input_items(OWNER, final["id"], order="asc", limit=100)
            assert [i.get("type", "?") for i in page["data"]][1:] == [i["type"] for i in inputs[1:]]
            assert all(i["id"] for i in page["data"])
            assert page["data"][3] == {k: v for k, v in inputs[3].items() if k != "encrypted_content"}
            assert (await collect(store.stream_events(OWNER, final["id"]))) == events
            assert [e["sequence_number"] for e in events] == list(range(len(events)))

    run(main())


def test_input_items_pagination_both_orders(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            items = [{**user(f"m{i}"), "id": f"msg_{i}"} for i in range(7)]
            final, _ = await turn(store, items)
            rid = final["id"]

            async def ids(**kw: Any) -> tuple[list[str], bool, str | None, str | None]:
                page = await store.responses.list_input_items(OWNER, rid, **kw)
                assert page["object"] == "list"
                return [d["id"] for d in page["data"]], page["has_more"], page["first_id"], page["last_id"]

            assert await ids(order="asc", limit=3) == (["msg_0", "msg_1", "msg_2"], True, "msg_0", "msg_2")
            assert await ids(order="asc", limit=3, after="msg_2") == (
                ["msg_3", "msg_4", "msg_5"],
                True,
                "msg_3",
                "msg_5",
            )
            assert await ids(order="asc", after="msg_4") == (["msg_5", "msg_6"], False, "msg_5", "msg_6")
            assert (await ids())[0] == [f"msg_{i}" for i in range(6, -1, -1)]
            assert await ids(limit=2, after="msg_5") == (["msg_4", "msg_3"], True, "msg_4", "msg_3")
            assert (await ids(before="msg_2"))[0] == ["msg_6", "msg_5", "msg_4", "msg_3"]
            assert (await ids(order="asc", before="msg_2"))[0] == ["msg_0", "msg_1"]
            assert (await ids(order="asc", after="msg_1", before="msg_5"))[0] == ["msg_2", "msg_3", "msg_4"]
            assert (await ids(order="desc", after="msg_5", before="msg_1"))[0] == ["msg_4", "msg_3", "msg_2"]
            assert await ids(order="asc", after="msg_6") == ([], False, None, None)
            with pytest.raises(ItemNotFound):
                await store.responses.list_input_items(OWNER, rid, after="msg_nope")
            with pytest.raises(ValueError):
                await store.responses.list_input_items(OWNER, rid, limit=0)

    run(main())


def test_previous_response_chain_rebuilds_turns_in_order(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            first, _ = await turn(store, [user("q1")], script=rich)
            call_output = {"type": "function_call_output", "call_id": "call_1", "output": "result"}
            second, _ = await turn(store, [call_output], previous=first["id"])
            third_input = [user("q3")]
            context, resolved = await store.responses.resolve_input(
                OWNER, third_input, previous_response_id=second["id"]
            )
            assert resolved == third_input
            kinds = [(i["type"], i.get("role")) for i in context]
            assert kinds == [
                ("message", "user"),
                ("reasoning", None),
                ("function_call", None),
                ("message", "assistant"),
                ("function_call_output", None),
                ("message", "assistant"),
            ]
            assert context[0]["content"][0]["text"] == "q1"
            assert context[1]["encrypted_content"] == "sealed-state"  # reasoning state kept for the upstream
            assert context[2]["call_id"] == "call_1" and context[4]["output"] == "result"
            assert context[5]["content"][0]["text"] == "answer to 1 items"

    run(main())


def test_missing_previous_response(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            with pytest.raises(PreviousResponseNotFound) as caught:
                await store.responses.resolve_input(OWNER, [user("x")], previous_response_id="resp_missing")
            assert caught.value.code == "previous_response_not_found"
            assert caught.value.param == "previous_response_id"
            first, _ = await turn(store, [user("q")])
            with pytest.raises(PreviousResponseNotFound):
                await store.responses.resolve_input(OTHER, [user("x")], previous_response_id=first["id"])

    run(main())


def test_item_reference_resolution(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            first, _ = await turn(store, [{**user("hello"), "id": "msg_in"}], script=rich)
            fc_id = first["output"][1]["id"]
            refs = [
                {"type": "item_reference", "id": "msg_in"},
                {"type": "item_reference", "id": fc_id},
                user("next"),
            ]
            _ctx, resolved = await store.responses.resolve_input(OWNER, refs)
            assert resolved[0]["content"][0]["text"] == "hello"
            assert resolved[1] == first["output"][1]
            assert resolved[2] == refs[2]
            with pytest.raises(ItemReferenceNotFound) as caught:
                await store.responses.resolve_input(
                    OWNER, [user("a"), {"type": "item_reference", "id": "msg_none"}]
                )
            assert caught.value.param == "input[1]"
            with pytest.raises(ItemReferenceNotFound):
                await store.responses.resolve_input(OTHER, refs[:1])

    run(main())


def test_conversations_and_turn_append(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            conv = await store.conversations.create_conversation(
                OWNER, items=[user("seed")], metadata={"topic": "t"}
            )
            assert conv["object"] == "conversation" and conv["metadata"] == {"topic": "t"}
            cid = conv["id"]
            final, _ = await turn(store, [user("q1")], conversation=cid, script=rich)
            page = await store.conversations.list_conversation_items(OWNER, cid, order="asc")
            texts = [i["type"] for i in page["data"]]
            assert texts == ["message", "message", "reasoning", "function_call", "message"]
            assert page["data"][-1]["id"] == final["output"][-1]["id"]
            context, _ = await store.responses.resolve_input(OWNER, [user("q2")], conversation_id=cid)
            assert [c["id"] for c in context] == [d["id"] for d in page["data"]]
            added = await store.conversations.add_conversation_items(
                OWNER, cid, [user("extra"), user("extra2")]
            )
            assert len(added["data"]) == 2 and added["has_more"] is False
            newest = await store.conversations.list_conversation_items(OWNER, cid, limit=2)
            assert [d["id"] for d in newest["data"]] == [added["data"][1]["id"], added["data"][0]["id"]]
            assert newest["has_more"] is True
            one = await store.conversations.get_conversation_item(OWNER, cid, added["data"][0]["id"])
            assert one["content"][0]["text"] == "extra"
            after_delete = await store.conversations.delete_conversation_item(
                OWNER, cid, added["data"][0]["id"]
            )
            assert after_delete["id"] == cid
            with pytest.raises(ItemNotFound):
                await store.conversations.get_conversation_item(OWNER, cid, added["data"][0]["id"])
            updated = await store.conversations.update_conversation(OWNER, cid, {"topic": "u"})
            assert updated["metadata"] == {"topic": "u"}
            assert (await store.conversations.get_conversation(OWNER, cid))["metadata"] == {"topic": "u"}
            assert await store.conversations.delete_conversation(OWNER, cid) == {
                "id": cid,
                "object": "conversation.deleted",
                "deleted": True,
            }
            with pytest.raises(ConversationNotFound):
                await store.conversations.get_conversation(OWNER, cid)

    run(main())


def test_ownership_isolation_on_every_operation(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            conv = await store.conversations.create_conversation(
                OWNER, items=[{**user("c"), "id": "msg_conv"}]
            )
            final, _ = await turn(store, [{**user("q"), "id": "msg_mine"}], conversation=conv["id"])
            rid, cid = final["id"], conv["id"]
            attempts: list[tuple[Any, type[Exception]]] = [
                (store.responses.get_response(OTHER, rid), ResponseNotFound),
                (store.responses.delete_response(OTHER, rid), ResponseNotFound),
                (store.responses.list_input_items(OTHER, rid), ResponseNotFound),
                (store.responses.cancel_response(OTHER, rid), ResponseNotFound),
                (collect(store.stream_events(OTHER, rid)), ResponseNotFound),
                (
                    store.responses.resolve_input(OTHER, [], previous_response_id=rid),
                    PreviousResponseNotFound,
                ),
                (
                    store.responses.resolve_input(OTHER, [{"type": "item_reference", "id": "msg_mine"}]),
                    ItemReferenceNotFound,
                ),
                (
                    store.responses.resolve_input(OTHER, [{"type": "item_reference", "id": "msg_conv"}]),
                    ItemReferenceNotFound,
                ),
                (store.responses.resolve_input(OTHER, [], conversation_id=cid), ConversationNotFound),
                (store.conversations.get_conversation(OTHER, cid), ConversationNotFound),
                (store.conversations.update_conversation(OTHER, cid, {"x": "y"}), ConversationNotFound),
                (store.conversations.delete_conversation(OTHER, cid), ConversationNotFound),
                (store.conversations.list_conversation_items(OTHER, cid), ConversationNotFound),
                (store.conversations.add_conversation_items(OTHER, cid, [user("z")]), ConversationNotFound),
                (store.conversations.get_conversation_item(OTHER, cid, "msg_conv"), ConversationNotFound),
                (store.conversations.delete_conversation_item(OTHER, cid, "msg_conv"), ConversationNotFound),
            ]
            for coro, error in attempts:
                with pytest.raises(error):
                    await coro
            with pytest.raises(ConversationNotFound):
                await turn(store, [user("q")], owner=OTHER, conversation=cid)
            # Nothing the other owner tried changed anything.
            assert (await store.responses.get_response(OWNER, rid))["status"] == "completed"
            assert len((await store.conversations.list_conversation_items(OWNER, cid))["data"]) == 3
            deleted = await store.responses.delete_response(OWNER, rid)
            assert deleted == {"id": rid, "object": "response", "deleted": True}
            with pytest.raises(ResponseNotFound):
                await store.responses.get_response(OWNER, rid)

    run(main())


def test_event_replay_from_n_then_live_follow(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url, flush_interval=0.01) as store:
            response = new_response("m", background=True)
            builder = StreamBuilder(response)
            builder.start(queued=True)
            await store.responses.create_response(
                OWNER, builder.snapshot(), request={}, input_items=[user("q")]
            )
            assert (await store.responses.get_response(OWNER, response["id"]))["status"] == "queued"
            recorder = store.recorder(response["id"])
            sent: list[JSON] = builder.take()
            await recorder.add(sent)
            builder.mark_in_progress()
            item = builder.open_message()
            builder.text_delta(item, "a")
            chunk = builder.take()
            sent += chunk
            await recorder.add(chunk)
            await recorder.flush()
            assert (await store.responses.get_response(OWNER, response["id"]))["status"] == "in_progress"

            follower = asyncio.create_task(
                collect(store.stream_events(OWNER, response["id"], starting_after=2))
            )
            for piece in "bcdefgh":
                builder.text_delta(item, piece)
                chunk = builder.take()
                sent += chunk
                await recorder.add(chunk)
                await asyncio.sleep(0.003)
            builder.close_message(item)
            builder.complete()
            chunk = builder.take()
            sent += chunk
            await recorder.add(chunk)
            got = await asyncio.wait_for(follower, 10)
            assert got == sent[3:]
            replay = await collect(store.stream_events(OWNER, response["id"], starting_after=5))
            assert replay == sent[6:]
            assert (
                await collect(store.stream_events(OWNER, response["id"], starting_after=len(sent) - 1)) == []
            )
            final = await store.responses.get_response(OWNER, response["id"])
            assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "abcdefgh"

    run(main())


def test_cancel_queued_and_in_progress(store_url: str) -> None:
    async def main() -> None:
        async with opened(store_url) as store:
            queued = new_response("m", background=True)
            b1 = StreamBuilder(queued)
            b1.start(queued=True)
            await store.responses.create_response(OWNER, b1.snapshot(), request={}, input_items=[])
            result = await store.responses.cancel_response(OWNER, queued["id"])
            assert result["status"] == "cancelled"
            # A worker that picks it up late cannot bring it back.
            b1.mark_in_progress()
            await store.recorder(queued["id"]).add(b1.take())
            assert (await store.responses.get_response(OWNER, queued["id"]))["status"] == "cancelled"

            running = new_response("m", background=True)
            b2 = StreamBuilder(running)
            b2.start()
            await store.responses.create_response(OWNER, b2.snapshot(), request={}, input_items=[])
            recorder = store.recorder(running["id"])
            await recorder.add(b2.take())
            signal_ = store.cancel_event(running["id"])

            async def worker() -> None:
                await signal_.wait()
                snapshot = b2.snapshot()
                snapshot["status"] = "cancelled"
                await recorder.finish(snapshot)

            task = asyncio.create_task(worker())
            result = await store.responses.cancel_response(OWNER, running["id"], wait=5)
            await task
            assert result["status"] == "cancelled"
            events = await collect(store.stream_events(OWNER, running["id"]))
            assert [e["type"] for e in events] == ["response.created", "response.in_progress"]

    run(main())


CRASHER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from responses_gateway.protocol.builder import StreamBuilder
    from responses_gateway.protocol.response import new_response
    from responses_gateway.store import open_store

    async def main():
        store = await open_store(sys.argv[1], lease_seconds=float(sys.argv[2]))
        response = new_response("m", background=True)
        builder = StreamBuilder(response)
        builder.start()
        await store.responses.create_response("owner-a", builder.snapshot(), request={}, input_items=[])
        recorder = store.recorder(response["id"])
        builder.message("first item")
        item = builder.open_message()
        builder.text_delta(item, "half")
        await recorder.add(builder.take())
        await recorder.flush()
        print(response["id"], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def test_crash_recovery_fails_a_dead_instances_response(store_url: str) -> None:
    # A real SIGKILL in a child process: nothing of it runs after the flush.
    done = subprocess.run(
        [sys.executable, "-c", CRASHER, store_url, "600"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    rid = done.stdout.strip()

    async def main() -> None:
        # Its lease is 10 minutes, yet the process is gone from this host: recovered at start-up.
        async with opened(store_url) as store:
            response = await store.responses.get_response(OWNER, rid)
            assert response["status"] == "failed"
            assert response["error"]["code"] == "server_error"
            # The item that was streaming is closed as a live failure closes it: incomplete, with the
            # text streamed before the crash.
            output = response["output"]
            assert [o["content"][0]["text"] for o in output] == ["first item", "half"]
            assert [o["status"] for o in output] == ["completed", "incomplete"]
            events = await collect(store.stream_events(OWNER, rid))
            types = [e["type"] for e in events]
            assert types[:2] == ["response.created", "response.in_progress"]
            assert types[-2:] == ["error", "response.failed"]
            assert "response.output_text.delta" in types
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            check_stream(events)

    run(main())


def test_live_instance_is_not_recovered_but_expired_lease_is(store_url: str) -> None:
    async def main() -> None:
        async with (
            opened(store_url, lease_seconds=600) as alive,
            opened(store_url, lease_seconds=600) as other,
        ):
            response = new_response("m")
            builder = StreamBuilder(response)
            builder.start()
            await alive.responses.create_response(OWNER, builder.snapshot(), request={}, input_items=[])
            await alive.recorder(response["id"]).add(builder.take())
            assert response["id"] not in await other.recover()
            assert (await other.responses.get_response(OWNER, response["id"]))["status"] == "in_progress"
            # Pretend `alive` stopped heartbeating on another host long ago.
            async with other.db.transaction() as tx:
                await tx.execute(
                    "UPDATE rg_instances SET heartbeat_at = 1, host = 'elsewhere' WHERE id = ?",
                    alive.instance_id,
                )
            assert response["id"] in await other.recover()
            assert (await other.responses.get_response(OWNER, response["id"]))["status"] == "failed"
            follow = await collect(other.stream_events(OWNER, response["id"]))
            assert follow[-1]["type"] == "response.failed"

    run(main())


def test_migrations_are_idempotent_and_versioned(store_url: str) -> None:
    from responses_gateway.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate

    async def main() -> None:
        async with opened(store_url) as store:
            assert await migrate(store.db) == SCHEMA_VERSION
            async with store.db.transaction() as tx:
                versions = await tx.fetch("SELECT version FROM rg_schema ORDER BY version")
                assert versions == [(version,) for version, _ in MIGRATIONS]

    run(main())


def test_sqlite_file_is_created_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "gateway.db"

    async def main() -> None:
        async with opened(f"sqlite://{path}") as store, store.db.transaction() as tx:
            assert (await tx.fetchone("PRAGMA journal_mode")) == ("wal",)

    run(main())
    assert path.exists() and os.path.getsize(path) > 0


@pytest.mark.parametrize("live", ["local", "redis"])
def test_event_arrival_times_are_stored_and_survive_compaction(store_url: str, live: str) -> None:
    from responses_gateway.store.compaction import has_refs

    # With Redis the events go through the recorder's pump task, not the in-place hot path.
    options: dict[str, Any] = {"redis_url": require("redis")} if live == "redis" else {}

    async def main() -> None:
        async with opened(store_url, flush_interval=0.01, **options) as store:
            response = new_response("m")
            rid = response["id"]
            builder = StreamBuilder(response)
            builder.start()
            await store.responses.create_response(
                OWNER, builder.snapshot(), request={}, input_items=[user("q")]
            )
            recorder = store.recorder(rid)
            recorder.add_nowait(builder.take())  # the group writer's way
            item = builder.open_message()
            for piece in "abcdef":
                builder.text_delta(item, piece * 50)
                recorder.add_nowait(builder.take())
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # a pause in the stream
            builder.close_message(item)
            builder.complete()
            await recorder.add(builder.take())  # the end's way

            timed, more = await store.timed_events(OWNER, rid)
            assert not more
            assert [t.sequence_number for t in timed] == list(range(len(timed)))
            times = [t.at_ms for t in timed]
            assert all(isinstance(at, int) for at in times), times
            assert times == sorted(times) and times[0] < 1000
            done = next(i for i, t in enumerate(timed) if t.event["type"] == "response.output_text.done")
            assert timed[done - 1].event["type"] == "response.output_text.delta"
            assert times[done] - times[done - 1] >= 190  # the pause, as recorded
            check_stream([t.event for t in timed])

            assert await store.compact_response(rid)
            async with store.db.transaction() as tx:
                rows = await tx.fetch("SELECT event FROM rg_events WHERE response_id = ?", rid)
            assert any(has_refs(orjson.loads(text)) for (text,) in rows)  # really rewritten
            again, _ = await store.timed_events(OWNER, rid)
            assert again == timed  # the same events (expanded) at the same times

            page, more = await store.timed_events(OWNER, rid, after=2, limit=3)
            assert more and [t.sequence_number for t in page] == [3, 4, 5] and page == timed[3:6]
            last, more = await store.timed_events(OWNER, rid, after=len(timed) - 2, limit=3)
            assert not more and last == timed[-1:]
            with pytest.raises(ResponseNotFound):
                await store.timed_events(OTHER, rid)
            with pytest.raises(ResponseNotFound):
                await store.timed_events(OWNER, "resp_missing")

    run(main())


def test_a_finished_live_log_is_dropped_at_its_end_and_followers_read_the_database(store_url: str) -> None:
    """A finished response's events leave memory at its end (they were kept 30 s, then 1 s, which at
    load meant long garbage-collector passes over them). A follower in the middle of reading is told
    at once that the response ended and reads the rest from the database; one that starts later
    reads everything from there."""

    async def main() -> None:
        async with opened(store_url) as store:
            live = store.live
            assert isinstance(live, LocalLiveLog)
            builder = StreamBuilder(new_response("m"))
            builder.start()
            rid = str(builder.snapshot()["id"])
            snapshot = builder.snapshot()
            await store.responses.create_response(OWNER, snapshot, request={}, input_items=[user("q")])
            recorder = store.recorder(rid)
            item = builder.open_message()
            builder.text_delta(item, "a")
            first = builder.take()
            await recorder.add(first)
            assert live.running_here(rid)
            # A follower that has read the first events and is busy when the response ends.
            follower = store.stream_events(OWNER, rid)
            seen = [await anext(follower) for _ in first]
            for piece in "bc":
                builder.text_delta(item, piece)
            builder.close_message(item)
            builder.complete()
            rest = builder.take()
            await recorder.add(rest)
            assert not live.running_here(rid)  # the events are gone from memory
            assert live.ended_here(rid)
            live.publish_nowait(rid, rest[-1:])  # a stray publish after the end makes no new log
            assert not live.running_here(rid)
            # Told that it ended (not the pause and "nothing" of an id this instance never ran).
            assert await live.read(rid, len(first) - 1, timeout=5) == ([], True)
            seen += [event async for event in follower]
            assert seen == first + rest
            assert await collect(store.stream_events(OWNER, rid)) == first + rest

    asyncio.run(main())
