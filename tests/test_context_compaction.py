"""Server-side compaction (``context_management``) against a real gateway: the scripted back end and a
Chat Completions upstream (mock), over HTTP with the openai SDK and over a WebSocket.

A request whose context is estimated past its ``compact_threshold`` gets a summarising turn first:
the Response's first output item is a sealed ``compaction`` item and the model's turn reads the
compacted window (the user messages, the summary, the tool results still awaited) instead of the
history. Sent back (stateless, appended after the history, or through ``previous_response_id``), the
item stands for everything before it; altered, it is refused. Small contexts are not compacted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseCompactionItem
from websockets.sync.client import connect

from conftest import Gateway, check_stream, start_gateway, stream_events
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, json_reply

JSON = dict[str, Any]
SUMMARY = "NOTES: the user is refactoring parser.py; tests pass; next: rename the module."
# An old assistant answer long enough to pass a 1000-token threshold (4 bytes a token).
LONG = "The parser walks every token and builds the tree. " * 120
HISTORY: list[JSON] = [
    {"role": "user", "content": "Refactor parser.py."},
    {"role": "assistant", "content": LONG},
    {"role": "user", "content": "Now rename the module."},
]
CONTEXT = [{"type": "compaction", "compact_threshold": 1000}]
SCRIPT = {
    "turns": [
        {"when": {"text_contains": "Summarize the conversation so far"}, "steps": [{"message": [SUMMARY]}]},
        {
            "when": {"text_contains": "NOTES: the user"},
            "steps": [{"message": ["Renamed, ", "from the notes."]}],
        },
        {"steps": [{"message": ["Answered ", "from the full history."]}]},
    ]
}


@pytest.fixture(scope="module")
def scripted() -> ScriptedProvider:
    return ScriptedProvider(SCRIPT, name="m")


@pytest.fixture(scope="module")
def gw(scripted: ScriptedProvider) -> Iterator[Gateway]:
    gateway = start_gateway([scripted], request_log=False)
    yield gateway
    gateway.stop()


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def _texts(items: list[JSON]) -> str:
    return json.dumps(items)


def test_a_long_context_is_compacted_before_the_turn(gw: Gateway, scripted: ScriptedProvider) -> None:
    events = stream_events(
        gw.url("/v1/responses"),
        {"model": "m", "input": HISTORY, "store": False, "stream": True, "context_management": CONTEXT},
    )
    check_stream(events)
    response = Response.model_validate(events[-1]["response"])
    compaction, answer = response.output
    assert isinstance(compaction, ResponseCompactionItem) and compaction.id.startswith("cmp_")
    assert answer.type == "message"
    assert "NOTES" not in compaction.encrypted_content and "parser" not in compaction.encrypted_content
    assert response.output_text == "Renamed, from the notes."
    # The stream carried the item like any other: added, then done, before the answer.
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["compaction", "message"]
    # The model's turn read the compacted window: the user messages and the summary, not the history.
    turn = scripted.requests[-1]
    assert LONG not in _texts(turn.input) and SUMMARY in _texts(turn.input)
    assert [i.get("role") for i in turn.input] == ["user", "user", "developer"]

    # Stateless chaining: the client appends the output and a new message; the compaction item
    # stands for everything before it, so the next turn is small and not compacted again.
    again = _client(gw).responses.create(
        model="m",
        store=False,
        context_management=CONTEXT,  # type: ignore[arg-type]
        input=[
            *HISTORY,
            *[item.to_dict() for item in response.output],
            {"role": "user", "content": "Thanks."},
        ],
    )
    assert [item.type for item in again.output] == ["message"]
    assert again.output_text == "Renamed, from the notes."
    seen = scripted.requests[-1].input
    assert LONG not in _texts(seen) and SUMMARY in _texts(seen) and "Thanks." in _texts(seen)


def test_a_short_context_is_not_compacted(gw: Gateway) -> None:
    response = _client(gw).responses.create(
        model="m",
        input="Hello.",
        context_management=CONTEXT,
        store=False,  # type: ignore[arg-type]
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "Answered from the full history."


def test_an_altered_compaction_item_is_refused(gw: Gateway) -> None:
    response = _client(gw).responses.create(
        model="m",
        input=HISTORY,
        context_management=CONTEXT,
        store=False,  # type: ignore[arg-type]
    )
    item = response.output[0].to_dict()
    sealed = item["encrypted_content"]
    item["encrypted_content"] = sealed[:-6] + ("AAAAAA" if not sealed.endswith("AAAAAA") else "BBBBBB")
    refused = httpx.post(
        gw.url("/v1/responses"),
        json={"model": "m", "store": False, "input": [item, {"role": "user", "content": "go"}]},
        timeout=30,
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_encrypted_content" and error["param"] == "input[0].encrypted_content"


def test_tool_results_awaited_survive_the_compaction(gw: Gateway, scripted: ScriptedProvider) -> None:
    call = {"type": "function_call", "call_id": "call_7", "name": "run", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_7", "output": "exit 0"}
    tools = [{"type": "function", "name": "run", "parameters": {"type": "object"}}]
    response = _client(gw).responses.create(
        model="m",
        store=False,
        tools=tools,  # type: ignore[list-item]
        context_management=CONTEXT,  # type: ignore[arg-type]
        input=[*HISTORY, call, output],  # type: ignore[list-item]
    )
    assert response.output[0].type == "compaction"
    seen = scripted.requests[-1].input
    assert [i.get("type") for i in seen[-2:]] == ["function_call", "function_call_output"]
    assert LONG not in _texts(seen)


def test_context_management_is_validated(gw: Gateway) -> None:
    for entry, param in (
        ({"type": "compaction", "compact_threshold": 10}, "context_management[0].compact_threshold"),
        ({"type": "truncate"}, "context_management[0].type"),
        ({"type": "compaction", "every": 3}, "context_management[0].every"),
    ):
        answer = httpx.post(
            gw.url("/v1/responses"),
            json={"model": "m", "input": "hi", "context_management": [entry]},
            timeout=30,
        )
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_compaction_over_a_websocket_chain(gw: Gateway, scripted: ScriptedProvider) -> None:
    with connect(f"ws://127.0.0.1:{gw.port}/v1/responses") as ws:

        def turn(**body: Any) -> JSON:
            ws.send(json.dumps({"type": "response.create", "model": "m", "store": False, **body}))
            events = []
            while not events or events[-1]["type"] not in ("response.completed", "response.failed"):
                events.append(json.loads(ws.recv(timeout=15)))
            check_stream(events)
            return dict(events[-1]["response"])

        first = turn(input=HISTORY[:2])  # long, but no context_management: not compacted
        assert [i["type"] for i in first["output"]] == ["message"]
        second = turn(previous_response_id=first["id"], input=HISTORY[2:], context_management=CONTEXT)
        assert [i["type"] for i in second["output"]] == ["compaction", "message"]
        third = turn(previous_response_id=second["id"], input="And then?", context_management=CONTEXT)
        assert [i["type"] for i in third["output"]] == ["message"]
        seen = scripted.requests[-1].input
        assert LONG not in _texts(seen) and SUMMARY in _texts(seen) and "And then?" in _texts(seen)


def _chat(text: str) -> Any:
    return json_reply(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-x",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920},
        }
    )


def test_compaction_through_a_chat_completions_upstream() -> None:
    with UpstreamMock() as upstream:
        provider = OpenAIChatProvider(base_url=upstream.url, api_key="sk-test", upstream_model="gpt-x")
        provider.name = "chat"
        gw = start_gateway([provider], request_log=False)
        try:
            upstream.reset([_chat(SUMMARY), _chat("Renamed.")])
            events = stream_events(
                gw.url("/v1/responses"),
                {"model": "chat", "input": HISTORY, "stream": True, "context_management": CONTEXT},
            )
            check_stream(events)
            output = events[-1]["response"]["output"]
            assert [i["type"] for i in output] == ["compaction", "message"]
            summary_turn, answer_turn = (r.json for r in upstream.requests)
            assert LONG in json.dumps(summary_turn["messages"])
            sent = json.dumps(answer_turn["messages"])
            assert LONG not in sent and SUMMARY in sent and "Now rename the module." in sent
        finally:
            gw.stop()


def test_a_compaction_trigger_answers_with_the_compaction_item_alone(
    gw: Gateway, scripted: ScriptedProvider
) -> None:
    """``{"type": "compaction_trigger"}`` as the final input item (OpenAI's, and Codex's "remote
    compaction v2"): the Response holds exactly one compaction item; sent back as the base of the next
    request, it is the context."""
    client = _client(gw)
    compacted = client.responses.create(
        model="m",
        store=False,
        input=[*HISTORY, {"type": "compaction_trigger"}],  # type: ignore[list-item]
    )
    assert compacted.status == "completed"
    [item] = compacted.output
    assert isinstance(item, ResponseCompactionItem)
    assert "Summarize the conversation so far" in _texts(scripted.requests[-1].input)
    after = client.responses.create(
        model="m",
        store=False,
        input=[item.to_dict(), {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
    )
    assert after.output_text == "Renamed, from the notes."
    assert LONG not in _texts(scripted.requests[-1].input)

    misplaced = httpx.post(
        gw.url("/v1/responses"),
        json={"model": "m", "input": [{"type": "compaction_trigger"}, {"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert misplaced.status_code == 400 and misplaced.json()["error"]["param"] == "input[0]"


def test_a_compact_window_starts_a_new_websocket_chain(gw: Gateway, scripted: ScriptedProvider) -> None:
    """The Open Responses suite's websocket-compact-new-chain: ``POST /responses/compact``'s output,
    plus a new message, as the input of a WebSocket response without ``previous_response_id``."""
    window = [item.to_dict() for item in _client(gw).responses.compact(model="m", input=HISTORY).output]  # type: ignore[arg-type]
    with connect(f"ws://127.0.0.1:{gw.port}/v1/responses") as ws:
        body = {"type": "response.create", "model": "m", "store": False, "tools": []}
        ws.send(json.dumps({**body, "input": [*window, {"role": "user", "content": "Continue from here."}]}))
        events: list[JSON] = []
        while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
            events.append(json.loads(ws.recv(timeout=15)))
    check_stream(events)
    response = Response.model_validate(events[-1]["response"])
    assert response.status == "completed" and response.output_text == "Renamed, from the notes."
    assert LONG not in _texts(scripted.requests[-1].input)


def test_a_slow_summary_does_not_hold_back_the_first_event() -> None:
    """The summarising turn can take minutes on a small local model: the Response's first event goes
    out as soon as the back end has accepted that turn (and keepalives after it), not once the summary
    is written, so no client or proxy read timeout cuts a slow compaction."""
    slow = {
        "turns": [
            {
                "when": {"text_contains": "Summarize the conversation so far"},
                "steps": [{"message": ["NOTES: "]}, {"sleep": 4}, {"message": ["renamed the module."]}],
            },
            {"steps": [{"message": ["Done."]}]},
        ]
    }
    gateway = start_gateway([ScriptedProvider(slow, name="slow")], request_log=False)
    body = {"model": "slow", "input": HISTORY, "store": False, "stream": True, "context_management": CONTEXT}
    arrived: list[tuple[float, str]] = []
    try:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", gateway.url("/v1/responses"), json=body) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event: "):
                    arrived.append((time.monotonic(), line[len("event: ") :]))
    finally:
        gateway.stop()
    types = [kind for _, kind in arrived]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    created = arrived[0][0]
    compaction = next(at for at, kind in arrived if kind == "response.output_item.added")
    # The four seconds of the summary passed between the first event and the compaction item.
    assert compaction - created > 3, types
