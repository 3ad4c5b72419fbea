"""Regression tests named after the pitfalls in provider-mapping.md §5 that concern Chat Completions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider, decode_reasoning_state
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, stream_reply


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def stream(
    upstream: UpstreamMock, chunks: list[dict[str, Any]], body: dict[str, Any] | None = None
) -> list[Any]:
    upstream.reset([stream_reply(encode_chunks(chunks, "openai-chat"), split=True, seed=7, delay=0)])
    events = asyncio.run(
        drive(OpenAIChatProvider(base_url=upstream.url), body or {"model": "m", "input": "hi"})
    )
    assert check(events) == []
    return events


def delta(d: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}], **extra}


def test_pitfall_01_openrouter_signatures_are_kept(upstream: UpstreamMock) -> None:
    upstream.reset(
        [fixture_reply("openai-chat__openrouter-streaming-reasoning-details__pydantic-pydantic-ai.sse")]
    )
    events = asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "2+2"}))
    reasoning = events[-1]["response"]["output"][0]
    state = decode_reasoning_state(reasoning["encrypted_content"])
    assert state is not None and state["field"] == "reasoning_details"
    assert [d["signature"][:10] for d in state["details"]] == ["Et0BCkgICh"]


def test_pitfall_03_parallel_call_results_follow_one_assistant_message(upstream: UpstreamMock) -> None:
    upstream.reset([stream_reply(encode_chunks([delta({"content": "ok"}, "stop")], "openai-chat"))])
    items = [
        {"role": "user", "content": "a and b"},
        {"type": "function_call", "call_id": "1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "1", "output": "A"},
        {"type": "function_call_output", "call_id": "2", "output": "B"},
    ]
    asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": items}))
    messages = upstream.requests[-1].json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["1", "2"]


def test_pitfall_10_usage_is_overwritten_not_added(upstream: UpstreamMock) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    events = stream(
        upstream,
        [
            delta({"content": "a"}, usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}),
            delta({}, "stop", usage=usage),
        ],
    )
    final = events[-1]["response"]["usage"]
    assert (final["input_tokens"], final["output_tokens"], final["total_tokens"]) == (10, 3, 13)


def test_usage_details_that_are_not_objects_are_ignored(upstream: UpstreamMock) -> None:
    # A server sending a number where the token details object goes: the counts it does send are kept,
    # and the stream completes (it used to end in an AttributeError at the stream's end).
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    events = stream(
        upstream,
        [
            delta({"content": "a"}),
            delta({}, "stop", usage={**usage, "completion_tokens_details": 5, "prompt_tokens_details": "x"}),
        ],
    )
    assert events[-1]["type"] == "response.completed"
    final = events[-1]["response"]["usage"]
    assert (final["input_tokens"], final["output_tokens"]) == (4, 2)


def test_pitfall_13_one_output_index_per_item_and_stable_reasoning_id(upstream: UpstreamMock) -> None:
    events = stream(
        upstream,
        [delta({"reasoning_content": r}) for r in ("a", "b", "c")]
        + [
            delta({"content": "x"}),
            delta({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}),
        ]
        + [delta({}, "tool_calls")],
    )
    added = [
        (e["output_index"], e["item"]["type"]) for e in events if e["type"] == "response.output_item.added"
    ]
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    ids = {e["item_id"] for e in events if e["type"] == "response.reasoning_summary_text.delta"}
    assert len(ids) == 1


def test_pitfall_17_text_is_kept_next_to_tool_calls(upstream: UpstreamMock) -> None:
    events = stream(
        upstream,
        [
            delta({"content": "Let me check."}),
            delta({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
            delta({}, "tool_calls", usage={"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}),
        ],
    )
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"]
    assert output[0]["content"][0]["text"] == "Let me check."
    assert events[-1]["response"]["usage"]["output_tokens"] == 4


def test_pitfall_18_error_after_http_200_fails_the_response(upstream: UpstreamMock) -> None:
    error = {"error": {"message": "Overloaded", "type": "server_error", "code": "server_is_overloaded"}}
    events = stream(upstream, [delta({"content": "partial"}), error])
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "server_is_overloaded"


async def first_yield_then_close(provider: Any, body: dict[str, Any]) -> list[Any]:
    """Run a provider until its first yield, then close it as the server does when the client leaves."""
    request = parse_request(body)
    builder = StreamBuilder(new_response(request.model, **request.echo()))
    builder.start()
    stream = provider.stream(request, builder)
    await stream.__anext__()
    await stream.aclose()
    await provider.aclose()
    return builder.take()


@pytest.mark.parametrize("kind", ["openai-chat", "gemini", "openai-responses"])
def test_client_gone_aborts_the_upstream(upstream: UpstreamMock, kind: str) -> None:
    """Closing the provider's generator drops the upstream connection (it stops generating and billing)."""
    first: dict[str, Any]
    if kind == "openai-chat":
        first, provider = delta({"content": "Hel"}), OpenAIChatProvider(base_url=upstream.url)
    elif kind == "gemini":
        first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]}
        provider = GeminiProvider(base_url=upstream.url)
    else:
        item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
        first = {"type": "response.output_item.added", "output_index": 0, "item": item}
        provider = OpenAIResponsesProvider(base_url=upstream.url)
    wire = encode_chunks([first], kind)
    upstream.reset([stream_reply(wire, stall_after=len(wire.removesuffix(b"data: [DONE]\n\n")))])
    events = asyncio.run(first_yield_then_close(provider, {"model": "m", "input": "hi"}))
    assert any(e["type"] == "response.output_item.added" for e in events)
    assert upstream.wait_disconnect(5)
