"""Every event and Response the builder emits validates against the openai SDK and Open Responses models.

Known, documented gaps (asserted below, so a change in either direction is noticed):
- ``ping`` (the optional keepalive spelling) is in neither schema; the default keepalive is a repeated
  ``response.in_progress``, which is.
- Built-in tool call items (``web_search_call``, ``custom_tool_call``…) are extensions: the spec's item
  unions reject them, so only core-only responses are spec-valid.
- Raw reasoning validates in the SDK as ``response.reasoning_text.*`` and in the spec as
  ``response.reasoning.*`` (the builder's ``raw_reasoning`` option picks the spelling).
"""

from __future__ import annotations

import typing
from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from responses_gateway.protocol import StreamBuilder, new_response

spec = pytest.importorskip("openresponses_types")

Events = list[dict[str, Any]]


def _union_members(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) is typing.Annotated:
        return _union_members(typing.get_args(tp)[0])
    return typing.get_args(tp)


SDK_EVENTS: dict[str, type[BaseModel]] = {
    value: cls
    for cls in _union_members(ResponseStreamEvent)
    for value in typing.get_args(cls.model_fields["type"].annotation)
}
SPEC_EVENTS: dict[str, type[BaseModel]] = {
    member.value: cls
    for name, cls in vars(spec).items()
    if isinstance(cls, type) and name.endswith("StreamingEvent")
    for member in cls.model_fields["type"].annotation
}
EXTENSION_EVENT_PREFIXES = (
    "response.reasoning_text.",
    "response.custom_tool_call_input.",
    "response.mcp_",
    "response.web_search_call.",
    "response.file_search_call.",
    "response.code_interpreter_call",
    "response.image_generation_call.",
)
CORE_ITEMS = {"message", "function_call", "function_call_output", "reasoning", "compaction"}
LOGPROB = {"token": "hi", "logprob": -0.25, "bytes": [104, 105], "top_logprobs": []}
CITATION = {
    "type": "url_citation",
    "url": "https://example.com",
    "start_index": 0,
    "end_index": 2,
    "title": "E",
}


def wire(events: Events) -> Events:
    decoded: Events = orjson.loads(orjson.dumps(events))
    return decoded


def core_stream(raw: str, finish: str = "complete") -> Events:
    b = StreamBuilder(new_response("m", instructions="be brief"), raw_reasoning=raw)  # type: ignore[arg-type]
    b.start(queued=True)
    b.mark_in_progress()
    b.keepalive()
    r = b.open_reasoning(encrypted_content="opaque")
    b.summary_delta(r, "Plan.")
    b.close_summary_part(r)
    b.reasoning_delta(r, "raw thought")
    b.close_reasoning(r)
    m = b.open_message(phase="final_answer")
    b.text_delta(m, "hi", logprobs=[LOGPROB])
    b.annotation(m, CITATION)
    b.refusal_delta(m, "cannot")
    b.close_message(m)
    f = b.open_function_call("lookup")
    b.arguments_delta(f, '{"q": 1}')
    b.close_function_call(f)
    b.open_message()  # left open: the finish closes it
    b.set_usage(10, 5, cached_tokens=3, reasoning_tokens=2)
    if finish == "complete":
        b.complete()
    elif finish == "incomplete":
        b.incomplete("max_output_tokens")
    else:
        b.fail("server_error", "upstream failed")
    return wire(b.take())


def extension_stream() -> Events:
    b = StreamBuilder(new_response("m"))
    b.start()
    c = b.open_custom_tool_call("apply_patch")
    b.custom_input_delta(c, "*** Begin Patch")
    b.close_custom_tool_call(c)
    ws = b.open_tool_call("web_search_call", action={"type": "search", "query": "q"})
    b.tool_progress(ws, "searching")
    b.close_tool_call(ws, action={"type": "search", "query": "q"})
    fs = b.open_tool_call("file_search_call", queries=["q"])
    b.tool_progress(fs, "searching")
    b.close_tool_call(fs, results=None)
    ci = b.open_tool_call("code_interpreter_call", container_id="cntr", code=None, outputs=None)
    b.tool_progress(ci, "interpreting")
    b.code_delta(ci, "print(1)")
    b.close_tool_call(ci, outputs=[{"type": "logs", "logs": "1"}])
    ig = b.open_tool_call("image_generation_call", result=None)
    b.tool_progress(ig, "generating")
    b.partial_image(ig, "aGk=", 0)
    b.close_tool_call(ig, result="aGk=")
    mc = b.open_tool_call("mcp_call", name="t", server_label="s", arguments="")
    b.arguments_delta(mc, "{}")
    b.close_tool_call(mc, output="ok")
    ml = b.open_tool_call("mcp_list_tools", server_label="s", tools=[])
    b.close_tool_call(ml)
    b.complete()
    return wire(b.take())


def sdk_cases() -> list[tuple[str, dict[str, Any]]]:
    streams = [
        core_stream(raw, finish)
        for raw in ("reasoning_text", "reasoning")
        for finish in ("complete", "incomplete", "fail")
    ]
    streams.append(extension_stream())
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for events in streams:
        for e in events:
            seen.setdefault((e["type"], e.get("item", {}).get("type", "")), e)
    return [(f"{t}:{k}" if k else t, e) for (t, k), e in seen.items()]


SDK_CASES = sdk_cases()


def test_cases_cover_what_the_builder_emits() -> None:
    types = {e["type"] for _, e in SDK_CASES}
    expected = {
        "response.created", "response.queued", "response.in_progress", "response.completed",
        "response.incomplete", "response.failed", "error",
        "response.output_item.added", "response.output_item.done",
        "response.content_part.added", "response.content_part.done",
        "response.output_text.delta", "response.output_text.done", "response.output_text.annotation.added",
        "response.refusal.delta", "response.refusal.done",
        "response.reasoning_summary_part.added", "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.reasoning.delta", "response.reasoning.done",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.code_interpreter_call_code.delta", "response.code_interpreter_call_code.done",
        "response.image_generation_call.partial_image", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
    }  # fmt: skip
    for kind, phases in {
        "web_search_call": ("in_progress", "searching", "completed"),
        "file_search_call": ("in_progress", "searching", "completed"),
        "code_interpreter_call": ("in_progress", "interpreting", "completed"),
        "image_generation_call": ("in_progress", "generating", "completed"),
        "mcp_call": ("in_progress", "completed"),
        "mcp_list_tools": ("in_progress", "completed"),
    }.items():
        expected |= {f"response.{kind}.{phase}" for phase in phases}
    assert expected <= types


@pytest.mark.parametrize(("name", "event"), SDK_CASES, ids=[name for name, _ in SDK_CASES])
def test_event_validates_against_openai_sdk(name: str, event: dict[str, Any]) -> None:
    if event["type"] == "response.reasoning.delta" or event["type"] == "response.reasoning.done":
        # The spec spelling of raw reasoning; the SDK only knows response.reasoning_text.*.
        assert event["type"] not in SDK_EVENTS
        return
    SDK_EVENTS[event["type"]].model_validate(event, strict=True)


@pytest.mark.parametrize(("name", "event"), SDK_CASES, ids=[name for name, _ in SDK_CASES])
def test_event_against_open_responses_spec(name: str, event: dict[str, Any]) -> None:
    model = SPEC_EVENTS.get(event["type"])
    if model is None:
        # Only extension families may fall outside the spec; core items must use spec events.
        assert event["type"].startswith(EXTENSION_EVENT_PREFIXES), event["type"]
        return
    item = event.get("item")
    response = event.get("response")
    extension = (isinstance(item, dict) and item["type"] not in CORE_ITEMS) or (
        isinstance(response, dict) and any(o["type"] not in CORE_ITEMS for o in response["output"])
    )
    if extension:
        with pytest.raises(ValueError):
            model.model_validate(event)
    else:
        model.model_validate(event)


def test_keepalive_ping_is_in_neither_schema() -> None:
    assert "ping" not in SDK_EVENTS and "ping" not in SPEC_EVENTS


@pytest.mark.parametrize("finish", ["complete", "incomplete", "fail"])
def test_final_core_response_validates_against_both(finish: str) -> None:
    final = core_stream("reasoning", finish)[-1]["response"]
    Response.model_validate(final, strict=True)
    spec.ResponseResource.model_validate(final)


def test_final_extension_response_validates_against_sdk_only() -> None:
    final = extension_stream()[-1]["response"]
    Response.model_validate(final, strict=True)
    with pytest.raises(ValueError):
        spec.ResponseResource.model_validate(final)


def test_every_lifecycle_snapshot_is_a_full_response_resource() -> None:
    for event in core_stream("reasoning"):
        if "response" in event:
            spec.ResponseResource.model_validate(event["response"])
            Response.model_validate(event["response"], strict=True)
