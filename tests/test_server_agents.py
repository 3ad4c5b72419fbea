"""The OpenAI Agents SDK running a tool loop against the gateway over real HTTP."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import openai
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from conftest import Gateway
from responses_gateway.providers.scripted import ScriptedProvider

set_tracing_disabled(True)

# Turn 1 calls the tool; once the tool's output is in the input, turn 2 answers with it.
SCRIPT = {
    "turns": [
        {
            "when": {"input_has": "function_call_output"},
            "steps": [{"message": ["It is ", "sunny in Paris."]}],
        },
        {"steps": [{"function_call": {"name": "get_weather", "arguments": ['{"city": ', '"Paris"}']}}]},
    ]
}

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    calls.append(city)
    return f"sunny in {city}"


def _agent(gw: Gateway) -> Agent:
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    return Agent(
        name="weather",
        instructions="Answer with the weather.",
        model=OpenAIResponsesModel(model="m", openai_client=client),
        tools=[get_weather],
    )


def _check_second_turn(provider: ScriptedProvider) -> None:
    assert len(provider.requests) == 2
    second = provider.requests[1]
    outputs = [item for item in second.input if item["type"] == "function_call_output"]
    assert outputs and outputs[0]["output"] == "sunny in Paris"
    echoed = [item for item in second.input if item["type"] == "function_call"]
    assert echoed[0]["call_id"] == outputs[0]["call_id"]


def test_runner_run(gateway: Callable[..., Gateway]) -> None:
    calls.clear()
    provider = ScriptedProvider(SCRIPT, name="m")
    gw = gateway([provider])
    result = asyncio.run(Runner.run(_agent(gw), "What's the weather in Paris?"))
    assert result.final_output == "It is sunny in Paris."
    assert calls == ["Paris"]
    _check_second_turn(provider)


def test_runner_run_streamed(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    calls.clear()
    provider = ScriptedProvider(SCRIPT, name="m")
    gw = gateway([provider])

    streams: list[list[dict[str, Any]]] = []

    async def run() -> tuple[str, list[str]]:
        result = Runner.run_streamed(_agent(gw), "What's the weather in Paris?")
        deltas: list[str] = []
        async for event in result.stream_events():
            if event.type != "raw_response_event":
                continue
            if event.data.type == "response.created":
                streams.append([])
            streams[-1].append(event.data.model_dump(mode="json", exclude_unset=True))
            if event.data.type == "response.output_text.delta":
                deltas.append(event.data.delta)
        return str(result.final_output), deltas

    final, deltas = asyncio.run(run())
    assert len(streams) == 2
    for events in streams:
        assert_valid_stream(events)
    assert final == "It is sunny in Paris."
    assert deltas == ["It is ", "sunny in Paris."]
    assert calls == ["Paris"]
    _check_second_turn(provider)
