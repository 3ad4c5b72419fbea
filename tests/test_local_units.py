"""The local back end's pure parts, no model needed: UTF-8 holdback, call parsing, prompt, grammar, checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_cpp")

import itertools

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import ResponseRequest, parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.local import LocalProvider, Utf8Pieces, _Output
from responses_gateway.providers.local_grammar import (
    CallParser,
    GrammarSpec,
    build_grammar,
)
from responses_gateway.providers.local_prompt import call_text, render_prompt

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


# ---------------------------------------------------------------------------------------- UTF-8
def _fake_tokens(text: str, cuts: list[int]) -> list[bytes]:
    """Token pieces as a tokenizer with byte-fallback tokens would produce: cut anywhere."""
    data = text.encode()
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_utf8_holdback_at_every_split_point() -> None:
    text = "añ€🙂z"
    data = text.encode()
    for cut in range(1, len(data)):
        pieces = Utf8Pieces()
        deltas = [pieces.feed(p) for p in _fake_tokens(text, [cut])] + [pieces.flush()]
        assert "".join(deltas) == text
        assert all("\ufffd" not in d for d in deltas)


def test_utf8_emoji_split_over_four_tokens_is_one_delta() -> None:
    pieces = Utf8Pieces()
    emoji = "🙂".encode()
    out = [pieces.feed(emoji[i : i + 1]) for i in range(4)]
    assert out == ["", "", "", "🙂"]


def test_utf8_truncated_character_at_end_becomes_replacement() -> None:
    pieces = Utf8Pieces()
    assert pieces.feed("é".encode()[:1]) == ""
    assert pieces.flush() == "\ufffd"


# ---------------------------------------------------------------------------------------- calls
TWO_CALLS = (
    call_text("get_weather", '{"city": "Pa}ri\\"s", "x": [1, {"y": 2}]} ') + "\n" + call_text("noargs", "{}")
)


def _parse(chunks: list[str]) -> list[tuple[str, str]]:
    parser = CallParser()
    events: list[tuple[str, str]] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    merged: list[tuple[str, str]] = []
    for kind, value in events:
        if kind == "args" and merged and merged[-1][0] == "args":
            merged[-1] = ("args", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


def test_call_parser_every_split_point() -> None:
    expected = [
        ("name", "get_weather"),
        ("args", '{"city": "Pa}ri\\"s", "x": [1, {"y": 2}]}'),
        ("end", ""),
        ("name", "noargs"),
        ("args", "{}"),
        ("end", ""),
    ]
    assert _parse([TWO_CALLS]) == expected
    for cut in range(1, len(TWO_CALLS)):
        assert _parse([TWO_CALLS[:cut], TWO_CALLS[cut:]]) == expected
    assert _parse(list(TWO_CALLS)) == expected


def test_call_parser_rejects_other_text() -> None:
    with pytest.raises(ValueError):
        CallParser().feed("<tool_cal!")


# ---------------------------------------------------------------------------------------- grammar
def test_grammar_free_text_is_unconstrained() -> None:
    assert build_grammar(GrammarSpec()) is None


def test_grammar_names_each_tool_and_bounds_calls() -> None:
    grammar = build_grammar(GrammarSpec(tools=(WEATHER,), allow_text=False, max_calls=3))
    assert grammar is not None
    assert '\\"get_weather\\"' in grammar
    assert '( "\\n" call ){0,2}' in grammar
    single = build_grammar(GrammarSpec(tools=(WEATHER,), allow_text=False, max_calls=1))
    assert single is not None and "root ::= ( call )" in single


def test_grammar_auto_text_branch_excludes_the_call_marker() -> None:
    grammar = build_grammar(GrammarSpec(tools=(WEATHER,)))
    assert grammar is not None
    root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
    assert "( [^<] any* )" in root and '( "<tool_call" [^>] any* )' in root


def test_grammar_keeps_refs_of_two_tools_apart() -> None:
    def tool(name: str, kind: str) -> dict[str, Any]:
        return {
            "type": "function",
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"v": {"$ref": "#/$defs/V"}},
                "required": ["v"],
                "$defs": {"V": {"type": kind}},
            },
        }

    grammar = build_grammar(GrammarSpec(tools=(tool("a", "integer"), tool("b", "boolean")), allow_text=False))
    assert grammar is not None
    assert "integer" in grammar and "boolean" in grammar


# ---------------------------------------------------------------------------------------- prompt
def test_prompt_turns_instructions_and_tools() -> None:
    req = parse_request(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use metric units."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "18C"},
                {"role": "assistant", "content": "It is 18C."},
                {"role": "user", "content": "Thanks"},
                {"role": "user", "content": "Bye"},
            ],
        }
    )
    prompt = render_prompt(req.input, instructions=req.instructions, preamble="TOOLS")
    assert prompt == (
        "<start_of_turn>user\nBe brief.\n\nUse metric units.\n\nTOOLS\n\nWeather in Paris?<end_of_turn>\n"
        '<start_of_turn>model\n<tool_call>{"name": "get_weather", "arguments": {"city":"Paris"}}'
        "</tool_call><end_of_turn>\n"
        "<start_of_turn>user\nResult of get_weather:\n```tool_output\n18C\n```<end_of_turn>\n"
        "<start_of_turn>model\nIt is 18C.<end_of_turn>\n"
        "<start_of_turn>user\nThanks\n\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert "opaque" not in prompt


def test_prompt_starts_with_user_turn_when_history_starts_with_model() -> None:
    prompt = render_prompt(
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]}]
    )
    assert prompt.startswith("<start_of_turn>user\n<end_of_turn>\n<start_of_turn>model\nHi")


# ---------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}],
                    }
                ]
            },
            "input[0].content[0]",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
    ],
)
def test_check_request_rejects_what_it_cannot_honour(body: dict[str, Any], param: str) -> None:
    req = parse_request({"model": "gemma-3-270m", "input": "hi", **body})
    with pytest.raises(ProviderError) as info:
        LocalProvider("/nonexistent.gguf").check_request(req)
    assert info.value.status == 400
    assert info.value.param == param


def test_check_request_rejects_unresolved_item_reference() -> None:
    # The store may resolve references before the provider sees them; any left over are refused.
    req = ResponseRequest(model="gemma-3-270m", input=[{"type": "item_reference", "id": "msg_1"}])
    with pytest.raises(ProviderError) as info:
        LocalProvider("/nonexistent.gguf").check_request(req)
    assert info.value.status == 400 and info.value.param == "input[0]"


def test_check_request_accepts_function_tools_and_schemas() -> None:
    req = parse_request(
        {
            "model": "gemma-3-270m",
            "input": "hi",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )
    LocalProvider("/nonexistent.gguf").check_request(req)
    assert json.loads(json.dumps(req.tools)) == [WEATHER]


# ---------------------------------------------------------------------------------------- output
def _drive_output(pieces: list[str], *, parse_calls: bool) -> list[dict[str, Any]]:
    builder = StreamBuilder(new_response("gemma-3-270m"))
    builder.start()
    out = _Output(builder, parse_calls=parse_calls)
    for piece in pieces:
        out.feed(piece)
    out.finish()
    builder.complete()
    events = builder.take()
    for profile in ("openai", "strict-spec"):
        assert not check(events, profile=profile)
    return events


def test_output_text_that_diverges_from_the_marker_keeps_one_delta_per_piece() -> None:
    events = _drive_output(["<", "to", "ast", " is good"], parse_calls=True)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["<", "to", "ast", " is good"]


def test_output_calls_open_once_the_name_is_known_and_stream_arguments() -> None:
    text = call_text("get_weather", '{"city": "Paris"}') + "\n" + call_text("get_weather", '{"city": "Rome"}')
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    events = _drive_output(pieces, parse_calls=True)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["name"] for e in added] == ["get_weather", "get_weather"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [{"city": "Paris"}, {"city": "Rome"}]
    assert not [e for e in events if e["type"] == "response.output_text.delta"]


def test_output_marker_prefix_at_the_end_is_text() -> None:
    events = _drive_output(["<tool"], parse_calls=True)
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["<tool"]


def test_output_without_calls_is_text_even_if_it_looks_like_one() -> None:
    events = _drive_output([call_text("x", "{}")], parse_calls=False)
    assert events[-1]["response"]["output"][0]["type"] == "message"


def test_output_nothing_generated_is_an_empty_message() -> None:
    events = _drive_output([], parse_calls=True)
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message"]
    assert output[0]["content"][0]["text"] == ""


# ---------------------------------------------------------------------------------------- tool choice
@pytest.mark.parametrize(
    ("choice", "names", "mode"),
    [
        ("auto", ["get_weather", "get_time"], "auto"),
        ("none", ["get_weather", "get_time"], "none"),
        ("required", ["get_weather", "get_time"], "required"),
        ({"type": "function", "name": "get_time"}, ["get_time"], "required"),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]},
            ["get_time"],
            "auto",
        ),
    ],
)
def test_tool_choice_selects_tools_and_mode(choice: Any, names: list[str], mode: str) -> None:
    time_tool = {**WEATHER, "name": "get_time"}
    req = parse_request({"model": "m", "input": "hi", "tools": [WEATHER, time_tool], "tool_choice": choice})
    tools, got = LocalProvider("/nonexistent.gguf")._callable_tools(req)
    assert got == mode
    assert [t["name"] for t in tools] == names
