"""The sans-IO side of hosted tools: a JSON string field decoded while it streams, and the builder
showing a model's call to a hosted function as the tool's own item, turn by turn."""

from __future__ import annotations

import json

import pytest

from conftest import check_stream
from responses_gateway.protocol.builder import BuilderError, HostedSpec, StreamBuilder
from responses_gateway.protocol.json_field import StringFieldStream
from responses_gateway.protocol.response import new_response

CODES = [
    "print('hi')",
    'x = "quoted \\\\ backslash"\nprint(x)\t# tab',
    "s = 'caf\u00e9 \u2603 \U0001f600'",  # é, ☃ and an emoji (a surrogate pair when escaped)
    "",
]


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_field_decodes_the_same_at_every_split(code: str, ascii_only: bool) -> None:
    arguments = json.dumps({"code": code, "other": 1}, ensure_ascii=ascii_only)
    for a in range(len(arguments) + 1):
        for b in range(a, len(arguments) + 1, 3):
            stream = StringFieldStream("code")
            out = "".join(stream.feed(piece) for piece in (arguments[:a], arguments[a:b], arguments[b:]))
            value, rest = stream.finish(arguments)
            assert value == code and out + rest == code, (a, b)
            assert rest == ""  # the field is the first key: all of it streamed


def test_a_field_that_is_not_the_first_key_arrives_whole_at_the_end() -> None:
    arguments = json.dumps({"language": "python", "code": "print(1)"})
    stream = StringFieldStream("code")
    assert stream.feed(arguments) == ""
    assert stream.finish(arguments) == ("print(1)", "print(1)")


def test_malformed_arguments_give_no_value() -> None:
    stream = StringFieldStream("code")
    stream.feed('{"code": "abc')
    assert stream.finish('{"code": "abc') == (None, "")
    assert StringFieldStream("code").finish('{"code": 3}') == (None, "")


def _builder() -> StreamBuilder:
    builder = StreamBuilder(new_response("m"))
    builder.hosted = {
        "code_interpreter": HostedSpec(
            "code_interpreter_call", {"code": "", "container_id": "cntr_1", "outputs": None}, "code"
        )
    }
    builder.start()
    return builder


def test_a_hosted_call_is_shown_as_the_tools_item_and_left_for_the_engine() -> None:
    builder = _builder()
    builder.defer_finish = True
    item = builder.open_function_call("code_interpreter", call_id="call_1")
    assert item.kind == "code_interpreter_call" and item.call is not None
    for piece in ['{"co', 'de": "print(', "1)\\n", '"}']:
        builder.arguments_delta(item, piece)
    builder.close_function_call(item)
    builder.complete()  # the back end's turn ends; the Response does not
    assert builder.turn_status == ("completed", None) and not builder.finished
    assert builder.hosted_pending() == [item] and item.data["code"] == "print(1)\n"
    with pytest.raises(BuilderError):
        builder.arguments_delta(item, "more")
    # The engine runs it, then the next turn answers and the Response completes.
    builder.tool_progress(item, "interpreting")
    builder.close_tool_call(item, outputs=[{"type": "logs", "logs": "1\n"}])
    builder.defer_finish = False
    builder.message("Done.")
    builder.complete()
    events = builder.take()
    check_stream(events, strict=False)
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    assert [e["delta"] for e in events if e["type"].endswith("_code.delta")] == ["print(", "1)\n"]
    assert events[-1]["response"]["output"][0]["outputs"] == [{"type": "logs", "logs": "1\n"}]


def test_a_failure_closes_hosted_items_too() -> None:
    builder = _builder()
    builder.defer_finish = True
    item = builder.open_function_call("code_interpreter")
    builder.arguments_delta(item, '{"code": "x"}')
    builder.close_function_call(item)
    builder.fail("server_error", "upstream broke")
    events = builder.take()
    check_stream(events, strict=False)
    assert builder.finished and events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_other_functions_are_untouched() -> None:
    builder = _builder()
    item = builder.open_function_call("get_weather")
    assert item.kind == "function_call" and item.call is None


def test_lone_surrogates_never_reach_an_event() -> None:
    # A model may write "\ud800" alone; an event must stay encodable as UTF-8 (the stream would break).
    stream = StringFieldStream("code")
    text = stream.feed('{"code": "a\\ud800b') + stream.feed('\\udc00"}')
    value, rest = stream.finish('{"code": "a\\ud800b\\udc00"}')
    assert (text + rest).encode("utf-8") and value is not None and value.encode("utf-8")
    assert text == "a\ufffdb\ufffd"


def test_a_hosted_call_cut_short_is_closed_not_left_to_run() -> None:
    builder = _builder()
    builder.defer_finish = True
    item = builder.open_function_call("code_interpreter")
    builder.arguments_delta(item, '{"code": "import os; os.remove(')
    builder.close_function_call(item, status="incomplete")
    builder.incomplete("max_output_tokens")
    assert builder.hosted_pending() == [] and item.data["status"] == "incomplete"
    events = builder.take()
    assert "response.code_interpreter_call_code.done" in [e["type"] for e in events]


def test_code_streamed_into_an_item_whose_code_is_not_text() -> None:
    # A passthrough upstream announcing a code_interpreter_call with a number for its code, then streaming
    # code: the item's code is the streamed text, and failing the response closes it cleanly (this used
    # to raise TypeError while joining the code).
    builder = StreamBuilder(new_response("m"))
    builder.start()
    item = builder.open_item("code_interpreter_call", {"code": 5, "container_id": "cntr_1", "outputs": None})
    builder.code_delta(item, "print(1)")
    builder.fail("server_error", "the upstream closed the connection")
    events = builder.take()
    done = next(e for e in events if e["type"] == "response.code_interpreter_call_code.done")
    assert done["code"] == "print(1)"
    assert events[-1]["type"] == "response.failed"
