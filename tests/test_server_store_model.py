"""A multi-turn conversation with a tool call via ``previous_response_id`` through the local model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from conftest import start_gateway
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import JSON, ResponseRequest
from responses_gateway.providers.base import Provider
from responses_gateway.providers.local import LocalProvider

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Seen(Provider):
    """The local model, keeping the input each request brought (the history the model was given)."""

    name = MODEL

    def __init__(self, inner: LocalProvider) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.inputs: list[list[JSON]] = []

    def check_request(self, request: ResponseRequest) -> None:
        self.inner.check_request(request)

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        self.inputs.append(list(request.input))
        async for _ in self.inner.stream(request, builder):
            yield

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_previous_response_id_multi_turn_with_a_tool_call(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    local = LocalProvider(seed=7)
    local.load()
    seen = Seen(local)
    gw = start_gateway([seen], store_url=f"sqlite://{tmp_path}/gw.db", data_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=120)
        first = client.responses.create(
            model=MODEL,
            input="What's the weather in Paris?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=60,
        )
        calls = [item for item in first.output if item.type == "function_call"]
        assert first.status == "completed" and len(calls) == 1
        call = calls[0]
        assert isinstance(json.loads(call.arguments), dict)
        second = client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="none",
            max_output_tokens=40,
        )
        assert second.status in ("completed", "incomplete") and second.output_text
        third = client.responses.create(
            model=MODEL,
            previous_response_id=second.id,
            input="Thanks! One word: hot or cold?",
            max_output_tokens=8,
        )
        assert third.status in ("completed", "incomplete")

        history = seen.inputs[-1]
        kinds = [item["type"] for item in history]
        assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
        assert history[0]["content"][0]["text"] == "What's the weather in Paris?"
        assert history[1]["call_id"] == call.call_id and history[1]["arguments"] == call.arguments
        assert history[2]["output"] == "Sunny, 24 C"
        assert history[3]["role"] == "assistant" and history[3]["content"][0]["text"] == second.output_text
        assert history[4]["content"][0]["text"] == "Thanks! One word: hot or cold?"
        # Turn 2 got the same history as far as it went (stored items carry the ids they were given).
        assert [{k: v for k, v in i.items() if k != "id"} for i in seen.inputs[1]] == [
            {k: v for k, v in i.items() if k != "id"} for i in history[:3]
        ]
        assert client.responses.retrieve(third.id).previous_response_id == second.id
    finally:
        gw.stop()
