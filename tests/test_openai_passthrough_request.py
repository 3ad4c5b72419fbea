"""Request direction of the Responses passthrough: the exact body the upstream Responses server receives.

Request fields go up as the client sent them (only the model is replaced, ``stream`` set, string input
written as a message, and the gateway's own state fields kept home) — for a table of requests covering
a multi-turn tool loop with reasoning coming back, images and files, instructions, structured output
and every ``tool_choice`` form.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import UpstreamMock, drive, fixture_reply

JSON = dict[str, Any]
REPLY = "openai-responses__refusal-delta-stream-gpt-4o__mirascope-mirascope.sse"
FN: JSON = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}
FN2: JSON = {"type": "function", "name": "get_time", "parameters": {"type": "object"}, "strict": False}


def user(text: str) -> JSON:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


HISTORY: list[JSON] = [
    user("Weather in Paris and Rome?"),
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Two calls."}],
     "encrypted_content": "gAAAAABopaque+/="},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city":"Paris"}', "status": "completed"},
    {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "get_weather",
     "arguments": '{"city":"Rome"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Sunny and rainy.", "annotations": []}]},
    user("Thanks"),
]  # fmt: skip

IMAGES: list[JSON] = [
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is in these?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
        ],
    }
]

SCHEMA: JSON = {
    "type": "json_schema",
    "name": "weather",
    "schema": {"type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"],
               "additionalProperties": False},
    "strict": True,
}  # fmt: skip

# (id, request body, fields the upstream body must have besides model/stream/input)
CASES: list[tuple[str, JSON, list[JSON] | None]] = [
    ("plain string input", {"input": "hi"}, [user("hi")]),
    ("multi-turn tool loop with reasoning coming back",
     {"input": HISTORY, "tools": [FN], "include": ["reasoning.encrypted_content"], "store": False,
      "reasoning": {"effort": "medium", "summary": "auto"}}, None),
    ("images and files", {"input": IMAGES}, None),
    ("instructions and a developer message",
     {"instructions": "Be terse.",
      "input": [{**user("No emoji."), "role": "developer"}, user("hi")]}, None),
    ("structured output", {"input": [user("t?")], "text": {"format": SCHEMA, "verbosity": "low"}}, None),
    ("tool_choice required, parallel off",
     {"input": [user("w?")], "tools": [FN, FN2], "tool_choice": "required", "parallel_tool_calls": False},
     None),
    ("tool_choice none", {"input": [user("w?")], "tools": [FN], "tool_choice": "none"}, None),
    ("tool_choice auto with max_tool_calls",
     {"input": [user("w?")], "tools": [FN], "tool_choice": "auto", "max_tool_calls": 2}, None),
    ("tool_choice a named function",
     {"input": [user("w?")], "tools": [FN, FN2], "tool_choice": {"type": "function", "name": "get_time"}},
     None),
    ("tool_choice allowed_tools",
     {"input": [user("w?")], "tools": [FN, FN2],
      "tool_choice": {"type": "allowed_tools", "mode": "required",
                      "tools": [{"type": "function", "name": "get_weather"}]}}, None),
    ("tool_choice a hosted tool",
     {"input": [user("news?")], "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     None),
    ("sampling, limits, metadata and cache key",
     {"input": [user("hi")], "temperature": 0.2, "top_p": 0.9, "max_output_tokens": 100,
      "metadata": {"k": "v"}, "prompt_cache_key": "pk", "safety_identifier": "u1", "truncation": "auto",
      "service_tier": "flex"}, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def sent(upstream: UpstreamMock, body: JSON) -> JSON:
    upstream.reset([fixture_reply(REPLY)])
    provider = OpenAIResponsesProvider(
        base_url=upstream.url + "/v1", api_key="sk-x-1234567", upstream_model="up"
    )
    asyncio.run(drive(provider, {"model": "alias", "stream": True, **copy.deepcopy(body)}))
    (request,) = upstream.requests
    assert request.path == "/v1/responses"
    result: JSON = request.json
    return result


@pytest.mark.parametrize(("body", "input_items"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_upstream_body(upstream: UpstreamMock, body: JSON, input_items: list[JSON] | None) -> None:
    want = {**copy.deepcopy(body), "model": "up", "stream": True}
    if input_items is not None:
        want["input"] = input_items
    assert sent(upstream, body) == want


def test_gateway_state_fields_do_not_go_up(upstream: UpstreamMock) -> None:
    """previous_response_id, conversation and background are the gateway's; the upstream gets the rest."""
    body = {
        "input": [user("hi")],
        "previous_response_id": "resp_ours",
        "conversation": "conv_ours",
        "background": True,
        "store": True,
    }
    # parse_request resolves nothing: drive() only parses, so these are still in raw.
    got = sent(upstream, body)
    assert got == {"model": "up", "stream": True, "input": [user("hi")], "store": True}
