"""The openai SDK against the gateway over real HTTP, with scripted back ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from conftest import Gateway, stream_events
from responses_gateway.providers.scripted import ScriptedProvider

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
]


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def _events_as_dicts(stream: Any) -> list[dict[str, Any]]:
    return [event.model_dump(mode="json", exclude_unset=True) for event in stream]


def test_non_stream_create_returns_the_full_response(gateway: Callable[..., Gateway]) -> None:
    provider = ScriptedProvider(
        [{"message": ["Hello", ", world"]}, {"usage": {"input_tokens": 3, "output_tokens": 2}}], name="m"
    )
    client = _client(gateway([provider]))
    response = client.responses.create(model="m", input="hi", instructions="be brief", temperature=0.5)
    assert response.status == "completed"
    assert response.output_text == "Hello, world"
    assert response.model == "m"
    assert response.instructions == "be brief"
    assert response.temperature == 0.5
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        3,
        2,
        5,
    )
    assert response.output[0].id.startswith("msg_")
    assert provider.requests[0].input == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]


def test_create_stream_events_in_order_and_valid(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    client = _client(gateway([ScriptedProvider([{"message": ["a", "b", "c"]}], name="m")]))
    events = _events_as_dicts(client.responses.create(model="m", input="hi", stream=True))
    assert_valid_stream(events)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types.count("response.output_text.delta") == 3
    assert types[-1] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "abc"


def test_stream_helper_final_response(gateway: Callable[..., Gateway]) -> None:
    script = [
        {"reasoning": {"summary": [["Think", "ing"]], "encrypted_content": "opaque"}},
        {"message": ["Par", "is"]},
    ]
    client = _client(gateway([ScriptedProvider(script, name="m")]))
    deltas: list[str] = []
    with client.responses.stream(model="m", input="capital of France?") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == "Paris"
    assert final.output_text == "Paris"
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == "Thinking"
    assert reasoning.encrypted_content == "opaque"


def test_function_call_streaming(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    script = [
        {"function_call": {"name": "get_weather", "arguments": ['{"city":', '"Paris"}'], "call_id": "call_7"}}
    ]
    client = _client(gateway([ScriptedProvider(script, name="m")]))
    events = _events_as_dicts(client.responses.create(model="m", input="weather?", tools=TOOLS, stream=True))
    assert_valid_stream(events)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"city":', '"Paris"}']
    call = events[-1]["response"]["output"][0]
    assert call["type"] == "function_call"
    assert (call["name"], call["arguments"], call["call_id"], call["status"]) == (
        "get_weather",
        '{"city":"Paris"}',
        "call_7",
        "completed",
    )
    assert events[-1]["response"]["tools"][0]["name"] == "get_weather"

    with client.responses.stream(model="m", input="weather?", tools=TOOLS) as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call"


def test_failure_mid_stream_ends_with_response_failed(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    script = [
        {"message": ["partial"]},
        {
            "error": {
                "status": 429,
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached; try again in 2s.",
            }
        },
    ]
    gw = gateway([ScriptedProvider(script, name="m")])
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    assert_valid_stream(events)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {
        "code": "rate_limit_exceeded",
        "message": "Rate limit reached; try again in 2s.",
    }
    # What was finished before the failure is kept.
    assert failed["output"][0]["content"][0]["text"] == "partial"

    # The SDK raises on the ``error`` event (its nested ``error`` object, which other clients need),
    # after having delivered everything before it.
    client = _client(gw)
    seen: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for event in client.responses.create(model="m", input="hi", stream=True):
            seen.append(event.type)
    assert "response.output_text.delta" in seen
    assert info.value.message == "Rate limit reached; try again in 2s."
    assert info.value.code == "rate_limit_exceeded"

    # Non-streaming: the failure is an HTTP error with the status its code implies.
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(model="m", input="hi")
    assert info.value.code == "rate_limit_exceeded"
    assert info.value.type == "rate_limit_exceeded"


def test_incomplete_response(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    script = [{"message": ["cut", " off"]}, {"incomplete": "max_output_tokens"}]
    client = _client(gateway([ScriptedProvider(script, name="m")]))
    events = _events_as_dicts(
        client.responses.create(model="m", input="hi", stream=True, max_output_tokens=16)
    )
    assert_valid_stream(events)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}

    response = client.responses.create(model="m", input="hi", max_output_tokens=16)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "cut off"
    assert response.max_output_tokens == 16


def test_error_before_first_byte_is_an_http_error(gateway: Callable[..., Gateway]) -> None:
    script = [
        {"error": {"status": 503, "code": "server_is_overloaded", "message": "busy", "retry_after": 1.2}}
    ]
    client = _client(gateway([ScriptedProvider(script, name="m")]))
    with pytest.raises(openai.InternalServerError) as info:
        client.responses.create(model="m", input="hi", stream=True)
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"] == "2"
    assert info.value.body == {
        "message": "busy",
        "type": "server_error",
        "param": None,
        "code": "server_is_overloaded",
    }


def test_models_list(gateway: Callable[..., Gateway]) -> None:
    client = _client(gateway([ScriptedProvider([], name="a"), ScriptedProvider([], name="b")]))
    assert [m.id for m in client.models.list()] == ["a", "b"]
    assert client.models.retrieve("b").id == "b"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_stream_helper_tolerates_keepalives(gateway: Callable[..., Gateway]) -> None:
    script = [{"message": ["a"]}, {"sleep": 0.35}, {"message": ["b"]}]
    client = _client(gateway([ScriptedProvider(script, name="m")], keepalive_interval=0.1))
    with client.responses.stream(model="m", input="hi") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types.count("response.in_progress") >= 2
    assert final.output_text == "ab"
