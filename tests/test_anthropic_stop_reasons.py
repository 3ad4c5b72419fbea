"""Every Anthropic ``stop_reason`` becomes the Response status and ``incomplete_details`` a client acts on.

Each stream comes from a mock upstream over HTTP: a text block (or a tool_use block) then
``message_delta`` with the stop reason under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from responses_gateway.protocol.checker import check
from responses_gateway.providers.anthropic import AnthropicProvider
from upstream_mock import UpstreamMock, drive, encode_chunks, stream_reply

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def message(stop: str, *, tool: bool = False, details: JSON | None = None) -> bytes:
    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
             "stop_reason": None, "usage": {"input_tokens": 9, "output_tokens": 1}}  # fmt: skip
    if tool:
        block: JSON = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
        delta: JSON = {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    else:
        block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": "Partial answer"}
    end: JSON = {"stop_reason": stop, "stop_sequence": "###" if stop == "stop_sequence" else None}
    if details is not None:
        end["stop_details"] = details
    return encode_chunks(
        [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": end, "usage": {"output_tokens": 12}},
            {"type": "message_stop"},
        ],
        "anthropic",
    )


def run(upstream: UpstreamMock, body: bytes) -> JSON:
    upstream.reset([stream_reply(body, split=True, seed=11, delay=0)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-stop", max_continuations=0)
    body = {"model": "claude", "input": "hi", "tools": [{"type": "function", "name": "f"}]}
    events = asyncio.run(drive(provider, body))
    assert check(events) == []
    response: JSON = events[-1]["response"]
    assert response["usage"]["output_tokens"] == 12
    return response


@pytest.mark.parametrize(
    ("stop", "tool", "status", "incomplete", "item_status"),
    [
        ("end_turn", False, "completed", None, "completed"),
        ("stop_sequence", False, "completed", None, "completed"),
        ("tool_use", True, "completed", None, "completed"),
        ("max_tokens", False, "incomplete", "max_output_tokens", "incomplete"),
        # The tool_use block was stopped with whole arguments: the call itself is complete.
        ("max_tokens", True, "incomplete", "max_output_tokens", "completed"),
        ("model_context_window_exceeded", False, "incomplete", "max_output_tokens", "incomplete"),
        ("pause_turn", False, "incomplete", "max_output_tokens", "incomplete"),
    ],
)
def test_stop_reason(
    upstream: UpstreamMock, stop: str, tool: bool, status: str, incomplete: str | None, item_status: str
) -> None:
    response = run(upstream, message(stop, tool=tool))
    assert response["status"] == status
    assert response["incomplete_details"] == (None if incomplete is None else {"reason": incomplete})
    (item,) = response["output"]
    assert item["type"] == ("function_call" if tool else "message")
    assert item["status"] == item_status
    if not tool:
        assert item["content"][0]["text"] == "Partial answer"


def test_refusal_stop_reason_is_a_refusal_part_and_content_filter(upstream: UpstreamMock) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "I can't help with that."}
    response = run(upstream, message("refusal", details=details))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    (item,) = response["output"]
    assert [p["type"] for p in item["content"]] == ["output_text", "refusal"]
    assert item["content"][1]["refusal"] == "I can't help with that."
