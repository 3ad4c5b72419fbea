"""Responses requests -> the exact GenerateContentRequest the Gemini upstream receives."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from fixtures_loader import load_chunks
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.gemini import GeminiProvider, build_gemini_body, encode_reasoning_state
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, stream_reply

OK = [{"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}]}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def sent(upstream: UpstreamMock, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    upstream.reset([stream_reply(encode_chunks(OK, "gemini"))])
    events = asyncio.run(
        drive(GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789", **kw), body)
    )
    assert events[-1]["type"] == "response.completed"
    result: dict[str, Any] = upstream.requests[-1].json
    return result


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "additionalProperties": False,
    },
}
DECL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parametersJsonSchema": WEATHER["parameters"],
}

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("plain", {"input": "hi"}, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    (
        "instructions-system-and-generation",
        {
            "input": [{"role": "system", "content": "Sys."}, {"role": "user", "content": "hi"}],
            "instructions": "Be brief.",
            "max_output_tokens": 100,
            "temperature": 0.5,
            "top_p": 0.8,
        },
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief.\n\nSys."}]},
            "generationConfig": {"maxOutputTokens": 100, "temperature": 0.5, "topP": 0.8},
        },
    ),
    (
        "images",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"},
                        {"type": "input_image", "image_url": "https://x.test/cat.webp"},
                    ],
                }
            ]
        },
        {
            "contents": [
                {
                    "role": "user",
                    "parts": [
                        {"text": "what?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}},
                        {"fileData": {"mimeType": "image/webp", "fileUri": "https://x.test/cat.webp"}},
                    ],
                }
            ]
        },
    ),
    (
        "tool-loop-with-signature-and-parallel-results",
        {
            "input": [
                {"role": "user", "content": "Paris and Rome?"},
                {
                    "type": "reasoning",
                    "summary": [],
                    "encrypted_content": encode_reasoning_state(
                        {"signatures": [{"signature": "SIG1", "call_id": "c1"}]}
                    ),
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "get_weather",
                    "arguments": '{"city":"Rome"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "18C"},
                {"type": "function_call_output", "call_id": "c2", "output": "21C"},
            ],
            "tools": [WEATHER],
        },
        {
            "contents": [
                {"role": "user", "parts": [{"text": "Paris and Rome?"}]},
                {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"id": "c1", "name": "get_weather", "args": {"city": "Paris"}},
                            "thoughtSignature": "SIG1",
                        },
                        {"functionCall": {"id": "c2", "name": "get_weather", "args": {"city": "Rome"}}},
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "id": "c1",
                                "name": "get_weather",
                                "response": {"output": "18C"},
                            }
                        },
                        {
                            "functionResponse": {
                                "id": "c2",
                                "name": "get_weather",
                                "response": {"output": "21C"},
                            }
                        },
                    ],
                },
            ],
            "tools": [{"functionDeclarations": [DECL]}],
        },
    ),
    (
        "text-signature-goes-back-on-the-text",
        {
            "input": [
                {"role": "user", "content": "q"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                {
                    "type": "reasoning",
                    "summary": [],
                    "encrypted_content": encode_reasoning_state({"signatures": [{"signature": "TS"}]}),
                },
                {"role": "user", "content": "q2"},
            ]
        },
        {
            "contents": [
                {"role": "user", "parts": [{"text": "q"}]},
                {"role": "model", "parts": [{"text": "a", "thoughtSignature": "TS"}]},
                {"role": "user", "parts": [{"text": "q2"}]},
            ]
        },
    ),
    (
        "tool-choice-function",
        {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [DECL]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}},
        },
    ),
    (
        "tool-choice-none-and-search",
        {"input": "hi", "tools": [WEATHER, {"type": "web_search"}], "tool_choice": "none"},
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [DECL]}, {"googleSearch": {}}],
            "toolConfig": {"functionCallingConfig": {"mode": "NONE"}},
        },
    ),
    (
        "json-schema-and-thinking",
        {
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "reasoning": {"effort": "high", "summary": "auto"},
        },
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object"},
                "thinkingConfig": {"thinkingBudget": 24576, "includeThoughts": True},
            },
        },
    ),
]


@pytest.mark.parametrize(("request_body", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_request_body(upstream: UpstreamMock, request_body: dict[str, Any], want: dict[str, Any]) -> None:
    assert sent(upstream, {"model": "gemini-2.5-pro", **request_body}) == want


def test_thinking_level_for_gemini_3() -> None:
    request = parse_request({"model": "gemini-3-pro-preview", "input": "x", "reasoning": {"effort": "low"}})
    assert build_gemini_body(request)["generationConfig"] == {"thinkingConfig": {"thinkingLevel": "low"}}
    budget = build_gemini_body(request, thinking_style="budget")["generationConfig"]
    assert budget == {"thinkingConfig": {"thinkingBudget": 1024}}


def test_pitfall_20_signatures_roundtrip_from_a_real_stream(upstream: UpstreamMock) -> None:
    """Pitfall 20: the call's signature from a recorded Gemini 3 turn goes back on that call."""
    name = "gemini__stream-function-call-with-thought-signature-gemini-3-pro__vercel-ai.chunks.jsonl"
    upstream.reset([fixture_reply(name)])
    events = asyncio.run(
        drive(GeminiProvider(base_url=upstream.url), {"model": "gemini-3-pro", "input": "w?"})
    )
    output = events[-1]["response"]["output"]
    call = output[-1]
    follow_up = [
        {"role": "user", "content": "w?"},
        *output,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]
    body = sent(upstream, {"model": "gemini-3-pro", "input": follow_up, "tools": [WEATHER]})
    model_turn = body["contents"][1]
    assert model_turn["role"] == "model"
    (part,) = model_turn["parts"]
    assert part["functionCall"] == {
        "id": call["call_id"],
        "name": "weather",
        "args": {"location": "San Francisco"},
    }
    (recorded,) = [p["thoughtSignature"] for p in fixture_parts(name) if "functionCall" in p]
    assert part["thoughtSignature"] == recorded
    assert body["contents"][2]["parts"][0]["functionResponse"]["name"] == "weather"


def test_pitfall_20_signature_of_a_text_only_turn_goes_back(upstream: UpstreamMock) -> None:
    """Pitfall 20 (litellm #18570): a turn without tool calls signs its (empty) last text part."""
    name = "gemini__stream-text-thought-signature-gemini-3-pro__vercel-ai.chunks.jsonl"
    upstream.reset([fixture_reply(name)])
    events = asyncio.run(
        drive(GeminiProvider(base_url=upstream.url), {"model": "gemini-3-pro", "input": "r?"})
    )
    output = events[-1]["response"]["output"]
    follow_up = [{"role": "user", "content": "r?"}, *output, {"role": "user", "content": "and in raspberry?"}]
    body = sent(upstream, {"model": "gemini-3-pro", "input": follow_up})
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    (recorded,) = [p["thoughtSignature"] for p in fixture_parts(name) if "thoughtSignature" in p]
    signed = [p for p in body["contents"][1]["parts"] if "thoughtSignature" in p]
    assert [p["thoughtSignature"] for p in signed] == [recorded]
    text = "".join(p.get("text", "") for p in body["contents"][1]["parts"])
    assert text.startswith("There are **3**")


def fixture_parts(name: str) -> list[dict[str, Any]]:
    return [p for c in load_chunks(name) for cand in c["candidates"] for p in cand["content"]["parts"]]


def test_unsupported_things_are_rejected() -> None:
    provider = GeminiProvider(base_url="http://127.0.0.1:1")
    with pytest.raises(ProviderError) as info:
        provider.check_request(
            parse_request(
                {
                    "model": "g",
                    "input": "x",
                    "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
                }
            )
        )
    assert info.value.param == "tools[0].type"
    image = {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}
    with pytest.raises(ProviderError) as info:
        provider.check_request(parse_request({"model": "g", "input": [image]}))
    assert info.value.param == "input[0].content[0].file_id"
    # Google Search grounding has no domain filter: refused rather than searching everywhere.
    search = {"type": "web_search", "filters": {"allowed_domains": ["example.com"]}}
    with pytest.raises(ProviderError) as info:
        provider.check_request(parse_request({"model": "g", "input": "x", "tools": [search]}))
    assert info.value.param == "tools[0].filters.allowed_domains"


def test_model_path_and_no_key_in_url(upstream: UpstreamMock) -> None:
    sent(upstream, {"model": "alias", "input": "hi"}, upstream_model="models/gemini-2.0-flash")
    request = upstream.requests[-1]
    assert request.path == "/models/gemini-2.0-flash:streamGenerateContent"
    assert request.query == {"alt": "sse"}
    assert request.headers["x-goog-api-key"] == "AIzaTESTKEY0123456789"
