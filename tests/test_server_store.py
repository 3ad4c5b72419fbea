"""The Responses API over a real store, through HTTP: SQLite and a real PostgreSQL.

Each test starts a gateway (uvicorn on a free port) whose store is a fresh SQLite file or a database
of its own on the test PostgreSQL server, and talks to it with the openai SDK or raw httpx. Upstreams
are real HTTP servers (tests/upstream_mock.py) or the scripted provider, which records what it got.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import openai
import orjson
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.sse import EventStreamDecoder
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.server.auth import SHARED_OWNER
from responses_gateway.store import open_store
from test_store_services import require, run
from upstream_mock import UpstreamMock, encode_chunks, stream_reply

JSON = dict[str, Any]
_PG_DATABASE = "rg_http_test"


@functools.cache
def _pg_database() -> str:
    """A database of these tests' own on the test server (test_store_suite resets ``rg_test``)."""
    base = require("postgres")

    async def create() -> None:
        conn = await asyncpg.connect(base)
        await conn.execute(f"DROP DATABASE IF EXISTS {_PG_DATABASE} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {_PG_DATABASE}")
        await conn.close()

    run(create())
    return base.rsplit("/", 1)[0] + "/" + _PG_DATABASE


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/data/gateway.db"
    return _pg_database()


@pytest.fixture
def stored(store_url: str, tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """``stored([providers], **config)``: a gateway on this test's store."""
    started: list[Gateway] = []

    def factory(models: Any, **config: Any) -> Gateway:
        config.setdefault("store_url", store_url)
        config.setdefault("data_dir", str(tmp_path / "data"))
        gw = start_gateway(models, **config)
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def sdk(gw: Gateway, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def http(key: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(timeout=30, headers=headers)


def user(text: str) -> JSON:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}

# A scripted model that calls the tool, then answers from its output, then says goodbye.
TOOL_SCRIPT = {
    "turns": [
        {"when": {"text_contains": "thanks"}, "steps": [{"message": ["You're ", "welcome."]}]},
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Sunny ", "in Paris."]}]},
        {
            "steps": [
                {"reasoning": {"summary": [["Need ", "the weather."]], "encrypted_content": "state-1"}},
                {"function_call": {"name": "get_weather", "arguments": ['{"city":', '"Paris"}']}},
            ]
        },
    ]
}


# ---------------------------------------------------------------------------------------- basics
def test_store_get_delete_and_include(stored: Callable[..., Gateway]) -> None:
    gw = stored([ScriptedProvider(TOOL_SCRIPT, name="m")])
    client = sdk(gw)
    first = client.responses.create(model="m", input="weather in Paris?", tools=[WEATHER_TOOL])
    assert first.status == "completed" and [o.type for o in first.output] == ["reasoning", "function_call"]

    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.status == "completed"
    assert got.output[1].model_dump() == first.output[1].model_dump()
    # Reasoning state is shown only when asked for, and then sealed: never the upstream's own bytes.
    assert got.output[0].encrypted_content is None
    sealed = client.responses.retrieve(first.id, include=["reasoning.encrypted_content"])
    state = sealed.output[0].encrypted_content
    assert state is not None and state.startswith("rgs1.") and "state-1" not in state

    # A streamed create reads back the same as its terminal event.
    with http() as h:
        events = decode_sse(
            h.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}).content
        )
        check_stream(events, strict=False)
        final = events[-1]["response"]
        assert h.get(gw.url(f"/v1/responses/{final['id']}")).json()["output"] == [
            {k: v for k, v in item.items() if k != "encrypted_content"} for item in final["output"]
        ]

        deleted = h.delete(gw.url(f"/v1/responses/{first.id}"))
        assert deleted.status_code == 200
        assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
        for method, path in (
            ("GET", f"/v1/responses/{first.id}"),
            ("DELETE", f"/v1/responses/{first.id}"),
            ("GET", f"/v1/responses/{first.id}/input_items"),
        ):
            missing = h.request(method, gw.url(path))
            assert missing.status_code == 404, (method, path)
            assert missing.json()["error"]["type"] == "invalid_request_error"


def test_store_false_keeps_nothing(stored: Callable[..., Gateway]) -> None:
    gw = stored([ScriptedProvider([{"message": "ok"}], name="m")])
    client = sdk(gw)
    response = client.responses.create(model="m", input="hi", store=False)
    assert response.status == "completed" and response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="m", input="again", previous_response_id=response.id)
    assert info.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_input_items_pagination(stored: Callable[..., Gateway]) -> None:
    gw = stored([ScriptedProvider([{"message": "ok"}], name="m")])
    client = sdk(gw)
    items = [user(f"message {i}") for i in range(5)]
    response = client.responses.create(model="m", input=items)  # type: ignore[arg-type]

    page = client.responses.input_items.list(response.id, order="asc", limit=2)
    texts = [item.content[0].text for item in page.data]  # type: ignore[union-attr]
    assert texts == ["message 0", "message 1"] and page.has_more
    ids = [item.id for item in client.responses.input_items.list(response.id, order="asc").data]
    assert len(ids) == 5 and len(set(ids)) == 5
    # The SDK's auto-pagination walks `after` to the end, in either order.
    assert [item.id for item in client.responses.input_items.list(response.id, order="asc", limit=2)] == ids
    assert [item.id for item in client.responses.input_items.list(response.id, limit=2)] == ids[::-1]

    with http() as h:
        url = gw.url(f"/v1/responses/{response.id}/input_items")
        body = h.get(url, params={"order": "asc", "after": ids[1], "limit": 2}).json()
        assert [d["id"] for d in body["data"]] == ids[2:4]
        assert (body["first_id"], body["last_id"], body["has_more"]) == (ids[2], ids[3], True)
        body = h.get(url, params={"order": "desc", "before": ids[1]}).json()
        assert [d["id"] for d in body["data"]] == ids[4:1:-1]
        assert h.get(url, params={"limit": 0}).status_code == 400
        assert h.get(url, params={"limit": 101}).json()["error"]["param"] == "limit"
        assert h.get(url, params={"order": "up"}).json()["error"]["param"] == "order"
        assert h.get(url, params={"after": "msg_nope"}).status_code == 404


# ---------------------------------------------------------------------------------------- chains
def test_previous_response_id_with_tools_through_scripted_provider(stored: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider(TOOL_SCRIPT, name="m")
    client = sdk(stored([provider]))
    first = client.responses.create(model="m", input="weather in Paris?", tools=[WEATHER_TOOL])
    call = first.output[1]
    assert call.type == "function_call"
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "Sunny in Paris." and second.previous_response_id == first.id
    third = client.responses.create(model="m", previous_response_id=second.id, input="thanks!")
    assert third.output_text == "You're welcome."

    seen = provider.requests[-1].input
    assert [item["type"] for item in seen] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert seen[0]["content"][0]["text"] == "weather in Paris?"
    # The provider gets the reasoning state as it produced it (unsealed, with the summary).
    assert seen[1]["encrypted_content"] == "state-1" and seen[1]["summary"][0]["text"] == "Need the weather."
    assert seen[2]["call_id"] == call.call_id and seen[2]["arguments"] == '{"city":"Paris"}'
    assert seen[3]["output"] == "sunny, 24C"
    assert seen[4]["role"] == "assistant" and seen[4]["content"][0]["text"] == "Sunny in Paris."
    assert seen[5]["content"][0]["text"] == "thanks!"


def _chat_chunks(*deltas: JSON, finish: str) -> bytes:
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": "up", "choices": [{"index": 0, "delta": d}]}
        for d in deltas
    ]
    chunks.append(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "up",
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
        }
    )
    return encode_chunks(chunks, "openai-chat")


def test_previous_response_id_rebuilds_history_for_a_stateless_upstream(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    upstream.reset(
        [
            stream_reply(
                _chat_chunks(
                    {"role": "assistant", "reasoning_content": "Check the weather."},
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_w",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                            }
                        ]
                    },
                    finish="tool_calls",
                )
            ),
            stream_reply(_chat_chunks({"role": "assistant", "content": "Sunny in Paris."}, finish="stop")),
            stream_reply(_chat_chunks({"role": "assistant", "content": "Bye."}, finish="stop")),
        ]
    )
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-up", upstream_model="up")
    provider.name = "chat"
    gw = stored([provider])
    client = sdk(gw)
    first = client.responses.create(model="chat", input="weather in Paris?", tools=[WEATHER_TOOL])
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    with client.responses.stream(
        model="chat",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_w", "output": "sunny"}],
        tools=[WEATHER_TOOL],
    ) as stream:
        second = stream.get_final_response()
    assert second.output_text == "Sunny in Paris."
    third = client.responses.create(model="chat", previous_response_id=second.id, input="thanks")
    assert third.output_text == "Bye."

    sent = [r.json["messages"] for r in upstream.requests]
    assert len(sent) == 3
    assert [m["role"] for m in sent[0]] == ["user"]
    history = sent[2]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[0]["content"] in ("weather in Paris?", [{"type": "text", "text": "weather in Paris?"}])
    # The reasoning goes back with the tool call it preceded (DeepSeek refuses tool loops without it).
    assert history[1]["reasoning_content"] == "Check the weather."
    assert history[1]["tool_calls"][0]["id"] == "call_w"
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert history[2]["tool_call_id"] == "call_w" and history[2]["content"] == "sunny"
    assert "Sunny in Paris." in str(history[3]["content"])
    assert "thanks" in str(history[4]["content"])
    assert sent[1] == history[:3]


def test_item_reference_and_conversation(stored: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider(TOOL_SCRIPT, name="m")
    gw = stored([provider])
    client = sdk(gw)
    first = client.responses.create(model="m", input="weather in Paris?", tools=[WEATHER_TOOL])
    call = first.output[1]
    # The Vercel AI SDK's way: earlier items by reference, store off for this turn.
    with http() as h:
        reply = h.post(
            gw.url("/v1/responses"),
            json={
                "model": "m",
                "store": False,
                "input": [
                    {"type": "item_reference", "id": first.output[0].id},
                    {"id": call.id},
                    {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
                ],
            },
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][0]["content"][0]["text"] == "Sunny in Paris."
        seen = provider.requests[-1].input
        assert [i["type"] for i in seen] == ["reasoning", "function_call", "function_call_output"]
        assert seen[0]["encrypted_content"] == "state-1" and seen[1]["call_id"] == call.call_id

        missing = h.post(
            gw.url("/v1/responses"),
            json={"model": "m", "input": [user("x"), {"type": "item_reference", "id": "msg_nope"}]},
        )
        assert missing.status_code == 404
        assert missing.json()["error"]["param"] == "input[1]"

        # A conversation collects each turn; the next turn sees the earlier ones.
        conversation = run(_create_conversation(gw.app.config.store_url or ""))
        for text in ("weather in Paris?", "thanks"):
            done = h.post(
                gw.url("/v1/responses"), json={"model": "m", "conversation": conversation, "input": text}
            )
            assert done.status_code == 200, done.text
            assert done.json()["conversation"] == {"id": conversation}
        seen = provider.requests[-1].input
        assert [i["type"] for i in seen] == ["message", "reasoning", "function_call", "message"]
        assert seen[-1]["content"][0]["text"] == "thanks"
        both = h.post(
            gw.url("/v1/responses"),
            json={"model": "m", "conversation": conversation, "previous_response_id": first.id, "input": "x"},
        )
        assert both.status_code == 400 and both.json()["error"]["param"] == "conversation"
        gone = h.post(gw.url("/v1/responses"), json={"model": "m", "conversation": "conv_nope", "input": "x"})
        assert gone.status_code == 404


async def _create_conversation(url: str) -> str:
    # Made through a second store on the same database (the Conversations endpoints have their own tests).
    store = await open_store(url)
    try:
        conversation = await store.conversations.create_conversation(SHARED_OWNER)
    finally:
        await store.close()
    return str(conversation["id"])


# ---------------------------------------------------------------------------------------- background
def _slow_chat_reply(upstream_text: list[str]) -> tuple[bytes, int]:
    """A chat stream and the byte count after its first frame (to stall there)."""
    body = _chat_chunks(
        {"role": "assistant", "content": upstream_text[0]},
        *({"content": t} for t in upstream_text[1:]),
        finish="stop",
    )
    return body, body.index(b"data:", 1)


class Follower(threading.Thread):
    """Reads an SSE stream in the background, keeping every event."""

    def __init__(self, url: str, *, method: str = "GET", body: JSON | None = None, key: str | None = None):
        super().__init__(daemon=True)
        self.url, self.method, self.body, self.key = url, method, body, key
        self.events: list[JSON] = []
        self.status = 0
        self.started_streaming = threading.Event()

    def run(self) -> None:
        decoder = EventStreamDecoder()
        with http(self.key) as h, h.stream(self.method, self.url, json=self.body) as response:
            self.status = response.status_code
            self.started_streaming.set()
            for chunk in response.iter_bytes():
                self.events.extend(decoder.feed(chunk))
        self.events.extend(decoder.flush())


def test_background_poll_cancel_aborts_upstream(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    body, stall = _slow_chat_reply(["Hel", "lo"])
    upstream.reset([stream_reply(body, stall_after=stall)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", upstream_model="up")
    provider.name = "chat"
    gw = stored([provider, ScriptedProvider([{"message": "done"}], name="m")])
    client = sdk(gw)

    queued = client.responses.create(model="chat", input="hi", background=True)
    assert queued.status in ("queued", "in_progress") and queued.background is True
    wait_for(lambda: client.responses.retrieve(queued.id).status == "in_progress" and bool(upstream.requests))
    follower = Follower(gw.url(f"/v1/responses/{queued.id}?stream=true"))
    follower.start()
    wait_for(lambda: any(e["type"] == "response.output_text.delta" for e in follower.events))

    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert upstream.wait_disconnect(5), "the upstream request was not aborted"
    follower.join(10)
    assert not follower.is_alive()
    events = follower.events
    check_stream(events)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "response_cancelled"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # Polling agrees, cancelling again is idempotent, the partial text is kept.
    again = client.responses.cancel(queued.id)
    assert again.status == "cancelled" and client.responses.retrieve(queued.id).status == "cancelled"
    assert "Hel" in str(again.output)

    # Only background responses can be cancelled, and a finished one cannot.
    plain = client.responses.create(model="m", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(plain.id)
    finished = client.responses.create(model="m", input="hi", background=True)
    wait_for(lambda: client.responses.retrieve(finished.id).status == "completed")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(finished.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hi", background=True, store=False)
    assert info.value.body["param"] == "background"  # type: ignore[index]


def test_background_stream_survives_disconnect_and_resumes(stored: Callable[..., Gateway]) -> None:
    words = [f"w{i} " for i in range(30)]
    provider = ScriptedProvider([{"message": words, "delay": 0.03}], name="m")
    gw = stored([provider])
    first: list[JSON] = []
    decoder = EventStreamDecoder()
    with (
        http() as h,
        h.stream(
            "POST",
            gw.url("/v1/responses"),
            json={"model": "m", "input": "go", "background": True, "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            first.extend(decoder.feed(chunk))
            if sum(e["type"] == "response.output_text.delta" for e in first) >= 5:
                break  # the client goes away mid-stream
    assert first[0]["type"] == "response.created" and first[0]["response"]["status"] == "queued"
    rid = first[0]["response"]["id"]
    last = first[-1]["sequence_number"]

    with http() as h:
        rest = decode_sse(
            h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true", "starting_after": last}).content
        )
        joined = first + rest
        check_stream(joined)
        assert [e["sequence_number"] for e in joined] == list(range(len(joined)))
        assert joined[-1]["type"] == "response.completed"
        assert joined[-1]["response"]["output"][0]["content"][0]["text"] == "".join(words)
        # The background work went on without its client; a replay from the start is the same stream.
        assert h.get(gw.url(f"/v1/responses/{rid}")).json()["status"] == "completed"
        replay = decode_sse(h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content)
        assert replay == joined
        bad = h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true", "starting_after": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


def test_foreground_stream_can_be_followed_while_it_runs(stored: Callable[..., Gateway]) -> None:
    words = [f"w{i} " for i in range(20)]
    gw = stored([ScriptedProvider([{"message": words, "delay": 0.03}], name="m")], keepalive="off")
    creator = Follower(
        gw.url("/v1/responses"), method="POST", body={"model": "m", "input": "go", "stream": True}
    )
    creator.start()
    wait_for(lambda: sum(e["type"] == "response.output_text.delta" for e in creator.events) >= 3)
    rid = creator.events[0]["response"]["id"]
    joined_at = creator.events[2]["sequence_number"]
    follower = Follower(gw.url(f"/v1/responses/{rid}?stream=true&starting_after={joined_at}"))
    follower.start()
    creator.join(10)
    follower.join(10)
    check_stream(creator.events)
    assert creator.events[: joined_at + 1] + follower.events == creator.events


def test_deleting_a_running_response_ends_its_stream(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    body, stall = _slow_chat_reply(["Hel", "lo"])
    upstream.reset([stream_reply(body, stall_after=stall)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", upstream_model="up")
    provider.name = "chat"
    gw = stored([provider])
    for background in (True, False):
        upstream.reset([stream_reply(body, stall_after=stall)])
        creator = Follower(
            gw.url("/v1/responses"),
            method="POST",
            body={"model": "chat", "input": "hi", "stream": True, "background": background},
        )
        creator.start()
        wait_for(lambda c=creator: any(e["type"] == "response.output_text.delta" for e in c.events))  # type: ignore[misc]
        rid = creator.events[0]["response"]["id"]
        with http() as h:
            assert h.delete(gw.url(f"/v1/responses/{rid}")).json()["deleted"] is True
            assert upstream.wait_disconnect(5), "the upstream request was not aborted"
            creator.join(10)
            assert not creator.is_alive()
            check_stream(creator.events)
            assert creator.events[-1]["type"] == "response.failed"
            assert creator.events[-1]["response"]["error"]["code"] == "response_deleted"
            assert h.get(gw.url(f"/v1/responses/{rid}")).status_code == 404


# ---------------------------------------------------------------------------------------- ownership
def test_another_key_sees_nothing(stored: Callable[..., Gateway], upstream: UpstreamMock) -> None:
    provider = ScriptedProvider(TOOL_SCRIPT, name="m")
    body, stall = _slow_chat_reply(["Hel", "lo"])
    upstream.reset([stream_reply(body, stall_after=stall)])
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", upstream_model="up")
    chat.name = "chat"
    gw = stored([provider, chat], api_keys=("key-a", "key-b"))
    a = sdk(gw, "key-a")
    done = a.responses.create(model="m", input="weather?", tools=[WEATHER_TOOL])
    running = a.responses.create(model="chat", input="hi", background=True)
    wait_for(lambda: a.responses.retrieve(running.id).status == "in_progress" and bool(upstream.requests))
    sealed = a.responses.retrieve(done.id, include=["reasoning.encrypted_content"]).output[0]

    with http("key-b") as hb, http("key-a") as ha, http() as anonymous:
        for rid in (done.id, running.id):
            for method, path in (
                ("GET", f"/v1/responses/{rid}"),
                ("GET", f"/v1/responses/{rid}?stream=true"),
                ("GET", f"/v1/responses/{rid}/input_items"),
                ("POST", f"/v1/responses/{rid}/cancel"),
                ("DELETE", f"/v1/responses/{rid}"),
            ):
                answer = hb.request(method, gw.url(path))
                assert answer.status_code == 404, (method, path, answer.text)
                assert rid in answer.json()["error"]["message"]
                assert anonymous.request(method, gw.url(path)).status_code == 401
        chained = hb.post(
            gw.url("/v1/responses"), json={"model": "m", "input": "x", "previous_response_id": done.id}
        )
        assert chained.status_code == 404 and chained.json()["error"]["code"] == "previous_response_not_found"
        referenced = hb.post(
            gw.url("/v1/responses"),
            json={"model": "m", "input": [{"type": "item_reference", "id": done.output[1].id}]},
        )
        assert referenced.status_code == 404
        # Sealed reasoning state opens only for the key it was sealed for.
        replayed = hb.post(
            gw.url("/v1/responses"),
            json={"model": "m", "store": False, "input": [user("x"), sealed.model_dump(exclude_none=True)]},
        )
        assert (
            replayed.status_code == 400 and replayed.json()["error"]["param"] == "input[1].encrypted_content"
        )
        # The owner still has everything.
        assert ha.get(gw.url(f"/v1/responses/{done.id}")).status_code == 200
        assert ha.post(gw.url(f"/v1/responses/{running.id}/cancel")).json()["status"] == "cancelled"
        ok = ha.post(
            gw.url("/v1/responses"),
            json={"model": "m", "store": False, "input": [user("x"), sealed.model_dump(exclude_none=True)]},
        )
        assert ok.status_code == 200, ok.text
        assert provider.requests[-1].input[1]["encrypted_content"] == "state-1"


# ---------------------------------------------------------------------------------------- sealing
def _anthropic_thinking_reply() -> bytes:
    events = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_up",
                "type": "message",
                "role": "assistant",
                "model": "claude-up",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Think hard."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "SIG-42"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
        {"type": "message_stop"},
    ]
    return encode_chunks(events, "anthropic")


def test_sealed_reasoning_round_trip_with_store_false(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    upstream.reset([stream_reply(_anthropic_thinking_reply())])
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-up")
    provider.name = "claude"
    gw = stored([provider])
    client = sdk(gw)
    request: Any = {"model": "claude", "store": False, "include": ["reasoning.encrypted_content"]}
    first = client.responses.create(input="hello", **request)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content is not None
    state = reasoning.encrypted_content
    assert state.startswith("rgs1.") and "SIG-42" not in state and "Think hard" not in state
    # Streamed: every place the item appears is sealed.
    with http() as h:
        events = decode_sse(
            h.post(gw.url("/v1/responses"), json={**request, "input": "x", "stream": True}).content
        )
    check_stream(events)
    shown = [
        item.get("encrypted_content")
        for e in events
        for item in ([e["item"]] if "item" in e else e.get("response", {}).get("output", []))
        if item.get("type") == "reasoning" and item.get("encrypted_content")
    ]
    assert shown and all(s.startswith("rgs1.") for s in shown)

    history = [
        user("hello"),
        reasoning.model_dump(exclude_none=True),
        *(o.model_dump(exclude_none=True) for o in first.output[1:]),
    ]
    second = client.responses.create(input=[*history, user("again")], **request)
    assert second.status == "completed"
    messages = upstream.requests[-1].json["messages"]
    assert messages[1]["role"] == "assistant"
    assert messages[1]["content"][0] == {"type": "thinking", "thinking": "Think hard.", "signature": "SIG-42"}

    calls = len(upstream.requests)
    tampered = dict(history[1])
    middle = len(state) // 2
    tampered["encrypted_content"] = (
        state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1 :]
    )
    with http() as h:
        for bad in (tampered["encrypted_content"], state[:-6], "rgs1.AAAA"):
            answer = h.post(
                gw.url("/v1/responses"),
                json={
                    **request,
                    "input": [history[0], {**tampered, "encrypted_content": bad}, user("again")],
                },
            )
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert (error["param"], error["code"]) == (
                "input[1].encrypted_content",
                "invalid_encrypted_content",
            )
    assert len(upstream.requests) == calls


# ---------------------------------------------------------------------------------------- endings
async def _response_column(url: str, column: str) -> list[Any]:
    """One column of every stored response (``COUNT(*)`` counts them)."""
    store = await open_store(url)
    try:
        async with store.db.transaction() as tx:
            rows = await tx.fetch(f"SELECT {column} FROM rg_responses")
    finally:
        await store.close()
    return [row[0] for row in rows]


async def _count_responses(url: str) -> int:
    return int((await _response_column(url, "COUNT(*)"))[0])


def test_refused_before_the_first_event_stores_nothing(stored: Callable[..., Gateway]) -> None:
    refusal = {"error": {"status": 429, "message": "slow down", "code": "rate_limit_exceeded"}}
    gw = stored([ScriptedProvider([refusal], name="m")])
    url = gw.app.config.store_url or ""
    before = run(_count_responses(url))
    with http() as h:
        for stream in (False, True):
            answer = h.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": stream})
            assert answer.status_code == 429 and answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert run(_count_responses(url)) == before


def test_a_foreground_client_that_leaves_cancels_the_stored_response(stored: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider([{"message": [f"w{i} " for i in range(50)], "delay": 0.05}], name="m")
    gw = stored([provider])
    seen: list[JSON] = []
    decoder = EventStreamDecoder()
    with (
        http() as h,
        h.stream(
            "POST", gw.url("/v1/responses"), json={"model": "m", "input": "go", "stream": True}
        ) as response,
    ):
        for chunk in response.iter_bytes():
            seen.extend(decoder.feed(chunk))
            if sum(e["type"] == "response.output_text.delta" for e in seen) >= 3:
                break
    rid = seen[0]["response"]["id"]
    with http() as h:
        wait_for(lambda: h.get(gw.url(f"/v1/responses/{rid}")).json()["status"] == "cancelled")
        events = decode_sse(h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content)
    check_stream(events)
    assert events[: len(seen)] == seen
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "response_cancelled"


def test_a_client_that_leaves_before_the_first_token_ends_the_run_cleanly(
    stored: Callable[..., Gateway], upstream: UpstreamMock, caplog: pytest.LogCaptureFixture
) -> None:
    """The client leaves while the upstream has answered its head but no token yet (nothing has been
    sent to the client): the upstream request is closed, the stored response is not left running, and
    nothing is logged as an error."""
    upstream.reset([stream_reply(b"", stall_after=0)])  # the head, then nothing until the client goes
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-up", upstream_model="up")
    provider.name = "chat"
    gw = stored([provider])
    url = gw.app.config.store_url or ""
    before, asked = upstream.disconnects, len(upstream.requests)
    body = orjson.dumps({"model": "chat", "input": "go", "stream": True})
    head = (
        "POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gw.port)) as client:
        client.sendall(head.encode() + body)
        wait_for(lambda: len(upstream.requests) > asked)
    wait_for(lambda: upstream.disconnects > before)  # the upstream request was closed
    wait_for(lambda: "in_progress" not in asyncio.run(_response_column(url, "status")))
    # The request's task has ended, so whatever escaped it is logged within this test (conftest's guard
    # fails the test on it: compiled by mypyc, drive once raised the client's CancelledError here).
    wait_for(lambda: not gw.server.server_state.tasks)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records
    ]


def test_shutdown_fails_running_background_responses(store_url: str, tmp_path: Path) -> None:
    config: Any = {"store_url": store_url, "data_dir": str(tmp_path / "data")}
    slow = ScriptedProvider([{"message": [f"w{i} " for i in range(100)], "delay": 0.05}], name="m")
    gw = start_gateway([slow], **config)
    try:
        client = sdk(gw)
        running = client.responses.create(model="m", input="go", background=True)
        wait_for(lambda: client.responses.retrieve(running.id).status == "in_progress")
    finally:
        gw.stop()
    again = start_gateway([ScriptedProvider([{"message": "ok"}], name="m")], **config)
    try:
        after = sdk(again).responses.retrieve(running.id)
        assert after.status == "failed" and after.error is not None and after.error.code == "server_error"
        # Ended by the shutdown itself (crash recovery would say the instance stopped).
        assert "shut down" in after.error.message
        with http() as h:
            events = decode_sse(
                h.get(again.url(f"/v1/responses/{running.id}"), params={"stream": "true"}).content
            )
        check_stream(events)
        assert events[-1]["type"] == "response.failed"
    finally:
        again.stop()


def test_sdk_resume_and_sealed_input_items(stored: Callable[..., Gateway]) -> None:
    gw = stored([ScriptedProvider(TOOL_SCRIPT, name="m")])
    client = sdk(gw)
    first = client.responses.create(model="m", input="weather?", tools=[WEATHER_TOOL])
    # The SDK's own resume call: retrieve(stream=True, starting_after=N).
    with client.responses.retrieve(first.id, stream=True, starting_after=2) as stream:
        events = [event.model_dump() for event in stream]
    assert events[0]["sequence_number"] == 3 and events[-1]["type"] == "response.completed"
    # Reasoning items given as input are listed sealed when asked for, and without state otherwise.
    second = client.responses.create(
        model="m",
        input=[first.output[0].model_dump(exclude_none=True), {"role": "user", "content": "thanks"}],  # type: ignore[list-item]
    )
    listed = client.responses.input_items.list(
        second.id, order="asc", include=["reasoning.encrypted_content"]
    )
    state = listed.data[0].encrypted_content  # type: ignore[union-attr]
    assert state is not None and state.startswith("rgs1.")
    assert client.responses.input_items.list(second.id, order="asc").data[0].encrypted_content is None  # type: ignore[union-attr]


def test_serve_options_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from responses_gateway.server.run import add_serve_arguments, store_settings

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    for name in ("RG_STORE_URL", "RG_REDIS_URL", "RG_DATA_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    home_default = tmp_path / ".local" / "share" / "responses-gateway"
    assert store_settings(parser.parse_args([])) == (
        f"sqlite://{home_default / 'gateway.db'}",
        None,
        str(home_default),
    )
    data = tmp_path / "d"
    assert (
        store_settings(parser.parse_args(["--data-dir", str(data)]))[0] == f"sqlite://{data / 'gateway.db'}"
    )
    monkeypatch.setenv("RG_DATA_DIR", str(data))
    monkeypatch.setenv("RG_STORE_URL", "postgresql://u@db/x")
    monkeypatch.setenv("RG_REDIS_URL", "redis://r:6379/0")
    assert store_settings(parser.parse_args([])) == ("postgresql://u@db/x", "redis://r:6379/0", str(data))
    # Options win over the environment; "none" runs without a store.
    assert store_settings(parser.parse_args(["--store", "sqlite:///x.db"]))[0] == "sqlite:///x.db"
    monkeypatch.delenv("RG_REDIS_URL")
    assert store_settings(parser.parse_args(["--store", "none"]))[0] is None
    with pytest.raises(ValueError, match="needs a store"):
        store_settings(parser.parse_args(["--store", "none", "--redis", "redis://r"]))
    with pytest.raises(ValueError, match="must start with"):
        store_settings(parser.parse_args(["--store", "mysql://x"]))


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("mode", ["in_progress", "ping"])
def test_keepalives_are_stored_with_the_stream(
    stored: Callable[..., Gateway], mode: str, background: bool
) -> None:
    script = [{"message": ["a"]}, {"sleep": 0.4}, {"message": ["b"]}]
    gw = stored([ScriptedProvider(script, name="m")], keepalive=mode, keepalive_interval=0.05)
    body = {"model": "m", "input": "x", "stream": True, "background": background}
    with http() as h:
        events = decode_sse(h.post(gw.url("/v1/responses"), json=body).content)
        keepalive = "response.in_progress" if mode == "in_progress" else "ping"
        assert sum(e["type"] == keepalive for e in events) >= 3
        check_stream(events, strict=mode == "in_progress")
        rid = events[0]["response"]["id"]
        replay = decode_sse(h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content)
    assert replay == events


def _anthropic_events(*blocks: tuple[JSON, list[JSON]], stop: str) -> bytes:
    events: list[JSON] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_up",
                "type": "message",
                "role": "assistant",
                "model": "claude-up",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        }
    ]
    for index, (start, deltas) in enumerate(blocks):
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 7}})
    events.append({"type": "message_stop"})
    return encode_chunks(events, "anthropic")


def test_previous_response_id_sends_thinking_and_tool_turns_back_to_anthropic(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    thinking = (
        {"type": "thinking", "thinking": "", "signature": ""},
        [
            {"type": "thinking_delta", "thinking": "Use the tool."},
            {"type": "signature_delta", "signature": "SIG-7"},
        ],
    )
    tool_use = (
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
        [{"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}],
    )
    text = ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Sunny."}])
    upstream.reset(
        [
            stream_reply(_anthropic_events(thinking, tool_use, stop="tool_use")),
            stream_reply(_anthropic_events(text, stop="end_turn")),
        ]
    )
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-up")
    provider.name = "claude"
    client = sdk(stored([provider]))
    first = client.responses.create(model="claude", input="weather in Paris?", tools=[WEATHER_TOOL])
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    second = client.responses.create(
        model="claude",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "toolu_1", "output": "sunny"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "Sunny."
    messages = upstream.requests[-1].json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Use the tool.",
        "signature": "SIG-7",
    }
    assert messages[1]["content"][1]["type"] == "tool_use" and messages[1]["content"][1]["id"] == "toolu_1"
    assert messages[1]["content"][1]["input"] == {"city": "Paris"}
    assert (
        messages[2]["content"][0]["type"] == "tool_result"
        and messages[2]["content"][0]["tool_use_id"] == "toolu_1"
    )


def test_deleting_a_running_non_streamed_response(
    stored: Callable[..., Gateway], upstream: UpstreamMock
) -> None:
    body, stall = _slow_chat_reply(["Hel", "lo"])
    upstream.reset([stream_reply(body, stall_after=stall)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", upstream_model="up")
    provider.name = "chat"
    gw = stored([provider])
    answers: list[httpx.Response] = []
    creator = threading.Thread(
        target=lambda: answers.append(
            http().post(gw.url("/v1/responses"), json={"model": "chat", "input": "hi"})
        ),
        daemon=True,
    )
    creator.start()
    wait_for(lambda: bool(upstream.requests))
    url = gw.app.config.store_url or ""
    assert gw.app.store is not None
    instance = gw.app.store.instance_id

    async def running_id() -> str:
        store = await open_store(url)
        try:
            async with store.db.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT id FROM rg_responses WHERE status = 'in_progress' AND instance_id = ?", instance
                )
        finally:
            await store.close()
        assert len(rows) == 1
        return str(rows[0][0])

    rid = run(running_id())
    with http() as h:
        assert h.delete(gw.url(f"/v1/responses/{rid}")).status_code == 200
    assert upstream.wait_disconnect(5)
    creator.join(10)
    assert answers and answers[0].status_code == 409
    assert answers[0].json()["error"]["code"] == "response_deleted"


def test_resume_on_another_instance_through_redis(tmp_path: Path) -> None:
    url, redis_url = _pg_database(), require("redis")
    config: Any = {"store_url": url, "redis_url": redis_url, "data_dir": str(tmp_path / "data")}
    words = [f"w{i} " for i in range(40)]
    a = start_gateway([ScriptedProvider([{"message": words, "delay": 0.03}], name="m")], **config)
    b = start_gateway([ScriptedProvider([{"message": "unused"}], name="m")], **config)
    try:
        creator = Follower(
            a.url("/v1/responses"),
            method="POST",
            body={"model": "m", "input": "go", "stream": True, "background": True},
        )
        creator.start()
        wait_for(lambda: sum(e["type"] == "response.output_text.delta" for e in creator.events) >= 5)
        first = list(creator.events)
        rid, last = first[0]["response"]["id"], first[-1]["sequence_number"]
        with http() as h:
            rest = decode_sse(
                h.get(
                    b.url(f"/v1/responses/{rid}"), params={"stream": "true", "starting_after": last}
                ).content
            )
        joined = first + rest
        check_stream(joined)
        assert [e["sequence_number"] for e in joined] == list(range(len(joined)))
        assert joined[-1]["response"]["output"][0]["content"][0]["text"] == "".join(words)
        creator.join(10)
        assert creator.events == joined
    finally:
        a.stop()
        b.stop()


def test_a_failure_mid_stream_is_stored_as_failed(stored: Callable[..., Gateway]) -> None:
    script = [
        {"message": ["par", "tial"]},
        {"error": {"status": 503, "message": "upstream broke", "code": "server_is_overloaded"}},
    ]
    gw = stored([ScriptedProvider(script, name="m")])
    with http() as h:
        events = decode_sse(
            h.post(gw.url("/v1/responses"), json={"model": "m", "input": "x", "stream": True}).content
        )
        check_stream(events)
        assert events[-1]["type"] == "response.failed"
        rid = events[0]["response"]["id"]
        stored_response = h.get(gw.url(f"/v1/responses/{rid}")).json()
        assert stored_response["status"] == "failed"
        assert stored_response["error"] == events[-1]["response"]["error"]
        assert stored_response["output"] == events[-1]["response"]["output"]
        assert decode_sse(h.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content) == events
        # Not streamed: the HTTP error, and the same failed response kept.
        answer = h.post(gw.url("/v1/responses"), json={"model": "m", "input": "x"})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_is_overloaded"
    assert gw.app.store is not None
    assert run(_statuses(gw.app.config.store_url or "", gw.app.store.instance_id)) == ["failed", "failed"]


async def _statuses(url: str, instance: str) -> list[str]:
    store = await open_store(url)
    try:
        async with store.db.transaction() as tx:
            rows = await tx.fetch("SELECT status FROM rg_responses WHERE instance_id = ?", instance)
    finally:
        await store.close()
    return [str(status) for (status,) in rows]


def test_the_end_of_a_response_survives_a_database_hiccup(tmp_path: Path) -> None:
    from responses_gateway.protocol.builder import StreamBuilder
    from responses_gateway.protocol.response import new_response

    async def scenario() -> str:
        store = await open_store(f"sqlite://{tmp_path}/gw.db")
        try:
            builder = StreamBuilder(new_response("m"))
            builder.start()
            await store.responses.create_response(
                "o", builder.snapshot(), request={}, input_items=[user("x")]
            )
            recorder = store.recorder(builder.response["id"])
            recorder.add_nowait(builder.take())
            real = store.events.write_events
            failures = [1]

            async def flaky(
                response_id: str, events: list[JSON], final: JSON | None, times: Any = None
            ) -> bool:
                if failures and any(e["type"] == "response.completed" for e in events):
                    failures.pop()
                    raise OSError("database went away for a moment")
                return await real(response_id, events, final, times)

            store.events.write_events = flaky  # type: ignore[method-assign]
            builder.message("hi")
            builder.complete()
            await recorder.add(builder.take())
            assert not failures
            got = await store.responses.get_response("o", builder.response["id"])
            return str(got["status"])
        finally:
            await store.close()

    assert run(scenario()) == "completed"


def test_without_a_store_responses_do_not_claim_to_be_stored() -> None:
    """``--store none``: the response says ``store: false`` (nothing was kept), in the stream and in the
    body, and it cannot be read back."""
    gw = start_gateway([ScriptedProvider([{"message": "ok"}], name="m")])
    try:
        client = sdk(gw)
        body = client.responses.create(model="m", input="hi")
        assert body.store is False
        with client.responses.stream(model="m", input="hi") as stream:
            events = [e.model_dump(warnings=False) for e in stream]
        assert all(e["response"]["store"] is False for e in events if "response" in e)
        with http() as h:
            assert h.get(gw.url(f"/v1/responses/{body.id}")).status_code == 404
    finally:
        gw.stop()


def test_sealed_state_is_the_same_everywhere_in_one_stream(stored: Callable[..., Gateway]) -> None:
    """Sealing is randomized, but within one stream an item's state is sealed once: ``output_item.done``
    and the final response show the same ``encrypted_content`` (a client diffing them sees no change)."""
    gw = stored([ScriptedProvider(TOOL_SCRIPT, name="m")])
    client = sdk(gw)
    for store in (True, False):
        with client.responses.stream(
            model="m",
            input="weather?",
            tools=[WEATHER_TOOL],
            store=store,
            include=["reasoning.encrypted_content"],
        ) as stream:
            events = [e.model_dump(warnings=False) for e in stream]
        done = [
            e["item"]["encrypted_content"]
            for e in events
            if e["type"] == "response.output_item.done" and e["item"]["type"] == "reasoning"
        ]
        final = events[-1]["response"]["output"][0]["encrypted_content"]
        assert done == [final] and final.startswith("rgs1.") and "state-1" not in final
