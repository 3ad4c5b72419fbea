"""Custom tools (Codex's ``apply_patch``) on the embedded model.

The model sees a custom tool as a function taking one JSON string ``input`` and writes its call under
the grammar; the call becomes a ``custom_tool_call`` whose input streams as the string is written. The
unit tests need no model; the last one (marked ``model``) runs the real model through a gateway with
the openai SDK: a forced custom tool call, then the next turn with its ``custom_tool_call_output``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_cpp")

from conftest import check_stream, start_gateway
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.local import LocalProvider, _Output
from responses_gateway.providers.local_prompt import call_text, render_prompt, tool_preamble

JSON = dict[str, Any]

GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch"'
APPLY_PATCH: JSON = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
WEATHER: JSON = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+say "hi" \\ é\n*** End Patch'


def _request(**body: Any) -> Any:
    return parse_request({"model": "gemma-3-270m", "input": "hi", **body})


def test_check_request_accepts_custom_tools_and_forcing_one() -> None:
    provider = LocalProvider("/nonexistent.gguf")
    request = _request(tools=[WEATHER, APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"})
    provider.check_request(request)
    tools, mode = provider._callable_tools(request)
    assert mode == "required"
    assert tools == [
        {
            "type": "function",
            "name": "apply_patch",
            "parameters": {
                "type": "object",
                "properties": {
                    "input": {"type": "string", "description": "The raw input for the tool, as one string."}
                },
                "required": ["input"],
                "additionalProperties": False,
            },
            "description": f"Edit files with a patch.\n\nThe input must match this lark grammar:\n{GRAMMAR}",
        }
    ]
    allowed = _request(
        tools=[WEATHER, APPLY_PATCH],
        tool_choice={
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "custom", "name": "apply_patch"}],
        },
    )
    assert [t["name"] for t in provider._callable_tools(allowed)[0]] == ["apply_patch"]


def test_grammar_makes_the_input_one_json_string_and_the_prompt_describes_the_format() -> None:
    provider = LocalProvider("/nonexistent.gguf")
    request = _request(tools=[APPLY_PATCH], tool_choice="required")
    spec, grammar, mode = provider._grammar(request)
    assert grammar is not None and mode == "required"
    assert '{\\"name\\": \\"apply_patch\\", \\"arguments\\": "' in grammar
    assert "input" in grammar
    preamble = tool_preamble(list(spec.tools), required=True)
    assert "apply_patch" in preamble and "lark grammar" in preamble


def test_other_tool_types_are_still_refused() -> None:
    with pytest.raises(ProviderError) as info:
        LocalProvider("/nonexistent.gguf").check_request(_request(tools=[{"type": "code_interpreter"}]))
    assert (info.value.status, info.value.param) == (400, "tools[0].type")


def test_history_renders_the_call_and_its_output_for_the_model() -> None:
    prompt = render_prompt(
        [
            {"role": "user", "content": [{"type": "input_text", "text": "Add a.txt"}]},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
        ]
    )
    assert call_text("apply_patch", json.dumps({"input": PATCH})) in prompt
    assert "Result of apply_patch:\n```tool_output\nDone\n```" in prompt


def test_output_turns_a_custom_tool_call_into_a_streamed_custom_tool_call() -> None:
    text = call_text("apply_patch", json.dumps({"input": PATCH}, ensure_ascii=False))
    text += "\n" + call_text("get_weather", '{"city": "Paris"}')
    builder = StreamBuilder(new_response("gemma-3-270m"))
    builder.start()
    out = _Output(builder, parse_calls=True, custom=frozenset({"apply_patch"}))
    for at in range(0, len(text), 3):
        out.feed(text[at : at + 3])
    out.finish()
    builder.complete()
    events = builder.take()
    check_stream(events, strict=False)
    assert not check(events, profile="codex")
    custom, function = events[-1]["response"]["output"]
    assert (custom["type"], custom["name"], custom["input"]) == ("custom_tool_call", "apply_patch", PATCH)
    assert (function["type"], json.loads(function["arguments"])) == ("function_call", {"city": "Paris"})
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == PATCH and len(deltas) > 10


@pytest.mark.model
def test_forced_custom_tool_call_and_its_output_over_http() -> None:
    openai = pytest.importorskip("openai")
    provider = LocalProvider(seed=3)
    gw = start_gateway([provider])
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="test", max_retries=0, timeout=120)
        tools = [APPLY_PATCH]
        stream = client.responses.create(
            model="local",
            input="Create the file a.txt containing hello.",
            tools=tools,
            tool_choice={"type": "custom", "name": "apply_patch"},
            max_output_tokens=60,
            stream=True,
        )
        events = [event.to_dict() for event in stream]
        check_stream(events, strict=False)
        assert not check(events, profile="codex")
        first = events[-1]["response"]
        call = first["output"][0]
        assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == "response.custom_tool_call_input.delta" and e["item_id"] == call["id"]
        ]
        assert "".join(deltas) == call["input"]
        if call["status"] == "completed":
            # The grammar closed the JSON string: the input is the decoded string, not JSON text.
            assert not call["input"].startswith('{"input"')
        result = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done"}
        history = [{"role": "user", "content": "Create the file a.txt containing hello."}, call, result]
        second = client.responses.create(model="local", input=history, tools=tools, max_output_tokens=24)
        assert second.status in ("completed", "incomplete")
        assert second.output
    finally:
        gw.stop()
