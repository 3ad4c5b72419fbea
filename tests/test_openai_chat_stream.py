"""Every recorded Chat Completions stream, replayed by a real local upstream, through OpenAIChatProvider.

The expected output is rebuilt from the recording itself (what an SDK accumulating the chunks would
get), so each fixture checks exact text, refusal, reasoning, call names and arguments, status and usage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fixtures_loader import list_fixtures, load_chunks, load_sse
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import SSEDecoder
from responses_gateway.providers.openai_chat import OpenAIChatProvider, decode_reasoning_state
from upstream_mock import UpstreamMock, drive, fixture_reply, json_reply, stream_reply

STREAMS = list_fixtures("openai-chat__", suffixes=(".sse", ".chunks.jsonl"))


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def recorded(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(SSE event name, parsed payload) for every data message of a recording, [DONE] left out."""
    if name.endswith(".chunks.jsonl"):
        return [("message", c) for c in load_chunks(name)]
    decoder = SSEDecoder()
    messages = decoder.feed(load_sse(name)) + decoder.flush()
    return [(m.event, orjson.loads(m.data)) for m in messages if m.data.strip() != "[DONE]"]


def rebuild(name: str) -> dict[str, Any]:
    """What the recording says: item kinds in order, texts, calls, finish reason, usage, error."""
    out: dict[str, Any] = {
        "kinds": [],
        "text": "",
        "refusal": "",
        "reasoning": "",
        "calls": {},
        "searches": {},
    }
    out.update(finish=None, usage=None, error=None, details_text="", signature=None)

    def kind(k: Any) -> None:
        if not out["kinds"] or out["kinds"][-1] != k:
            out["kinds"].append(k)

    for event, chunk in recorded(name):
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        if (chunk.get("x_groq") or {}).get("usage"):
            out["usage"] = chunk["x_groq"]["usage"]
        if event == "error" or chunk.get("error"):
            out["error"] = chunk["error"]
            continue
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                kind("reasoning")
                out["reasoning"] += reasoning
            for detail in delta.get("reasoning_details") or []:
                out["details_text"] += detail.get("text") or ""
                out["signature"] = detail.get("signature") or out["signature"]
            content = delta.get("content")
            if isinstance(content, list):
                for part in content:
                    if part["type"] == "thinking":
                        kind("reasoning")
                        out["reasoning"] += "".join(p["text"] for p in part["thinking"])
                    elif part["type"] == "text" and part["text"]:
                        kind("message")
                        out["text"] += part["text"]
            elif content:
                kind("message")
                out["text"] += content
            if delta.get("refusal"):
                kind("message")
                out["refusal"] += delta["refusal"]
            if delta.get("annotations"):
                kind("message")
            for tool in delta.get("executed_tools") or []:
                if tool["index"] not in out["searches"]:
                    out["searches"][tool["index"]] = orjson.loads(tool["arguments"])["query"]
                    kind("web_search_call")
            for call in delta.get("tool_calls") or []:
                entry = out["calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                kind(("call", call["index"]))
                entry["id"] = entry["id"] or call.get("id")
                fn = call.get("function") or {}
                entry["name"] = entry["name"] or fn.get("name") or ""
                entry["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                out["finish"] = choice["finish_reason"]
    return out


def run(upstream: UpstreamMock, name: str, *, split: bool, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    upstream.reset([fixture_reply(name, split=split, seed=seed, max_piece=97, delay=0)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-test-key-123456", **kw)
    return asyncio.run(drive(provider, {"model": "gpt", "input": "hi"}))


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream(upstream: UpstreamMock, name: str, split: bool) -> None:
    events = run(upstream, name, split=split, seed=len(name))
    assert check(events) == []
    acc = accumulate(events)
    assert acc.discrepancies == []
    response = acc.response
    want = rebuild(name)
    output = response["output"]

    kinds = ["function_call" if isinstance(k, tuple) else k for k in want["kinds"]]
    # Calls stay open until the end, so interleaved fragments of one call do not split it.
    calls_first = [k for k in kinds if k != "function_call"] + [k for k in kinds if k == "function_call"]
    assert [o["type"] for o in output] == calls_first

    messages = [o for o in output if o["type"] == "message"]
    text = "".join(p.get("text", "") for m in messages for p in m["content"] if p["type"] == "output_text")
    refusal = "".join(p.get("refusal", "") for m in messages for p in m["content"] if p["type"] == "refusal")
    assert (text, refusal) == (want["text"], want["refusal"])

    reasoning = [o for o in output if o["type"] == "reasoning"]
    summary = "".join(s["text"] for r in reasoning for s in r["summary"])
    assert summary == (want["reasoning"] or want["details_text"])
    for item in reasoning:
        state = decode_reasoning_state(item["encrypted_content"])
        assert state is not None and state["text"] == "".join(s["text"] for s in item["summary"])
    if want["signature"]:
        details = [d for r in reasoning for d in decode_reasoning_state(r["encrypted_content"])["details"]]
        assert [d.get("signature") for d in details if d.get("signature")] == [want["signature"]]

    searches = [o["action"] for o in output if o["type"] == "web_search_call"]
    assert searches == [{"type": "search", "query": q} for q in want["searches"].values()]

    calls = [o for o in output if o["type"] == "function_call"]
    want_calls = [want["calls"][i] for i in sorted(want["calls"])]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        (w["id"], w["name"], w["arguments"] or "{}") for w in want_calls
    ]

    if want["error"] is not None:
        assert response["status"] == "failed"
        assert response["error"]["message"] == want["error"]["message"]
    elif want["finish"] == "length":
        assert response["status"] == "incomplete"
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        assert response["status"] == "completed"
        assert all(o["status"] == "completed" for o in output if "status" in o)

    usage = want["usage"]
    if usage is None:
        assert response["usage"] is None
    else:
        got = response["usage"]
        assert got["input_tokens"] == usage["prompt_tokens"]
        assert got["input_tokens_details"]["cached_tokens"] == (
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        )
        reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
        assert got["output_tokens_details"]["reasoning_tokens"] == reasoning_tokens
        assert got["total_tokens"] == usage["total_tokens"]
        assert got["output_tokens"] == usage["total_tokens"] - usage["prompt_tokens"]


def test_pitfall_02_reasoning_is_not_sent_as_text(upstream: UpstreamMock) -> None:
    name = "openai-chat__deepseek-reasoner-reasoning-content-raw__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=True, seed=3)
    text_deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    summary_deltas = [e for e in events if e["type"] == "response.reasoning_summary_text.delta"]
    assert "" not in text_deltas and len(summary_deltas) > 100
    want = rebuild(name)
    assert "".join(text_deltas) == want["text"]


def test_reasoning_as_raw_text_when_configured(upstream: UpstreamMock) -> None:
    name = "openai-chat__zai-glm-reasoning-content__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=False, reasoning_output="reasoning_text")
    assert check(events, profile="openai") == []
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "reasoning" and item["summary"] == []
    assert item["content"][0]["text"] == rebuild(name)["reasoning"]
    assert any(e["type"] == "response.reasoning_text.delta" for e in events)


def test_reasoning_hidden_when_configured(upstream: UpstreamMock) -> None:
    name = "openai-chat__groq-qwen3-reasoning-field__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=False, reasoning_output="none")
    assert check(events) == []
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["message"]


def test_pitfall_04_parallel_calls_index_0_and_1(upstream: UpstreamMock) -> None:
    name = "openai-chat__openai-gpt-4o-parallel-tool-calls-index-0-and-1__pydantic-pydantic-ai.sse"
    output = run(upstream, name, split=True, seed=11)[-1]["response"]["output"]
    assert [(o["name"], o["arguments"]) for o in output] == [
        ("get_weather", '{"city": "Mexico City"}'),
        ("get_product_name", "{}"),
    ]
    assert len({o["id"] for o in output}) == 2


def test_pitfall_05_name_then_arguments_in_later_chunk(upstream: UpstreamMock) -> None:
    name = "openai-chat__openrouter-kimi-k2-tool-call-name-then-args-chunk__simonw-llm.sse"
    output = run(upstream, name, split=False)[-1]["response"]["output"]
    got = [(o["call_id"], o["name"], o["arguments"]) for o in output]
    assert got == [("llm_version:0", "llm_version", "{}")]


def test_pitfall_07_no_argument_calls_are_empty_objects(upstream: UpstreamMock) -> None:
    name = "openai-chat__groq-single-chunk-tool-call__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=False)
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"]) for e in done] == [("weather", "{}")]


def test_pitfall_12_length_is_incomplete_even_without_content(upstream: UpstreamMock) -> None:
    name = "openai-chat__finish-reason-length-no-content-gpt-5-mini__mirascope-mirascope.sse"
    final = run(upstream, name, split=False)[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"] == []
    assert final["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == 50


def test_refusal_part(upstream: UpstreamMock) -> None:
    name = "openai-chat__refusal-delta-stream-gpt-4o__mirascope-mirascope.sse"
    events = run(upstream, name, split=True, seed=5)
    final = events[-1]["response"]
    refusal = "I'm very sorry, but I can't assist with that request."
    assert final["output"][0]["content"] == [{"type": "refusal", "refusal": refusal}]
    assert any(e["type"] == "response.refusal.done" for e in events)


def test_openrouter_annotations_become_url_citations(upstream: UpstreamMock) -> None:
    name = "openai-chat__openrouter-web-search-annotations__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=False)
    part = events[-1]["response"]["output"][0]["content"][0]
    urls = [a["url"] for a in part["annotations"]]
    assert urls[0] == "https://github.com/pydantic/pydantic-ai" and len(urls) == 5
    assert all(a["type"] == "url_citation" and set(a) == {"type", "url", "title", "start_index", "end_index"}
               for a in part["annotations"])  # fmt: skip
    added = [e for e in events if e["type"] == "response.output_text.annotation.added"]
    assert [e["annotation_index"] for e in added] == [0, 1, 2, 3, 4]


def test_openrouter_midstream_error_fails_with_usage(upstream: UpstreamMock) -> None:
    name = STREAMS[[n.startswith("openai-chat__openrouter-comments") for n in STREAMS].index(True)]
    events = run(upstream, name, split=True, seed=2)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    final = events[-1]["response"]
    assert final["error"]["message"] == "Token limit reached"
    assert final["usage"]["input_tokens"] == 43


def test_groq_event_error_maps_code(upstream: UpstreamMock) -> None:
    name = "openai-chat__groq-gpt-oss-midstream-event-error-tool-use-failed__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=False)
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert final["error"]["code"] == "tool_use_failed"
    assert final["output"][0]["type"] == "reasoning"


def test_pitfall_09_cached_tokens_and_xai_reasoning_usage(upstream: UpstreamMock) -> None:
    name = "openai-chat__deepseek-reasoner-reasoning-then-tool-call-split-args__vercel-ai.chunks.jsonl"
    usage = run(upstream, name, split=False)[-1]["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 320
    assert (usage["input_tokens"], usage["output_tokens"]) == (339, 83)
    name = "openai-chat__xai-grok-3-mini-reasoning-content-then-tool-call__vercel-ai.chunks.jsonl"
    usage = run(upstream, name, split=False)[-1]["response"]["usage"]
    # xAI leaves reasoning out of completion_tokens (26); output_tokens includes it.
    assert (usage["output_tokens"], usage["output_tokens_details"]["reasoning_tokens"]) == (253, 227)
    assert usage["total_tokens"] == 560


@pytest.mark.parametrize(
    "name",
    [
        "openai-chat__ollama-local-nonstream-gemma3__mirascope-mirascope.json",
        "openai-chat__ollama-local-nonstream-json-schema__pydantic-pydantic-ai.json",
    ],
)
def test_whole_completion_when_stream_is_ignored(upstream: UpstreamMock, name: str) -> None:
    body = orjson.loads(load_sse(name))
    upstream.reset([json_reply(body)])
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1")
    events = asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert check(events) == []
    final = events[-1]["response"]
    message = body["choices"][0]["message"]
    texts = [o["content"][0]["text"] for o in final["output"] if o["type"] == "message"]
    assert texts == [message["content"]]
    if message.get("reasoning"):
        assert final["output"][0]["summary"][0]["text"] == message["reasoning"]
    assert final["usage"]["input_tokens"] == body["usage"]["prompt_tokens"]


def test_truncated_stream_fails(upstream: UpstreamMock) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
    upstream.reset([stream_reply(b"data: " + orjson.dumps(chunk) + b"\n\n")])
    provider = OpenAIChatProvider(base_url=upstream.url)
    events = asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert check(events) == []
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert final["output"][0]["content"][0]["text"] == "Hel"
    assert final["output"][0]["status"] == "incomplete"
