"""``POST /v1/messages`` (and ``/count_tokens``) through the anthropic SDK against a served gateway.

Scripted back ends show each field's mapping; the mock upstreams replay recorded openai-chat,
Anthropic and Gemini streams and the message must say what ``POST /v1/responses`` says for the same
recording on the same gateway. Thinking blocks come back signed by the gateway and are opened again
when a client sends them back; every error is in Anthropic's shape.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from pydantic import BaseModel

from conftest import Gateway, start_gateway
from responses_gateway.protocol.messages import MessagesStream, messages_request
from responses_gateway.protocol.request import RequestError
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.scripted import DEFAULT_CAPABILITIES, ScriptedProvider
from responses_gateway.server.registry import ModelRegistry
from test_frontend_chat import upstream_provider
from upstream_mock import UpstreamMock, fixture_reply, json_reply

JSON = dict[str, Any]
MINTED = re.compile(r"call_[0-9a-f]{24}")

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
USER: list[Any] = [{"role": "user", "content": "hi"}]

SCRIPTED: dict[str, Any] = {
    "think": [
        {"reasoning": {"summary": [["Think", "ing"], "more"], "encrypted_content": "state-42"}},
        {"message": ["Hel", "lo"]},
        {"usage": {"input_tokens": 9, "output_tokens": 4, "cached_tokens": 3}},
    ],
    "weather": {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": "Sunny in Paris."}]},
            {
                "steps": [
                    {"message": "Let me check."},
                    {
                        "function_call": {
                            "name": "get_weather",
                            "arguments": ['{"city":', '"Paris"}'],
                            "call_id": "toolu_1",
                        }
                    },
                ]
            },
        ]
    },
    "long": [{"message": ["cut ", "short"]}, {"incomplete": "max_output_tokens"}],
    "broken": [{"message": ["partial"]}, {"fail": {"code": "server_error", "message": "upstream broke"}}],
    "refused": [{"error": {"status": 429, "message": "slow down", "code": "rate_limit_exceeded"}}],
}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Gateway, dict[str, ScriptedProvider]]]:
    providers = {name: ScriptedProvider(script, name=name) for name, script in SCRIPTED.items()}
    plain = dataclasses.replace(DEFAULT_CAPABILITIES, reasoning=False)
    providers["plain"] = ScriptedProvider([{"message": "ok"}], name="plain", capabilities=plain)
    structured = dataclasses.replace(DEFAULT_CAPABILITIES, structured_output=True)
    providers["json"] = ScriptedProvider(
        [{"message": ['{"name":"Paris",', '"population":2100000}']}], name="json", capabilities=structured
    )
    gw = start_gateway(list(providers.values()), api_keys=["sk-gw-key", "sk-gw-other"])
    yield gw, providers
    gw.stop()


def _client(gw: Gateway, key: str = "sk-gw-key") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.origin, api_key=key, max_retries=0, timeout=30)


def test_message_with_thinking_and_usage(scripted: Any) -> None:
    gw, providers = scripted
    message = _client(gw).messages.create(
        model="think",
        max_tokens=64,
        system=[{"type": "text", "text": "be brief"}],
        messages=USER,
        extra_body={"temperature": 0.5},
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert [b.type for b in message.content] == ["thinking", "text"]
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "Thinking\n\nmore"
    assert "state-42" not in thinking.signature and thinking.signature
    assert message.content[1].type == "text" and message.content[1].text == "Hello"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (
        message.usage.input_tokens,
        message.usage.output_tokens,
        message.usage.cache_read_input_tokens,
    ) == (
        6,
        4,
        3,
    )
    request = providers["think"].requests[-1]
    assert (request.instructions, request.max_output_tokens, request.temperature) == ("be brief", 64, 0.5)
    assert request.reasoning["effort"] == "low" and request.store is False


def test_stream_helper_and_thinking_round_trip(scripted: Any) -> None:
    gw, providers = scripted
    client = _client(gw)
    with client.messages.stream(model="think", max_tokens=64, messages=USER) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "signature" in kinds and "thinking" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].type == "text" and final.content[1].text == "Hello"
    assert final.usage.output_tokens == 4

    # The thinking block goes back as it came: the back end gets its reasoning item, state and all.
    history = [*USER, {"role": "assistant", "content": [b.model_dump() for b in final.content]}]
    client.messages.create(
        model="think", max_tokens=64, messages=[*history, {"role": "user", "content": "more?"}]
    )
    item = providers["think"].requests[-1].input[1]
    assert item["type"] == "reasoning" and item["encrypted_content"] == "state-42"
    assert [s["text"] for s in item["summary"]] == ["Thinking", "more"]

    # Another key's, or altered: refused.
    with pytest.raises(anthropic.BadRequestError, match="Invalid signature"):
        _client(gw, "sk-gw-other").messages.create(model="think", max_tokens=64, messages=[*history, *USER])
    block = final.content[0].model_dump()
    block["signature"] = block["signature"][:-4] + "AAAA"
    with pytest.raises(anthropic.BadRequestError, match="Invalid signature") as info:
        client.messages.create(
            model="think", max_tokens=64, messages=[*USER, {"role": "assistant", "content": [block]}, *USER]
        )
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": info.value.body["error"]["message"]},  # type: ignore[index]
    }


class City(BaseModel):
    name: str
    population: int


def test_output_config_structured_output_and_effort(scripted: Any) -> None:
    gw, providers = scripted
    client = _client(gw)
    parsed = client.messages.parse(
        model="json",
        max_tokens=64,
        messages=USER,
        output_format=City,
        output_config={"effort": "max"},
        extra_body={"cache_control": {"type": "ephemeral"}, "speed": "standard", "inference_geo": "us"},
    )
    assert parsed.parsed_output == City(name="Paris", population=2100000)
    request = providers["json"].requests[-1]
    fmt = request.text["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["properties"]["population"]["type"] == "integer"
    assert request.reasoning["effort"] == "xhigh"
    with client.messages.stream(model="json", max_tokens=64, messages=USER, output_format=City) as stream:
        assert stream.get_final_message().parsed_output == City(name="Paris", population=2100000)
    # A back end that cannot follow a schema: the refusal names the Messages field.
    with pytest.raises(anthropic.BadRequestError, match="'output_config'"):
        client.messages.parse(model="think", max_tokens=64, messages=USER, output_format=City)


def test_tools_round_trip(scripted: Any) -> None:
    gw, providers = scripted
    client = _client(gw)
    with client.messages.stream(
        model="weather",
        max_tokens=64,
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        partial = [e.partial_json for e in stream if e.type == "input_json"]
        first = stream.get_final_message()
    assert partial == ['{"city":', '"Paris"}']
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    use = first.content[1]
    assert use.type == "tool_use" and (use.id, use.name, use.input) == (
        "toolu_1",
        "get_weather",
        {"city": "Paris"},
    )
    request = providers["weather"].requests[-1]
    assert request.tool_choice == "required" and request.parallel_tool_calls is False
    assert request.tools[0]["name"] == "get_weather" and request.tools[0]["parameters"]["required"] == [
        "city"
    ]

    second = client.messages.create(
        model="weather",
        max_tokens=64,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[
            *USER,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "21C"}],
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    )
    assert second.content[0].type == "text" and second.content[0].text == "Sunny in Paris."
    items = providers["weather"].requests[-1].input
    assert [i["type"] for i in items] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[2]["call_id"] == items[3]["call_id"] == "toolu_1"
    assert json.loads(items[2]["arguments"]) == {"city": "Paris"} and items[3]["output"] == "21C"
    assert providers["weather"].requests[-1].tool_choice == {"type": "function", "name": "get_weather"}


def test_stop_reasons_and_failures(scripted: Any) -> None:
    gw, _ = scripted
    client = _client(gw)
    long = client.messages.create(model="long", max_tokens=2, messages=USER)
    assert (
        long.stop_reason == "max_tokens"
        and long.content[0].type == "text"
        and long.content[0].text == "cut short"
    )

    with httpx.Client(timeout=30) as http:
        raw = http.post(
            gw.url("/v1/messages"),
            json={"model": "broken", "max_tokens": 8, "messages": USER, "stream": True},
            headers={"x-api-key": "sk-gw-key"},
        )
    assert raw.status_code == 200
    frames = [f for f in raw.text.split("\n\n") if f]
    assert frames[-1].splitlines()[0] == "event: error"
    assert json.loads(frames[-1].splitlines()[1].removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream broke"},
    }
    assert "message_stop" not in raw.text
    with (
        pytest.raises(anthropic.APIStatusError, match="upstream broke"),
        client.messages.stream(model="broken", max_tokens=8, messages=USER) as stream,
    ):
        stream.get_final_message()
    with pytest.raises(anthropic.InternalServerError, match="upstream broke"):
        client.messages.create(model="broken", max_tokens=8, messages=USER)
    for streamed in (False, True):
        with pytest.raises(anthropic.RateLimitError, match="slow down") as info:
            client.messages.create(model="refused", max_tokens=8, messages=USER, stream=streamed)
        assert info.value.body == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "slow down"},
        }


BAD: list[tuple[JSON, int, str, str]] = [
    ({"model": "think", "messages": USER}, 400, "invalid_request_error", "max_tokens: Field required"),
    ({"model": "think", "max_tokens": 8}, 400, "invalid_request_error", "messages: Field required"),
    ({"max_tokens": 8, "messages": USER}, 400, "invalid_request_error", "model: Field required"),
    ({"model": "think", "max_tokens": 0, "messages": USER}, 400, "invalid_request_error", "max_tokens"),
    (
        {"model": "think", "max_tokens": 8, "messages": USER, "stop_sequences": [""]},
        400,
        "invalid_request_error",
        "stop_sequences",
    ),
    (
        {"model": "think", "max_tokens": 8, "messages": USER, "top_k": 5},
        400,
        "invalid_request_error",
        "top_k",
    ),
    (
        {"model": "think", "max_tokens": 8, "messages": USER, "frobnicate": 1},
        400,
        "invalid_request_error",
        "Extra inputs",
    ),
    (
        {"model": "think", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
        400,
        "invalid_request_error",
        "messages.0.role",
    ),
    (
        {"model": "think", "max_tokens": 8, "messages": USER, "temperature": 1.5},
        400,
        "invalid_request_error",
        "temperature",
    ),
    (
        {
            "model": "think",
            "max_tokens": 8,
            "messages": USER,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        400,
        "invalid_request_error",
        "server tools",
    ),
    (
        {"model": "think", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
        400,
        "invalid_request_error",
        "messages.0.content.0.type",
    ),
    (
        {
            "model": "plain",
            "max_tokens": 8,
            "messages": USER,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        400,
        "invalid_request_error",
        "'thinking'",
    ),
    ({"model": "nope", "max_tokens": 8, "messages": USER}, 404, "not_found_error", "does not exist"),
]


@pytest.mark.parametrize(("body", "status", "etype", "message"), BAD)
def test_bad_requests_get_anthropic_errors(
    scripted: Any, body: JSON, status: int, etype: str, message: str
) -> None:
    gw, _ = scripted
    with httpx.Client(timeout=30) as http:
        reply = http.post(gw.url("/v1/messages"), json=body, headers={"x-api-key": "sk-gw-key"})
    assert reply.status_code == status, reply.text
    payload = reply.json()
    assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
    assert payload["error"]["type"] == etype and message in payload["error"]["message"]


def test_keys_and_malformed_bodies(scripted: Any) -> None:
    gw, _ = scripted
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(gw, "wrong").messages.create(model="think", max_tokens=8, messages=USER)
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }
    with httpx.Client(timeout=30) as http:
        bearer = http.post(
            gw.url("/v1/messages"),
            json={"model": "think", "max_tokens": 8, "messages": USER},
            headers={"authorization": "Bearer sk-gw-key"},
        )
        assert bearer.status_code == 200 and bearer.json()["content"][-1]["text"] == "Hello"
        broken = http.post(gw.url("/v1/messages"), content=b"{", headers={"x-api-key": "sk-gw-key"})
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
        # x-api-key is the Messages routes' header only.
        other = http.post(
            gw.url("/v1/responses"),
            json={"model": "think", "input": "hi"},
            headers={"x-api-key": "sk-gw-key"},
        )
        assert other.status_code == 401 and other.json()["error"]["code"] == "invalid_api_key"


def test_count_tokens_goes_to_the_back_end(scripted: Any) -> None:
    gw, _ = scripted
    with pytest.raises(anthropic.BadRequestError, match="Counting input tokens is not available"):
        _client(gw).messages.count_tokens(model="think", messages=USER)
    with UpstreamMock() as upstream:
        upstream.enqueue(json_reply({"input_tokens": 42}))
        registry = ModelRegistry()
        registry.add(
            AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude"), "claude"
        )
        gw2 = start_gateway(registry)
        try:
            counted = _client(gw2).messages.count_tokens(
                model="claude", system="be brief", messages=USER, tools=TOOLS
            )
        finally:
            gw2.stop()
    assert counted.input_tokens == 42
    sent = upstream.requests[-1]
    assert sent.path.endswith("/v1/messages/count_tokens")
    assert sent.json["system"] == "be brief" or sent.json["system"][0]["text"] == "be brief"
    assert sent.json["tools"][0]["name"] == "get_weather"


# ------------------------------------------------------------------------- recorded upstreams
RECORDINGS: dict[str, tuple[str, ...]] = {
    "openai-chat": (
        "openai-chat__openai-tool-call-args-split-include-usage__pydantic-pydantic-ai.sse",
        "openai-chat__deepseek-reasoner-reasoning-content__vercel-ai.chunks.jsonl",
        "openai-chat__finish-reason-length-gpt-4o__mirascope-mirascope.sse",
    ),
    "anthropic": (
        "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse",
        "anthropic-messages__redacted-thinking-blocks-then-text__pydantic-pydantic-ai.sse",
        "anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse",
    ),
    "gemini": (
        "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse",
        "gemini__stream-function-call-thought-signature-gemini-3-pro__pydantic-pydantic-ai.sse",
    ),
}


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


def _expected(response: JSON) -> tuple[list[tuple[str, Any]], str]:
    """The blocks a message must hold (kind, what it says), from the Response for the same recording."""
    blocks: list[tuple[str, Any]] = []
    for item in response["output"]:
        if item["type"] == "message":
            blocks += [("text", p["text"]) for p in item["content"] if p["type"] == "output_text"]
        elif item["type"] == "function_call":
            blocks.append(("tool_use", (item["name"], json.loads(item["arguments"] or "{}"))))
        elif item["type"] == "reasoning":
            text = "".join(c["text"] for c in item.get("content") or []) or "\n\n".join(
                s["text"] for s in item["summary"]
            )
            if text:
                blocks.append(("thinking", text))
            elif item.get("encrypted_content"):
                blocks.append(("redacted_thinking", None))
    if response["status"] == "incomplete":
        stop = "max_tokens"
    else:
        stop = "tool_use" if any(k == "tool_use" for k, _ in blocks) else "end_turn"
    return blocks, stop


def _said(content: list[Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for block in content:
        if block.type == "text":
            out.append(("text", block.text))
        elif block.type == "tool_use":
            out.append(("tool_use", (block.name, block.input)))
        elif block.type == "thinking":
            assert block.signature
            out.append(("thinking", block.thinking))
        elif block.type == "redacted_thinking":
            assert block.data
            out.append(("redacted_thinking", None))
    return out


CASES = [(kind, name) for kind, names in RECORDINGS.items() for name in names]


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[n.split("__")[1] for _, n in CASES])
def test_every_back_end_answers_messages(upstreams: Any, kind: str, name: str) -> None:
    gw, mocks = upstreams
    mocks[kind].reset([fixture_reply(name)])
    with httpx.Client(timeout=30) as http:
        reference = http.post(
            gw.url("/v1/responses"),
            json={"model": kind, "input": "hi", "include": ["reasoning.encrypted_content"]},
        )
    assert reference.status_code == 200, reference.text
    blocks, stop = _expected(reference.json())
    assert blocks

    client = _client(gw)
    message = client.messages.create(model=kind, max_tokens=256, messages=USER)
    assert _said(message.content) == blocks
    assert message.stop_reason == stop
    usage = reference.json()["usage"]
    assert message.usage.output_tokens == usage["output_tokens"]
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == usage["input_tokens"]

    with client.messages.stream(model=kind, max_tokens=256, messages=USER) as stream:
        final = stream.get_final_message()
    assert _said(final.content) == blocks
    assert final.stop_reason == stop
    assert final.usage.output_tokens == usage["output_tokens"]

    # The blocks go back as they came: the back end is sent the same conversation as when a Responses
    # client sends the same output back (thinking as the back end's own reasoning state included).
    output = reference.json()["output"]
    calls = [i for i in output if i["type"] == "function_call"]
    history = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
    ]
    if calls:
        history.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                    for b in final.content
                    if b.type == "tool_use"
                ],
            }
        )
        follow: list[JSON] = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls
        ]
    else:
        history.append({"role": "user", "content": "go on"})
        follow = [{"role": "user", "content": "go on"}]
    client.messages.create(model=kind, max_tokens=256, messages=history)
    via_messages = mocks[kind].requests[-1].json
    with httpx.Client(timeout=30) as http:
        again = http.post(
            gw.url("/v1/responses"),
            json={"model": kind, "input": [{"role": "user", "content": "hi"}, *output, *follow]},
        )
    assert again.status_code == 200, again.text
    via_responses = mocks[kind].requests[-1].json
    field = "contents" if kind == "gemini" else "messages"
    # Gemini calls that come without an id get one of ours per run (the two runs differ there only).
    assert _unminted(via_messages[field]) == _unminted(via_responses[field])


def _unminted(value: Any) -> str:
    return MINTED.sub("call_minted", orjson.dumps(value).decode())


# ------------------------------------------------------------------------- the translator alone
def _sign(item: JSON) -> str:
    return "sig:" + orjson.dumps({k: item.get(k) for k in ("summary", "encrypted_content")}).decode()


def test_translator_awkward_sequences() -> None:
    stream = MessagesStream("m", _sign)
    out = stream.feed({"type": "response.created", "response": {"id": "resp_1", "model": "m"}})
    assert [name for name, _ in out] == ["message_start", "ping"] and out[0][1]["message"]["id"] == "msg_1"
    assert stream.feed({"type": "response.in_progress", "response": {}}) == []
    # Reasoning with state but no text: one redacted_thinking block, opened and closed at its end.
    redacted = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}
    out = stream.feed({"type": "response.output_item.added", "item": {**redacted, "encrypted_content": None}})
    out += stream.feed({"type": "response.output_item.done", "item": redacted})
    assert [p["type"] for _, p in out] == ["content_block_start", "content_block_stop"]
    assert out[0][1]["content_block"] == {"type": "redacted_thinking", "data": _sign(redacted)}
    # A call whose arguments arrive only when it ends ("{}" for none): sent as one input_json_delta.
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": ""}
    out = stream.feed({"type": "response.output_item.added", "item": call})
    out += stream.feed({"type": "response.output_item.done", "item": {**call, "arguments": "{}"}})
    assert [p.get("delta", {}).get("partial_json") for _, p in out] == [None, "{}", None]
    assert [p["index"] for _, p in out] == [1, 1, 1]
    # Text of a message that is never closed is closed by the end; the failure is Anthropic's error.
    out = stream.feed(
        {"type": "response.output_text.delta", "item_id": "msg_a", "content_index": 0, "delta": "a"}
    )
    out += stream.feed(
        {"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded", "message": "m"}}}
    )
    assert [name for name, _ in out] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "error",
    ]
    assert out[-1][1] == {"type": "error", "error": {"type": "rate_limit_error", "message": "m"}}
    assert stream.failed and stream.feed({"type": "response.output_text.delta", "delta": "late"}) == []


def test_request_translation_keeps_order() -> None:
    def opener(signature: str, param: str) -> JSON:
        raise RequestError("bad", param=param)

    body = messages_request(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"k": 1}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "r", "is_error": True},
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                        },
                    ],
                },
            ],
        },
        opener,
    )
    assert [i["type"] for i in body["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert body["input"][0]["content"][1] == {
        "type": "input_image",
        "image_url": "https://x/y.png",
        "detail": "auto",
    }
    assert body["input"][2]["output"] == "Error: r"
    assert body["input"][3]["content"] == [{"type": "input_text", "text": "doc"}]
    with pytest.raises(RequestError) as info:
        messages_request(
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "thinking", "thinking": "t", "signature": "s"}],
                    }
                ],
            },
            opener,
        )
    assert info.value.param == "messages.0.content.0.signature"


def test_silence_is_filled_with_pings() -> None:
    gw = start_gateway(
        [ScriptedProvider([{"message": "early "}, {"sleep": 0.8}, {"message": "late"}], name="m")],
        keepalive_interval=0.1,
    )
    try:
        with httpx.Client(timeout=30) as http:
            raw = http.post(
                gw.url("/v1/messages"), json={"model": "m", "max_tokens": 8, "messages": USER, "stream": True}
            )
        names = [f.splitlines()[0] for f in raw.text.split("\n\n") if f]
        assert names[0] == "event: message_start" and names.count("event: ping") >= 3
        assert names[-1] == "event: message_stop"
        with _client(gw).messages.stream(model="m", max_tokens=8, messages=USER) as stream:
            assert "".join(stream.text_stream) == "early late"
    finally:
        gw.stop()


def test_a_client_that_leaves_stops_the_back_end() -> None:
    provider = ScriptedProvider([{"message": "first"}, {"sleep": 20}, {"message": "never"}], name="m")
    gw = start_gateway([provider])
    try:
        with (
            httpx.Client(timeout=30) as http,
            http.stream(
                "POST",
                gw.url("/v1/messages"),
                json={"model": "m", "max_tokens": 8, "messages": USER, "stream": True},
            ) as reply,
        ):
            for chunk in reply.iter_text():
                if "first" in chunk:
                    break
        deadline = time.monotonic() + 10
        while provider.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert provider.cancelled == 1
    finally:
        gw.stop()


def test_translator_sends_a_part_that_came_whole_once() -> None:
    stream = MessagesStream("m", _sign)
    stream.feed({"type": "response.created", "response": {"id": "resp_1"}})
    out = stream.feed(
        {"type": "response.output_text.delta", "item_id": "msg_1", "content_index": 0, "delta": "ab"}
    )
    out += stream.feed(
        {
            "type": "response.output_item.done",
            "item": {
                "type": "message",
                "id": "msg_1",
                "content": [{"type": "output_text", "text": "ab"}, {"type": "output_text", "text": "cd"}],
            },
        }
    )
    deltas = [(p["index"], p["delta"]["text"]) for name, p in out if name == "content_block_delta"]
    assert deltas == [(0, "ab"), (1, "cd")]
    assert [name for name, _ in out].count("content_block_stop") == 2


def test_a_claude_code_shaped_request(scripted: Any) -> None:
    """What Claude Code sends: system and tool blocks with cache_control, a metadata user id, thinking,
    a long max_tokens, tool results with cache_control, streamed, on ``/v1/messages?beta=true``."""
    gw, providers = scripted
    body = {
        "model": "weather",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be careful."},
        ],
        "metadata": {"user_id": "user_abc_account_123_session_456"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "temperature": 1,
        "tools": [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Oslo"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_0",
                        "content": [{"type": "text", "text": "rain"}],
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }
    with httpx.Client(timeout=30) as http:
        reply = http.post(
            gw.url("/v1/messages?beta=true"),
            json=body,
            headers={"x-api-key": "sk-gw-key", "anthropic-version": "2023-06-01", "anthropic-beta": "x"},
        )
    assert reply.status_code == 200, reply.text
    names = [f.splitlines()[0] for f in reply.text.split("\n\n") if f]
    assert names[0] == "event: message_start" and names[-1] == "event: message_stop"
    assert "Sunny in Paris." in reply.text
    request = providers["weather"].requests[-1]
    assert request.instructions == "You are Claude Code.\n\nBe careful."
    assert request.reasoning["effort"] == "high" and request.max_output_tokens == 32000
    assert request.safety_identifier == "user_abc_account_123_session_456"
    assert [i["type"] for i in request.input] == ["message", "function_call", "function_call_output"]
