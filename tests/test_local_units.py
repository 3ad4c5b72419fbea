"""The local back end's pure parts, no model needed: UTF-8 holdback, call parsing, prompt, grammar, checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_cpp")

import itertools

from responses_gateway.protocol.request import ResponseRequest, parse_request
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.local import LocalProvider, Utf8Pieces
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
