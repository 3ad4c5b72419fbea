"""Regression tests for the Anthropic-related pitfalls of provider-mapping.md §5, one named test each.

(Pitfall 1, signatures dropped, is the two-turn loop in test_anthropic_request.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.anthropic import AnthropicProvider
from test_anthropic_errors import OVERLOADED, start, text_block
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, stream_reply


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def replay(upstream: UpstreamMock, reply: Any, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    upstream.reset([reply])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k")
    return asyncio.run(drive(provider, body or {"model": "claude", "input": "hi"}))


def request_body(request: dict[str, Any]) -> dict[str, Any]:
    return AnthropicProvider(api_key="k").build_body(parse_request({"model": "claude", **request}))


def test_pitfall_02_thinking_is_reasoning_not_output_text(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__thinking-delta-signature-delta-then-text-sonnet-4.5__vercel-ai.chunks.jsonl"
    events = replay(upstream, fixture_reply(name, split=True))
    kinds = [e["type"] for e in events]
    first_message = kinds.index("response.output_text.delta")
    # 55 thinking_delta events upstream, one of them empty (skipped).
    assert kinds.count("response.reasoning_summary_text.delta") == 54
    assert all(
        k != "response.output_text.delta"
        for k in kinds[: kinds.index("response.reasoning_summary_text.done")]
    )
    assert all(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert first_message > kinds.index("response.reasoning_summary_part.done")
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning["type"] == "reasoning" and message["type"] == "message"


def test_pitfall_03_parallel_calls_share_one_assistant_message() -> None:
    body = request_body(
        {
            "input": [
                {"role": "user", "content": "both"},
                {"type": "function_call", "call_id": "toolu_a", "name": "f", "arguments": '{"x":1}'},
                {"type": "function_call", "call_id": "toolu_b", "name": "f", "arguments": '{"x":2}'},
                {"type": "function_call_output", "call_id": "toolu_a", "output": "1"},
                {"type": "function_call_output", "call_id": "toolu_b", "output": "2"},
            ]
        }
    )
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert [b["id"] for b in body["messages"][1]["content"]] == ["toolu_a", "toolu_b"]
    assert [b["tool_use_id"] for b in body["messages"][2]["content"]] == ["toolu_a", "toolu_b"]


def test_pitfall_07_tool_without_arguments_gets_empty_object(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__tool-use-no-args-sonnet-4.5__vercel-ai.chunks.jsonl"
    events = replay(upstream, fixture_reply(name))
    call = events[-1]["response"]["output"][-1]
    assert call["type"] == "function_call" and call["arguments"] == "{}"
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == "{}"
    assert not [e for e in events if e["type"] == "response.function_call_arguments.delta" and not e["delta"]]
    # And the other way: a call with no arguments goes upstream as an empty object.
    body = request_body(
        {"input": [{"type": "function_call", "call_id": "c", "name": "now", "arguments": ""}]}
    )
    assert body["messages"][0]["content"][0]["input"] == {}


def test_pitfall_08_empty_text_blocks_are_dropped() -> None:
    body = request_body(
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": ""}, {"type": "input_text", "text": "q"}],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ""}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": ""},
            ]
        }
    )
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c"}]},
    ]


def _usage_stream(message_start_usage: dict[str, Any], delta_usage: dict[str, Any]) -> bytes:
    first = start()
    first["message"]["usage"] = message_start_usage
    events = [
        first,
        *text_block(0, "ok"),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": delta_usage,
        },
        {"type": "message_stop"},
    ]
    return encode_chunks(events, "anthropic")


def test_pitfall_09_cache_tokens_count_as_input(upstream: UpstreamMock) -> None:
    usage = {
        "input_tokens": 5,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2000,
        "output_tokens": 1,
    }
    events = replay(upstream, stream_reply(_usage_stream(usage, {"output_tokens": 12})))
    assert events[-1]["response"]["usage"] == {
        "input_tokens": 2105,
        "input_tokens_details": {"cache_write_tokens": 100, "cached_tokens": 2000},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2117,
    }


def test_pitfall_10_cumulative_usage_is_not_double_counted(upstream: UpstreamMock) -> None:
    usage = {
        "input_tokens": 40,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 3,
    }
    delta = {"input_tokens": 40, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
             "output_tokens": 90, "output_tokens_details": {"thinking_tokens": 30}}  # fmt: skip
    events = replay(upstream, stream_reply(_usage_stream(usage, delta)))
    got = events[-1]["response"]["usage"]
    assert (got["input_tokens"], got["output_tokens"], got["total_tokens"]) == (40, 90, 130)
    assert got["output_tokens_details"] == {"reasoning_tokens": 30}


def test_pitfall_12_truncation_is_incomplete_with_a_reason(upstream: UpstreamMock) -> None:
    events = replay(
        upstream, fixture_reply("anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse")
    )
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_pitfall_13_item_lifecycle_is_whole(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse"
    events = replay(upstream, fixture_reply(name, split=True, max_piece=5))
    assert check(events, profile="codex") == []
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [0, 1] == [e["output_index"] for e in done]
    ids = [e["item"]["id"] for e in added]
    assert ids == [e["item"]["id"] for e in done] and len(set(ids)) == 2
    for event in events:
        if "item_id" in event:
            assert event["item_id"] == ids[event["output_index"]]


def test_pitfall_18_midstream_overloaded_ends_with_response_failed(upstream: UpstreamMock) -> None:
    body = encode_chunks([start(), *text_block(0, "Hi"), OVERLOADED], "anthropic")
    events = replay(upstream, stream_reply(body))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "server_is_overloaded"


def test_pitfall_19_reasoning_item_with_only_an_id_is_tolerated() -> None:
    body = request_body(
        {
            "store": False,
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "id": "rs_68c1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                {"role": "user", "content": "more"},
            ],
        }
    )
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == [{"type": "text", "text": "a"}]
