"""The openai SDK, by base URL alone, against the gateway serving AnthropicProvider over a mock upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from conftest import Gateway
from fixtures_loader import load_sse
from responses_gateway.providers.anthropic import AnthropicProvider
from upstream_mock import UpstreamMock, error_reply, fixture_reply

THINKING_TOOL = "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse"
CITATIONS = "anthropic-messages__web-search-server-tool-citations-delta-sonnet-4__vercel-ai.chunks.jsonl"
PLAIN = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def client(upstream: UpstreamMock, gateway: Callable[..., Gateway]) -> openai.OpenAI:
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-upstream", upstream_model="claude-x")
    provider.name = "claude"
    gw = gateway([provider])
    return openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0)


def test_sdk_tool_loop_round_trips_the_signature(upstream: UpstreamMock, client: openai.OpenAI) -> None:
    upstream.reset([fixture_reply(THINKING_TOOL, split=True), fixture_reply(PLAIN)])
    tools: list[Any] = [{"type": "function", "name": "fixed_version", "parameters": {"type": "object"},
                         "strict": False}]  # fmt: skip
    with client.responses.stream(
        model="claude", input="Name a pelican", tools=tools, reasoning={"effort": "low"}
    ) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert call.type == "function_call" and call.name == "fixed_version"

    history: list[Any] = [
        {"role": "user", "content": "Name a pelican"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "Pete"},
    ]
    second = client.responses.create(model="claude", input=history, tools=tools, reasoning={"effort": "low"})
    assert second.status == "completed"
    assert second.output_text
    sent = upstream.requests[1].json
    assert sent["model"] == "claude-x"
    thinking = sent["messages"][1]["content"][0]
    assert thinking["type"] == "thinking"
    assert thinking["thinking"] == reasoning.summary[0].text
    assert upstream.requests[0].json["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    recorded = load_sse(THINKING_TOOL).decode().split('"signature":"')[-1].split('"', 1)[0]
    assert thinking["signature"] == recorded


def test_sdk_sees_citations_and_web_search(upstream: UpstreamMock, client: openai.OpenAI) -> None:
    upstream.reset([fixture_reply(CITATIONS)])
    response = client.responses.create(
        model="claude",
        input="Tech news?",
        tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"],
    )
    search, message = response.output[0], response.output[1]
    assert search.type == "web_search_call" and search.status == "completed"
    assert message.type == "message"
    part = message.content[0]
    assert part.type == "output_text"
    assert len(part.annotations) == 14
    assert all(a.type == "url_citation" and a.end_index > a.start_index for a in part.annotations)
    assert response.usage is not None and response.usage.input_tokens > 0
    assert upstream.requests[0].json["tools"] == [{"type": "web_search_20250305", "name": "web_search"}]


def test_sdk_gets_upstream_auth_failure_as_502(upstream: UpstreamMock, client: openai.OpenAI) -> None:
    error = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    upstream.reset([error_reply(401, error)])
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(model="claude", input="hi", stream=True)
    assert info.value.status_code == 502
    body = info.value.body
    assert isinstance(body, dict)
    assert body.get("code") == "upstream_authentication_error"
    assert "sk-ant-upstream" not in str(body)
