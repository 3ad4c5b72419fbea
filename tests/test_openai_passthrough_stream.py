"""Every recorded Responses stream relayed through OpenAIResponsesProvider, plus the relay's edge cases.

The relayed stream must pass the checker with our own response id and sequence numbers, and its final
output must be the upstream's own final output: same items, same ids, same text, arguments, summaries,
byte-identical encrypted_content, same usage and status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fixtures_loader import list_fixtures, load_chunks, load_json, load_sse
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.protocol.builder import BuilderError, StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.protocol.sse import SSEDecoder
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider, build_responses_body
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, json_reply, stream_reply

STREAMS = list_fixtures("openai-responses__", suffixes=(".sse", ".chunks.jsonl"))
# GitHub Copilot changes an item's id between its events; the relay keeps the first one.
ROTATING_IDS = {"openai-responses__reasoning-summary-then-text-gpt-5.3-codex__vercel-ai.chunks.jsonl"}
# Edited by their recorders (anonymized, shortened): the done message's text no longer continues its
# deltas (and one lost its phase). The relay keeps what it streamed: deltas cannot be taken back.
EDITED = {
    "openai-responses__reasoning-multiple-summary-parts-azure-gpt-5.4__vercel-ai.chunks.jsonl",
    "openai-responses__shell-call-container-output-gpt-5.2__vercel-ai.chunks.jsonl",
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def recorded(name: str) -> list[dict[str, Any]]:
    if name.endswith(".chunks.jsonl"):
        return load_chunks(name)
    decoder = SSEDecoder()
    messages = decoder.feed(load_sse(name)) + decoder.flush()
    return [orjson.loads(m.data) for m in messages if m.data.strip() != "[DONE]"]


def upstream_view(name: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The items a client takes from ``output_item.done`` and the terminal Response, if any.

    Only the first response counts (one fixture holds four back to back). The done items, not the
    terminal ``output``, are what clients keep (OpenAI's SDK says to take encrypted_content from
    them), and some upstreams disagree with themselves between the two.
    """
    done: dict[int, dict[str, Any]] = {}
    for event in recorded(name):
        if event["type"] == "response.output_item.done":
            done[event["output_index"]] = event["item"]
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            return [done[i] for i in sorted(done)], event["response"]
    return [done[i] for i in sorted(done)], None


def normalized(item: dict[str, Any], *, ids: bool = True) -> dict[str, Any]:
    """An item as compared: ``logprobs: []`` parts are the same as parts without logprobs."""
    out = dict(item)
    if not ids:
        out.pop("id", None)
    if isinstance(out.get("content"), list):
        out["content"] = [
            {k: v for k, v in p.items() if not (k == "logprobs" and v == [])} for p in out["content"]
        ]
    return out


def run(upstream: UpstreamMock, name: str, *, split: bool, seed: int = 0) -> list[dict[str, Any]]:
    upstream.reset([fixture_reply(name, split=split, seed=seed, max_piece=211, delay=0)])
    provider = OpenAIResponsesProvider(base_url=upstream.url + "/v1", api_key="sk-test-relay-0000001")
    return asyncio.run(drive(provider, {"model": "gpt-5", "input": "hi"}))


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream(upstream: UpstreamMock, name: str, split: bool) -> None:
    events = run(upstream, name, split=split, seed=len(name))
    assert check(events) == []
    acc = accumulate(events)
    assert acc.discrepancies == []
    response = acc.response
    items, final = upstream_view(name)
    assert response["id"].startswith("resp_") and response["id"] != (final or {}).get("id")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    ids = name not in ROTATING_IDS
    got = [normalized(o, ids=ids) for o in response["output"]]
    want = [normalized(o, ids=ids) for o in items]
    if name in EDITED:
        deltas = "".join(e["delta"] for e in recorded(name) if e["type"] == "response.output_text.delta")
        assert got[-1]["content"][0]["text"] == deltas
        got[-1] = {k: v for k, v in got[-1].items() if k != "phase"}
        got[-1]["content"] = want[-1]["content"]
    assert got == want
    if final is None:
        assert response["status"] == "failed"
        return
    assert response["status"] == final["status"]
    if final.get("usage") is None:
        assert response["usage"] is None
    else:
        # Vendor extras (OpenRouter's cost) are not part of the Responses usage object.
        standard = {k: v for k, v in final["usage"].items() if k in response["usage"]}
        assert response["usage"] == {**standard, **_cache_write(final["usage"])}
    if final["status"] == "incomplete":
        assert response["incomplete_details"] == final["incomplete_details"]
    if final["status"] == "failed":
        assert response["error"] == {"code": final["error"]["code"], "message": final["error"]["message"]}


def _cache_write(usage: dict[str, Any]) -> dict[str, Any]:
    details = dict(usage.get("input_tokens_details") or {})
    details.setdefault("cache_write_tokens", 0)
    return {"input_tokens_details": details}


def test_request_passes_through(upstream: UpstreamMock) -> None:
    name = "openai-responses__refusal-delta-stream-gpt-4o__mirascope-mirascope.sse"
    upstream.reset([fixture_reply(name)])
    provider = OpenAIResponsesProvider(
        base_url=upstream.url + "/v1", api_key="sk-k-123456", upstream_model="gpt-4o"
    )
    body = {
        "model": "alias",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-opaque=="},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
        "instructions": "Be terse.",
        "tools": [
            {"type": "web_search"},
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
        ],
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": False,
        "stream": True,
        "metadata": {"k": "v"},
    }
    asyncio.run(drive(provider, body))
    request = upstream.requests[-1]
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "Bearer sk-k-123456"
    sent = request.json
    expected = dict(body)
    expected["model"] = "gpt-4o"
    expected["input"][0] = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
    }
    assert sent == expected


def test_gateway_state_fields_stay_home() -> None:
    request = parse_request({"model": "m", "input": "hi", "stream": True, "store": True})
    request.raw.update(previous_response_id="resp_ours", conversation="conv_ours", background=True)
    request.raw["stream_options"] = {"include_obfuscation": False}
    body = build_responses_body(request, upstream_model="gpt-5")
    assert body == {"model": "gpt-5", "input": request.input, "stream": True, "store": True}


def test_encrypted_content_is_byte_identical(upstream: UpstreamMock) -> None:
    name = "openai-responses__web-search-call-with-encrypted-reasoning__pydantic-pydantic-ai.sse"
    events = run(upstream, name, split=True, seed=8)
    want = [o["encrypted_content"] for o in upstream_view(name)[0] if o["type"] == "reasoning"]
    got = [o["encrypted_content"] for o in events[-1]["response"]["output"] if o["type"] == "reasoning"]
    assert got == want and all(got)


def test_copilot_rotating_ids_stay_stable(upstream: UpstreamMock) -> None:
    name = next(iter(ROTATING_IDS))
    events = run(upstream, name, split=False)
    added = {e["output_index"]: e["item"]["id"] for e in events if e["type"] == "response.output_item.added"}
    for event in events:
        if "item_id" in event:
            assert event["item_id"] == added[event["output_index"]]


def test_unknown_events_pass_through_with_our_numbers(upstream: UpstreamMock) -> None:
    name = "openai-responses__apply-patch-call-diff-delta-gpt-5.1__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=False)
    diffs = [e for e in events if e["type"] == "response.apply_patch_call_operation_diff.delta"]
    assert len(diffs) == sum(1 for e in recorded(name) if e["type"] == diffs[0]["type"])
    patch = next(o for o in events[-1]["response"]["output"] if o["type"] == "apply_patch_call")
    assert all(e["item_id"] == patch["id"] for e in diffs)


def test_pitfall_18_error_event_then_failed(upstream: UpstreamMock) -> None:
    name = "openai-responses__error-event-then-response-failed-insufficient-quota__vercel-ai.chunks.jsonl"
    events = run(upstream, name, split=False)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "insufficient_quota"


def test_multi_response_recording_stops_at_the_first_terminal(upstream: UpstreamMock) -> None:
    name = next(n for n in STREAMS if "multi-step-reasoning-summary" in n)
    events = run(upstream, name, split=False)
    assert sum(e["type"] == "response.completed" for e in events) == 1


@pytest.mark.parametrize(
    "name",
    [n for n in list_fixtures("openai-responses__nonstream-", suffixes=(".json",)) if "http-" not in n],
)
def test_whole_response_body(upstream: UpstreamMock, name: str) -> None:
    body = load_json(name)
    upstream.reset([json_reply(body)])
    provider = OpenAIResponsesProvider(base_url=upstream.url)
    events = asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert check(events) == []
    final = events[-1]["response"]
    assert [normalized(o) for o in final["output"]] == [normalized(o) for o in body["output"]]
    assert final["status"] == body["status"]


@pytest.mark.parametrize(
    ("name", "sent", "status", "code"),
    [
        (
            "openai-responses__http-400-model-not-found-body__mirascope-mirascope.json",
            400,
            404,
            "model_not_found",
        ),
        (
            "openai-responses__http-error-body-insufficient-quota__vercel-ai.json",
            429,
            429,
            "insufficient_quota",
        ),
        (
            "openai-responses__http-error-body-unsupported-parameter-temperature__vercel-ai.json",
            400,
            400,
            None,
        ),
        (
            "openai-responses__nonstream-http-400-invalid-temperature__pydantic-pydantic-ai.json",
            400,
            400,
            None,
        ),
    ],
)
def test_http_errors(upstream: UpstreamMock, name: str, sent: int, status: int, code: str | None) -> None:
    body = load_json(name)
    upstream.reset([json_reply(body, status=sent)])
    provider = OpenAIResponsesProvider(base_url=upstream.url, api_key="sk-test-secret-42424242")
    with pytest.raises(ProviderError) as info:
        asyncio.run(drive(provider, {"model": "m", "input": "hi"}))
    assert info.value.status == status
    assert info.value.code == (code or body["error"]["code"] or "invalid_request_error")
    assert info.value.message == body["error"]["message"]
    assert info.value.param == body["error"]["param"] or code == "model_not_found"


def events_stream(upstream: UpstreamMock, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    upstream.reset([stream_reply(encode_chunks(events, "openai-responses"), split=True, seed=2, delay=0)])
    out = asyncio.run(drive(OpenAIResponsesProvider(base_url=upstream.url), {"model": "m", "input": "hi"}))
    assert check(out) == []
    return out


def test_done_without_deltas_is_filled(upstream: UpstreamMock) -> None:
    msg = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    text = {"type": "output_text", "text": "", "annotations": []}
    final = {**msg, "status": "completed", "content": [{**text, "text": "Hello there"}]}
    out = events_stream(
        upstream,
        [
            {"type": "response.output_item.added", "output_index": 0, "item": msg},
            {
                "type": "response.content_part.added",
                "output_index": 0,
                "item_id": "msg_1",
                "content_index": 0,
                "part": text,
            },
            {
                "type": "response.output_text.delta",
                "output_index": 0,
                "item_id": "msg_1",
                "content_index": 0,
                "delta": "Hel",
            },
            {
                "type": "response.output_text.done",
                "output_index": 0,
                "item_id": "msg_1",
                "content_index": 0,
                "text": "Hello there",
            },
            {"type": "response.output_item.done", "output_index": 0, "item": final},
            {"type": "response.completed", "response": {"status": "completed", "output": [final]}},
        ],
    )
    assert [e["delta"] for e in out if e["type"] == "response.output_text.delta"] == ["Hel", "lo there"]
    assert out[-1]["response"]["output"][0]["content"][0]["text"] == "Hello there"


def test_stream_cut_before_terminal_fails(upstream: UpstreamMock) -> None:
    msg = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    out = events_stream(
        upstream,
        [
            {
                "type": "response.created",
                "response": {"id": "resp_up", "status": "in_progress", "output": []},
            },
            {"type": "response.output_item.added", "output_index": 0, "item": msg},
            {
                "type": "response.output_text.delta",
                "output_index": 0,
                "item_id": "msg_1",
                "content_index": 0,
                "delta": "x",
            },
        ],
    )
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["output"][0]["status"] == "incomplete"


def test_builder_passthrough_refuses_owned_events() -> None:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    item = builder.open_item("shell_call", {"status": "in_progress", "action": {"commands": []}})
    event = builder.passthrough(
        {"type": "response.shell_call_command.added", "item_id": "up", "output_index": 9}, item
    )
    assert (event["item_id"], event["output_index"]) == (item.id, 0)
    with pytest.raises(BuilderError):
        builder.passthrough({"type": "response.output_item.done", "item": {}})
    builder.close_item(item)
    with pytest.raises(BuilderError):
        builder.passthrough({"type": "response.shell_call_command.delta", "item_id": "up"}, item)
    builder.complete()
    assert check(builder.take()) == []


def test_contradictory_upstream_events_are_dropped_not_fatal(upstream: UpstreamMock) -> None:
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c",
        "name": "f",
        "arguments": "",
        "status": "in_progress",
    }
    done = {**call, "arguments": "{}", "status": "completed"}
    out = events_stream(
        upstream,
        [
            {"type": "response.output_item.added", "output_index": 0, "item": call},
            {
                "type": "response.reasoning_summary_text.delta",
                "output_index": 0,
                "item_id": "fc_1",
                "delta": "x",
            },
            {"type": "response.web_search_call.searching", "output_index": 0, "item_id": "fc_1"},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 0,
                "item_id": "fc_1",
                "delta": "late",
            },
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            {"type": "response.completed", "response": {"status": "completed", "output": [done]}},
        ],
    )
    assert out[-1]["type"] == "response.completed"
    assert out[-1]["response"]["output"] == [{**done, "id": "fc_1"}]
