"""Recovery closes what a crash left open: any cut of a valid stream, so closed, is a valid stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conftest import check_stream
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.store.recovery import close_open_items
from upstream_mock import drive

JSON = dict[str, Any]

SCRIPTS: dict[str, list[JSON]] = {
    "message": [{"message": ["Hel", "lo ", "there"]}],
    "reasoning_then_call": [
        {"reasoning": {"summary": [["Thin", "king"], "more"], "text": ["raw ", "thought"]}},
        {"function_call": {"name": "f", "arguments": ['{"a":', " 1}"]}},
    ],
    "custom_call_and_refusal": [
        {"custom_tool_call": {"name": "patch", "input": ["*** Begin", " Patch"]}},
        {"refusal": ["I can", "not"]},
    ],
    "empty_arguments": [{"function_call": {"name": "f", "arguments": [""]}}, {"message": ["ok"]}],
}


def _stream(script: list[JSON]) -> list[JSON]:
    body = {"model": "m", "input": "x", "stream": True, "tools": [{"type": "function", "name": "f"}]}
    if any("custom_tool_call" in step for step in script):
        body["tools"] = [{"type": "custom", "name": "patch"}]
    return asyncio.run(drive(ScriptedProvider(script, name="m"), body))


def _recovered(cut: list[JSON]) -> list[JSON]:
    """What the store appends after a crash (see store/lease.py, Lease._fail_orphan), for a checked replay."""
    last = cut[-1]["sequence_number"]
    closing, output = close_open_items(cut, last + 1)
    response = {**cut[0]["response"], "status": "failed", "output": output, "error": {"code": "server_error"}}
    seq = last + len(closing)
    error = {
        "type": "error",
        "sequence_number": seq + 1,
        "code": "server_error",
        "message": "m",
        "param": None,
        "error": {"type": "server_error", "code": "server_error", "message": "m", "param": None},
    }
    return [
        *cut,
        *closing,
        error,
        {"type": "response.failed", "sequence_number": seq + 2, "response": response},
    ]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_cut_closes_into_a_valid_stream(name: str) -> None:
    events = _stream(SCRIPTS[name])
    check_stream(events, strict=False)
    assert events[-1]["type"] == "response.completed"
    for end in range(2, len(events)):  # from just after response.in_progress to just before the end
        replay = _recovered(events[:end])
        check_stream(replay, strict=False)
        # Items the client already saw done keep exactly their done form.
        done_before = {
            e["item"]["id"]: e["item"] for e in events[:end] if e["type"] == "response.output_item.done"
        }
        for item in replay[-1]["response"]["output"]:
            if item["id"] in done_before:
                assert item == done_before[item["id"]]
            elif "status" in item:
                assert item["status"] == "incomplete"


def test_nothing_open_adds_nothing() -> None:
    events = _stream(SCRIPTS["message"])
    closing, output = close_open_items(events[:-1], events[-1]["sequence_number"])
    assert closing == [] and output == events[-1]["response"]["output"]
