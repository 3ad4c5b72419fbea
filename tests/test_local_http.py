"""The local model over HTTP: the openai SDK and the OpenAI Agents SDK against a real gateway."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("llama_cpp")
jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

from conftest import Gateway, _assert_valid_stream, decode_sse, start_gateway  # noqa: E402
from responses_gateway.providers.local import LocalProvider  # noqa: E402

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}
CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "indoor": {"type": "boolean"},
    },
    "required": ["name", "age", "indoor"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def local() -> LocalProvider:
    provider = LocalProvider(seed=7)
    provider.load()
    return provider


@pytest.fixture(scope="module")
def gw(local: LocalProvider) -> Iterator[Gateway]:
    gateway = start_gateway([local])
    # The provider's own name is "local"; clients ask for the model by its public name.
    gateway.registry.add(local, MODEL, owned_by="local")
    yield gateway
    gateway.stop()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="test", max_retries=0, timeout=120)


def _raw_stream(gw: Gateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.Client(timeout=120) as http:
        response = http.post(gw.url("/v1/responses"), json={"model": MODEL, "stream": True, **body})
        assert response.status_code == 200, response.text
        events = decode_sse(response.content)
    _assert_valid_stream(events)
    return events


def test_non_stream_create(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=20)
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message"
    assert response.output_text
    assert response.usage is not None and response.usage.output_tokens >= 1


def test_create_stream(client: openai.OpenAI, gw: Gateway) -> None:
    deltas = []
    final = None
    with client.responses.create(
        model=MODEL, input="Name three fruits.", max_output_tokens=20, stream=True
    ) as s:
        for event in s:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert final is not None and deltas
    assert "".join(deltas) == final.output_text
    _raw_stream(gw, {"input": "Name three fruits.", "max_output_tokens": 20})


def test_stream_helper_final_response(client: openai.OpenAI) -> None:
    # get_final_response() needs response.completed; a schema-bounded answer always finishes, whereas
    # free text from this model usually runs to the token budget.
    with client.responses.stream(
        model=MODEL,
        input="Describe a cat.",
        text={"format": {"type": "json_schema", "name": "cat", "schema": CAT, "strict": True}},
        max_output_tokens=80,
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == text
    jsonschema.validate(json.loads(text), CAT)


def test_forced_function_call_arguments_validate(client: openai.OpenAI, gw: Gateway) -> None:
    response = client.responses.create(
        model=MODEL,
        input="What's the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=80,
    )
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    events = _raw_stream(
        gw,
        {
            "input": "What's the weather in Rome?",
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_output_tokens": 80,
        },
    )
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(done) == 1
    jsonschema.validate(json.loads(done[0]["arguments"]), WEATHER_PARAMS)


def test_input_tokens_are_what_usage_then_says(client: openai.OpenAI) -> None:
    """POST /v1/responses/input_tokens counts with the model's own tokenizer, exactly."""
    body: dict[str, Any] = {
        "instructions": "Be brief.",
        "input": "What's the weather in Oslo?",
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    counted = client.responses.input_tokens.count(model=MODEL, **body)
    response = client.responses.create(model=MODEL, max_output_tokens=40, **body)
    assert response.usage is not None and counted.input_tokens == response.usage.input_tokens > 50


def test_json_schema_output(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="Describe a cat.",
        text={"format": {"type": "json_schema", "name": "cat", "schema": CAT, "strict": True}},
        max_output_tokens=80,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CAT)


def test_max_output_tokens_incomplete(client: openai.OpenAI) -> None:
    # A list of a hundred numbers cannot fit in five tokens.
    response = client.responses.create(
        model=MODEL,
        input="Count from 1 to 100, separated by commas.",
        max_output_tokens=5,
        temperature=0,
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 5


def test_client_disconnect_stops_generation(gw: Gateway, local: LocalProvider) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "input": "Write a very long story about the sea.",
        "temperature": 1,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", gw.url("/v1/responses"), json=body) as response,
    ):
        assert response.status_code == 200
        seen = 0
        for chunk in response.iter_raw():
            seen += chunk.count(b"response.output_text.delta")
            if seen >= 5:
                break
    # The server notices the closed connection at its next write; give it a moment, then watch.
    deadline = time.monotonic() + 5
    previous = local.tokens_generated
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if local.tokens_generated == previous:
            break
        previous = local.tokens_generated
    settled = local.tokens_generated
    time.sleep(0.5)
    assert local.tokens_generated == settled
    assert local._active == 0
    # And the gateway keeps serving.
    events = _raw_stream(gw, {"input": "Hi", "max_output_tokens": 16})
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


def _agents_run(gw: Gateway, streamed: bool) -> tuple[Any, Any, list[str]]:
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    agents = pytest.importorskip("agents")
    import asyncio

    import pydantic

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"It is sunny and 21 degrees in {city}."

    class Report(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=30)
        sunny: bool

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="test", max_retries=0)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    # Turn 1: the call is forced (a 270M model does not reliably choose to call on its own).
    caller = agents.Agent(
        name="weather",
        instructions="Answer questions about the weather using the get_weather tool.",
        model=model,
        tools=[get_weather],
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=96, temperature=0.7
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    # Turn 2: the answer from the history (function_call + function_call_output items as the SDK
    # echoes them). With tool_choice reset to "auto" this model imitates its history and calls again,
    # so the answer turn says "none"; the typed answer is schema-bounded, so it always completes (free
    # text from this model runs to the budget, an incomplete response the SDK treats as an error).
    answerer = agents.Agent(
        name="reporter",
        instructions="Report the weather from the tool result.",
        model=model,
        tools=[get_weather],
        output_type=Report,
        model_settings=agents.ModelSettings(tool_choice="none", max_tokens=96, temperature=0.7),
    )

    async def run(agent: Any, given: Any) -> Any:
        if streamed:
            result = agents.Runner.run_streamed(agent, given, max_turns=2)
            kinds = [event.type async for event in result.stream_events()]
            assert "raw_response_event" in kinds
            return result
        return await agents.Runner.run(agent, given, max_turns=2)

    async def go() -> tuple[Any, Any]:
        first = await run(caller, "What's the weather in Paris?")
        second = await run(answerer, first.to_input_list())
        return first, second

    first, second = asyncio.run(go())
    return first, second, calls


@pytest.mark.parametrize("streamed", [False, True])
def test_agents_sdk_runner_with_function_tool(gw: Gateway, streamed: bool) -> None:
    first, second, calls = _agents_run(gw, streamed)
    assert len(calls) == 1 and calls[0]
    assert [item.type for item in first.new_items] == ["tool_call_item", "tool_call_output_item"]
    assert first.final_output == f"It is sunny and 21 degrees in {calls[0]}."
    assert second.final_output.city
    assert isinstance(second.final_output.sunny, bool)
    assert [item.type for item in second.new_items] == ["message_output_item"]
