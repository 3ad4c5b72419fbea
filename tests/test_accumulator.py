"""Accumulator: builder round trips, the dialects of other servers, and the discrepancies it reports."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from responses_gateway.protocol import StreamBuilder, new_response
from responses_gateway.protocol.accumulator import Accumulator, accumulate
from responses_gateway.protocol.sse import EventStreamDecoder, encode_event

JSON = dict[str, Any]


def build(script: Callable[[StreamBuilder], None]) -> list[JSON]:
    """Run a builder script and return its events as they would be sent (serialized at emit time)."""
    builder = StreamBuilder(new_response("test-model"))
    builder.start()
    events: list[JSON] = []
    script(builder)
    # Each event is copied on its own, as a server serializes each event when it sends it.
    events += [copy.deepcopy(e) for e in builder.take()]
    return events


def over_the_wire(events: list[JSON]) -> list[JSON]:
    """Encode, then decode in 7-byte chunks."""
    wire = b"".join(encode_event(e) for e in events)
    decoder = EventStreamDecoder()
    out: list[JSON] = []
    for pos in range(0, len(wire), 7):
        out += decoder.feed(wire[pos : pos + 7])
    return out + decoder.flush()


def round_trip(events: list[JSON]) -> Accumulator:
    """Accumulate the events directly and from the wire; both must agree with the terminal snapshot."""
    direct = accumulate(events)
    wired = accumulate(over_the_wire(events))
    for acc in (direct, wired):
        assert acc.discrepancies == []
        assert acc.unknown_events == []
        assert acc.terminal is not None
        assert acc.items == events[-1]["response"]["output"]
        assert acc.response == events[-1]["response"]
    assert wired.items == direct.items
    return direct


def stepwise(script: Callable[[StreamBuilder, list[JSON]], None]) -> list[JSON]:
    """Like :func:`build`, but the script drains (copies) events itself between calls."""
    builder = StreamBuilder(new_response("test-model"))
    builder.start()
    events: list[JSON] = []
    drain(builder, events)
    script(builder, events)
    drain(builder, events)
    return events


def drain(builder: StreamBuilder, events: list[JSON]) -> None:
    events += [copy.deepcopy(e) for e in builder.take()]


# ---------------------------------------------------------------------------------------- round trips


def test_text_with_annotations() -> None:
    def script(b: StreamBuilder, ev: list[JSON]) -> None:
        msg = b.open_message(phase="final_answer")
        for piece in ("Hel", "lo, ", "wörld 😀"):
            b.text_delta(msg, piece)
            drain(b, ev)
        b.annotation(msg, {"type": "url_citation", "url": "https://x.test", "start_index": 0, "end_index": 5})
        b.text_delta(msg, "!")
        b.close_message(msg)
        b.set_usage(3, 4)
        b.complete()

    acc = round_trip(stepwise(script))
    (item,) = acc.items
    part = item["content"][0]
    assert part["text"] == "Hello, wörld 😀!"
    assert part["annotations"][0]["url"] == "https://x.test"
    assert item["phase"] == "final_answer"
    assert acc.response["usage"]["total_tokens"] == 7


def test_streamed_text_is_reconstructed_before_the_done() -> None:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    msg = builder.open_message()
    builder.text_delta(msg, "par")
    builder.text_delta(msg, "tial")
    acc = Accumulator().feed_all(copy.deepcopy(builder.take()))
    assert acc.items[0]["content"][0]["text"] == "partial"
    assert acc.response["status"] == "in_progress"
    acc.end()
    response = acc.response
    assert response["status"] == "incomplete"
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "partial"


def test_two_text_parts_in_one_message() -> None:
    def script(b: StreamBuilder) -> None:
        msg = b.open_message()
        b.text_delta(msg, "one")
        b.open_text(msg)
        b.text_delta(msg, "two")
        b.complete()

    acc = round_trip(build(script))
    assert [p["text"] for p in acc.items[0]["content"]] == ["one", "two"]


@pytest.mark.parametrize("spelling", ["reasoning_text", "reasoning"])
def test_reasoning_summary_raw_and_encrypted(spelling: Any) -> None:
    builder = StreamBuilder(new_response("m"), raw_reasoning=spelling)
    builder.start()
    item = builder.open_reasoning()
    builder.summary_delta(item, "**Plan**")
    builder.summary_delta(item, " first")
    builder.open_summary_part(item)
    builder.summary_delta(item, "second part")
    builder.reasoning_delta(item, "raw ")
    builder.reasoning_delta(item, "thoughts")
    builder.set_encrypted_content(item, "opaque-signature")
    builder.close_reasoning(item)
    builder.message("answer")
    builder.complete()
    events = copy.deepcopy(builder.take())
    assert f"response.{spelling}.delta" in {e["type"] for e in events}
    acc = round_trip(events)
    reasoning = acc.items[0]
    assert [s["text"] for s in reasoning["summary"]] == ["**Plan** first", "second part"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "raw thoughts"}]
    assert reasoning["encrypted_content"] == "opaque-signature"


def test_parallel_function_calls_interleaved() -> None:
    def script(b: StreamBuilder, ev: list[JSON]) -> None:
        first = b.open_function_call("get_weather", call_id="call_1")
        second = b.open_function_call("get_time", call_id="call_2")
        for a, c in (('{"city":', '{"tz":'), ('"Paris"}', '"CET"}')):
            b.arguments_delta(first, a)
            b.arguments_delta(second, c)
            drain(b, ev)
        b.close_function_call(second)
        b.close_function_call(first)
        b.function_call("no_args", "")
        b.complete()

    acc = round_trip(stepwise(script))
    calls = acc.items
    assert [(c["name"], c["call_id"], c["arguments"]) for c in calls[:2]] == [
        ("get_weather", "call_1", '{"city":"Paris"}'),
        ("get_time", "call_2", '{"tz":"CET"}'),
    ]
    assert calls[2]["arguments"] == "{}"


def test_custom_tool_call() -> None:
    def script(b: StreamBuilder) -> None:
        call = b.open_custom_tool_call("apply_patch", call_id="call_9")
        b.custom_input_delta(call, "*** Begin Patch\n")
        b.custom_input_delta(call, "*** End Patch")
        b.close_custom_tool_call(call)
        b.complete()

    acc = round_trip(build(script))
    assert acc.items[0]["input"] == "*** Begin Patch\n*** End Patch"
    assert acc.items[0]["type"] == "custom_tool_call"


def test_built_in_tool_calls() -> None:
    def script(b: StreamBuilder, ev: list[JSON]) -> None:
        search = b.open_tool_call("web_search_call")
        b.tool_progress(search, "searching")
        drain(b, ev)
        b.close_tool_call(search, action={"type": "search", "query": "q"})
        files = b.open_tool_call("file_search_call", queries=["q"])
        b.tool_progress(files, "searching")
        b.close_tool_call(files, results=None)
        code = b.open_tool_call("code_interpreter_call", container_id="cntr_1", code="", outputs=None)
        b.code_delta(code, "print(")
        b.code_delta(code, "1)")
        drain(b, ev)
        b.tool_progress(code, "interpreting")
        b.close_tool_call(code, outputs=[{"type": "logs", "logs": "1\n"}])
        image = b.open_tool_call("image_generation_call")
        b.tool_progress(image, "generating")
        b.partial_image(image, "cGFydGlhbA==", 0)
        b.close_tool_call(image, result="ZmluYWw=")
        listing = b.open_tool_call("mcp_list_tools", server_label="srv", tools=[])
        b.close_tool_call(listing, tools=[{"name": "t", "input_schema": {}}])
        mcp = b.open_tool_call("mcp_call", name="t", server_label="srv", arguments="")
        b.arguments_delta(mcp, '{"a":')
        b.arguments_delta(mcp, "1}")
        b.close_tool_call(mcp, output="ok")
        b.complete()

    acc = round_trip(stepwise(script))
    types = [i["type"] for i in acc.items]
    assert types == [
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_list_tools",
        "mcp_call",
    ]
    by_type = {i["type"]: i for i in acc.items}
    assert by_type["code_interpreter_call"]["code"] == "print(1)"
    assert by_type["mcp_call"]["arguments"] == '{"a":1}'
    assert by_type["image_generation_call"]["result"] == "ZmluYWw="
    assert by_type["web_search_call"]["status"] == "completed"


def test_tool_status_follows_progress_events() -> None:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    item = builder.open_tool_call("web_search_call")
    builder.tool_progress(item, "searching")
    acc = Accumulator().feed_all(copy.deepcopy(builder.take()))
    assert acc.items[0]["status"] == "searching"


def test_image_partial_stands_in_when_the_result_is_missing() -> None:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    image = builder.open_tool_call("image_generation_call")
    builder.partial_image(image, "cGFydA==", 0)
    builder.close_tool_call(image)
    events = copy.deepcopy(builder.take())
    assert accumulate(events).items[0]["result"] == "cGFydA=="


def test_refusal() -> None:
    def script(b: StreamBuilder) -> None:
        msg = b.open_message()
        b.refusal_delta(msg, "I can't ")
        b.refusal_delta(msg, "help with that.")
        b.complete()

    acc = round_trip(build(script))
    assert acc.items[0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]


def test_failure_records_the_error() -> None:
    def script(b: StreamBuilder) -> None:
        msg = b.open_message()
        b.text_delta(msg, "so far")
        b.fail("server_error", "upstream died")

    acc = round_trip(build(script))
    assert acc.status == "failed"
    assert acc.errors[0]["message"] == "upstream died"
    assert acc.response["error"] == {"code": "server_error", "message": "upstream died"}
    assert acc.items[0]["status"] == "incomplete"


def test_incomplete() -> None:
    def script(b: StreamBuilder) -> None:
        b.message("cut")
        call = b.open_function_call("f")
        b.arguments_delta(call, '{"x"')
        b.incomplete("max_output_tokens")

    acc = round_trip(build(script))
    assert acc.status == "incomplete"
    assert acc.response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert acc.items[1]["arguments"] == '{"x"'


def test_queued_then_keepalives() -> None:
    builder = StreamBuilder(new_response("m"))
    builder.start(queued=True)
    acc = Accumulator().feed_all(copy.deepcopy(builder.take()))
    assert acc.status == "queued"
    builder.mark_in_progress()
    builder.keepalive("ping")
    builder.keepalive("in_progress")
    builder.message("hi")
    builder.complete()
    acc.feed_all(copy.deepcopy(builder.take()))
    assert acc.unknown_events == [] and acc.discrepancies == []
    assert acc.response["status"] == "completed"


def test_error_without_terminal_reads_as_failed() -> None:
    acc = Accumulator()
    acc.feed({"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}})
    acc.feed({"type": "error", "code": "rate_limit_exceeded", "message": "slow down"})
    assert acc.response["status"] == "in_progress"
    acc.end()
    assert acc.response["status"] == "failed"
    assert acc.response["error"] == {"code": "rate_limit_exceeded", "message": "slow down"}


# ------------------------------------------------------------------------------------------- dialects


def test_seed_002_dialect() -> None:
    """Open Responses server spellings: text.done, function_call.arguments.*, code_interpreter.call.*."""
    events: list[JSON] = [
        {
            "type": "response.created",
            "event": "response.created",
            "response": {"id": "u1", "status": "running"},
        },
        {
            "type": "response.output_item.added",
            "event": "response.output_item.added",
            "output_index": 0,
            "item": {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            },
        },
        {
            "type": "response.output_text.delta",
            "item_id": "m1",
            "output_index": 0,
            "content_index": 0,
            "delta": "Hi",
        },
        {"type": "response.text.done", "item_id": "m1", "output_index": 0, "content_index": 0, "text": "Hi"},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "function_call", "id": "f1", "call_id": "c1", "name": "f", "arguments": ""},
        },
        {"type": "response.function_call.arguments.delta", "call_id": "c1", "delta": '{"a"'},
        {"type": "response.function_call.arguments.delta", "call_id": "c1", "delta": ":1}"},
        {"type": "response.function_call.arguments.done", "call_id": "c1", "arguments": '{"a":1}'},
        {
            "type": "response.output_item.added",
            "output_index": 2,
            "item": {"type": "code_interpreter_call", "id": "ci1", "status": "in_progress", "code": ""},
        },
        {"type": "response.code_interpreter.in_progress", "item_id": "ci1"},
        {"type": "response.code_interpreter.call.code.delta", "item_id": "ci1", "delta": "1+"},
        {"type": "response.code_interpreter.call.code.delta", "item_id": "ci1", "delta": "1"},
        {"type": "response.code_interpreter.call.code.done", "item_id": "ci1", "code": "1+1"},
        {"type": "response.code_interpreter.call.interpreting", "item_id": "ci1"},
        {"type": "response.code_interpreter.output_text.delta", "item_id": "ci1", "delta": "2"},
        {
            "type": "response.code_interpreter.output_image.delta",
            "item_id": "ci1",
            "mime_type": "image/png",
            "base64": "iVBO",
        },
        {"type": "response.code_interpreter.call.completed", "item_id": "ci1"},
    ]
    acc = accumulate(events)
    assert acc.unknown_events == []
    assert acc.discrepancies == []
    message, call, code = acc.items
    assert message["content"][0]["text"] == "Hi"
    assert call["arguments"] == '{"a":1}'
    assert code["code"] == "1+1"
    assert code["status"] == "completed"
    assert code["outputs"] == [
        {"type": "logs", "logs": "2"},
        {"type": "image", "url": "data:image/png;base64,iVBO"},
    ]
    # No terminal event: the Response is built from what arrived.
    assert acc.response["status"] == "incomplete"
    assert acc.response["id"] == "u1"


def test_seed_003_dialect() -> None:
    """Spec spellings: output_text_annotation.added, reasoning.*, reasoning_summary.*, object deltas."""
    events: list[JSON] = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "reasoning", "id": "r1", "summary": []},
        },
        {
            "type": "response.reasoning.delta",
            "item_id": "r1",
            "output_index": 0,
            "content_index": 0,
            "delta": {"text": "think"},
        },
        {
            "type": "response.reasoning.done",
            "item_id": "r1",
            "output_index": 0,
            "content_index": 0,
            "text": "think",
        },
        {
            "type": "response.reasoning_summary.delta",
            "item_id": "r1",
            "output_index": 0,
            "summary_index": 0,
            "delta": {"text": "sum"},
        },
        {
            "type": "response.reasoning_summary.done",
            "item_id": "r1",
            "output_index": 0,
            "summary_index": 0,
            "text": "sum",
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "message", "id": "m1", "role": "assistant", "content": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "m1",
            "output_index": 1,
            "content_index": 0,
            "delta": "text",
        },
        {
            "type": "response.output_text_annotation.added",
            "item_id": "m1",
            "output_index": 1,
            "content_index": 0,
            "annotation_index": 0,
            "annotation": {"type": "text_annotation", "text": "note", "start": 0, "end": 4},
        },
        {
            "type": "response.output_item.added",
            "output_index": 2,
            "item": {"type": "mcp_call", "id": "mc1", "status": "in_progress", "name": "t", "arguments": ""},
        },
        {"type": "response.mcp_call.arguments.delta", "item_id": "mc1", "output_index": 2, "delta": {"a": 1}},
        {"type": "response.mcp_call.arguments.delta", "item_id": "mc1", "output_index": 2, "delta": {"b": 2}},
        {
            "type": "response.mcp_call.arguments.done",
            "item_id": "mc1",
            "output_index": 2,
            "arguments": {"a": 1, "b": 2},
        },
        {"type": "response.mcp_call.completed", "item_id": "mc1", "output_index": 2},
    ]
    acc = accumulate(events)
    assert acc.unknown_events == []
    assert acc.discrepancies == []
    reasoning, message, mcp = acc.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "sum"}]
    assert message["content"][0]["annotations"][0]["text"] == "note"
    assert message["content"][0]["text"] == "text"
    assert orjson.loads(mcp["arguments"]) == {"a": 1, "b": 2}
    assert mcp["status"] == "completed"


def test_rotating_item_ids_fall_back_to_output_index() -> None:
    def script(b: StreamBuilder) -> None:
        b.message("abc")
        b.complete()

    events = build(script)
    rotated = copy.deepcopy(events)
    for n, event in enumerate(rotated):
        if "item_id" in event:
            event["item_id"] = f"rotated-{n}"
    acc = accumulate(rotated)
    assert acc.discrepancies == []
    assert acc.items == events[-1]["response"]["output"]


# -------------------------------------------------------------------------------------- discrepancies


def text_events() -> list[JSON]:
    def script(b: StreamBuilder) -> None:
        msg = b.open_message(item_id="msg_1")
        b.text_delta(msg, "Hello")
        b.text_delta(msg, " world")
        call = b.open_function_call("f", item_id="fc_1")
        b.arguments_delta(call, '{"a":1}')
        b.complete()

    return build(script)


def find(events: list[JSON], kind: str) -> JSON:
    return next(e for e in events if e["type"] == kind)


def test_clean_stream_has_no_discrepancies() -> None:
    assert accumulate(text_events()).discrepancies == []


def test_done_text_differs_from_deltas() -> None:
    events = text_events()
    find(events, "response.output_text.done")["text"] = "Hello there"
    acc = accumulate(events)
    assert acc.discrepancies == [
        "output[0] message msg_1: text[0] deltas give 'Hello world', "
        "response.output_text.done says 'Hello there'",
        "output[0] message msg_1: text[0] earlier done events give 'Hello there', "
        "response.content_part.done says 'Hello world'",
    ]
    # The done value is the server's final word.
    # Each done value is the server's word for the piece from then on; the item's done is the last.
    assert acc.items[0]["content"][0]["text"] == "Hello world"


def test_item_done_differs_from_deltas() -> None:
    events = text_events()
    item = find(events, "response.output_item.done")["item"]
    item["content"][0]["text"] = "Goodbye"
    acc = accumulate(events)
    assert acc.discrepancies == [
        "output[0] message msg_1: text[0] is 'Hello world' from earlier events, "
        "output_item.done has 'Goodbye'",
        "terminal output[0] message msg_1 differs from the streamed item in content",
    ]
    assert acc.items[0]["content"][0]["text"] == "Goodbye"


def test_arguments_differ() -> None:
    events = text_events()
    find(events, "response.function_call_arguments.done")["arguments"] = '{"a":2}'
    acc = accumulate(events)
    assert acc.discrepancies == [
        "output[1] function_call fc_1: arguments[0] deltas give '{\"a\":1}', "
        "response.function_call_arguments.done says '{\"a\":2}'",
        "output[1] function_call fc_1: arguments[0] is '{\"a\":2}' from earlier events, "
        "output_item.done has '{\"a\":1}'",
    ]


def test_terminal_missing_an_item() -> None:
    events = text_events()
    events[-1]["response"]["output"].pop()
    acc = accumulate(events)
    assert acc.discrepancies == ["terminal output has 1 item(s), the stream produced 2"]
    assert len(acc.response["output"]) == 1


def test_terminal_item_differs() -> None:
    events = text_events()
    events[-1]["response"]["output"][1]["arguments"] = "{}"
    acc = accumulate(events)
    assert acc.discrepancies == [
        "terminal output[1] function_call fc_1 differs from the streamed item in arguments"
    ]


def test_terminal_without_output_uses_streamed_items() -> None:
    events = text_events()
    del events[-1]["response"]["output"]
    acc = accumulate(events)
    assert acc.response["output"] == acc.items
    assert acc.discrepancies == ["response.completed: snapshot has no output, the stream produced 2 item(s)"]


def test_unknown_and_late_events_are_kept_aside() -> None:
    events = text_events()
    events.insert(3, {"type": "response.future_feature.delta", "x": 1})
    events.append({"type": "response.output_text.delta", "delta": "late"})
    acc = accumulate(events)
    assert [e["type"] for e in acc.unknown_events] == ["response.future_feature.delta"]
    assert acc.discrepancies == ["event 'response.output_text.delta' after the terminal 'response.completed'"]


def test_delta_for_an_item_never_added() -> None:
    acc = accumulate(
        [{"type": "response.output_text.delta", "item_id": "ghost", "content_index": 0, "delta": "x"}]
    )
    assert acc.discrepancies == ["response.output_text.delta for an item that was never added (output[0])"]
    assert acc.items == [
        {
            "type": "message",
            "status": "in_progress",
            "id": "ghost",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "x"}],
        }
    ]


def test_missing_item_done_before_terminal() -> None:
    events = [e for e in text_events() if e["type"] != "response.output_item.done"]
    acc = accumulate(events)
    assert acc.discrepancies == [
        "output[0] message msg_1: no output_item.done before response.completed",
        "output[1] function_call fc_1: no output_item.done before response.completed",
        "terminal output[0] message msg_1 differs from the streamed item in status",
        "terminal output[1] function_call fc_1 differs from the streamed item in status",
    ]


def test_response_id_change_is_reported() -> None:
    events = text_events()
    events[1]["response"]["id"] = "resp_other"
    acc = accumulate(events)
    assert any("response id 'resp_other'" in d for d in acc.discrepancies)


def test_feeding_does_not_mutate_events() -> None:
    events = text_events()
    before = orjson.dumps(events)
    accumulate(events).response  # noqa: B018 - reading the property builds the Response
    assert orjson.dumps(events) == before
