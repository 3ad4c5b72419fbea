"""Responses requests -> the exact Chat Completions body the upstream receives; errors; synthetic chunks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fixtures_loader import load_json
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.openai_chat import (
    OpenAIChatProvider,
    build_chat_body,
    decode_reasoning_state,
    encode_reasoning_state,
)
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, json_reply, stream_reply

DONE = [{"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def sent(upstream: UpstreamMock, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """The JSON body the upstream received for the Responses request ``body``."""
    upstream.reset([stream_reply(encode_chunks(DONE, "openai-chat"))])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-test-abcdef123456", **kw)
    events = asyncio.run(drive(provider, body))
    assert events[-1]["type"] == "response.completed"
    request = upstream.requests[-1]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test-abcdef123456"
    result: dict[str, Any] = request.json
    return result


BASE = {"model": "gpt-x", "stream": True, "stream_options": {"include_usage": True}}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": WEATHER["parameters"],
        "strict": True,
    },
}
TOOL_LOOP = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21C"}]},
]
CHAT_TOOL_LOOP = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
]

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("plain", {"input": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}),
    (
        "instructions-and-sampling",
        {
            "input": "hi",
            "instructions": "Be brief.",
            "temperature": 0.2,
            "top_p": 0.9,
            "max_output_tokens": 99,
        },
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 99,
        },
    ),
    (
        "developer-message-becomes-system",
        {"input": [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "go"}]},
        {"messages": [{"role": "system", "content": "Rules."}, {"role": "user", "content": "go"}]},
    ),
    (
        "image-and-text",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,iVBORw0",
                            "detail": "low",
                        },
                        {"type": "input_image", "image_url": "https://x.test/a.jpg", "detail": "auto"},
                    ],
                }
            ]
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0", "detail": "low"},
                        },
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                    ],
                }
            ]
        },
    ),
    (
        "pitfall-03-parallel-calls-share-one-assistant-message",
        {"input": TOOL_LOOP, "tools": [WEATHER]},
        {"messages": CHAT_TOOL_LOOP, "tools": [CHAT_WEATHER]},
    ),
    (
        "assistant-text-then-call-is-one-message",
        {
            "input": [
                {"role": "user", "content": "hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Checking."}],
                },
                {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": ""},
                {"type": "function_call_output", "call_id": "c", "output": "sunny"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [WEATHER],
        },
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "sunny"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [CHAT_WEATHER],
        },
    ),
    (
        "tool-choice-function-and-no-parallel",
        {
            "input": "hi",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
        },
    ),
    (
        "tool-choice-required",
        {"input": "hi", "tools": [WEATHER], "tool_choice": "required"},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_WEATHER], "tool_choice": "required"},
    ),
    (
        "tool-choice-none",
        {"input": "hi", "tools": [WEATHER], "tool_choice": "none"},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_WEATHER], "tool_choice": "none"},
    ),
    (
        "allowed-tools-filter-the-tool-list",
        {
            "input": "hi",
            "tools": [WEATHER, {"type": "function", "name": "other", "parameters": {"type": "object"}}],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
        },
        {"messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_WEATHER], "tool_choice": "required"},
    ),
    (
        "json-schema",
        {
            "input": "hi",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "city",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True},
            },
        },
    ),
    (
        "json-object-and-effort",
        {"input": "hi", "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"}},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
            "reasoning_effort": "low",
        },
    ),
    (
        "logprobs-user-cache-key",
        {"input": "hi", "top_logprobs": 3, "user": "u1", "prompt_cache_key": "k"},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "top_logprobs": 3,
            "user": "u1",
            "prompt_cache_key": "k",
        },
    ),
]


@pytest.mark.parametrize(("request_body", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_request_body(upstream: UpstreamMock, request_body: dict[str, Any], want: dict[str, Any]) -> None:
    assert sent(upstream, {"model": "gpt-x", **request_body}) == {**BASE, **want}


def test_dialect_options(upstream: UpstreamMock) -> None:
    body = sent(
        upstream,
        {
            "model": "alias",
            "input": "hi",
            "instructions": "I",
            "max_output_tokens": 50,
            "reasoning": {"effort": "high"},
        },
        upstream_model="qwen3:8b",
        system_role="developer",
        max_tokens_field="max_completion_tokens",
        effort_style="reasoning",
        include_usage=False,
        extra_body={"options": {"num_ctx": 8192}},
    )
    assert body == {
        "model": "qwen3:8b",
        "stream": True,
        "messages": [{"role": "developer", "content": "I"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 50,
        "reasoning": {"effort": "high"},
        "options": {"num_ctx": 8192},
    }


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
STRUCTURED_AND_NAMED = {
    "model": "m",
    "input": "hi",
    "max_output_tokens": 20,
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}},
    "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "function", "name": "g", "parameters": {"type": "object"}},
    ],
    "tool_choice": {"type": "function", "name": "g"},
}


@pytest.mark.parametrize(
    ("preset", "response_format", "tool_names", "tool_choice", "effort"),
    [
        (
            "openai",
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            ["f", "g"],
            {"type": "function", "function": {"name": "g"}},
            {"reasoning_effort": "low"},
        ),
        (
            "llama-cpp-python",
            {"type": "json_object", "schema": SCHEMA},
            ["f", "g"],
            {"type": "function", "function": {"name": "g"}},
            {},
        ),
        (
            "llama.cpp",
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            ["g"],
            "required",
            {},
        ),
        (
            "ollama",
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            ["g"],
            "required",
            {"reasoning": {"effort": "low"}},
        ),
        (
            "lm-studio",
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            ["g"],
            "required",
            {},
        ),
        (
            "vllm",
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            ["f", "g"],
            {"type": "function", "function": {"name": "g"}},
            {"reasoning_effort": "low"},
        ),
    ],
)
def test_dialect_presets(
    preset: str, response_format: Any, tool_names: list[str], tool_choice: Any, effort: dict[str, Any]
) -> None:
    """How each local server spells structured output, a named tool choice, the limit and reasoning."""
    from responses_gateway.providers.openai_chat import DIALECT_PRESETS, ChatDialect

    dialect = ChatDialect(**DIALECT_PRESETS[preset])
    body = build_chat_body(
        parse_request(STRUCTURED_AND_NAMED), dialect=dialect, base_url="http://localhost:8000/v1"
    )
    assert body["response_format"] == response_format
    assert [t["function"]["name"] for t in body["tools"]] == tool_names
    assert body["tool_choice"] == tool_choice
    assert body["max_tokens"] == 20 and "max_completion_tokens" not in body
    assert {k: body[k] for k in ("reasoning_effort", "reasoning") if k in body} == effort


def test_a_models_file_picks_a_preset_and_overrides_it() -> None:
    from responses_gateway.config import parse_config
    from responses_gateway.providers.registry import ProviderContext, build_provider

    text = (
        "models:\n"
        "  - name: m\n    provider: openai-chat\n    upstream_model: x\n    base_url: http://localhost:8000/v1\n"
        "    options: {dialect: llama-cpp-python, effort_style: reasoning_effort}\n"
        "  - name: bad\n    provider: openai-chat\n    upstream_model: x\n    base_url: http://localhost:8000/v1\n"
        "    options: {dialect: tgi}\n"
    )
    config = parse_config(text, "models.yaml")
    provider: Any = build_provider(config.models[0], ProviderContext())
    inner = getattr(provider, "inner", provider)
    assert inner.dialect.structured_output == "json_object_schema"
    assert inner.dialect.effort_style == "reasoning_effort"  # the model's own key wins over its preset
    with pytest.raises(
        Exception, match=r"models.yaml:11: models\[1\].options.dialect: must be one of .*, not 'tgi'"
    ):
        build_provider(config.models[1], ProviderContext())


def test_max_tokens_field_follows_the_host() -> None:
    request = parse_request({"model": "m", "input": "hi", "max_output_tokens": 70})
    openai = build_chat_body(request, base_url="https://api.openai.com/v1")
    azure = build_chat_body(request, base_url="https://me.openai.azure.com/openai/deployments/x")
    local = build_chat_body(request, base_url="http://localhost:11434/v1")
    assert (openai["max_completion_tokens"], azure["max_completion_tokens"], local["max_tokens"]) == (
        70,
        70,
        70,
    )


def test_pitfall_15_deepseek_reasoning_goes_back_with_the_tool_call(upstream: UpstreamMock) -> None:
    state = encode_reasoning_state({"field": "reasoning_content", "text": "I should call the tool."})
    body = sent(
        upstream,
        {
            "model": "deepseek-reasoner",
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": state},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [WEATHER],
        },
    )
    assistant = body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["reasoning_content"] == "I should call the tool."
    assert assistant["tool_calls"][0]["id"] == "c1"


def test_reasoning_roundtrip_from_a_real_stream(upstream: UpstreamMock) -> None:
    """What a DeepSeek stream produced goes back unchanged in the field it came in."""
    name = "openai-chat__deepseek-reasoner-reasoning-then-tool-call-split-args__vercel-ai.chunks.jsonl"
    upstream.reset([fixture_reply(name)])
    events = asyncio.run(
        drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "weather?"})
    )
    output = events[-1]["response"]["output"]
    body = sent(upstream, {"model": "m", "input": [{"role": "user", "content": "weather?"}, *output]})
    reasoning = "".join(s["text"] for s in output[0]["summary"])
    assert body["messages"][1]["reasoning_content"] == reasoning
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"location": "San Francisco"}'


def test_openrouter_details_go_back_with_signatures(upstream: UpstreamMock) -> None:
    name = "openai-chat__openrouter-streaming-reasoning-details__pydantic-pydantic-ai.sse"
    upstream.reset([fixture_reply(name)])
    events = asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "2+2?"}))
    output = events[-1]["response"]["output"]
    body = sent(upstream, {"model": "m", "input": [{"role": "user", "content": "2+2?"}, *output]})
    assistant = body["messages"][1]
    assert assistant["content"] == "2 + 2 = 4"
    (detail,) = assistant["reasoning_details"]
    assert detail["type"] == "reasoning.text" and detail["format"] == "anthropic-claude-v1"
    assert detail["text"] == "This is a simple arithmetic question. 2+2 equals 4."
    assert detail["signature"].startswith("Et0BCkgIChACGAIqQA2s7h7t")


def test_foreign_reasoning_is_dropped_unless_configured(upstream: UpstreamMock) -> None:
    items = [
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "thought"}],
            "encrypted_content": "gAAA",
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"role": "user", "content": "q2"},
    ]
    plain = sent(upstream, {"model": "m", "input": items})
    assert plain["messages"][1] == {"role": "assistant", "content": "a"}
    forced = sent(upstream, {"model": "m", "input": items}, reasoning_passback="reasoning")
    assert forced["messages"][1] == {"role": "assistant", "content": "a", "reasoning": "thought"}


def test_reasoning_state_envelope() -> None:
    state = {"field": "reasoning", "text": "é\n", "details": [{"type": "reasoning.encrypted", "data": "xyz"}]}
    assert decode_reasoning_state(encode_reasoning_state(state)) == state
    assert decode_reasoning_state("gAAAAB") is None
    assert decode_reasoning_state("rgchat1.!!!") is None


def test_unsupported_tools_are_rejected() -> None:
    provider = OpenAIChatProvider(base_url="http://127.0.0.1:1")
    with pytest.raises(ProviderError) as info:
        provider.check_request(parse_request({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}))
    assert (info.value.status, info.value.param) == (400, "tools[0].type")


@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        (
            "openai-chat__http-401-invalid-api-key-body__mirascope-mirascope.json",
            502,
            "upstream_authentication_error",
        ),
        ("openai-chat__http-404-model-not-found-body__mirascope-mirascope.json", 404, "model_not_found"),
    ],
)
def test_http_errors(upstream: UpstreamMock, name: str, status: int, code: str) -> None:
    upstream.reset([fixture_reply(name)])
    provider = OpenAIChatProvider(base_url=upstream.url, api_key="sk-secret-value-999999")
    with pytest.raises(ProviderError) as info:
        asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert (info.value.status, info.value.code) == (status, code)
    assert "sk-secret-value-999999" not in info.value.message
    assert load_json(name)["error"]["message"].split(" ")[0] in info.value.message


def chunks_stream(upstream: UpstreamMock, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    upstream.reset([stream_reply(encode_chunks(chunks, "openai-chat"), split=True, seed=1, delay=0)])
    events = asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "hi"}))
    assert check(events) == []
    return events


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def call(index: int, **fields: Any) -> dict[str, Any]:
    return delta({"tool_calls": [{"index": index, **fields}]})


def test_pitfall_06_empty_tool_calls_keep_the_text(upstream: UpstreamMock) -> None:
    events = chunks_stream(
        upstream,
        [
            delta({"role": "assistant", "content": "Hello", "tool_calls": []}),
            delta({"tool_calls": []}, "stop"),
        ],
    )
    output = events[-1]["response"]["output"]
    assert [(o["type"], o["content"][0]["text"]) for o in output] == [("message", "Hello")]


def test_pitfall_04_repeated_index_zero_with_new_ids(upstream: UpstreamMock) -> None:
    events = chunks_stream(
        upstream,
        [
            call(0, id="a", function={"name": "f", "arguments": '{"x":1}'}),
            call(0, id="b", function={"name": "g", "arguments": '{"y":2}'}),
            delta({}, "tool_calls"),
        ],
    )
    output = events[-1]["response"]["output"]
    assert [(o["call_id"], o["name"], o["arguments"]) for o in output] == [
        ("a", "f", '{"x":1}'),
        ("b", "g", '{"y":2}'),
    ]


def test_pitfall_05_name_repeated_in_every_chunk_is_set_once(upstream: UpstreamMock) -> None:
    events = chunks_stream(
        upstream,
        [
            call(0, id="a", function={"name": "read_file", "arguments": '{"p":'}),
            call(0, function={"name": "read_file", "arguments": '"x"}'}),
            delta({}, "tool_calls"),
        ],
    )
    (item,) = events[-1]["response"]["output"]
    assert (item["name"], item["arguments"]) == ("read_file", '{"p":"x"}')


def test_pitfall_05_arguments_before_the_name_are_kept(upstream: UpstreamMock) -> None:
    events = chunks_stream(
        upstream,
        [
            call(0, function={"arguments": '{"q"'}),
            call(0, id="z", function={"name": "s", "arguments": ":1}"}),
        ],
    )
    (item,) = events[-1]["response"]["output"]
    assert (item["call_id"], item["name"], item["arguments"]) == ("z", "s", '{"q":1}')


def test_pitfall_14_vllm_reasoning_field(upstream: UpstreamMock) -> None:
    events = chunks_stream(upstream, [delta({"reasoning": "think"}), delta({"content": "answer"}, "stop")])
    output = events[-1]["response"]["output"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": "think"}]
    assert decode_reasoning_state(output[0]["encrypted_content"]) == {"field": "reasoning", "text": "think"}
    assert output[1]["content"][0]["text"] == "answer"


def test_content_filter_is_incomplete(upstream: UpstreamMock) -> None:
    events = chunks_stream(upstream, [delta({"content": "par"}), delta({}, "content_filter")])
    final = events[-1]["response"]
    assert (final["status"], final["incomplete_details"]) == ("incomplete", {"reason": "content_filter"})


def test_logprobs_are_mapped(upstream: UpstreamMock) -> None:
    lp = {
        "token": "Hi",
        "logprob": -0.1,
        "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.1}],
    }
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp]}}]}
    events = chunks_stream(upstream, [chunk, delta({}, "stop")])
    (ev,) = [e for e in events if e["type"] == "response.output_text.delta"]
    assert ev["logprobs"] == [
        {
            "token": "Hi",
            "bytes": [72, 105],
            "logprob": -0.1,
            "top_logprobs": [{"token": "Hi", "bytes": [], "logprob": -0.1}],
        }
    ]


def test_upstream_disconnect_mid_stream_fails(upstream: UpstreamMock) -> None:
    body = encode_chunks([delta({"content": "partial"})], "openai-chat")
    upstream.reset([stream_reply(body[: body.index(b"data: [DONE]")])])
    events = asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "hi"}))
    assert check(events) == []
    assert events[-1]["type"] == "response.failed"
    assert orjson.dumps(events[-1]["response"]["output"][0]["content"][0]["text"]) == b'"partial"'


def test_error_body_with_status_200_fails_the_response(upstream: UpstreamMock) -> None:
    upstream.reset([json_reply({"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}})])
    events = asyncio.run(drive(OpenAIChatProvider(base_url=upstream.url), {"model": "m", "input": "hi"}))
    assert check(events) == []
    assert events[-1]["response"]["error"] == {"code": "rate_limit_exceeded", "message": "Rate limit reached"}
