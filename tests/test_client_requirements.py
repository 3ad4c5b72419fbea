"""client-requirements.md bullets that no other test asserted, over real HTTP against a gateway.

Each test names the client (Codex CLI, openai-python, Vercel AI SDK, Open Responses) whose behaviour it
pins; docs/client-requirements-coverage.md maps every bullet to its test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from conftest import Gateway, check_stream, stream_events
from responses_gateway.protocol.checker import check
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from test_server_request import CODEX_BODY
from upstream_mock import UpstreamMock, fixture_reply

Factory = Callable[..., Gateway]

ANTHROPIC_PLAIN = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
GEMINI_PLAIN = "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse"
CHAT_PLAIN = "openai-chat__plain-text-include-usage-final-chunk-gpt-4.1-nano__vercel-ai.chunks.jsonl"

# Codex's own tool list without the hosted tools a scripted back end cannot run (refused below).
CODEX_TOOLS = [t for t in CODEX_BODY["tools"] if t["type"] in ("function", "custom")]

CODEX_TURN: list[dict[str, Any]] = [
    {
        "reasoning": {
            "summary": [["Look ", "around."]],
            "text": ["raw ", "thought"],
            "encrypted_content": "opaque-state",
        }
    },
    {"message": ["Listing ", "files."]},
    {"function_call": {"name": "shell", "arguments": ['{"cmd":', '["ls"]}'], "call_id": "call_a"}},
    {"custom_tool_call": {"name": "apply_patch", "input": ["*** Begin Patch\n", "*** End Patch"]}},
    {"usage": {"input_tokens": 40, "output_tokens": 9, "cached_tokens": 32, "reasoning_tokens": 4}},
]


def _raw_frames(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Split an SSE body the way Codex and the Open Responses parser read it: strict LF frames."""
    assert b"\r" not in raw
    assert raw.endswith(b"\n\n")
    frames = []
    for frame in raw[:-2].split(b"\n\n"):
        lines = frame.split(b"\n")
        # `event: T` then exactly one single-line `data:`; no `id:` line, never a data-less event.
        assert len(lines) == 2, frame
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), frame
        data = orjson.loads(lines[1][len(b"data: ") :])
        assert data["type"] == lines[0][len(b"event: ") :].decode()
        frames.append((data["type"], data))
    return frames


def _codex_read(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What codex-rs/codex-api/src/sse/responses.rs accepts, asserted event by event."""
    assert check(events, profile="codex") == []
    active: dict[str, str] = {}
    history: list[dict[str, Any]] = []
    completed: dict[str, Any] | None = None
    raw_deltas = 0
    for event in events:
        kind = event["type"]
        assert completed is None, "Codex stops reading after response.completed"
        if kind == "response.created":
            assert isinstance(event["response"], dict)
        elif kind == "response.output_item.added":
            item = event["item"]
            if item["type"] == "reasoning":
                assert isinstance(item["summary"], list)  # even in .added
            active[item["id"]] = item["type"]
        elif kind == "response.output_item.done":
            item = event["item"]
            if item["type"] == "message":
                assert [p["type"] for p in item["content"]] == ["output_text"] * len(item["content"])
                assert all(p["annotations"] == [] for p in item["content"])
                assert item["status"] == "completed"
            elif item["type"] == "reasoning":
                assert isinstance(item["summary"], list)
            elif item["type"] == "function_call":
                assert isinstance(item["arguments"], str) and isinstance(item["call_id"], str)
                assert isinstance(item["name"], str) and item["status"] == "completed"
            elif item["type"] == "custom_tool_call":
                assert isinstance(item["input"], str) and isinstance(item["call_id"], str)
            history.append(item)
        elif kind == "response.output_text.delta":
            assert active.get(event["item_id"]) == "message", "OutputTextDelta without active item"
        elif kind == "response.custom_tool_call_input.delta":
            assert active.get(event["item_id"]) == "custom_tool_call"
        elif kind == "response.reasoning_summary_text.delta":
            assert isinstance(event["summary_index"], int)
            assert active.get(event["item_id"]) == "reasoning"
        elif kind == "response.reasoning_text.delta":
            assert isinstance(event["content_index"], int)
            assert active.get(event["item_id"]) == "reasoning"
            raw_deltas += 1
        elif kind == "response.completed":
            completed = event["response"]
    assert completed is not None, "stream closed before response.completed"
    assert isinstance(completed["id"], str)
    return {"history": history, "completed": completed, "raw_deltas": raw_deltas}


# ------------------------------------------------------------------------------------------- Codex
def test_codex_turn_on_the_wire(gateway: Factory) -> None:
    provider = ScriptedProvider(CODEX_TURN, name="m")
    gw = gateway([provider], api_keys=("local-key",))
    body = {**CODEX_BODY, "tools": CODEX_TOOLS}
    # What codex-rs sends besides the body ($LOCAL_KEY from env_key as the bearer token).
    headers = {
        "authorization": "Bearer local-key",
        "accept": "text/event-stream",
        "openai-beta": "responses=experimental",
        "originator": "codex_cli_rs",
        "session_id": "0199-session",
        "conversation_id": "0199-session",
        "version": "0.169.0",
    }
    with httpx.Client(timeout=30) as client:
        refused = client.post(gw.url("/v1/responses"), json=body, headers={**headers, "authorization": "x"})
        answer = client.post(gw.url("/v1/responses"), json=body, headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    frames = _raw_frames(answer.content)
    events = [data for _, data in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    check_stream(events, strict=False)  # custom_tool_call is an extension item

    read = _codex_read(events)
    completed = read["completed"]

    # History is built from the .done items; response.completed.output holds every one of them. (The
    # sealed reasoning state is sealed afresh, with a new nonce, wherever the item is shown.)
    def unsealed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in item.items() if k != "encrypted_content"} for item in items]

    assert unsealed(completed["output"]) == unsealed(read["history"])
    kinds = [i["type"] for i in read["history"]]
    assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]
    reasoning, message, call, custom = read["history"]
    assert reasoning["encrypted_content"]  # include: ["reasoning.encrypted_content"]
    # Raw reasoning in Codex's spelling (response.reasoning_text.delta, with content_index).
    assert read["raw_deltas"] == 2
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "raw thought"}]
    assert message["content"][0]["text"] == "Listing files."
    assert (call["call_id"], call["arguments"]) == ("call_a", '{"cmd":["ls"]}')
    assert custom["input"] == "*** Begin Patch\n*** End Patch"
    for item, prefix in zip(read["history"], ("rs_", "msg_", "fc_", "ctc_"), strict=True):
        assert item["id"].startswith(prefix)

    usage = completed["usage"]
    assert usage == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 4},
        "total_tokens": 49,
    }
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert type(usage[key]) is int
    assert type(usage["input_tokens_details"]["cached_tokens"]) is int
    assert type(usage["output_tokens_details"]["reasoning_tokens"]) is int

    # What Codex sent is echoed back, and reached the back end.
    assert completed["store"] is False and completed["parallel_tool_calls"] is False
    assert completed["prompt_cache_key"] == "conv-1" and completed["tool_choice"] == "auto"
    assert provider.requests[0].instructions == "You are Codex."


def test_codex_next_turn_sends_the_whole_history_back(gateway: Factory) -> None:
    script = {
        "turns": [
            {"when": {"input_has": "custom_tool_call_output"}, "steps": [{"message": "All done."}]},
            {"steps": CODEX_TURN},
        ]
    }
    provider = ScriptedProvider(script, name="m")
    gw = gateway([provider])
    first = {**CODEX_BODY, "tools": CODEX_TOOLS, "input": [CODEX_BODY["input"][1]]}
    history = _codex_read(stream_events(gw.url("/v1/responses"), first))["history"]
    # Codex resends every turn in full (store: false), sometimes without the ids it was given.
    reasoning, message, call, custom = (dict(item) for item in history)
    del message["id"], call["id"]
    custom["id"] = "codex-" + custom["id"]
    second_input = [
        CODEX_BODY["input"][1],
        reasoning,
        message,
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"},
        custom,
        {"type": "custom_tool_call_output", "call_id": custom["call_id"], "output": "Done"},
    ]
    second = stream_events(gw.url("/v1/responses"), {**first, "input": second_input})
    check_stream(second)
    assert _codex_read(second)["completed"]["output"][0]["content"][0]["text"] == "All done."
    seen = provider.requests[1].input
    assert [i["type"] for i in seen] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
    ]
    # The sealed reasoning state is opened again for the back end that produced it.
    assert seen[1]["encrypted_content"] == "opaque-state"
    assert seen[3]["arguments"] == '{"cmd":["ls"]}' and seen[5]["input"] == custom["input"]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search", "external_web_access": False},
        {"type": "tool_search"},
        {"type": "image_generation", "output_format": "png"},
    ],
    ids=lambda t: t["type"],
)
def test_codex_hosted_tools_a_back_end_cannot_run_are_refused_naming_the_param(
    gateway: Factory, tool: dict[str, Any]
) -> None:
    provider = ScriptedProvider([{"message": "never"}], name="m")
    gw = gateway([provider])
    body = {**CODEX_BODY, "tools": [*CODEX_TOOLS, tool]}
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "tools[2].type"
    assert error["type"] == "invalid_request_error"
    assert tool["type"] in error["message"]
    assert provider.requests == []


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("context_length_exceeded", "Your input exceeds the context window of this model."),
        ("insufficient_quota", "You exceeded your current quota."),
        ("rate_limit_exceeded", "Rate limit reached. Please try again in 7s."),
        ("server_is_overloaded", "The upstream is overloaded."),
    ],
)
def test_codex_failure_codes_end_the_stream_with_response_failed(
    gateway: Factory, code: str, message: str
) -> None:
    script = [{"message": ["partial"]}, {"error": {"status": 400, "code": code, "message": message}}]
    gw = gateway([ScriptedProvider(script, name="m")])
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    check_stream(events)
    error, failed = events[-2:]
    # Codex ignores `error`; it maps response.failed by error.code (and reads the retry delay).
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": code, "message": message}
    assert failed["response"]["id"] == events[0]["response"]["id"]
    # The `error` event in both forms: top-level (openai-python) and nested (open-responses, Vercel),
    # with the sequence_number the Vercel schema requires.
    assert error["type"] == "error"
    assert error["sequence_number"] == failed["sequence_number"] - 1
    assert (error["code"], error["message"]) == (code, message)
    assert (error["error"]["code"], error["error"]["message"]) == (code, message)


# ---------------------------------------------------------------------------------- openai-python
@pytest.mark.parametrize("mode", ["in_progress", "ping", "comment"])
def test_every_keepalive_mode_is_readable_by_the_sdk(gateway: Factory, mode: str) -> None:
    script = [{"message": ["a"]}, {"sleep": 0.35}, {"message": ["b"]}]
    gw = gateway([ScriptedProvider(script, name="m")], keepalive=mode, keepalive_interval=0.1)
    raw = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}).content
    # No `id:` line anywhere (after one, a comment would make the SDK dispatch an empty event).
    assert not any(line.startswith(b"id:") for line in raw.split(b"\n"))
    if mode == "comment":
        assert b": keepalive\n\n" in raw
        raw = raw.replace(b": keepalive\n\n", b"")
    frames = _raw_frames(raw)  # every event carries single-line JSON data
    assert len(frames) >= 10
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "ab"


# -------------------------------------------------------------------------------------- Vercel AI
def test_vercel_input_shapes_are_accepted(gateway: Factory) -> None:
    provider = ScriptedProvider([{"message": "ok"}], name="m")
    gw = gateway([provider])
    # Messages without `type`, assistant content as a plain string, a function call without an id.
    body = {
        "model": "m",
        "input": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "store": False,
    }
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    seen = provider.requests[0].input
    assert [(i["type"], i.get("role")) for i in seen] == [
        ("message", "system"),
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call_output", None),
    ]
    assert seen[2]["content"] == [{"type": "output_text", "text": "Checking.", "annotations": []}]


def test_pitfall_19_reasoning_item_sent_back_with_only_its_id(gateway: Factory) -> None:
    provider = ScriptedProvider([{"message": "ok"}], name="m")
    gw = gateway([provider])
    body = {
        "model": "m",
        "store": False,
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_0123456789abcdef", "summary": []},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
    }
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"


def test_lifecycle_snapshots_carry_id_created_at_and_model(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([{"message": "x"}], name="m")])
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    ids = set()
    for event in events:
        if event["type"].startswith("response.") and "response" in event:
            snapshot = event["response"]
            assert isinstance(snapshot["created_at"], int) and snapshot["model"] == "m"
            ids.add(snapshot["id"])
        if event["type"] == "response.output_text.delta":
            assert event["item_id"].startswith("msg_")
    assert len(ids) == 1


# ------------------------------------------------------------------------------- Open Responses
def test_compact_endpoint_compacts_and_a_missing_model_is_a_clear_400(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([{"message": "notes"}], name="m")])
    answer = httpx.post(gw.url("/v1/responses/compact"), json={"model": "m", "input": "hi"}, timeout=30)
    assert answer.status_code == 200, answer.text
    compacted = answer.json()
    assert compacted["object"] == "response.compaction" and compacted["output"][-1]["type"] == "compaction"
    missing = httpx.post(gw.url("/v1/responses/compact"), json={"input": "hi"}, timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.mark.parametrize("vendor", ["anthropic", "gemini"])
def test_codex_cached_web_search_is_refused_by_live_only_back_ends(
    gateway: Factory, upstream: UpstreamMock, vendor: str
) -> None:
    provider: Any
    if vendor == "anthropic":
        provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-x")
        reply = fixture_reply(ANTHROPIC_PLAIN)
    else:
        provider = GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")
        reply = fixture_reply(GEMINI_PLAIN)
    provider.name = "m"
    gw = gateway([provider])
    upstream.reset()
    tools = [CODEX_TOOLS[0], {"type": "web_search", "external_web_access": False}]
    body = {**CODEX_BODY, "input": [CODEX_BODY["input"][1]], "tools": tools}
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "tools[1].external_web_access"
    assert "external_web_access" in error["message"]
    assert upstream.requests == []
    # Live search (Codex's web_search = "live") is what these back ends do.
    upstream.reset([reply])
    tools[1] = {"type": "web_search", "external_web_access": True}
    events = stream_events(gw.url("/v1/responses"), body)
    assert events[-1]["type"] == "response.completed"
    sent = orjson.dumps(upstream.requests[0].json)
    assert b"web_search_20250305" in sent or b"googleSearch" in sent


@pytest.mark.parametrize("vendor", ["anthropic", "gemini"])
def test_codex_cached_web_search_is_left_out_when_the_server_drops_web_search(
    gateway: Factory, upstream: UpstreamMock, vendor: str
) -> None:
    # serve --drop-unsupported-tool web_search: the back end's own refusal of the tool's settings
    # leaves the tool out instead of failing Codex's request.
    provider: Any
    if vendor == "anthropic":
        provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-x")
        reply = fixture_reply(ANTHROPIC_PLAIN)
    else:
        provider = GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")
        reply = fixture_reply(GEMINI_PLAIN)
    provider.name = "m"
    gw = gateway([provider], drop_unsupported_tools=("web_search",))
    upstream.reset([reply])
    tools = [{"type": "web_search", "external_web_access": False}, CODEX_TOOLS[0]]
    body = {**CODEX_BODY, "input": [CODEX_BODY["input"][1]], "tools": tools}
    events = stream_events(gw.url("/v1/responses"), body)
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    assert [t["type"] for t in events[-1]["response"]["tools"]] == [CODEX_TOOLS[0]["type"]]
    sent = orjson.dumps(upstream.requests[0].json)
    assert b"web_search" not in sent and b"googleSearch" not in sent
    assert CODEX_TOOLS[0]["name"].encode() in sent


@pytest.mark.parametrize("vendor", ["anthropic", "gemini", "openai-chat"])
def test_pitfall_19_bare_reasoning_id_is_tolerated_by_every_upstream_provider(
    gateway: Factory, upstream: UpstreamMock, vendor: str
) -> None:
    provider: Any
    if vendor == "anthropic":
        provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-x")
        reply = fixture_reply(ANTHROPIC_PLAIN)
    elif vendor == "gemini":
        provider = GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")
        reply = fixture_reply(GEMINI_PLAIN)
    else:
        provider = OpenAIChatProvider(base_url=upstream.url, api_key="sk-test", upstream_model="gpt-x")
        reply = fixture_reply(CHAT_PLAIN)
    provider.name = "m"
    gw = gateway([provider])
    upstream.reset([reply])
    # vercel/ai #7543: under store: false the reasoning item comes back as its rs_ id alone.
    body = {
        "model": "m",
        "store": False,
        "stream": True,
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_0123456789abcdef", "summary": []},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
    }
    events = stream_events(gw.url("/v1/responses"), body)
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    sent = orjson.dumps(upstream.requests[0].json)
    assert b"rs_0123456789abcdef" not in sent
    assert b"hello" in sent and b"again" in sent


CODEX_UPSTREAMS = {
    "anthropic": "anthropic-messages__thinking-then-tool-use__simonw-llm-anthropic.sse",
    "gemini": "gemini__stream-function-call-with-thought-signature-gemini-3-pro__vercel-ai.chunks.jsonl",
    "openai-chat": (
        "openai-chat__deepseek-reasoner-reasoning-then-tool-call-split-args__vercel-ai.chunks.jsonl"
    ),
}


@pytest.mark.parametrize("vendor", sorted(CODEX_UPSTREAMS))
def test_codex_reads_every_upstream_providers_tool_turn(
    gateway: Factory, upstream: UpstreamMock, vendor: str
) -> None:
    provider: Any
    if vendor == "anthropic":
        provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant", upstream_model="claude-x")
    elif vendor == "gemini":
        provider = GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")
    else:
        provider = OpenAIChatProvider(base_url=upstream.url, api_key="sk-test", upstream_model="gpt-x")
    provider.name = "m"
    gw = gateway([provider])
    upstream.reset([fixture_reply(CODEX_UPSTREAMS[vendor])])
    tools = [CODEX_TOOLS[0]] if vendor != "anthropic" else CODEX_TOOLS
    body = {**CODEX_BODY, "tools": tools, "input": [CODEX_BODY["input"][1]]}
    events = stream_events(gw.url("/v1/responses"), body)
    check_stream(events)
    read = _codex_read(events)
    calls = [item for item in read["history"] if item["type"] == "function_call"]
    assert calls, [item["type"] for item in read["history"]]
    assert read["history"][0]["type"] == "reasoning"
    # The next turn, as Codex builds it, goes back upstream with the same call id.
    upstream.reset([fixture_reply(CODEX_UPSTREAMS[vendor])])
    history = [
        CODEX_BODY["input"][1],
        *read["history"],
        *({"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls),
    ]
    second = stream_events(gw.url("/v1/responses"), {**body, "input": history})
    assert second[-1]["type"] == "response.completed"
    sent = orjson.dumps(upstream.requests[-1].json)
    for call in calls:
        assert call["call_id"].encode() in sent
