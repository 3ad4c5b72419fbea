"""The SSE relay: framing and batching, keepalive modes, client disconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from conftest import Gateway, decode_sse, stream_events
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import encode_event
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.server.app import GatewayApp
from responses_gateway.server.registry import ModelRegistry

BODY = {"model": "m", "input": "hi", "stream": True}


async def _call_app(app: GatewayApp, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Drive the ASGI app directly and return every message it sends."""
    sent: list[dict[str, Any]] = []
    requested = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/responses", "headers": []}
    await app(scope, receive, send)
    return sent


def test_one_body_message_per_provider_yield_with_exact_frames() -> None:
    registry = ModelRegistry()
    registry.add(ScriptedProvider([{"message": ["a", "b"]}], name="m"))
    sent = asyncio.run(_call_app(GatewayApp(registry), BODY))
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert (b"cache-control", b"no-cache") in start["headers"]
    assert all(m["more_body"] for m in bodies[:-1]) and not bodies[-1]["more_body"]
    per_message = [[e["type"] for e in decode_sse(m["body"])] for m in bodies]
    # First yield: created + in_progress + the item, its part and the first delta, in one send.
    assert per_message == [
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
        ],
        ["response.output_text.delta"],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done"],
        ["response.completed"],
    ]
    # Every frame is exactly what protocol.sse.encode_event writes.
    events = [e for m in bodies for e in decode_sse(m["body"])]
    assert not check(events, profile="strict-spec")
    assert b"".join(m["body"] for m in bodies) == b"".join(encode_event(e) for e in events)


SLOW = [{"message": ["a"]}, {"sleep": 0.45}, {"message": ["b"]}]


def test_keepalive_in_progress(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    gw = gateway([ScriptedProvider(SLOW, name="m")], keepalive_interval=0.1)
    events = stream_events(gw.url("/v1/responses"), BODY)
    assert_valid_stream(events)
    types = [e["type"] for e in events]
    repeats = [i for i, t in enumerate(types) if t == "response.in_progress" and i > 1]
    assert 2 <= len(repeats) <= 5
    # The keepalives fall in the silence between the two messages and carry the live snapshot.
    first_done = types.index("response.output_item.done")
    assert all(first_done < i < types.index("response.output_item.added", first_done) for i in repeats)
    assert events[repeats[0]]["response"]["output"][0]["content"][0]["text"] == "a"


def test_keepalive_ping(gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]) -> None:
    gw = gateway([ScriptedProvider(SLOW, name="m")], keepalive="ping", keepalive_interval=0.1)
    events = stream_events(gw.url("/v1/responses"), BODY)
    assert_valid_stream(events, strict=False)
    assert [e["type"] for e in events].count("ping") >= 2
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_keepalive_comment_and_off(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    comment = gateway([ScriptedProvider(SLOW, name="m")], keepalive="comment", keepalive_interval=0.1)
    raw = httpx.post(comment.url("/v1/responses"), json=BODY, timeout=10).content
    assert raw.count(b": keepalive\n\n") >= 2
    assert_valid_stream(decode_sse(raw))
    plain = [e["type"] for e in decode_sse(raw)]
    off = gateway([ScriptedProvider(SLOW, name="m")], keepalive="off", keepalive_interval=0.1)
    raw_off = httpx.post(off.url("/v1/responses"), json=BODY, timeout=10).content
    assert b": keepalive" not in raw_off
    assert [e["type"] for e in decode_sse(raw_off)] == plain
    assert plain.count("response.in_progress") == 1


def test_no_keepalive_when_events_flow(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    steps = [{"message": ["x"]}] + [{"sleep": 0.03}, {"message": ["y"]}] * 8
    gw = gateway([ScriptedProvider(steps, name="m")], keepalive_interval=0.1)
    events = stream_events(gw.url("/v1/responses"), BODY)
    assert_valid_stream(events)
    assert [e["type"] for e in events].count("response.in_progress") == 1


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_client_disconnect_stops_the_provider(gateway: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider([{"message": ["first"]}, {"sleep": 60}, {"message": ["never"]}], name="m")
    gw = gateway([provider, ScriptedProvider([{"message": "still here"}], name="ok")])
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", gw.url("/v1/responses"), json=BODY) as response,
    ):
        for line in response.iter_lines():
            if "response.output_text.delta" in line:
                break
    assert _wait_for(lambda: provider.cancelled == 1)
    # The server keeps serving.
    after = httpx.post(gw.url("/v1/responses"), json={"model": "ok", "input": "hi"}, timeout=10)
    assert after.json()["output"][0]["content"][0]["text"] == "still here"


def test_client_disconnect_stops_a_non_streaming_request(gateway: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider([{"sleep": 60}, {"message": "late"}], name="m")
    gw = gateway([provider])
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi"}, timeout=0.3)
    assert _wait_for(lambda: provider.cancelled == 1)


def test_provider_returning_unfinished_fails_the_stream(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    class Lazy(ScriptedProvider):
        async def stream(self, request: Any, builder: Any) -> Any:
            item = builder.open_message()
            builder.text_delta(item, "half")
            yield

    gw = gateway([Lazy([], name="m")])
    events = stream_events(gw.url("/v1/responses"), BODY)
    assert_valid_stream(events)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    response = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "server_error"


def test_concurrent_streams_do_not_mix(gateway: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider(
        {
            "turns": [
                {"when": {"text_contains": f"n{i}"}, "steps": [{"message": [f"r{i}-", "a"]}, {"sleep": 0.05}]}
                for i in range(6)
            ]
        },
        name="m",
    )
    gw = gateway([provider])

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, list[dict[str, Any]]]:
        response = await client.post(gw.url("/v1/responses"), json={**BODY, "input": f"n{i}"})
        return i, decode_sse(response.content)

    async def main() -> list[tuple[int, list[dict[str, Any]]]]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await asyncio.gather(*(one(client, i) for i in range(6)))

    results = asyncio.run(main())
    ids = set()
    for i, events in results:
        assert not check(events)
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == f"r{i}-a"
        ids.add(events[-1]["response"]["id"])
    assert len(ids) == 6


@pytest.mark.parametrize("spelling", ["reasoning_text", "reasoning"])
def test_raw_reasoning_event_names_follow_the_server_option(
    gateway: Callable[..., Gateway], spelling: str
) -> None:
    """``--raw-reasoning-events``: OpenAI's ``response.reasoning_text.*`` (default) or the Open Responses
    spec's ``response.reasoning.*``; the strict spec profile of the checker accepts only the latter."""
    script = [{"reasoning": {"text": ["Let me ", "think."]}}, {"message": "ok"}]
    gw = gateway([ScriptedProvider(script, name="m")], raw_reasoning=spelling)
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    types = {e["type"] for e in events}
    assert f"response.{spelling}.delta" in types and f"response.{spelling}.done" in types
    other = "reasoning" if spelling == "reasoning_text" else "reasoning_text"
    assert f"response.{other}.delta" not in types
    assert check(events) == []
    assert (check(events, profile="strict-spec") == []) == (spelling == "reasoning")
    done = next(e for e in events if e["type"] == f"response.{spelling}.done")
    assert done["text"] == "Let me think."
