"""Every recorded Anthropic stream, replayed by a real local upstream, through AnthropicProvider.

The expected output is derived from the recording itself (the content blocks an SDK would rebuild from
it), so each fixture checks exact text, call arguments, signatures and usage.
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
from responses_gateway.providers.anthropic import AnthropicProvider, decode_reasoning_state
from test_anthropic_errors import start as message_start
from test_anthropic_errors import text_block
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, json_reply, stream_reply

STREAMS = list_fixtures("anthropic-messages__", suffixes=(".sse", ".chunks.jsonl"))
PAUSE = "anthropic-messages__pause-turn-many-web-searches-thinking__pydantic-pydantic-ai.sse"
CODE_TOOLS = {"code_execution", "bash_code_execution", "text_editor_code_execution"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def recorded_events(name: str) -> list[dict[str, Any]]:
    """The upstream events of a recording, parsed."""
    if name.endswith(".chunks.jsonl"):
        return load_chunks(name)
    decoder = SSEDecoder()
    messages = decoder.feed(load_sse(name)) + decoder.flush()
    return [orjson.loads(m.data) for m in messages]


def rebuild(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
    """Content blocks, final usage and stop_reason, rebuilt the way Anthropic's SDK accumulates them."""
    blocks: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    stop = None
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            usage = dict(event["message"]["usage"])
        elif kind == "content_block_start":
            block = dict(event["content_block"])
            block["_json"] = ""
            blocks[event["index"]] = block
        elif kind == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                block["_json"] += delta["partial_json"]
            elif delta["type"] == "citations_delta":
                block.setdefault("_citations", []).append(delta["citation"])
        elif kind == "message_delta":
            usage.update(event["usage"])
            stop = event["delta"]["stop_reason"]
    return [blocks[i] for i in sorted(blocks)], usage, stop


def expected_items(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items (type plus the fields that matter) the blocks must become."""
    out: list[dict[str, Any]] = []
    last_text = False
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            if not block["text"]:
                continue
            if not last_text:
                out.append({"type": "message", "text": ""})
            out[-1]["text"] += block["text"]
            last_text = True
            continue
        if kind.endswith("_tool_result"):
            continue
        last_text = False
        if kind == "thinking":
            state = {"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]}
            out.append({"type": "reasoning", "state": state, "summary": block["thinking"]})
        elif kind == "redacted_thinking":
            out.append({"type": "reasoning", "state": {"type": "redacted_thinking", "data": block["data"]}})
        elif kind == "tool_use":
            out.append(
                {"type": "function_call", "call_id": block["id"], "name": block["name"],
                 "arguments": block["_json"] or "{}"}
            )  # fmt: skip
        elif kind == "server_tool_use" and block["name"] in ("web_search", "web_fetch"):
            out.append({"type": "web_search_call", "input": orjson.loads(block["_json"] or "{}")})
        elif kind == "server_tool_use" and block["name"] in CODE_TOOLS:
            out.append({"type": "code_interpreter_call"})
        elif kind == "mcp_tool_use":
            out.append({"type": "mcp_call", "name": block["name"], "arguments": block["_json"]})
    return out


def assert_items(output: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Output items match the expected ones in order, type and content."""
    assert [o["type"] for o in output] == [w["type"] for w in want]
    for got, exp in zip(output, want, strict=True):
        if exp["type"] == "message" and "text" in exp:
            assert got["content"][0]["type"] == "output_text"
            assert got["content"][0]["text"] == exp["text"]
        elif exp["type"] == "reasoning":
            assert decode_reasoning_state(got["encrypted_content"]) == exp["state"]
            summary = "".join(s["text"] for s in got["summary"])
            assert summary == exp.get("summary", "")
        elif exp["type"] == "function_call":
            assert (got["call_id"], got["name"], got["arguments"]) == (
                exp["call_id"], exp["name"], exp["arguments"]
            )  # fmt: skip
            assert got["status"] == "completed"
        elif exp["type"] == "web_search_call":
            action = got["action"]
            if "query" in exp["input"]:
                assert action == {**action, "type": "search", "query": exp["input"]["query"]}
            else:
                assert action == {"type": "open_page", "url": exp["input"]["url"]}
        elif exp["type"] == "mcp_call":
            assert (got["name"], got["arguments"]) == (exp["name"], exp["arguments"])


def run(upstream: UpstreamMock, name: str, *, split: bool, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    upstream.reset([fixture_reply(name, split=split, seed=seed, max_piece=193, delay=0)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-test", max_continuations=0, **kw)
    body = {"model": "claude", "input": "hi", "include": ["web_search_call.action.sources"]}
    return asyncio.run(drive(provider, body))


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream(upstream: UpstreamMock, name: str, split: bool) -> None:
    events = run(upstream, name, split=split, seed=len(name))
    assert check(events) == []
    acc = accumulate(events)
    assert acc.discrepancies == []
    response = acc.response
    blocks, usage, stop = rebuild(recorded_events(name))
    want = expected_items(blocks)
    output = response["output"]
    if stop == "refusal":
        want.append({"type": "message", "refusal": True})
    assert_items(output, want)

    cache_read = usage.get("cache_read_input_tokens") or 0
    cache_write = usage.get("cache_creation_input_tokens") or 0
    thinking = (usage.get("output_tokens_details") or {}).get("thinking_tokens", 0)
    assert response["usage"] == {
        "input_tokens": usage["input_tokens"] + cache_read + cache_write,
        "input_tokens_details": {"cache_write_tokens": cache_write, "cached_tokens": cache_read},
        "output_tokens": usage["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": thinking},
        "total_tokens": usage["input_tokens"] + cache_read + cache_write + usage["output_tokens"],
    }
    status = {"max_tokens": "incomplete", "refusal": "incomplete", "pause_turn": "incomplete"}
    assert response["status"] == status.get(stop or "", "completed")


def test_plain_text_exact(upstream: UpstreamMock) -> None:
    events = run(upstream, "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl",
                 split=True)  # fmt: skip
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 6 and "" not in deltas
    assert not any(e["type"] == "ping" for e in events)
    final = events[-1]
    assert final["type"] == "response.completed"
    text = final["response"]["output"][0]["content"][0]["text"]
    assert text == "".join(deltas)


def test_max_tokens_is_incomplete(upstream: UpstreamMock) -> None:
    events = run(upstream, "anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse",
                 split=False)  # fmt: skip
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"


def test_refusal_becomes_refusal_part(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__refusal-stop-reason-with-stop-details__simonw-llm-anthropic.sse"
    events = run(upstream, name, split=False)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "content_filter"}
    (part,) = final["output"][0]["content"]
    assert part["type"] == "refusal"
    assert part["refusal"].startswith("This request was blocked as it seems to violate")


def test_redacted_thinking_items(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__redacted-thinking-blocks-then-text__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=True)
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "reasoning", "message"]
    first = decode_reasoning_state(output[0]["encrypted_content"])
    assert first is not None and first["data"].startswith("EqkECkYIBxgCKkA8AZ4noDfV5VcOJe")
    assert output[0]["summary"] == []
    # The encrypted content is there from the start (it arrives whole) and again at done.
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["encrypted_content"] == output[0]["encrypted_content"]


def test_web_search_citations_have_exact_spans(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__web-search-server-tool-citations-delta-sonnet-4__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=True)
    blocks, _, _ = rebuild(recorded_events(name))
    output = events[-1]["response"]["output"]
    assert output[0]["type"] == "web_search_call"
    assert output[0]["status"] == "completed"
    assert output[0]["action"]["query"] == "tech news today September 26 2025"
    assert len(output[0]["action"]["sources"]) == 10
    message = output[1]
    part = message["content"][0]
    # Rebuild the expected annotations: each cited block's span inside the joined text.
    expected, offset = [], 0
    for block in blocks[2:]:
        if block["type"] != "text":
            continue
        for c in block.get("_citations", []):
            expected.append((offset, offset + len(block["text"]), c["url"], c["title"]))
        offset += len(block["text"])
    got = [(a["start_index"], a["end_index"], a["url"], a["title"]) for a in part["annotations"]]
    assert got == expected and len(got) == 14
    for start, end, _, _ in got:
        assert part["text"][start:end].strip()
    added = [e for e in events if e["type"] == "response.output_text.annotation.added"]
    assert [e["annotation_index"] for e in added] == list(range(14))
    searching = [e["type"] for e in events if e["type"].startswith("response.web_search_call.")]
    assert searching == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]


def test_sources_only_when_included(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__web-search-server-tool-citations-delta-sonnet-4__vercel-ai.chunks.jsonl"
    upstream.reset([fixture_reply(name)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k")
    events = asyncio.run(drive(provider, {"model": "claude", "input": "news?"}))
    action = events[-1]["response"]["output"][0]["action"]
    assert action == {"type": "search", "query": "tech news today September 26 2025"}


def test_thinking_as_raw_reasoning_text(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__thinking-short-signature-then-text-sonnet-4.5__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=False, thinking_output="reasoning_text")
    blocks, _, _ = rebuild(recorded_events(name))
    reasoning = events[-1]["response"]["output"][0]
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": blocks[0]["thinking"]}]
    assert any(e["type"] == "response.reasoning_text.delta" for e in events)


def test_parallel_tool_calls_keep_their_own_arguments(upstream: UpstreamMock) -> None:
    name = "anthropic-messages__three-parallel-tool-use-input-json-delta-sonnet-4.5__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=True)
    calls = events[-1]["response"]["output"]
    assert [c["type"] for c in calls] == ["function_call"] * 3
    assert len({c["call_id"] for c in calls}) == 3
    assert len({c["id"] for c in calls}) == 3
    assert [c["output_index"] for c in events if c["type"] == "response.output_item.added"] == [0, 1, 2]
    for call in calls:
        assert isinstance(orjson.loads(call["arguments"]), dict)


def test_pause_turn_is_continued_server_side(upstream: UpstreamMock) -> None:
    follow = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
    upstream.reset([fixture_reply(PAUSE, split=True, max_piece=193, delay=0), fixture_reply(follow)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k")
    events = asyncio.run(drive(provider, {"model": "claude", "input": "Search a lot"}))
    assert check(events) == []
    final = events[-1]
    assert final["type"] == "response.completed"
    first, second = upstream.requests
    blocks, usage1, _ = rebuild(recorded_events(PAUSE))
    _, usage2, _ = rebuild(recorded_events(follow))
    resumed = second.json["messages"]
    assert resumed[:-1] == first.json["messages"]
    assistant = resumed[-1]
    assert assistant["role"] == "assistant"
    # The paused turn goes back verbatim: thinking with its signature, tool uses, results, text.
    sent = assistant["content"]
    want = [b for b in blocks if not (b["type"] == "text" and not b["text"])]
    assert [b["type"] for b in sent] == [b["type"] for b in want]
    assert sent[0] == {
        "type": "thinking",
        "thinking": blocks[0]["thinking"],
        "signature": blocks[0]["signature"],
    }
    for got_block, raw in zip(sent, want, strict=True):
        if raw["type"] == "server_tool_use":
            assert got_block["input"] == orjson.loads(raw["_json"])
            assert got_block["id"] == raw["id"]
        elif raw["type"] == "web_search_tool_result":
            assert got_block["content"] == raw["content"]
    output = final["response"]["output"]
    assert output[-1]["content"][0]["text"] == "".join(
        b["text"] for b in rebuild(recorded_events(follow))[0] if b["type"] == "text"
    )
    # Usage is the sum of both upstream calls.
    assert final["response"]["usage"]["output_tokens"] == usage1["output_tokens"] + usage2["output_tokens"]


def test_pause_turn_limit_ends_incomplete(upstream: UpstreamMock) -> None:
    upstream.reset([fixture_reply(PAUSE)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k", max_continuations=1)
    events = asyncio.run(drive(provider, {"model": "claude", "input": "Search a lot"}))
    assert len(upstream.requests) == 2
    assert events[-1]["type"] == "response.incomplete"
    assert check(events) == []


NONSTREAM = list_fixtures("anthropic-messages__nonstream", suffixes=(".json",))


@pytest.mark.parametrize("name", NONSTREAM)
def test_non_streamed_message_body_is_translated(upstream: UpstreamMock, name: str) -> None:
    message = load_json(name)
    upstream.reset([json_reply(message)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k")
    events = asyncio.run(drive(provider, {"model": "claude", "input": "hi"}))
    assert check(events) == []
    blocks = []
    for block in message["content"]:
        block = dict(block, _json=orjson.dumps(block["input"]).decode() if "input" in block else "")
        if block.get("citations"):
            block["_citations"] = block["citations"]
        blocks.append(block)
    response = events[-1]["response"]
    assert_items(response["output"], expected_items(blocks))
    assert response["usage"]["output_tokens"] == message["usage"]["output_tokens"]
    assert response["status"] == "completed"
    annotations = [
        a for o in response["output"] if o["type"] == "message" for a in o["content"][0]["annotations"]
    ]
    cited = [c for b in blocks if b["type"] == "text" for c in b.get("_citations", [])]
    assert len(annotations) == len(cited)


def _json_delta(index: int, fragment: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": fragment},
    }


def _block(index: int, block: dict[str, Any], *partial_json: str) -> list[dict[str, Any]]:
    deltas = [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": p},
        }
        for p in partial_json
    ]
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        *deltas,
        {"type": "content_block_stop", "index": index},
    ]


def _finish(stop: str) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]


def _replay_events(
    upstream: UpstreamMock, events: list[dict[str, Any]], body: dict[str, Any]
) -> list[dict[str, Any]]:
    upstream.reset([stream_reply(encode_chunks(events, "anthropic"), split=True, max_piece=7, delay=0)])
    provider = AnthropicProvider(base_url=upstream.url, api_key="k")
    out = asyncio.run(drive(provider, body))
    assert check(out) == []
    return out


def test_custom_tool_use_becomes_custom_tool_call(upstream: UpstreamMock) -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    encoded = orjson.dumps({"input": patch}).decode()
    events = [
        message_start(),
        *_block(0, {"type": "tool_use", "id": "toolu_p", "name": "apply_patch", "input": {}}, "", encoded[:9],
                encoded[9:25], encoded[25:]),
        *_finish("tool_use"),
    ]  # fmt: skip
    body = {"model": "claude", "input": "patch it", "tools": [{"type": "custom", "name": "apply_patch"}]}
    out = _replay_events(upstream, events, body)
    (call,) = out[-1]["response"]["output"]
    assert call["type"] == "custom_tool_call"
    assert (call["call_id"], call["name"], call["input"]) == ("toolu_p", "apply_patch", patch)
    done = next(e for e in out if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == patch
    # The input streams as the JSON string decodes, not in one piece at the end.
    deltas = [e["delta"] for e in out if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == patch and len([d for d in deltas if d]) >= 2


def test_custom_tool_input_given_whole_at_block_start(upstream: UpstreamMock) -> None:
    events = [
        message_start(),
        *_block(0, {"type": "tool_use", "id": "toolu_w", "name": "apply_patch", "input": {"input": "whole"}}),
        *_finish("tool_use"),
    ]
    body = {"model": "claude", "input": "patch it", "tools": [{"type": "custom", "name": "apply_patch"}]}
    (call,) = _replay_events(upstream, events, body)[-1]["response"]["output"]
    assert (call["type"], call["input"]) == ("custom_tool_call", "whole")


def test_failed_web_search_and_mcp_error(upstream: UpstreamMock) -> None:
    events = [
        message_start(),
        *_block(0, {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                '{"query":"x"}'),
        *_block(1, {"type": "web_search_tool_result", "tool_use_id": "srv_1",
                    "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}}),
        *_block(2, {"type": "mcp_tool_use", "id": "mcp_1", "name": "lookup", "server_name": "docs",
                    "input": {}}, '{"q":', '"y"}'),
        *_block(3, {"type": "mcp_tool_result", "tool_use_id": "mcp_1", "is_error": True,
                    "content": [{"type": "text", "text": "boom"}]}),
        *text_block(4, "Sorry."),
        *_finish("end_turn"),
    ]  # fmt: skip
    out = _replay_events(upstream, events, {"model": "claude", "input": "q"})
    search, mcp, message = out[-1]["response"]["output"]
    assert (search["status"], search["action"]) == ("failed", {"type": "search", "query": "x"})
    assert (mcp["type"], mcp["status"], mcp["arguments"], mcp["error"]) == (
        "mcp_call",
        "failed",
        '{"q":"y"}',
        "boom",
    )
    assert mcp["server_label"] == "docs"
    assert "response.mcp_call.failed" in [e["type"] for e in out]
    assert message["content"][0]["text"] == "Sorry."


def test_max_tokens_inside_a_tool_call_leaves_it_incomplete(upstream: UpstreamMock) -> None:
    events = [
        message_start(),
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "toolu_t", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"a": "x'}},
        *_finish("max_tokens"),
    ]  # fmt: skip
    out = _replay_events(upstream, events, {"model": "claude", "input": "q"})
    assert out[-1]["type"] == "response.incomplete"
    (call,) = out[-1]["response"]["output"]
    assert (call["status"], call["arguments"]) == ("incomplete", '{"a": "x')


def test_empty_text_block_leaves_no_empty_message(upstream: UpstreamMock) -> None:
    events = [
        message_start(),
        *text_block(0),
        *_block(1, {"type": "tool_use", "id": "toolu_e", "name": "f", "input": {}}, ""),
        *text_block(2, "", "after"),
        *_finish("end_turn"),
    ]
    out = _replay_events(upstream, events, {"model": "claude", "input": "q"})
    call, message = out[-1]["response"]["output"]
    assert (call["type"], call["arguments"]) == ("function_call", "{}")
    assert message["content"] == [{"type": "output_text", "annotations": [], "logprobs": [], "text": "after"}]


def test_tool_names_with_dots_are_mapped_both_ways(upstream: UpstreamMock) -> None:
    events = [
        message_start(),
        *_block(0, {"type": "tool_use", "id": "toolu_d", "name": "fs_read", "input": {}}, '{"p":1}'),
        *_finish("tool_use"),
    ]
    tools = [{"type": "function", "name": "fs.read"}]
    history = [{"type": "function_call", "call_id": "toolu_0", "name": "fs.read", "arguments": "{}"}]
    body = {
        "model": "claude",
        "input": history,
        "tools": tools,
        "tool_choice": {"type": "function", "name": "fs.read"},
    }
    out = _replay_events(upstream, events, body)
    (call,) = out[-1]["response"]["output"]
    assert (call["name"], call["arguments"]) == ("fs.read", '{"p":1}')
    sent = upstream.requests[0].json
    assert sent["tools"][0]["name"] == "fs_read"
    assert sent["tool_choice"] == {"type": "tool", "name": "fs_read"}
    assert sent["messages"][0]["content"][0]["name"] == "fs_read"
