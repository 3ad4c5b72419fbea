"""A two-turn tool loop through every upstream provider with the openai SDK: call → output → answer.

The SDK talks to a real gateway (uvicorn on loopback, SQLite store) whose model is served by one of the
four upstream providers; the upstream is a mock server on loopback. Turn 1 replays a recorded stream that
ends in a tool call; turn 2 answers with text. The second upstream request must carry the call and its
output in the provider's own format — for Anthropic with thinking the recorded signature byte for byte,
for Gemini the recorded thought signature, for the Responses passthrough the reasoning item's
``encrypted_content`` exactly as the client got it. Each loop runs twice: the client resending the whole
history, and the client sending only the tool output with ``previous_response_id``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from conftest import Gateway, check_stream, start_gateway
from fixtures_loader import load_chunks, load_fixture
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import Reply, UpstreamMock, fixture_reply

JSON = dict[str, Any]

ANTHROPIC_TOOL = "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse"
ANTHROPIC_TEXT = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
CHAT_TOOL = "openai-chat__openai-tool-call-args-split-include-usage__pydantic-pydantic-ai.sse"
DEEPSEEK_TOOL = "openai-chat__deepseek-reasoner-reasoning-then-tool-call-split-args__vercel-ai.chunks.jsonl"
CHAT_TEXT = "openai-chat__plain-text-include-usage-final-chunk-gpt-4.1-nano__vercel-ai.chunks.jsonl"
RESPONSES_TOOL = (
    "openai-responses__multi-step-reasoning-summary-function-calls-gpt-5.1-codex-max__vercel-ai.chunks.jsonl"
)
RESPONSES_TEXT = "openai-responses__reasoning-empty-summary-plain-text-gpt-5-mini__wavetermdev-waveterm.sse"
GEMINI_TOOL = "gemini__stream-function-call-with-thought-signature-gemini-3-pro__vercel-ai.chunks.jsonl"
GEMINI_TEXT = "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse"

TOOL_OUTPUT = "Pete the pelican"


def _tool(name: str) -> JSON:
    return {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": False}


def _anthropic_signature() -> str:
    text = load_fixture(ANTHROPIC_TOOL)
    assert isinstance(text, bytes)
    return text.decode().split('"signature":"')[-1].split('"', 1)[0]


def _gemini_signature() -> str:
    (signature,) = [
        p["thoughtSignature"]
        for c in load_chunks(GEMINI_TOOL)
        for cand in c["candidates"]
        for p in cand["content"]["parts"]
        if "functionCall" in p
    ]
    return str(signature)


def _responses_ciphertext() -> str:
    """The first reasoning item's encrypted_content as its ``output_item.done`` carried it."""
    for event in load_chunks(RESPONSES_TOOL):
        item = event.get("item") or {}
        if event["type"] == "response.output_item.done" and item.get("type") == "reasoning":
            return str(item["encrypted_content"])
    raise AssertionError("no reasoning item in the recording")


def _check_anthropic(sent: JSON, first: list[JSON]) -> None:
    reasoning, call = first
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    thinking, tool_use = messages[1]["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": reasoning["summary"][0]["text"],
        "signature": _anthropic_signature(),
    }
    assert tool_use == {
        "type": "tool_use",
        "id": call["call_id"],
        "name": call["name"],
        "input": json.loads(call["arguments"]),
    }
    (result,) = messages[2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == call["call_id"]
    content = result["content"]
    text = content if isinstance(content, str) else "".join(b["text"] for b in content)
    assert text == TOOL_OUTPUT
    assert sent["thinking"]["type"] == "enabled"


def _check_chat(sent: JSON, first: list[JSON]) -> None:
    (call,) = first
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"] == [
        {
            "id": call["call_id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
    ]
    assert messages[2] == {"role": "tool", "tool_call_id": call["call_id"], "content": TOOL_OUTPUT}


def _check_deepseek(sent: JSON, first: list[JSON]) -> None:
    """DeepSeek refuses a tool turn without its reasoning_content (pitfall 15): it goes back as it came."""
    reasoning, call = first
    _check_chat(sent, [call])
    thought = "".join(s["text"] for s in reasoning["summary"])
    assert thought and sent["messages"][1]["reasoning_content"] == thought


def _check_responses(sent: JSON, first: list[JSON]) -> None:
    reasoning, call = first
    user, sent_reasoning, sent_call, output = sent["input"]
    assert user["role"] == "user"
    assert sent_reasoning["type"] == "reasoning" and sent_reasoning["id"] == reasoning["id"]
    # What OpenAI gave in the item's output_item.done, byte for byte (the client may hold it sealed).
    assert sent_reasoning["encrypted_content"] == _responses_ciphertext()
    assert {k: sent_call[k] for k in ("type", "call_id", "name", "arguments")} == {
        "type": "function_call",
        "call_id": call["call_id"],
        "name": "calculator",
        "arguments": '{"a":12,"b":7,"op":"add"}',
    }
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_OUTPUT}
    assert "previous_response_id" not in sent


def _check_gemini(sent: JSON, first: list[JSON]) -> None:
    call = first[-1]
    contents = sent["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    (part,) = contents[1]["parts"]
    assert part["functionCall"]["name"] == "weather"
    assert part["functionCall"]["args"] == {"location": "San Francisco"}
    assert part["thoughtSignature"] == _gemini_signature()
    (answer,) = contents[2]["parts"]
    assert answer["functionResponse"]["name"] == "weather"
    assert TOOL_OUTPUT in str(answer["functionResponse"]["response"])
    assert call["type"] == "function_call"


@dataclass(frozen=True)
class Loop:
    make: Callable[[str], Provider]
    turns: tuple[Reply, Reply]
    tool: str
    reasoning: JSON | None
    first_kinds: list[str]
    check: Callable[[JSON, list[JSON]], None]


LOOPS: dict[str, Loop] = {
    "anthropic": Loop(
        lambda url: AnthropicProvider(base_url=url, api_key="sk-ant-loop", upstream_model="claude-x"),
        (fixture_reply(ANTHROPIC_TOOL, split=True, seed=3), fixture_reply(ANTHROPIC_TEXT)),
        "fixed_version",
        {"effort": "low"},
        ["reasoning", "function_call"],
        _check_anthropic,
    ),
    "openai-chat": Loop(
        lambda url: OpenAIChatProvider(base_url=url + "/v1", api_key="sk-loop", upstream_model="gpt-4o"),
        (fixture_reply(CHAT_TOOL, split=True, seed=4), fixture_reply(CHAT_TEXT)),
        "get_capital",
        None,
        ["function_call"],
        _check_chat,
    ),
    "openai-chat-deepseek": Loop(
        lambda url: OpenAIChatProvider(
            base_url=url + "/v1", api_key="sk-loop", upstream_model="deepseek-reasoner"
        ),
        (fixture_reply(DEEPSEEK_TOOL, split=True, seed=7), fixture_reply(CHAT_TEXT)),
        "weather",
        None,
        ["reasoning", "function_call"],
        _check_deepseek,
    ),
    "openai": Loop(
        lambda url: OpenAIResponsesProvider(base_url=url + "/v1", api_key="sk-loop", upstream_model="gpt-5"),
        (fixture_reply(RESPONSES_TOOL, split=True, seed=5), fixture_reply(RESPONSES_TEXT)),
        "calculator",
        {"effort": "low", "summary": "auto"},
        ["reasoning", "function_call"],
        _check_responses,
    ),
    "gemini": Loop(
        lambda url: GeminiProvider(base_url=url, api_key="AIzaSyLOOP-0123456789abcdef", upstream_model="g3"),
        (fixture_reply(GEMINI_TOOL, split=True, seed=6), fixture_reply(GEMINI_TEXT)),
        "weather",
        None,
        ["reasoning", "function_call"],
        _check_gemini,
    ),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def gateway_for(tmp_path: Path) -> Iterator[Callable[[Provider], Gateway]]:
    started: list[Gateway] = []

    def factory(provider: Provider) -> Gateway:
        provider.name = "m"
        gw = start_gateway(
            [provider], store_url=f"sqlite://{tmp_path}/data/gateway.db", data_dir=str(tmp_path / "data")
        )
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


def _stream(client: openai.OpenAI, **kwargs: Any) -> JSON:
    """One streamed turn: the events pass the checker; the terminal Response, as a dict."""
    stream = client.responses.create(model="m", stream=True, **kwargs)
    events = [event.to_dict() for event in stream]
    check_stream(events)
    assert events[-1]["type"] == "response.completed", events[-1]
    response: JSON = events[-1]["response"]
    return response


@pytest.mark.parametrize("mode", ["full_history", "previous_response_id"])
@pytest.mark.parametrize("kind", list(LOOPS))
def test_two_turn_tool_loop_with_the_openai_sdk(
    upstream: UpstreamMock, gateway_for: Callable[[Provider], Gateway], kind: str, mode: str
) -> None:
    loop = LOOPS[kind]
    upstream.reset(list(loop.turns))
    gw = gateway_for(loop.make(upstream.url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0)
    extra: JSON = {"tools": [_tool(loop.tool)]}
    if loop.reasoning is not None:
        extra["reasoning"] = loop.reasoning
    if kind == "openai":
        extra["include"] = ["reasoning.encrypted_content"]

    first = _stream(client, input="Use the tool, please.", **extra)
    output: list[JSON] = first["output"]
    assert [o["type"] for o in output] == loop.first_kinds
    call = output[-1]
    assert call["type"] == "function_call" and call["name"] == loop.tool
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_OUTPUT}

    if mode == "full_history":
        history = [{"role": "user", "content": "Use the tool, please."}, *output, result]
        second = _stream(client, input=history, **extra)
    else:
        second = _stream(client, input=[result], previous_response_id=first["id"], **extra)
        assert second["previous_response_id"] == first["id"]
    text = "".join(
        p.get("text", "") for o in second["output"] if o["type"] == "message" for p in o["content"]
    )
    assert text

    assert len(upstream.requests) == 2
    loop.check(upstream.requests[1].json, output)
