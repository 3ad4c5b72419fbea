"""Responses request -> Anthropic Messages request: exact upstream bodies, headers, and the tool loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from fixtures_loader import load_sse
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.anthropic import (
    AnthropicProvider,
    decode_reasoning_state,
    encode_reasoning_state,
)
from responses_gateway.providers.base import ProviderError
from responses_gateway.sealing import Sealer
from upstream_mock import UpstreamMock, drive, fixture_reply

THINKING = {"type": "thinking", "thinking": "Let me think.\n", "signature": "EqQBCkYIBxgCKkB+sig=="}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def body_for(request: dict[str, Any], **options: Any) -> dict[str, Any]:
    provider = AnthropicProvider(api_key="k", **options)
    req = parse_request({"model": "claude-sonnet-4-5", **request})
    provider.check_request(req)
    return provider.build_body(req)


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "plain string input",
        {"input": "hi"},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("hi")]}], "stream": True},
    ),
    (
        "instructions and system/developer messages are hoisted into system, in order",
        {"instructions": "Be brief.", "input": [
            {"role": "developer", "content": "Use tools."}, user("hi"),
            {"role": "system", "content": [{"type": "input_text", "text": "Late rule."}]},
        ]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192, "system": "Be brief.\n\nUse tools.\n\nLate rule.",
         "messages": [{"role": "user", "content": [text("hi")]}], "stream": True},
    ),
    (
        "multi-turn tool loop: parallel calls share one assistant turn, results one user turn, text after",
        {"input": [
            user("weather?"),
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "toolu_1", "name": "get", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "toolu_2", "name": "get", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "toolu_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "toolu_2", "output": "25C"},
            user("and tomorrow?"),
        ]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192, "messages": [
            {"role": "user", "content": [text("weather?")]},
            {"role": "assistant", "content": [
                text("Checking."),
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get", "input": {"city": "Rome"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "25C"},
                text("and tomorrow?"),
            ]},
        ], "stream": True},
    ),
    (
        "a tool result after user text still leads the user turn; ids are made Anthropic-safe",
        {"input": [
            user("go"),
            {"type": "function_call", "call_id": "call.1:x", "name": "run", "arguments": ""},
            user("(also this)"),
            {"type": "function_call_output", "call_id": "call.1:x",
             "output": [{"type": "input_text", "text": "done"},
                        {"type": "input_image", "image_url": "https://x.test/a.png"}]},
        ]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192, "messages": [
            {"role": "user", "content": [text("go")]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1_x", "name": "run", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1_x", "content": [
                    text("done"), {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}]},
                text("(also this)"),
            ]},
        ], "stream": True},
    ),
    (
        "reasoning items come back as thinking/redacted_thinking, first in the assistant turn",
        {"input": [
            user("q"),
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "edited by client"}],
             "encrypted_content": encode_reasoning_state(THINKING)},
            {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning_state(REDACTED)},
            {"type": "function_call", "call_id": "toolu_9", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "toolu_9", "output": "ok"},
        ], "reasoning": {"effort": "low"}},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192 + 2048, "messages": [
            {"role": "user", "content": [text("q")]},
            {"role": "assistant", "content": [
                THINKING, REDACTED, {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "ok"}]},
        ], "thinking": {"type": "enabled", "budget_tokens": 2048}, "stream": True},
    ),
    (
        "images and documents",
        {"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
            {"type": "input_image", "image_url": "https://x.test/cat.jpg"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"},
            {"type": "input_file", "file_url": "https://x.test/b.pdf"},
            {"type": "input_file", "filename": "n.txt", "file_data": "data:text/plain;base64,aGVsbG8="},
        ]}]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192, "messages": [{"role": "user", "content": [
            text("what is this?"),
            {"type": "image",
             "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
            {"type": "document", "title": "a.pdf",
             "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}},
            {"type": "document", "source": {"type": "url", "url": "https://x.test/b.pdf"}},
            {"type": "document", "title": "n.txt",
             "source": {"type": "text", "media_type": "text/plain", "data": "hello"}},
        ]}], "stream": True},
    ),
    (
        "tools: function, schemaless function, custom, web search with limits; parallel off",
        {"input": "go", "max_tool_calls": 3, "parallel_tool_calls": False, "tools": [
            {"type": "function", "name": "get", "description": "Get it.", "strict": True,
             "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}},
            {"type": "function", "name": "now"},
            {"type": "custom", "name": "apply_patch", "description": "Patch files."},
            {"type": "web_search", "filters": {"allowed_domains": ["python.org"]},
             "user_location": {"type": "approximate", "country": "FR", "city": "Paris"}},
        ]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("go")]}],
         "tools": [
             {"name": "get", "description": "Get it.",
              "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}},
             {"name": "now", "input_schema": {"type": "object", "properties": {}}},
             {"name": "apply_patch", "description": "Patch files.", "input_schema": {
                 "type": "object",
                 "properties": {"input": {"type": "string", "description": "The raw input for the tool."}},
                 "required": ["input"]}},
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 3,
              "allowed_domains": ["python.org"],
              "user_location": {"type": "approximate", "city": "Paris", "country": "FR"}},
         ],
         "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}, "stream": True},
    ),
    (
        "tool_choice required -> any; a forced tool turns thinking off",
        {"input": "go", "tool_choice": "required", "reasoning": {"effort": "high"},
         "tools": [{"type": "function", "name": "f"}]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("go")]}],
         "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
         "tool_choice": {"type": "any"}, "stream": True},
    ),
    (
        "named tool_choice -> tool; none -> none",
        {"input": "go", "tool_choice": {"type": "function", "name": "f"},
         "tools": [{"type": "function", "name": "f"}]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("go")]}],
         "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
         "tool_choice": {"type": "tool", "name": "f"}, "stream": True},
    ),
    (
        "allowed_tools keeps only the allowed ones",
        {"input": "go", "tool_choice": {"type": "allowed_tools", "mode": "required",
                                        "tools": [{"type": "function", "name": "b"}]},
         "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}]},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("go")]}],
         "tools": [{"name": "b", "input_schema": {"type": "object", "properties": {}}}],
         "tool_choice": {"type": "any"}, "stream": True},
    ),
    (
        "max_output_tokens caps the thinking budget below it",
        {"input": "go", "max_output_tokens": 4000, "reasoning": {"effort": "high"}, "temperature": 0.3},
        {"model": "claude-sonnet-4-5", "max_tokens": 4000,
         "messages": [{"role": "user", "content": [text("go")]}],
         "thinking": {"type": "enabled", "budget_tokens": 3999}, "stream": True},
    ),
    (
        "too small a max_output_tokens for thinking: thinking off; temperature clamped, top_p dropped",
        {"input": "go", "max_output_tokens": 1000, "reasoning": {"effort": "medium"}, "temperature": 1.5,
         "top_p": 0.5},
        {"model": "claude-sonnet-4-5", "max_tokens": 1000,
         "messages": [{"role": "user", "content": [text("go")]}], "temperature": 1.0, "stream": True},
    ),
    (
        "effort none, top_p alone, structured output, user id",
        {"input": "go", "reasoning": {"effort": "none"}, "top_p": 0.9, "safety_identifier": "u-42",
         "text": {"format": {"type": "json_schema", "name": "out", "strict": True,
                             "schema": {"type": "object", "properties": {"x": {"type": "integer"}},
                                        "required": ["x"], "additionalProperties": False}}}},
        {"model": "claude-sonnet-4-5", "max_tokens": 8192,
         "messages": [{"role": "user", "content": [text("go")]}], "top_p": 0.9,
         "output_config": {"format": {"type": "json_schema", "schema": {
             "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
             "additionalProperties": False}}},
         "metadata": {"user_id": "u-42"}, "stream": True},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("request_body", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_request_translation(request_body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert body_for(request_body) == expected


def test_upstream_model_and_custom_tool_call_history() -> None:
    body = body_for(
        {
            "input": [
                user("patch"),
                {
                    "type": "custom_tool_call",
                    "call_id": "toolu_c",
                    "name": "apply_patch",
                    "input": "*** Begin",
                },
                {"type": "custom_tool_call_output", "call_id": "toolu_c", "output": "applied"},
            ],
            "tools": [{"type": "custom", "name": "apply_patch"}],
        },
        upstream_model="claude-opus-4-1",
    )
    assert body["model"] == "claude-opus-4-1"
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_c", "name": "apply_patch", "input": {"input": "*** Begin"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_c", "content": "applied"}],
        },
    ]


def test_malformed_arguments_are_wrapped_not_fatal() -> None:
    body = body_for({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]})
    assert body["messages"] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {"input": "{oops"}}],
        }
    ]


def test_strict_tools_option() -> None:
    req = {"input": "go", "tools": [{"type": "function", "name": "f", "strict": True, "parameters": {}}]}
    assert "strict" not in body_for(req)["tools"][0]
    assert body_for(req, strict_tools=True)["tools"][0]["strict"] is True


def test_default_effort_and_max_tokens_options() -> None:
    body = body_for({"input": "go"}, default_effort="minimal", default_max_tokens=1000)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["max_tokens"] == 2024


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools[0].type"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format.type"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
         "input[0].content[0].file_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
         "input[0].content[0].file_id"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ],
)  # fmt: skip
def test_check_request_rejects_what_it_cannot_honour(request_body: dict[str, Any], param: str) -> None:
    with pytest.raises(ProviderError) as info:
        body_for({"input": "x", **request_body})
    assert (info.value.status, info.value.param) == (400, param)


def test_foreign_or_bare_reasoning_items_are_dropped() -> None:
    body = body_for(
        {
            "input": [
                user("q"),
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABopenai-blob"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            ]
        }
    )
    assert body["messages"][1] == {"role": "assistant", "content": [text("a")]}


def test_reasoning_state_envelope_and_sealing() -> None:
    plain = encode_reasoning_state(THINKING)
    assert decode_reasoning_state(plain) == THINKING
    assert decode_reasoning_state("rgant1.!!!") is None
    sealer = Sealer([os.urandom(32)])
    sealed = encode_reasoning_state(THINKING, sealer)
    assert sealed.startswith("rgs1.") and THINKING["signature"] not in sealed
    assert decode_reasoning_state(sealed, sealer) == THINKING
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(ProviderError) as info:
        decode_reasoning_state(tampered, sealer)
    assert info.value.status == 400


# ---------------------------------------------------------------------------------------- on the wire


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def test_headers_path_and_body_on_the_wire(upstream: UpstreamMock) -> None:
    upstream.reset(
        [fixture_reply("anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl")]
    )
    provider = AnthropicProvider(
        base_url=upstream.url + "/v1",
        api_key="sk-ant-secret",
        betas=["a-1", "b-2"],
        upstream_model="claude-x",
    )
    asyncio.run(drive(provider, {"model": "alias", "input": "hi", "instructions": "Be nice."}))
    (req,) = upstream.requests
    assert (req.method, req.path) == ("POST", "/v1/messages")
    assert req.headers["x-api-key"] == "sk-ant-secret"
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert req.headers["anthropic-beta"] == "a-1,b-2"
    assert req.headers["content-type"] == "application/json"
    assert req.json == {
        "model": "claude-x",
        "max_tokens": 8192,
        "system": "Be nice.",
        "messages": [{"role": "user", "content": [text("hi")]}],
        "stream": True,
    }
    assert "sk-ant-secret" not in repr(provider)


@pytest.mark.parametrize("sealed", [False, True], ids=["envelope", "sealed"])
def test_pitfall_01_two_turn_loop_sends_the_signature_back_byte_for_byte(
    upstream: UpstreamMock, sealed: bool
) -> None:
    name = "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse"
    upstream.reset(
        [
            fixture_reply(name, split=True, seed=11),
            fixture_reply("anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"),
        ]
    )
    sealer = Sealer([os.urandom(32)]) if sealed else None
    tools = [{"type": "function", "name": "pelican_name", "parameters": {"type": "object"}}]
    first_input: list[dict[str, Any]] = [{"role": "user", "content": "Name a pelican"}]

    async def loop() -> list[dict[str, Any]]:
        provider = AnthropicProvider(base_url=upstream.url, api_key="k", sealer=sealer)
        req1 = {"model": "claude", "input": first_input, "tools": tools, "reasoning": {"effort": "low"}}
        events = await drive(provider, req1, close=False)
        output: list[dict[str, Any]] = events[-1]["response"]["output"]
        call = next(o for o in output if o["type"] == "function_call")
        second = [
            *first_input,
            *output,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "Pete"},
        ]
        await drive(provider, {**req1, "input": second})
        return output

    output = asyncio.run(loop())
    raw = load_sse(name).decode()
    signature = raw.split('"signature":"', 2)[-1].split('"', 1)[0]
    assert output[0]["type"] == "reasoning"
    sent = upstream.requests[1].json["messages"]
    assistant = sent[1]
    assert assistant["role"] == "assistant"
    thinking = assistant["content"][0]
    assert thinking["type"] == "thinking"
    assert thinking["signature"] == signature
    assert thinking["thinking"] == "".join(s["text"] for s in output[0]["summary"])
    assert assistant["content"][1]["type"] == "tool_use"
    assert assistant["content"][1]["id"] == output[1]["call_id"]
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": output[1]["call_id"], "content": "Pete"}
    ]


def test_prompt_caching_marks_the_stable_prefix() -> None:
    request = {
        "instructions": "System.",
        "prompt_cache_retention": "24h",
        "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning_state(THINKING)},
            {"type": "function_call", "call_id": "t1", "name": "a", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "t1", "output": "r"},
        ],
    }
    control = {"type": "ephemeral", "ttl": "1h"}
    body = body_for(request, prompt_caching=True)
    assert body["system"] == [{"type": "text", "text": "System.", "cache_control": control}]
    assert [t.get("cache_control") for t in body["tools"]] == [None, control]
    assert body["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "r", "cache_control": control}
    ]
    assert all("cache_control" not in b for m in body["messages"][:-1] for b in m["content"])
    # Off by default; without a 24h retention hint the default (5 minute) lifetime is used.
    assert "cache_control" not in str(body_for(request))
    del request["prompt_cache_retention"]
    assert body_for(request, prompt_caching=True)["tools"][-1]["cache_control"] == {"type": "ephemeral"}
