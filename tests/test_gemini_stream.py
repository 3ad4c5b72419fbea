"""Every recorded Gemini stream, replayed by a real local upstream, through GeminiProvider; errors too.

The expected output is rebuilt from the recording (texts, thoughts, calls, signatures, usage), so each
fixture checks exact content, where the thought signatures went and how usage was counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fixtures_loader import list_fixtures, load_chunks, load_json, load_sse
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import SSEDecoder
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.gemini import GeminiProvider, decode_reasoning_state
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, json_reply, stream_reply

STREAMS = list_fixtures("gemini__", suffixes=(".sse", ".chunks.jsonl"))
KEY = "AIzaSyTEST-key-0123456789abcdef"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def recorded(name: str) -> list[dict[str, Any]]:
    if name.endswith(".chunks.jsonl"):
        return load_chunks(name)
    decoder = SSEDecoder()
    return [orjson.loads(m.data) for m in decoder.feed(load_sse(name)) + decoder.flush()]


def rebuild(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Texts, thoughts, calls (name, parsed args, signature), text signatures, finish and usage."""
    out: dict[str, Any] = {"text": "", "thoughts": "", "calls": [], "text_signatures": [], "finish": None}
    out["usage"] = {}
    streaming: dict[str, Any] | None = None
    for chunk in chunks:
        out["usage"] = chunk.get("usageMetadata") or out["usage"]
        for cand in chunk.get("candidates", []):
            for part in cand.get("content", {}).get("parts", []):
                call = part.get("functionCall")
                if call is not None:
                    if call.get("name"):
                        streaming = {"name": call["name"], "args": call.get("args", {})}
                        streaming["signature"] = part.get("thoughtSignature")
                        out["calls"].append(streaming)
                    for arg in call.get("partialArgs", []):
                        assert streaming is not None
                        key = arg["jsonPath"].removeprefix("$.")
                        streaming["args"][key] = streaming["args"].get(key, "") + arg["stringValue"]
                elif part.get("thought"):
                    out["thoughts"] += part["text"]
                else:
                    out["text"] += part.get("text", "")
                    if part.get("thoughtSignature"):
                        out["text_signatures"].append(part["thoughtSignature"])
            out["finish"] = cand.get("finishReason") or out["finish"]
    return out


def run(upstream: UpstreamMock, name: str, *, split: bool, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    upstream.reset([fixture_reply(name, split=split, seed=seed, max_piece=151, delay=0)])
    provider = GeminiProvider(base_url=upstream.url + "/v1beta", api_key=KEY, **kw)
    events = asyncio.run(drive(provider, {"model": "gemini-2.5-pro", "input": "hi"}))
    request = upstream.requests[-1]
    assert request.path == "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert request.query == {"alt": "sse"}
    assert request.headers["x-goog-api-key"] == KEY
    return events


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream(upstream: UpstreamMock, name: str, split: bool) -> None:
    events = run(upstream, name, split=split, seed=len(name))
    assert check(events) == []
    acc = accumulate(events)
    assert acc.discrepancies == []
    response = acc.response
    want = rebuild(recorded(name))
    output = response["output"]

    messages = [o for o in output if o["type"] == "message"]
    assert "".join(p["text"] for m in messages for p in m["content"]) == want["text"]
    reasoning = [o for o in output if o["type"] == "reasoning"]
    assert "".join(s["text"] for r in reasoning for s in r["summary"]) == want["thoughts"]
    calls = [o for o in output if o["type"] == "function_call"]
    assert [(c["name"], orjson.loads(c["arguments"])) for c in calls] == [
        (w["name"], w["args"]) for w in want["calls"]
    ]
    assert len({c["call_id"] for c in calls}) == len(calls)

    # Pitfall 20: every signature is kept, byte for byte, with the call it belongs to.
    states = [decode_reasoning_state(r.get("encrypted_content")) for r in reasoning]
    signatures = [s for state in states if state for s in state["signatures"]]
    by_call = {s["call_id"]: s["signature"] for s in signatures if "call_id" in s}
    for got, exp in zip(calls, want["calls"], strict=True):
        assert by_call.get(got["call_id"]) == exp["signature"]
    assert [s["signature"] for s in signatures if "call_id" not in s] == want["text_signatures"]
    for item in reasoning:
        assert output.index(item) < min((output.index(c) for c in calls), default=len(output))

    finish = want["finish"]
    if finish == "MAX_TOKENS":
        assert (response["status"], response["incomplete_details"]) == (
            "incomplete",
            {"reason": "max_output_tokens"},
        )
    else:
        assert response["status"] == "completed"

    usage = want["usage"]
    thoughts = usage.get("thoughtsTokenCount", 0)
    prompt = usage.get("promptTokenCount", 0) + usage.get("toolUsePromptTokenCount", 0)
    assert response["usage"] == {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cache_write_tokens": 0,
            "cached_tokens": usage.get("cachedContentTokenCount", 0),
        },
        "output_tokens": usage.get("candidatesTokenCount", 0) + thoughts,
        "output_tokens_details": {"reasoning_tokens": thoughts},
        "total_tokens": prompt + usage.get("candidatesTokenCount", 0) + thoughts,
    }
    assert response["usage"]["total_tokens"] == usage["totalTokenCount"]


def test_pitfall_11_thought_tokens_count_as_output(upstream: UpstreamMock) -> None:
    name = "gemini__stream-finish-reason-max-tokens-gemini-2.5-flash__mirascope-mirascope.sse"
    usage = run(upstream, name, split=False)[-1]["response"]["usage"]
    assert (usage["output_tokens"], usage["output_tokens_details"]["reasoning_tokens"]) == (48, 38)


def test_thought_summary_then_signed_text(upstream: UpstreamMock) -> None:
    name = "gemini__stream-thought-summary-parts-then-text-gemini-2.5-pro__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=True, seed=9)
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "message"]
    assert output[0]["summary"][0]["text"].startswith("**Clarifying User Goals**")
    state = decode_reasoning_state(output[0]["encrypted_content"])
    assert state is not None and state["signatures"][0]["signature"].startswith("CiIB0e2Kb6Sy")
    assert sum(e["type"] == "response.reasoning_summary_text.delta" for e in events) == 4


def test_grounding_supports_become_url_citations(upstream: UpstreamMock) -> None:
    name = "gemini__stream-google-search-grounding-metadata-gemini-2.5-pro__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=False)
    part = events[-1]["response"]["output"][0]["content"][0]
    chunks = recorded(name)
    grounding = chunks[-1]["candidates"][0]["groundingMetadata"]
    supports = grounding["groundingSupports"]
    assert len(part["annotations"]) == sum(len(s["groundingChunkIndices"]) for s in supports)
    for annotation in part["annotations"]:
        cited = part["text"][annotation["start_index"] : annotation["end_index"]]
        segment = next(s["segment"] for s in supports if s["segment"]["text"] == cited)
        assert segment is not None
        assert annotation["url"].startswith("https://")
    first = part["annotations"][0]
    assert part["text"][first["start_index"] : first["end_index"]] == supports[0]["segment"]["text"]


def test_vertex_streamed_arguments(upstream: UpstreamMock) -> None:
    name = next(n for n in STREAMS if n.startswith("gemini__vertex-stream-thought-part"))
    events = run(upstream, name, split=True, seed=4)
    output = events[-1]["response"]["output"]
    calls = [(o["name"], o["arguments"]) for o in output if o["type"] == "function_call"]
    assert calls == [
        ("read_theme", "{}"),
        ("read_screen", '{"id":"A"}'),
        ("read_screen", '{"id":"B"}'),
        ("read_screen", '{"id":"C"}'),
    ]


@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        (
            "gemini__http-400-api-key-invalid-on-stream-endpoint__mirascope-mirascope.json",
            502,
            "upstream_authentication_error",
        ),
        (
            "gemini__http-404-model-not-found-on-stream-endpoint__mirascope-mirascope.json",
            404,
            "model_not_found",
        ),
        ("gemini__http-429-resource-exhausted-retry-info__vercel-ai.json", 429, "rate_limit_exceeded"),
    ],
)
def test_http_errors(upstream: UpstreamMock, name: str, status: int, code: str) -> None:
    upstream.reset([fixture_reply(name)])
    provider = GeminiProvider(base_url=upstream.url, api_key=KEY)
    with pytest.raises(ProviderError) as info:
        asyncio.run(drive(provider, {"model": "gemini-x", "input": "hi"}))
    assert (info.value.status, info.value.code) == (status, code)
    assert KEY not in info.value.message
    assert KEY not in upstream.requests[-1].path + str(upstream.requests[-1].query)
    if status == 429:
        assert info.value.retry_after == pytest.approx(34.4)


def test_http_error_wrapped_in_a_list(upstream: UpstreamMock) -> None:
    body = [load_json("gemini__http-404-model-not-found-on-stream-endpoint__mirascope-mirascope.json")]
    upstream.reset([json_reply(body, status=404)])
    with pytest.raises(ProviderError) as info:
        asyncio.run(drive(GeminiProvider(base_url=upstream.url), {"model": "g", "input": "hi"}))
    assert info.value.code == "model_not_found"


def chunk(parts: list[dict[str, Any]], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
    if finish:
        cand["finishReason"] = finish
    return {"candidates": [cand], **extra}


def synthetic(upstream: UpstreamMock, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    upstream.reset([stream_reply(encode_chunks(chunks, "gemini"), split=True, seed=3, delay=0)])
    events = asyncio.run(drive(GeminiProvider(base_url=upstream.url), {"model": "g", "input": "hi"}))
    assert check(events) == []
    response: dict[str, Any] = events[-1]["response"]
    return response


@pytest.mark.parametrize(
    ("finish", "status", "reason"),
    [
        ("SAFETY", "incomplete", "content_filter"),
        ("RECITATION", "incomplete", "content_filter"),
        ("MAX_TOKENS", "incomplete", "max_output_tokens"),
        ("MALFORMED_FUNCTION_CALL", "failed", None),
        ("STOP", "completed", None),
    ],
)
def test_finish_reasons(upstream: UpstreamMock, finish: str, status: str, reason: str | None) -> None:
    response = synthetic(upstream, [chunk([{"text": "Hi"}]), chunk([], finish)])
    assert response["status"] == status
    if reason:
        assert response["incomplete_details"] == {"reason": reason}
    if status == "failed":
        assert finish in response["error"]["message"]


def test_prompt_blocked_is_content_filter(upstream: UpstreamMock) -> None:
    response = synthetic(upstream, [{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {}}])
    assert (response["status"], response["incomplete_details"]) == (
        "incomplete",
        {"reason": "content_filter"},
    )


def test_truncated_stream_fails(upstream: UpstreamMock) -> None:
    response = synthetic(upstream, [chunk([{"text": "Hi"}])])
    assert response["status"] == "failed"
    assert response["output"][0]["status"] == "incomplete"


def test_midstream_error_payload_fails(upstream: UpstreamMock) -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    response = synthetic(upstream, [chunk([{"text": "Hi"}]), error])
    assert response["status"] == "failed"
    assert response["error"]["code"] == "server_is_overloaded"


def test_cached_tokens(upstream: UpstreamMock) -> None:
    meta = {
        "promptTokenCount": 100,
        "cachedContentTokenCount": 60,
        "candidatesTokenCount": 5,
        "totalTokenCount": 105,
    }
    response = synthetic(upstream, [chunk([{"text": "Hi"}], "STOP", usageMetadata=meta)])
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 60
    assert (response["usage"]["input_tokens"], response["usage"]["output_tokens"]) == (100, 5)


@pytest.mark.parametrize("wrap", [False, True], ids=["object", "array"])
def test_whole_body_without_sse(upstream: UpstreamMock, wrap: bool) -> None:
    """A proxy that drops ``alt=sse`` gets a JSON array (or one object); it is translated the same way."""
    body = load_json("gemini__nonstream-text-thought-signature__vercel-ai.json")
    upstream.reset([json_reply([body] if wrap else body)])
    events = asyncio.run(drive(GeminiProvider(base_url=upstream.url), {"model": "g", "input": "hi"}))
    assert check(events) == []
    output = events[-1]["response"]["output"]
    part = body["candidates"][0]["content"]["parts"][0]
    assert [o["type"] for o in output] == ["message", "reasoning"]
    assert output[0]["content"][0]["text"] == part["text"]
    state = decode_reasoning_state(output[1]["encrypted_content"])
    assert state == {"signatures": [{"signature": part["thoughtSignature"]}]}
    assert events[-1]["response"]["usage"]["output_tokens"] == 28 + 244
