"""Regression tests for pitfalls of provider-mapping.md §5 not covered by a provider's own pitfall file.

Pitfall 16 (tool calls streamed as text by non-harmony models behind vLLM), the parts of pitfall 17
(Ollama's responses.go: summary deltas without ``summary_part.added``, token details hard-coded to 0)
that the Chat Completions translation could repeat, and pitfall 19 (a reasoning item sent back with
only its id) in an Anthropic tool loop. Each upstream is a mock server over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from conftest import Gateway
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, stream_reply

JSON = dict[str, Any]
DEEPSEEK_RESPONSES = (
    "openai-responses__deepseek-responses-endpoint-reasoning-text-then-function-call"
    "__pydantic-pydantic-ai.sse"
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def chunk(delta: JSON, finish: str | None = None, **extra: Any) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "Qwen/Qwen3-8B",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def vllm_stream() -> list[JSON]:
    """What vLLM's chat endpoint sends for Qwen3 (hermes tool parser, ``reasoning`` field)."""
    call = {"id": "chatcmpl-tool-9f", "type": "function", "index": 0,
            "function": {"name": "get_weather", "arguments": ""}}  # fmt: skip
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "The user wants "}),
        chunk({"reasoning": "the weather."}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({"content": ""}, "tool_calls"),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "Qwen/Qwen3-8B",
            "choices": [],
            "usage": {
                "prompt_tokens": 40,
                "completion_tokens": 30,
                "total_tokens": 70,
                "prompt_tokens_details": {"cached_tokens": 32},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        },
    ]


def run_chat(upstream: UpstreamMock, chunks: list[JSON]) -> list[JSON]:
    upstream.reset([stream_reply(encode_chunks(chunks, "openai-chat"), split=True, seed=16)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", upstream_model="Qwen/Qwen3-8B")
    body = {
        "model": "m",
        "input": "Weather in Paris?",
        "tools": [{"type": "function", "name": "get_weather"}],
    }
    events = asyncio.run(drive(provider, body))
    assert check(events) == []
    return events


def test_pitfall_16_vllm_tool_calls_are_calls_not_text(upstream: UpstreamMock) -> None:
    """Pitfall 16: a vLLM model's tool call is a function_call item with argument deltas, never text."""
    events = run_chat(upstream, vllm_stream())
    types = [e["type"] for e in events]
    output = events[-1]["response"]["output"]
    # The empty content around the call makes no message item.
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert "response.output_text.delta" not in types
    call = output[1]
    assert (call["call_id"], call["name"], call["arguments"]) == (
        "chatcmpl-tool-9f",
        "get_weather",
        '{"city": "Paris"}',
    )
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"city": "Paris"}'
    assert events[-1]["response"]["status"] == "completed"


def test_pitfall_16_responses_server_calls_relay_as_calls(upstream: UpstreamMock) -> None:
    """Pitfall 16 through the passthrough: a non-OpenAI Responses server's function_call stays a call."""
    upstream.reset([fixture_reply(DEEPSEEK_RESPONSES, split=True, seed=16)])
    provider = OpenAIResponsesProvider(base_url=upstream.url + "/v1", upstream_model="deepseek")
    events = asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert check(events) == []
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert "response.output_text.delta" not in [e["type"] for e in events]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == output[1]["arguments"] and output[1]["arguments"]


def test_pitfall_17_summary_part_opened_before_its_deltas(upstream: UpstreamMock) -> None:
    """Pitfall 17 (Ollama): every reasoning summary delta follows the summary_part.added it belongs to."""
    events = run_chat(upstream, vllm_stream())
    opened: set[tuple[str, int]] = set()
    deltas = 0
    for event in events:
        if event["type"] == "response.reasoning_summary_part.added":
            opened.add((event["item_id"], event["summary_index"]))
        elif event["type"] == "response.reasoning_summary_text.delta":
            assert (event["item_id"], event["summary_index"]) in opened
            deltas += 1
    assert deltas == 2
    reasoning = events[-1]["response"]["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "The user wants the weather."}]


def test_pitfall_17_cached_and_reasoning_tokens_are_reported_not_zero(upstream: UpstreamMock) -> None:
    """Pitfall 17 (Ollama): cached and reasoning token counts come from the upstream, not a constant 0."""
    usage = run_chat(upstream, vllm_stream())[-1]["response"]["usage"]
    assert usage == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 12},
        "total_tokens": 70,
    }


ANTHROPIC_TOOL = "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse"
ANTHROPIC_TEXT = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
FIXED_VERSION: JSON = {"type": "function", "name": "fixed_version", "parameters": {"type": "object"}}


def test_pitfall_19_anthropic_tool_loop_with_a_bare_reasoning_id(
    upstream: UpstreamMock, gateway: Callable[..., Gateway]
) -> None:
    """Pitfall 19: a client under store:false sends the reasoning item back with only its id.

    The thinking block cannot be rebuilt from an id, and Anthropic refuses tool results for a turn
    whose thinking is missing while thinking is on; the turn goes up without thinking and completes.
    """
    upstream.reset([fixture_reply(ANTHROPIC_TOOL), fixture_reply(ANTHROPIC_TEXT)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-p19", upstream_model="claude-x")
    provider.name = "claude"
    client = openai.OpenAI(base_url=gateway([provider]).base_url, api_key="k", max_retries=0)
    common: JSON = {
        "model": "claude",
        "tools": [FIXED_VERSION],
        "reasoning": {"effort": "low"},
        "store": False,
    }
    first = client.responses.create(input="Name a pelican", **common)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    history: list[Any] = [
        {"role": "user", "content": "Name a pelican"},
        {"type": "reasoning", "id": reasoning.id, "summary": []},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Pete"},
    ]
    second = client.responses.create(input=history, **common)
    assert second.status == "completed" and second.output_text
    assert upstream.requests[0].json["thinking"]["type"] == "enabled"
    sent = upstream.requests[1].json
    assert "thinking" not in sent
    assert [b["type"] for b in sent["messages"][1]["content"]] == ["tool_use"]
    assert sent["messages"][2]["content"][0]["type"] == "tool_result"


def anthropic_body(items: list[JSON]) -> JSON:
    provider = AnthropicProvider(api_key="k")
    request = parse_request({"model": "claude-sonnet-4-5", "input": items, "reasoning": {"effort": "low"}})
    provider.check_request(request)
    return provider.build_body(request)


CALL: JSON = {"type": "function_call", "call_id": "toolu_1", "name": "f", "arguments": "{}"}
RESULT: JSON = {"type": "function_call_output", "call_id": "toolu_1", "output": "ok"}


def test_pitfall_19_thinking_stays_on_unless_a_tool_loop_lost_it() -> None:
    """Thinking goes off only where Anthropic refuses it: tool results for a turn without its thinking."""
    ask = {"role": "user", "content": "q"}
    assert "thinking" not in anthropic_body([ask, CALL, RESULT])
    # A question next to the results joins their user turn, which still answers the thinking-less calls.
    assert "thinking" not in anthropic_body([ask, CALL, RESULT, {"role": "user", "content": "and?"}])
    # Plain multi-turn text without calls keeps thinking.
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}
    assert anthropic_body([ask, answer, {"role": "user", "content": "more"}])["thinking"]["type"] == "enabled"


def test_pitfall_19_a_bare_reasoning_id_is_completed_from_the_store(
    upstream: UpstreamMock, gateway: Callable[..., Gateway], tmp_path: Any
) -> None:
    """With the first turn stored, a reasoning item sent back with only its id gets its thinking back:
    the store holds the item, so the upstream receives the thinking block and its signature unchanged
    and thinking stays on."""
    upstream.reset([fixture_reply(ANTHROPIC_TOOL), fixture_reply(ANTHROPIC_TEXT)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-p19", upstream_model="claude-x")
    provider.name = "claude"
    gw = gateway([provider], store_url=f"sqlite://{tmp_path}/gw.db", data_dir=str(tmp_path))
    client = openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
    common: JSON = {"model": "claude", "tools": [FIXED_VERSION], "reasoning": {"effort": "low"}}
    first = client.responses.create(input="Name a pelican", **common)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    first_blocks = upstream.requests[0].json
    history: list[Any] = [
        {"role": "user", "content": "Name a pelican"},
        {"type": "reasoning", "id": reasoning.id, "summary": []},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Pete"},
    ]
    second = client.responses.create(input=history, **common)
    assert second.status == "completed" and second.output_text
    sent = upstream.requests[1].json
    assert sent["thinking"]["type"] == "enabled" == first_blocks["thinking"]["type"]
    thinking, tool_use = sent["messages"][1]["content"]
    assert thinking["type"] == "thinking" and thinking["signature"]
    assert tool_use["type"] == "tool_use"
    # An id the store does not know is left as sent: the turn goes up without thinking, as before.
    unknown = [history[0], {"type": "reasoning", "id": "rs_unknown", "summary": []}, *history[2:]]
    upstream.reset([fixture_reply(ANTHROPIC_TEXT)])
    assert client.responses.create(input=unknown, **common).status == "completed"
    assert "thinking" not in upstream.requests[0].json
