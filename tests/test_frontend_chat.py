"""``POST /v1/chat/completions`` through the openai SDK against a served gateway.

Scripted back ends show each field's mapping (the script is the model; what the SDK parses is the
gateway's translation); the mock upstreams replay recorded openai-chat, Anthropic and Gemini streams
and the completion must say what ``POST /v1/responses`` says for the same recording on the same
gateway. Every error keeps OpenAI's shape.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.chat_completions import ChatOptions, ChatStream, chat_request
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import DEFAULT_CAPABILITIES, ScriptedProvider
from responses_gateway.server.registry import ModelRegistry
from upstream_mock import UpstreamMock, fixture_reply

JSON = dict[str, Any]

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]

WEATHER_TURNS = {
    "turns": [
        {
            "when": {"input_has": "function_call_output"},
            "steps": [{"message": ["It is ", "sunny in Paris."]}],
        },
        {
            "steps": [
                {"reasoning": {"summary": [["Need ", "the weather"]]}},
                {
                    "function_call": {
                        "name": "get_weather",
                        "arguments": ['{"city":', '"Paris"}'],
                        "call_id": "call_w1",
                    }
                },
                {"usage": {"input_tokens": 20, "output_tokens": 9, "reasoning_tokens": 4}},
            ]
        },
    ]
}


class City(BaseModel):
    name: str
    population: int


SCRIPTED: dict[str, Any] = {
    "plain": [
        {"reasoning": {"summary": [["Think", "ing"]]}},
        {"message": ["Hel", "lo", " there"]},
        {"usage": {"input_tokens": 7, "output_tokens": 3, "cached_tokens": 2}},
    ],
    "weather": WEATHER_TURNS,
    "long": [{"message": ["cut ", "short"]}, {"incomplete": "max_output_tokens"}],
    "broken": [{"message": ["partial"]}, {"fail": {"code": "server_error", "message": "upstream broke"}}],
    "refused": [{"error": {"status": 429, "message": "slow down", "code": "rate_limit_exceeded"}}],
}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Gateway, dict[str, ScriptedProvider]]]:
    providers = {name: ScriptedProvider(script, name=name) for name, script in SCRIPTED.items()}
    structured = dataclasses.replace(DEFAULT_CAPABILITIES, structured_output=True)
    providers["json"] = ScriptedProvider(
        [{"message": ['{"name":"Paris",', '"population":2100000}']}], name="json", capabilities=structured
    )
    gw = start_gateway(list(providers.values()))
    yield gw, providers
    gw.stop()


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "hi"}]


def test_not_streamed_reply_has_text_reasoning_and_usage(scripted: Any) -> None:
    gw, providers = scripted
    completion = _client(gw).chat.completions.create(
        model="plain",
        messages=[{"role": "system", "content": "be brief"}, *USER],
        temperature=0.3,
        max_completion_tokens=50,
        prompt_cache_retention="in_memory",
        extra_body={"prompt_cache_options": {"mode": "implicit"}},
    )
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.system_fingerprint is None
    choice = completion.choices[0]
    assert (choice.message.content, choice.finish_reason, choice.message.role) == (
        "Hello there",
        "stop",
        "assistant",
    )
    assert choice.message.model_extra == {"reasoning_content": "Thinking"}
    assert completion.usage is not None
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (
        7,
        3,
        10,
    )
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 2
    request = providers["plain"].requests[-1]
    assert request.input[0] == {
        "type": "message",
        "role": "system",
        "content": [{"type": "input_text", "text": "be brief"}],
    }
    assert (request.temperature, request.max_output_tokens, request.store) == (0.3, 50, False)
    assert request.prompt_cache_retention == "in-memory"


def test_stream_accumulates_with_the_sdk_helper_and_reports_usage(scripted: Any) -> None:
    gw, _ = scripted
    client = _client(gw)
    chunks = list(
        client.chat.completions.create(
            model="plain", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "") for c in chunks if c.choices
    )
    assert (text, reasoning) == ("Hello there", "Thinking")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10

    with client.chat.completions.stream(model="plain", messages=USER) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == "Hello there"
    assert final.choices[0].message.content == "Hello there"
    assert final.choices[0].finish_reason == "stop"


def test_tool_call_round_trip(scripted: Any) -> None:
    gw, providers = scripted
    client = _client(gw)
    with client.chat.completions.stream(
        model="weather", messages=USER, tools=TOOLS, tool_choice="auto"
    ) as stream:
        events = list(stream)
        first = stream.get_final_completion()
    assert [
        e.arguments_delta
        for e in events
        if e.type == "tool_calls.function.arguments.delta" and e.arguments_delta
    ] == [
        '{"city":',
        '"Paris"}',
    ]
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert (call.id, call.function.name, call.function.parsed_arguments) == (
        "call_w1",
        "get_weather",
        {"city": "Paris"},
    )  # type: ignore[union-attr]

    request = providers["weather"].requests[-1]
    assert request.tools[0]["name"] == "get_weather" and request.tools[0]["strict"] is True
    assert request.tool_choice == "auto"

    second = client.chat.completions.create(
        model="weather",
        messages=[
            *USER,
            message.model_dump(exclude_none=True, exclude={"parsed"}),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 21C"},
        ],
        tools=TOOLS,
    )
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    items = providers["weather"].requests[-1].input
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1]["call_id"] == items[2]["call_id"] == "call_w1"
    assert items[1]["arguments"] == '{"city":"Paris"}' and items[2]["output"] == "sunny, 21C"

    streamed = client.chat.completions.create(model="weather", messages=USER, tools=TOOLS, stream=True)
    calls = [tc for c in streamed for tc in (c.choices[0].delta.tool_calls or [] if c.choices else [])]
    assert calls[0].id == "call_w1" and calls[0].index == 0 and calls[0].function is not None
    assert calls[0].function.name == "get_weather"


def test_structured_output_parses(scripted: Any) -> None:
    gw, providers = scripted
    parsed = _client(gw).chat.completions.parse(model="json", messages=USER, response_format=City)
    assert parsed.choices[0].message.parsed == City(name="Paris", population=2100000)
    fmt = providers["json"].requests[-1].text["format"]
    assert fmt["type"] == "json_schema" and fmt["name"] == "City" and fmt["strict"] is True
    assert fmt["schema"]["properties"]["population"] == {"title": "Population", "type": "integer"}
    _client(gw).chat.completions.create(model="json", messages=USER, response_format={"type": "json_object"})
    assert providers["json"].requests[-1].text["format"] == {"type": "json_object"}


def test_store_keeps_the_run_as_a_response(tmp_path: Path) -> None:
    provider = ScriptedProvider([{"message": ["kept ", "answer"]}], name="m")
    gw = start_gateway([provider], store_url=f"sqlite:///{tmp_path / 'store.db'}")
    try:
        client = _client(gw)
        kept = client.chat.completions.create(model="m", messages=USER, store=True)
        with client.chat.completions.stream(model="m", messages=USER, store=True) as stream:
            streamed = stream.get_final_completion()
        passing = client.chat.completions.create(model="m", messages=USER)
        for completion in (kept, streamed):
            rid = "resp_" + completion.id.removeprefix("chatcmpl-")
            response = client.responses.retrieve(rid)
            assert response.status == "completed" and response.output_text == "kept answer"
            # The events the front end translated are a sound Responses stream.
            check_stream(
                decode_sse(httpx.get(gw.url(f"/v1/responses/{rid}?stream=true"), timeout=30).content)
            )
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve("resp_" + passing.id.removeprefix("chatcmpl-"))
        # A Responses client continues the stored run.
        client.responses.create(
            model="m", input="more", previous_response_id="resp_" + kept.id.removeprefix("chatcmpl-")
        )
        assert [i["type"] for i in provider.requests[-1].input] == ["message", "message", "message"]
        assert provider.requests[-1].input[1]["role"] == "assistant"
    finally:
        gw.stop()


def test_length_and_failures(scripted: Any) -> None:
    gw, _ = scripted
    client = _client(gw)
    long = client.chat.completions.create(model="long", messages=USER)
    assert (long.choices[0].finish_reason, long.choices[0].message.content) == ("length", "cut short")
    chunks = list(client.chat.completions.create(model="long", messages=USER, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"

    # Mid-stream: the chunk OpenAI sends for an error, which the SDK raises; no [DONE] after it.
    with httpx.Client(timeout=30) as http:
        raw = http.post(
            gw.url("/v1/chat/completions"), json={"model": "broken", "messages": USER, "stream": True}
        )
    assert raw.status_code == 200
    frames = [f for f in raw.text.split("\n\n") if f]
    assert json.loads(frames[-1].removeprefix("data: ")) == {
        "error": {"message": "upstream broke", "type": "server_error", "param": None, "code": "server_error"}
    }
    assert "[DONE]" not in raw.text
    with pytest.raises(openai.APIError, match="upstream broke"):
        list(client.chat.completions.create(model="broken", messages=USER, stream=True))
    with pytest.raises(openai.InternalServerError, match="upstream broke"):
        client.chat.completions.create(model="broken", messages=USER)
    # Before the first byte: a plain HTTP error, streamed or not.
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError, match="slow down"):
            client.chat.completions.create(model="refused", messages=USER, stream=stream)


BAD_REQUESTS: list[tuple[JSON, int, str | None, str]] = [
    ({"model": "plain"}, 400, "messages", "Missing required parameter: 'messages'"),
    ({"messages": USER}, 400, "model", "Missing required parameter: 'model'"),
    ({"model": "plain", "messages": []}, 400, "messages", "non-empty"),
    ({"model": "plain", "messages": USER, "n": 9}, 400, "n", "Expected a value <= 8"),
    ({"model": "plain", "messages": USER, "stop": ["\n"] * 5}, 400, "stop", "maximum length 4"),
    ({"model": "plain", "messages": USER, "seed": 3.5}, 400, "seed", "expected an integer"),
    (
        {"model": "plain", "messages": USER, "frobnicate": 1},
        400,
        "frobnicate",
        "Unrecognized request argument",
    ),
    ({"model": "plain", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "'robot'"),
    (
        {
            "model": "plain",
            "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
        },
        400,
        "messages[0].content[0].type",
        "Audio input is not supported",
    ),
    (
        {"model": "plain", "messages": [{"role": "tool", "content": "x"}]},
        400,
        "messages[0].tool_call_id",
        "string",
    ),
    ({"model": "plain", "messages": USER, "tools": [{"type": "custom"}]}, 400, "tools[0].type", "'function'"),
    (
        {"model": "plain", "messages": USER, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "stream",
    ),
    (
        {"model": "plain", "messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format.type",
        "'xml'",
    ),
    ({"model": "plain", "messages": USER, "temperature": 5}, 400, "temperature", "temperature"),
    ({"model": "nope", "messages": USER}, 404, "model", "does not exist"),
    (
        {"model": "plain", "messages": USER, "response_format": {"type": "json_object"}},
        400,
        "response_format",
        "'response_format' (json_object) is not supported with this model",
    ),
    ({"model": "plain", "messages": USER, "logprobs": True}, 400, "logprobs", "logprobs"),
]


@pytest.mark.parametrize(("body", "status", "param", "message"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors(
    scripted: Any, body: JSON, status: int, param: str | None, message: str
) -> None:
    gw, _ = scripted
    with httpx.Client(timeout=30) as http:
        reply = http.post(gw.url("/v1/chat/completions"), json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_not_json_and_bad_key() -> None:
    gw = start_gateway([ScriptedProvider([{"message": "x"}], name="m")], api_keys=["sk-gw-1"])
    try:
        with httpx.Client(timeout=30) as http:
            reply = http.post(
                gw.url("/v1/chat/completions"), content=b"{", headers={"authorization": "Bearer sk-gw-1"}
            )
            assert (
                reply.status_code == 400
                and "could not parse the JSON body" in reply.json()["error"]["message"]
            )
        client = openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=USER)
        ok = openai.OpenAI(base_url=gw.base_url, api_key="sk-gw-1", max_retries=0)
        assert ok.chat.completions.create(model="m", messages=USER).choices[0].message.content == "x"
    finally:
        gw.stop()


# ------------------------------------------------------------------------- recorded upstreams
RECORDINGS: dict[str, tuple[str, ...]] = {
    "openai-chat": (
        "openai-chat__openai-tool-call-args-split-include-usage__pydantic-pydantic-ai.sse",
        "openai-chat__deepseek-reasoner-reasoning-content__vercel-ai.chunks.jsonl",
        "openai-chat__finish-reason-length-gpt-4o__mirascope-mirascope.sse",
    ),
    "anthropic": (
        "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse",
        "anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse",
    ),
    "gemini": (
        "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse",
        "gemini__stream-function-call-thought-signature-gemini-3-pro__pydantic-pydantic-ai.sse",
    ),
}


def upstream_provider(kind: str, url: str) -> Provider:
    """The back end of ``kind`` (openai-chat, anthropic, gemini) in front of a mock upstream at ``url``."""
    if kind == "openai-chat":
        return OpenAIChatProvider(base_url=url + "/v1", api_key="sk-fixtures-000000", upstream_model="gpt")
    if kind == "anthropic":
        return AnthropicProvider(
            base_url=url, api_key="sk-ant-fixtures", upstream_model="claude", max_continuations=0
        )
    return GeminiProvider(
        base_url=url + "/v1beta", api_key="AIzaSyFIXTURES-0123456789ab", upstream_model="gemini-2.5-pro"
    )


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[Gateway, dict[str, UpstreamMock]]]:
    mocks = {kind: UpstreamMock() for kind in RECORDINGS}
    for mock in mocks.values():
        mock.__enter__()
    registry = ModelRegistry()
    for kind, mock in mocks.items():
        registry.add(upstream_provider(kind, mock.url), kind)
    gw = start_gateway(registry)
    yield gw, mocks
    gw.stop()
    for mock in mocks.values():
        mock.__exit__(None, None, None)


def _expected(response: JSON) -> tuple[str, str, list[tuple[str, str]], str]:
    """What a completion must say, from the Response ``POST /v1/responses`` gave for the same recording."""
    text = "".join(
        p["text"]
        for i in response["output"]
        if i["type"] == "message"
        for p in i["content"]
        if p["type"] == "output_text"
    )
    reasoning = "\n\n".join(
        "".join(c["text"] for c in i.get("content") or []) or "\n\n".join(s["text"] for s in i["summary"])
        for i in response["output"]
        if i["type"] == "reasoning"
    )
    reasoning = "\n\n".join(r for r in reasoning.split("\n\n") if r) if reasoning else ""
    calls = [(i["name"], i["arguments"]) for i in response["output"] if i["type"] == "function_call"]
    finish = "length" if response["status"] == "incomplete" else "tool_calls" if calls else "stop"
    return text, reasoning, calls, finish


CASES = [(kind, name) for kind, names in RECORDINGS.items() for name in names]


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[n.split("__")[1] for _, n in CASES])
def test_every_back_end_answers_chat_completions(upstreams: Any, kind: str, name: str) -> None:
    gw, mocks = upstreams
    mocks[kind].reset([fixture_reply(name)])
    with httpx.Client(timeout=30) as http:
        reference = http.post(gw.url("/v1/responses"), json={"model": kind, "input": "hi"})
    assert reference.status_code == 200, reference.text
    text, reasoning, calls, finish = _expected(reference.json())
    assert text or calls  # the recording says something

    client = _client(gw)
    completion = client.chat.completions.create(model=kind, messages=USER)
    message = completion.choices[0].message
    assert (message.content or "") == text
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == calls  # type: ignore[union-attr]
    assert completion.choices[0].finish_reason == finish
    if reasoning:
        assert (message.model_extra or {}).get("reasoning_content", "").replace(
            "\n\n", ""
        ) == reasoning.replace("\n\n", "")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == reference.json()["usage"]["output_tokens"]

    if finish == "length":
        # The SDK's helper raises for a truncated completion; the chunks say it as OpenAI's do.
        with (
            pytest.raises(openai.LengthFinishReasonError),
            client.chat.completions.stream(model=kind, messages=USER) as stream,
        ):
            stream.get_final_completion()
    with client.chat.completions.stream(
        model=kind, messages=USER, stream_options={"include_usage": True}
    ) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.current_completion_snapshot
    assert (final.choices[0].message.content or "") == text
    streamed_calls = [
        (c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls or []
    ]
    assert streamed_calls == calls
    assert final.choices[0].finish_reason == finish
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == reference.json()["usage"]["input_tokens"]
    assert mocks[kind].requests[-1].json is not None


# ------------------------------------------------------------------------- the translator alone
def test_translator_handles_awkward_sequences() -> None:
    body, options = chat_request(
        {
            "model": "m",
            "messages": USER,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
        }
    )
    assert body["include"] == ["message.output_text.logprobs"] and options.include_usage and options.logprobs
    stream = ChatStream(options)
    created = {"type": "response.created", "response": {"id": "resp_abc", "created_at": 5, "model": "m"}}
    out = stream.feed(created) + stream.feed({**created, "type": "response.in_progress"})
    assert [c["choices"][0]["delta"] for c in out] == [{"role": "assistant", "content": "", "refusal": None}]
    # Arguments for a call the translator never saw added are dropped, not misattributed.
    assert (
        stream.feed({"type": "response.function_call_arguments.delta", "item_id": "fc_x", "delta": "{}"})
        == []
    )
    two = [
        {
            "type": "response.output_item.added",
            "item": {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"c{n}",
                "name": "f",
                "arguments": "",
            },
        }
        for n in (1, 2)
    ]
    chunks = stream.feed(two[0]) + stream.feed(two[1])
    chunks += stream.feed(
        {"type": "response.function_call_arguments.delta", "item_id": "fc_2", "delta": "{}"}
    )
    assert [c["choices"][0]["delta"]["tool_calls"][0]["index"] for c in chunks] == [0, 1, 1]
    text = stream.feed(
        {"type": "response.output_text.delta", "delta": "x", "logprobs": [{"token": "x", "logprob": -0.5}]}
    )
    assert text[0]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    end = stream.feed(
        {
            "type": "response.completed",
            "response": {
                "status": "completed",
                "output": [{"type": "function_call"}],
                "usage": {"input_tokens": 1, "output_tokens": 2},
            },
        }
    )
    assert end[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert end[1]["choices"] == [] and end[1]["usage"]["total_tokens"] == 3
    assert stream.done and not stream.failed
    assert stream.feed({"type": "response.output_text.delta", "delta": "late"}) == []
    assert ChatOptions("m", False, False, False).stream is False


def test_silence_is_filled_with_sse_comments() -> None:
    gw = start_gateway(
        [ScriptedProvider([{"message": "early "}, {"sleep": 0.4}, {"message": "late"}], name="m")],
        keepalive_interval=0.1,
    )
    try:
        with httpx.Client(timeout=30) as http:
            raw = http.post(
                gw.url("/v1/chat/completions"), json={"model": "m", "messages": USER, "stream": True}
            )
        assert raw.text.count(": keepalive\n\n") >= 2
        chunks = list(_client(gw).chat.completions.create(model="m", messages=USER, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "early late"
    finally:
        gw.stop()


def test_translator_sends_a_part_that_came_whole_once() -> None:
    stream = ChatStream(ChatOptions("m", True, False, False))
    stream.feed({"type": "response.created", "response": {"id": "resp_1"}})
    streamed = stream.feed(
        {"type": "response.output_text.delta", "item_id": "msg_1", "content_index": 0, "delta": "ab"}
    )
    done = stream.feed(
        {
            "type": "response.output_item.done",
            "item": {
                "type": "message",
                "id": "msg_1",
                "content": [{"type": "output_text", "text": "ab"}, {"type": "refusal", "refusal": "no"}],
            },
        }
    )
    assert [c["choices"][0]["delta"] for c in streamed + done] == [{"content": "ab"}, {"refusal": "no"}]
