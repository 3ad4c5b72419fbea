"""Custom tools (Codex's freeform ``apply_patch``) through the Chat Completions and Gemini back ends.

Those upstreams only have functions: a custom tool goes up as a function taking one string ``input``
and its call comes back as a ``custom_tool_call``. Checked here: the exact upstream request bodies, the
incremental reading of the string out of streamed argument JSON, and a two-turn loop with the openai SDK
through a real gateway whose upstream is a mock server (the call streamed as
``custom_tool_call_input.delta`` events that pass the checker, then the ``custom_tool_call_output``
reaching the upstream as that function's result).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from conftest import Gateway, check_stream, start_gateway
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.base import Provider, ProviderError
from responses_gateway.providers.custom_tools import InputStream, custom_input
from responses_gateway.providers.gemini import GeminiProvider, build_gemini_body
from responses_gateway.providers.openai_chat import OpenAIChatProvider, build_chat_body
from upstream_mock import Reply, UpstreamMock, drive, encode_chunks, stream_reply

JSON = dict[str, Any]

GRAMMAR = (
    'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?'
)
APPLY_PATCH: JSON = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
SHELL: JSON = {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": False}
# Quotes, backslashes, a tab, non-ASCII and an astral character: every JSON escape a model may write.
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+print("héllo\\tworld")\t😀\n*** End Patch\n'
TOOL_OUTPUT = "Success. Updated the following files:\nA hello.txt\n"
CALL_ID = "call_patch_1"
DESCRIPTION = (
    "Use the `apply_patch` tool to edit files.\n\nThe input must match this lark grammar:\n" + GRAMMAR
)
INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw input for the tool, as one string."}},
    "required": ["input"],
    "additionalProperties": False,
}


# ---------------------------------------------------------------------------------------- InputStream
def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 12))))
    out, prev = [], 0
    for cut in [*cuts, len(text)]:
        out.append(text[prev:cut])
        prev = cut
    return out


def test_input_stream_decodes_the_string_whatever_the_fragment_boundaries() -> None:
    rng = random.Random(11)
    alphabet = ["a", " ", '"', "\\", "\n", "\t", "é", "😀", "\u2028", "/", "\x01", "}", ":"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        # Raw UTF-8, or \\uXXXX escapes (surrogate pairs for the astral character); spaces or none.
        arguments = json.dumps({"input": text}, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.5:
            arguments = arguments.replace('{"input": ', '{ "input" :', 1)
        stream = InputStream()
        deltas = [stream.feed(piece) for piece in _pieces(arguments, rng)]
        deltas.append(stream.finish())
        assert "".join(deltas) == text, arguments
    # Text streams before the arguments are complete.
    stream = InputStream()
    assert stream.feed('{"input": "*** Begin') == "*** Begin"
    assert stream.feed(" Patch\\") == " Patch"
    assert stream.feed('n"}') == "\n"
    assert stream.finish() == ""


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"patch": "*** Begin Patch"}', "*** Begin Patch"),  # the one parameter under another name
        ('"*** Begin Patch"', "*** Begin Patch"),  # a bare JSON string
        ("{}", ""),
        ("", ""),
        ('{"a": 1, "b": 2}', '{"a": 1, "b": 2}'),  # not a string: the arguments as written
        ("*** Begin Patch", "*** Begin Patch"),  # not JSON at all
        ('{"other": "x", "input": "y"}', "y"),
    ],
)
def test_input_of_other_argument_shapes(arguments: str, expected: str) -> None:
    assert custom_input(arguments) == expected
    stream = InputStream()
    assert stream.feed(arguments) + stream.finish() == expected


def test_input_stream_keeps_what_streamed_when_the_json_is_broken() -> None:
    stream = InputStream()
    # A raw newline inside the string is not valid JSON, but the text was already shown.
    assert stream.feed('{"input": "a\nb') == "a\nb"
    assert stream.feed('c"}') == "c"
    assert stream.finish() == ""


# ---------------------------------------------------------------------------------------- request bodies
HISTORY: list[JSON] = [
    {"role": "user", "content": "Add hello.txt"},
    {"type": "custom_tool_call", "call_id": CALL_ID, "name": "apply_patch", "input": PATCH},
    {"type": "custom_tool_call_output", "call_id": CALL_ID, "output": TOOL_OUTPUT},
]


def test_chat_body_sends_a_custom_tool_as_a_function_with_one_string() -> None:
    request = parse_request(
        {
            "model": "m",
            "input": HISTORY,
            "tools": [SHELL, APPLY_PATCH],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
    )
    OpenAIChatProvider(base_url="http://127.0.0.1:1").check_request(request)
    body = build_chat_body(request)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "shell", "parameters": {"type": "object"}, "strict": False},
        },
        {
            "type": "function",
            "function": {"name": "apply_patch", "description": DESCRIPTION, "parameters": INPUT_SCHEMA},
        },
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert body["messages"] == [
        {"role": "user", "content": "Add hello.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": CALL_ID,
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": orjson.dumps({"input": PATCH}).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": CALL_ID, "content": TOOL_OUTPUT},
    ]


def test_chat_body_custom_tool_without_format_and_allowed_tools() -> None:
    tool = {"type": "custom", "name": "note"}
    request = parse_request(
        {
            "model": "m",
            "input": "x",
            "tools": [SHELL, tool],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "custom", "name": "note"}],
            },
        }
    )
    body = build_chat_body(request)
    assert body["tools"] == [{"type": "function", "function": {"name": "note", "parameters": INPUT_SCHEMA}}]
    assert body["tool_choice"] == "required"


def test_gemini_body_sends_a_custom_tool_as_a_function_with_one_string() -> None:
    request = parse_request(
        {
            "model": "gemini-2.5-flash",
            "input": HISTORY,
            "tools": [SHELL, APPLY_PATCH],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
    )
    GeminiProvider(base_url="http://127.0.0.1:1").check_request(request)
    body = build_gemini_body(request)
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {"name": "shell", "parametersJsonSchema": {"type": "object"}},
                {"name": "apply_patch", "description": DESCRIPTION, "parametersJsonSchema": INPUT_SCHEMA},
            ]
        }
    ]
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["apply_patch"]}
    }
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Add hello.txt"}]},
        {
            "role": "model",
            "parts": [{"functionCall": {"id": CALL_ID, "name": "apply_patch", "args": {"input": PATCH}}}],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": CALL_ID,
                        "name": "apply_patch",
                        "response": {"output": TOOL_OUTPUT},
                    }
                }
            ],
        },
    ]


@pytest.mark.parametrize("make", [OpenAIChatProvider, GeminiProvider])
def test_other_tool_types_are_still_refused(make: Callable[..., Provider]) -> None:
    provider = make(base_url="http://127.0.0.1:1")
    request = parse_request({"model": "m", "input": "x", "tools": [{"type": "code_interpreter"}]})
    with pytest.raises(ProviderError) as info:
        provider.check_request(request)
    assert (info.value.status, info.value.param) == (400, "tools[0].type")


# ---------------------------------------------------------------------------------------- upstream replies
def _chat_call(arguments: str, *, step: int) -> Reply:
    """A Chat Completions stream: a little text, then the call's arguments in ``step``-sized fragments."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-x"}
    chunks: list[JSON] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Patching."}}]},
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": CALL_ID,
                                "type": "function",
                                "function": {"name": "apply_patch", "arguments": ""},
                            }
                        ]
                    },
                }
            ],
        },
    ]
    for at in range(0, len(arguments), step):
        piece = arguments[at : at + step]
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        chunks.append({**base, "choices": [{"index": 0, "delta": delta}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 30}})
    return stream_reply(encode_chunks(chunks, "openai-chat"), split=True, seed=9)


def _chat_text() -> Reply:
    base = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "model": "gpt-x"}
    chunks = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Done: hello.txt added."}}],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return stream_reply(encode_chunks(chunks, "openai-chat"))


def _gemini_call(*, streamed: bool) -> Reply:
    """A Gemini stream with the call whole (Gemini API) or its ``$.input`` in pieces (Vertex)."""
    usage = {"promptTokenCount": 50, "candidatesTokenCount": 30}

    def chunk(parts: list[JSON], finish: str | None = None) -> JSON:
        candidate: JSON = {"content": {"role": "model", "parts": parts}}
        if finish:
            candidate["finishReason"] = finish
        return {"candidates": [candidate], "usageMetadata": usage}

    chunks = [chunk([{"text": "Patching."}])]
    if streamed:
        chunks.append(
            chunk(
                [{"functionCall": {"name": "apply_patch", "willContinue": True}, "thoughtSignature": "c2ln"}]
            )
        )
        for at in range(0, len(PATCH), 9):
            arg = {"jsonPath": "$.input", "stringValue": PATCH[at : at + 9], "willContinue": True}
            chunks.append(chunk([{"functionCall": {"partialArgs": [arg], "willContinue": True}}]))
        chunks.append(chunk([{"functionCall": {}}], "STOP"))
    else:
        call = {"functionCall": {"name": "apply_patch", "args": {"input": PATCH}}, "thoughtSignature": "c2ln"}
        chunks.append(chunk([call], "STOP"))
    return stream_reply(encode_chunks(chunks, "gemini"), split=True, seed=10)


def _gemini_text() -> Reply:
    chunks = [
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": "Done: hello.txt added."}]},
                    "finishReason": "STOP",
                }
            ]
        }
    ]
    return stream_reply(encode_chunks(chunks, "gemini"))


# ---------------------------------------------------------------------------------------- over HTTP
@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def gateway_for(tmp_path: Path) -> Iterator[Callable[[Provider], Gateway]]:
    started: list[Gateway] = []

    def factory(provider: Provider) -> Gateway:
        provider.name = "m"
        gw = start_gateway(
            [provider], store_url=f"sqlite://{tmp_path}/data/gateway.db", data_dir=str(tmp_path / "data")
        )
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


def _stream(client: openai.OpenAI, **kwargs: Any) -> tuple[list[JSON], JSON]:
    """One streamed turn: its events (which pass the checker, Codex's profile too) and the Response."""
    stream = client.responses.create(model="m", stream=True, **kwargs)
    events = [event.to_dict() for event in stream]
    check_stream(events, strict=False)  # custom_tool_call is an extension item
    violations = check(events, profile="codex")
    assert not violations, "\n".join(str(v) for v in violations)
    assert events[-1]["type"] == "response.completed", events[-1]
    response: JSON = events[-1]["response"]
    return events, response


def _check_chat_result(sent: JSON, call: JSON) -> None:
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Patching."
    assert messages[1]["tool_calls"] == [
        {
            "id": call["call_id"],
            "type": "function",
            "function": {"name": "apply_patch", "arguments": orjson.dumps({"input": PATCH}).decode()},
        }
    ]
    assert messages[2] == {"role": "tool", "tool_call_id": call["call_id"], "content": TOOL_OUTPUT}
    assert sent["tools"][0]["function"]["parameters"] == INPUT_SCHEMA


def _check_gemini_result(sent: JSON, call: JSON) -> None:
    contents = sent["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    text, part = contents[1]["parts"]
    assert text == {"text": "Patching."}
    assert part == {
        "functionCall": {"id": call["call_id"], "name": "apply_patch", "args": {"input": PATCH}},
        "thoughtSignature": "c2ln",
    }
    assert contents[2]["parts"] == [
        {
            "functionResponse": {
                "id": call["call_id"],
                "name": "apply_patch",
                "response": {"output": TOOL_OUTPUT},
            }
        }
    ]
    assert sent["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == INPUT_SCHEMA


LOOPS: dict[str, tuple[Callable[[str], Provider], Callable[[], tuple[Reply, Reply]], Any]] = {
    "openai-chat": (
        lambda url: OpenAIChatProvider(base_url=url + "/v1", api_key="sk-loop", upstream_model="gpt-x"),
        lambda: (_chat_call(orjson.dumps({"input": PATCH}).decode(), step=5), _chat_text()),
        _check_chat_result,
    ),
    "gemini": (
        lambda url: GeminiProvider(base_url=url, api_key="AIzaSyLOOP-0123456789abcdef", upstream_model="g"),
        lambda: (_gemini_call(streamed=False), _gemini_text()),
        _check_gemini_result,
    ),
    "gemini-vertex-streamed": (
        lambda url: GeminiProvider(base_url=url, api_key="AIzaSyLOOP-0123456789abcdef", upstream_model="g"),
        lambda: (_gemini_call(streamed=True), _gemini_text()),
        _check_gemini_result,
    ),
}


@pytest.mark.parametrize("mode", ["full_history", "previous_response_id"])
@pytest.mark.parametrize("kind", list(LOOPS))
def test_custom_tool_loop_with_the_openai_sdk(
    upstream: UpstreamMock, gateway_for: Callable[[Provider], Gateway], kind: str, mode: str
) -> None:
    make, replies, check_result = LOOPS[kind]
    upstream.reset(list(replies()))
    gw = gateway_for(make(upstream.url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0)
    tools = [APPLY_PATCH, SHELL]

    events, first = _stream(client, input="Add hello.txt", tools=tools)
    kinds = [o["type"] for o in first["output"]]
    # Gemini's thought signature travels in a reasoning item before the call.
    assert kinds == (
        ["message", "custom_tool_call"]
        if kind == "openai-chat"
        else ["message", "reasoning", "custom_tool_call"]
    )
    call = first["output"][-1]
    assert (call["name"], call["input"], call["status"]) == ("apply_patch", PATCH, "completed")
    if kind == "openai-chat":
        assert call["call_id"] == CALL_ID
    deltas = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(e["delta"] for e in deltas) == PATCH
    assert all(e["item_id"] == call["id"] for e in deltas)
    if kind != "gemini":
        # The input streamed as the upstream streamed the arguments, not in one piece at the end.
        assert len(deltas) > 5
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert done["input"] == PATCH
    assert not any(e["type"].startswith("response.function_call_arguments") for e in events)

    result = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": TOOL_OUTPUT}
    if mode == "full_history":
        history = [{"role": "user", "content": "Add hello.txt"}, *first["output"], result]
        _, second = _stream(client, input=history, tools=tools)
    else:
        _, second = _stream(client, input=[result], previous_response_id=first["id"], tools=tools)
    assert second["output"][0]["content"][0]["text"] == "Done: hello.txt added."
    assert len(upstream.requests) == 2
    check_result(upstream.requests[1].json, call)


def test_gateway_accepts_custom_tools_and_forcing_one_for_these_back_ends(
    upstream: UpstreamMock, gateway_for: Callable[[Provider], Gateway]
) -> None:
    upstream.reset([_chat_call(orjson.dumps({"input": PATCH}).decode(), step=64)])
    gw = gateway_for(OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-loop"))
    client = openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0)
    response = client.responses.create(
        model="m",
        input="Add hello.txt",
        tools=[APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    assert response.output[-1].type == "custom_tool_call"
    assert response.output[-1].input == PATCH
    assert upstream.requests[0].json["tool_choice"] == {
        "type": "function",
        "function": {"name": "apply_patch"},
    }


def test_a_call_of_another_shape_still_gives_a_custom_tool_call(upstream: UpstreamMock) -> None:
    """A model that names the one argument differently: the string is still the input."""
    upstream.reset([_chat_call('{"patch": "*** Begin Patch\\n*** End Patch"}', step=4)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1")
    events = asyncio.run(drive(provider, {"model": "m", "input": "x", "tools": [APPLY_PATCH]}))
    check_stream(events, strict=False)
    final = events[-1]["response"]["output"][-1]
    assert (final["type"], final["input"]) == ("custom_tool_call", "*** Begin Patch\n*** End Patch")
