"""A finished response's text is stored once, and everything read back is what the client got.

After compaction (store/compaction.py, run when a response ends) the stored events refer into the
final Response instead of repeating its text. Replays (from the start and from the middle), the
Response and chains through previous_response_id must be exactly as before; the bytes at rest for a
long answer must be close to its text. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.response import new_response
from responses_gateway.store import Store
from test_store_suite import OWNER, collect, opened, rich, store_url, user  # noqa: F401 - store_url: fixture

JSON = dict[str, Any]
PIECE = "0123456789abcdefghij" * 200  # 4,000 characters per delta


def long_answer(builder: StreamBuilder) -> None:
    item = builder.open_message()
    for i in range(250):  # 1 MB of text
        builder.text_delta(item, f"<{i:04d}>" + PIECE[6:])
    builder.close_message(item)


def refusal(builder: StreamBuilder) -> None:
    item = builder.open_message()
    for piece in ("I can", "not help", " with that."):
        builder.refusal_delta(item, piece)
    builder.close_message(item)


def tool_call(builder: StreamBuilder) -> None:
    item = builder.open_function_call("lookup", call_id="call_9")
    for piece in ('{"q": ', '"weather', ' in Paris"}'):
        builder.arguments_delta(item, piece)
    builder.close_function_call(item)
    builder.message("checking")


async def stored_turn(
    store: Store, script: Callable[[StreamBuilder], None], end: str
) -> tuple[JSON, list[JSON]]:
    response = new_response("test-model")
    builder = StreamBuilder(response)
    builder.start()
    await store.responses.create_response(OWNER, builder.snapshot(), request={}, input_items=[user("hi")])
    recorder = store.recorder(response["id"])
    events = builder.take()
    script(builder)
    builder.set_usage(10, 5)
    if end == "completed":
        builder.complete()
    elif end == "incomplete":
        builder.incomplete("max_output_tokens")
    else:
        builder.fail("server_error", "the upstream went away")
    events += builder.take()
    for start in range(0, len(events), 7):  # in several writes, as a stream is recorded
        await recorder.add(events[start : start + 7])
    return builder.response, events


async def stored_bytes(store: Store, response_id: str) -> int:
    async with store.db.transaction() as tx:
        total = 0
        for sql in (
            "SELECT SUM(LENGTH(event)) FROM rg_events WHERE response_id = ?",
            "SELECT SUM(LENGTH(item)) FROM rg_items WHERE response_id = ?",
            "SELECT SUM(LENGTH(response)) FROM rg_responses WHERE id = ?",
        ):
            row = await tx.fetchone(sql, response_id)
            total += int(row[0] or 0) if row else 0
    return total


CASES = [
    ("long answer", long_answer, "completed"),
    ("reasoning, call, message", rich, "completed"),
    ("refusal", refusal, "completed"),
    ("tool call", tool_call, "incomplete"),
    ("failed midway", long_answer, "failed"),
]


@pytest.mark.parametrize(("label", "script", "end"), CASES, ids=[c[0] for c in CASES])
def test_replay_after_compaction_is_what_the_client_got(
    store_url: str,  # noqa: F811
    label: str,
    script: Callable[[StreamBuilder], None],
    end: str,
) -> None:
    async def go() -> None:
        async with opened(store_url) as store:
            response, events = await stored_turn(store, script, end)
            rid = response["id"]
            before = await store.responses.get_response(OWNER, rid, include=["reasoning.encrypted_content"])
            await store.compact_response(rid)  # (also run in the background when the response ended)
            replay = await collect(store.stream_events(OWNER, rid))
            assert [orjson.dumps(e) for e in replay] == [orjson.dumps(e) for e in events]
            middle = len(events) // 2
            tail = await collect(store.stream_events(OWNER, rid, starting_after=middle))
            assert tail == events[middle + 1 :]
            after = await store.responses.get_response(OWNER, rid, include=["reasoning.encrypted_content"])
            assert orjson.dumps(after) == orjson.dumps(before)
            # A chain through it still carries its output.
            context, _ = await store.responses.resolve_input(OWNER, [user("next")], previous_response_id=rid)
            assert context[-len(response["output"]) :] == response["output"] if response["output"] else True

    asyncio.run(go())


def test_a_long_answer_is_stored_about_once(store_url: str) -> None:  # noqa: F811
    """Compaction runs by itself when a long response ends (not for short ones, where it would cost
    more than it saves)."""

    async def go() -> None:
        async with opened(store_url) as store:
            long, _ = await stored_turn(store, long_answer, "completed")
            short, _ = await stored_turn(store, refusal, "completed")
        async with opened(store_url) as store:  # closing waited for the background compaction
            text = len(long["output"][0]["content"][0]["text"])
            total = await stored_bytes(store, long["id"])
            assert total <= 1.3 * text, f"{total / text:.2f}x the text at rest"
            async with store.db.transaction() as tx:
                row = await tx.fetchone("SELECT response FROM rg_responses WHERE id = ?", short["id"])
            assert row is not None and orjson.loads(row[0])["output"] == short["output"]  # left whole

    asyncio.run(go())
