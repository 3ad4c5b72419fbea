"""Remote MCP servers run by the gateway for any model, seen by real clients over HTTP.

Real MCP servers (the ``mcp`` SDK's server side, Streamable HTTP and SSE, on loopback) are driven
through the gateway by a scripted back end and a Chat Completions upstream (a mock on loopback), with
the openai SDK and the Agents SDK (``HostedMCPTool``). Every stream passes the checker and every event
and Response validates against the openai SDK's types. Covered: listing (and reusing a listed set),
streamed calls, tool errors, a server that hangs, dies or answers too much, the approval round trip
both ways (previous_response_id and input), operator-named servers, secrets kept out of echoes and
the store, and SSRF attempts refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.tool import MCPToolApprovalFunctionResult, MCPToolApprovalRequest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import Gateway, check_stream, decode_sse, start_gateway
from mcp_servers import HUGE_CHARS, LEAKED, Served, free_port, serve_sse, serve_streamable_http
from responses_gateway.engine.tools.mcp import McpServerSpec
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, encode_chunks, stream_reply

JSON = dict[str, Any]
EVENT = TypeAdapter(ResponseStreamEvent)
SECRET = LEAKED
CONF_SECRET = "conf-secret-456"


def call(name: str, *pieces: str) -> JSON:
    return {"function_call": {"name": f"mcp__calc__{name}", "arguments": list(pieces) or ["{}"]}}


def answered(text: str, first: JSON) -> JSON:
    """A scripted model that calls once, then answers ``text`` after reading a tool output."""
    return {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": [text]}]},
            {"steps": [first]},
        ]
    }


SCRIPTS: dict[str, Any] = {
    "add": answered("The sum is 5.", call("add", '{"a": 2,', ' "b": 3}')),
    "boom": answered("It broke.", call("boom")),
    "slow": answered("Too slow.", call("slow")),
    "huge": answered("Big.", call("huge")),
    "plain": [{"message": ["No tools needed."]}],
    "leak": answered("Leaked?", call("leak")),
    "conf": answered(
        "Echoed.", {"function_call": {"name": "mcp__conf__echo", "arguments": ['{"text": "hi"}']}}
    ),
}


@pytest.fixture(scope="module")
def streamable() -> Iterator[Served]:
    served = serve_streamable_http()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def sse() -> Iterator[Served]:
    served = serve_sse()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def providers() -> dict[str, ScriptedProvider]:
    return {name: ScriptedProvider(script, name=name) for name, script in SCRIPTS.items()}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp")


@pytest.fixture(scope="module")
def gw(providers: dict[str, ScriptedProvider], streamable: Served, data: Path) -> Iterator[Gateway]:
    """The gateway allows loopback explicitly (the MCP servers run there)."""
    gateway = start_gateway(
        list(providers.values()),
        store_url=f"sqlite://{data}/gateway.db",
        data_dir=str(data),
        tool_allow_networks=("127.0.0.0/8",),
        mcp_call_timeout=3.0,
        mcp_servers=(McpServerSpec("conf", streamable.url, {"X-Conf-Key": CONF_SECRET}),),
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def guarded(providers: dict[str, ScriptedProvider], streamable: Served) -> Iterator[Gateway]:
    """A gateway with the default rules: no private address allowed."""
    gateway = start_gateway(
        list(providers.values()),
        mcp_servers=(McpServerSpec("conf", streamable.url, {"X-Conf-Key": CONF_SECRET}),),
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def tool(url: str, **extra: Any) -> JSON:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **extra}


def stream(base_url: str, **body: Any) -> tuple[list[JSON], JSON]:
    """A streamed response: events validated against the SDK's types and the checker."""
    got = httpx.post(f"{base_url}/responses", json={"stream": True, **body}, timeout=60)
    assert got.status_code == 200, got.text
    events = decode_sse(got.content)
    for event in events:
        typed = EVENT.validate_python(event)
        assert typed.to_dict() == event, event["type"]
    check_stream(events, strict=False)
    Response.model_validate(events[-1]["response"])
    return events, events[-1]["response"]


def mcp_events(events: list[JSON]) -> list[str]:
    return [e["type"] for e in events if ".mcp" in e["type"]]


# ------------------------------------------------------------------------------ calls
def test_a_streamed_call_over_streamable_http(
    gw: Gateway, streamable: Served, providers: dict[str, ScriptedProvider]
) -> None:
    calls = streamable.recorder.count("tools/call")
    sessions = streamable.recorder.count("initialize")
    lists = streamable.recorder.count("tools/list")
    events, response = stream(
        gw.base_url,
        model="add",
        input="Add 2 and 3.",
        tools=[tool(streamable.url, require_approval="never", headers={"X-Key": SECRET})],
    )
    assert mcp_events(events) == [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ]
    assert not any("function_call" in e["type"] for e in events)
    listing, mcp_call, message = response["output"]
    assert listing["type"] == "mcp_list_tools" and listing["server_label"] == "calc"
    assert "status" not in listing and listing["error"] is None
    names = [t["name"] for t in listing["tools"]]
    assert names == ["add", "echo", "boom", "slow", "leak", "huge"]
    assert listing["tools"][0]["input_schema"]["required"] == ["a", "b"]
    assert mcp_call["type"] == "mcp_call" and mcp_call["status"] == "completed"
    assert mcp_call["name"] == "add" and mcp_call["server_label"] == "calc"
    assert json.loads(mcp_call["arguments"]) == {"a": 2, "b": 3}
    assert mcp_call["output"] == "5" and mcp_call["error"] is None
    assert mcp_call["approval_request_id"] is None
    assert message["content"][0]["text"] == "The sum is 5."
    assert streamable.recorder.count("tools/call") == calls + 1
    # One session for the listing and the call: one handshake, one listing.
    assert streamable.recorder.count("initialize") == sessions + 1
    assert streamable.recorder.count("tools/list") == lists + 1
    # The header reached the server; the Response echoes the tool without it.
    assert any(h.get("x-key") == SECRET for h in streamable.recorder.headers)
    assert response["tools"] == [tool(streamable.url, require_approval="never")]
    # The model was offered one function per MCP tool and read the call's output.
    first, second = providers["add"].requests[-2:]
    assert [t["name"] for t in first.tools] == [f"mcp__calc__{n}" for n in names]
    fc, out = second.input[-2:]
    assert fc["type"] == "function_call" and fc["name"] == "mcp__calc__add"
    assert out == {"type": "function_call_output", "call_id": fc["call_id"], "output": "5"}


def test_the_secret_is_not_stored(client: openai.OpenAI, streamable: Served, data: Path) -> None:
    response = client.responses.create(
        model="add",
        input="Add 2 and 3.",
        tools=[tool(streamable.url, require_approval="never", authorization=SECRET)],  # type: ignore[list-item]
    )
    assert response.output[1].type == "mcp_call" and response.output[1].output == "5"
    assert any(h.get("authorization") == f"Bearer {SECRET}" for h in streamable.recorder.headers)
    stored = client.responses.retrieve(response.id).to_dict()
    assert "authorization" not in json.dumps(stored["tools"])
    for path in data.iterdir():
        if path.name.startswith("gateway.db"):
            assert SECRET.encode() not in path.read_bytes(), path.name


def test_sse_transport_with_the_openai_sdk(client: openai.OpenAI, sse: Served) -> None:
    response = client.responses.create(
        model="add", input="Add.", tools=[tool(sse.url, require_approval="never")]
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"]
    assert response.output[1].output == "5"  # type: ignore[union-attr]
    assert sse.recorder.count("tools/call") >= 1


def test_a_listed_set_in_the_conversation_is_reused(client: openai.OpenAI, streamable: Served) -> None:
    first = client.responses.create(
        model="plain", input="Hello", tools=[tool(streamable.url, require_approval="never")]
    )
    assert [i.type for i in first.output] == ["mcp_list_tools", "message"]
    lists = streamable.recorder.count("tools/list")
    second = client.responses.create(
        model="add",
        input="Add 2 and 3.",
        previous_response_id=first.id,
        tools=[tool(streamable.url, require_approval="never")],
    )
    # No new listing item: the model was offered the listed set (the mcp client itself re-reads the
    # list once after a call, to validate structured output against the tool's output schema).
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    assert streamable.recorder.count("tools/list") <= lists + 1


def test_a_tool_error_is_the_calls_error(gw: Gateway, streamable: Served) -> None:
    events, response = stream(
        gw.base_url, model="boom", input="Break", tools=[tool(streamable.url, require_approval="never")]
    )
    assert "response.mcp_call.failed" in mcp_events(events)
    assert response["status"] == "completed"
    item = response["output"][1]
    assert item["status"] == "failed" and item["output"] is None
    assert item["error"]["type"] == "mcp_tool_execution_error"
    assert "boom" in item["error"]["content"][0]["text"]
    assert response["output"][2]["content"][0]["text"] == "It broke."


def test_a_server_echoing_the_credential_is_scrubbed(gw: Gateway, streamable: Served, data: Path) -> None:
    _, response = stream(
        gw.base_url,
        model="leak",
        input="Leak",
        tools=[tool(streamable.url, require_approval="never", headers={"X-Key": SECRET})],
    )
    item = response["output"][1]
    assert item["status"] == "failed"
    assert "bad token [redacted]" in item["error"]["content"][0]["text"]
    assert SECRET not in json.dumps(response)


def test_a_hanging_server_fails_its_call_not_the_response(gw: Gateway, streamable: Served) -> None:
    start = time.monotonic()
    _, response = stream(
        gw.base_url, model="slow", input="Wait", tools=[tool(streamable.url, require_approval="never")]
    )
    assert time.monotonic() - start < 12
    item = response["output"][1]
    assert item["status"] == "failed" and item["error"]["type"] == "http_error"
    assert item["error"]["code"] == 504 and "did not answer within 3 seconds" in item["error"]["message"]
    assert response["status"] == "completed"
    # The gateway still serves.
    assert httpx.get(gw.base_url.removesuffix("/v1") + "/health").status_code == 200


def test_huge_output_is_cut_and_says_so(client: openai.OpenAI, streamable: Served) -> None:
    response = client.responses.create(
        model="huge", input="Big", tools=[tool(streamable.url, require_approval="never")]
    )
    item = response.output[1]
    assert item.type == "mcp_call" and item.output is not None
    assert item.output.startswith("x" * 1000)
    assert len(item.output) < HUGE_CHARS
    assert f"output truncated: {HUGE_CHARS - 100_000} more characters" in item.output


def test_a_dead_server_fails_its_listing(gw: Gateway) -> None:
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    events, response = stream(
        gw.base_url, model="plain", input="Hi", tools=[tool(dead, require_approval="never")]
    )
    assert mcp_events(events) == ["response.mcp_list_tools.in_progress", "response.mcp_list_tools.failed"]
    listing = response["output"][0]
    assert listing["type"] == "mcp_list_tools" and listing["tools"] == []
    assert "cannot be reached" in listing["error"]
    assert response["status"] == "completed"


def test_a_server_that_never_answers_fails_its_listing(gw: Gateway) -> None:
    """A TCP server that accepts and says nothing: the listing fails at --mcp-call-timeout (3 s)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        start = time.monotonic()
        _, response = stream(
            gw.base_url, model="plain", input="Hi", tools=[tool(url, require_approval="never")]
        )
        assert time.monotonic() - start < 10
    listing = response["output"][0]
    assert "did not answer within 3 seconds" in listing["error"]
    assert response["output"][1]["content"][0]["text"] == "No tools needed."


def test_an_operator_named_server_by_label(guarded: Gateway, streamable: Served) -> None:
    _, response = stream(
        guarded.base_url,
        model="conf",
        input="Echo hi",
        tools=[{"type": "mcp", "server_label": "conf", "require_approval": "never"}],
    )
    assert response["output"][1]["output"] == "hi"
    assert any(h.get("x-conf-key") == CONF_SECRET for h in streamable.recorder.headers)
    assert response["tools"] == [{"type": "mcp", "server_label": "conf", "require_approval": "never"}]
    got = httpx.post(
        f"{guarded.base_url}/responses",
        json={"model": "plain", "input": "x", "tools": [{"type": "mcp", "server_label": "nope"}]},
    )
    assert got.status_code == 400 and got.json()["error"]["param"] == "tools[0].server_url"


def test_tool_choice_names_an_mcp_tool(
    gw: Gateway, streamable: Served, providers: dict[str, ScriptedProvider]
) -> None:
    _, response = stream(
        gw.base_url,
        model="add",
        input="Add",
        tools=[tool(streamable.url, require_approval="never")],
        tool_choice={"type": "mcp", "server_label": "calc", "name": "add"},
    )
    assert response["output"][1]["type"] == "mcp_call"
    assert response["tool_choice"] == {"type": "mcp", "server_label": "calc", "name": "add"}
    first, second = providers["add"].requests[-2:]
    assert first.tool_choice == {"type": "function", "name": "mcp__calc__add"}
    assert second.tool_choice == "auto"  # forced once, then the model decides


def test_with_a_namespace_the_back_end_gets_flat_functions(
    gw: Gateway, streamable: Served, providers: dict[str, ScriptedProvider]
) -> None:
    """The server flattens namespaces after the plan; the MCP functions listed later join them."""
    namespace = {
        "type": "namespace",
        "name": "files",
        "description": "File tools.",
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}],
    }
    _, response = stream(
        gw.base_url,
        model="add",
        input="Add",
        tools=[namespace, tool(streamable.url, require_approval="never")],
    )
    assert response["output"][1]["output"] == "5"
    first = providers["add"].requests[-2]
    assert {t["type"] for t in first.tools} == {"function"}
    assert "mcp__calc__add" in [t["name"] for t in first.tools] and len(first.tools) == 7
    # A namespace whose flat names fall under an MCP server's prefix is refused.
    clash = {**namespace, "name": "mcp__calc__"}
    got = httpx.post(
        f"{gw.base_url}/responses",
        json={"model": "plain", "input": "x", "tools": [clash, tool(streamable.url)]},
    )
    assert got.status_code == 400 and "rename the function" in got.json()["error"]["message"]


# ------------------------------------------------------------------------------ approvals
def test_approval_round_trip_through_previous_response_id(
    client: openai.OpenAI, gw: Gateway, streamable: Served
) -> None:
    calls = streamable.recorder.count("tools/call")
    events, first = stream(gw.base_url, model="add", input="Add 2 and 3.", tools=[tool(streamable.url)])
    assert [i["type"] for i in first["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    request = first["output"][1]
    assert request["name"] == "add" and json.loads(request["arguments"]) == {"a": 2, "b": 3}
    assert first["status"] == "completed"
    assert streamable.recorder.count("tools/call") == calls  # nothing ran
    assert "response.mcp_call.in_progress" not in mcp_events(events)
    events, second = stream(
        gw.base_url,
        model="add",
        previous_response_id=first["id"],
        input=[{"type": "mcp_approval_response", "approve": True, "approval_request_id": request["id"]}],
        tools=[tool(streamable.url)],
    )
    mcp_call, message = second["output"]
    assert mcp_call["type"] == "mcp_call" and mcp_call["approval_request_id"] == request["id"]
    assert mcp_call["output"] == "5" and message["content"][0]["text"] == "The sum is 5."
    assert streamable.recorder.count("tools/call") == calls + 1
    # A later turn sees the call once, with its output.
    third = client.responses.create(
        model="plain", previous_response_id=second["id"], input="Thanks", tools=[tool(streamable.url)]
    )
    assert third.output[-1].type == "message"


def test_a_declined_approval_in_the_input(gw: Gateway, streamable: Served, providers: dict[str, Any]) -> None:
    _, first = stream(
        gw.base_url, model="add", input="Add 2 and 3.", tools=[tool(streamable.url)], store=False
    )
    listing, request = first["output"]
    calls = streamable.recorder.count("tools/call")
    _, second = stream(
        gw.base_url,
        model="add",
        store=False,
        input=[
            {"role": "user", "content": "Add 2 and 3."},
            listing,
            request,
            {"type": "mcp_approval_response", "approve": False, "approval_request_id": request["id"]},
        ],
        tools=[tool(streamable.url)],
    )
    assert [i["type"] for i in second["output"]] == ["message"]
    assert streamable.recorder.count("tools/call") == calls
    last = providers["add"].requests[-1]
    assert last.input[-1]["output"] == "The user declined to run this tool call."


def test_require_approval_filters(gw: Gateway, streamable: Served) -> None:
    _, response = stream(
        gw.base_url,
        model="add",
        input="Add",
        tools=[tool(streamable.url, require_approval={"never": {"tool_names": ["add"]}})],
    )
    assert response["output"][1]["type"] == "mcp_call"
    _, response = stream(
        gw.base_url,
        model="add",
        input="Add",
        tools=[tool(streamable.url, require_approval={"always": {"tool_names": ["add"]}})],
    )
    assert response["output"][1]["type"] == "mcp_approval_request"
    _, response = stream(
        gw.base_url,
        model="plain",
        input="Hi",
        tools=[tool(streamable.url, allowed_tools=["add", "echo"], require_approval="never")],
    )
    assert [t["name"] for t in response["output"][0]["tools"]] == ["add", "echo"]


# ------------------------------------------------------------------------------ the Agents SDK
def _agent(gw: Gateway, mcp_tool: HostedMCPTool, model: str) -> Agent[Any]:
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    return Agent(
        name="calc",
        instructions="Use the tools.",
        tools=[mcp_tool],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )


def test_agents_sdk_hosted_mcp_tool(gw: Gateway, streamable: Served) -> None:
    mcp_tool = HostedMCPTool(tool_config=tool(streamable.url, require_approval="never"))  # type: ignore[arg-type]
    result = asyncio.run(Runner.run(_agent(gw, mcp_tool, "add"), "Add 2 and 3."))
    assert result.final_output == "The sum is 5."
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds  # the mcp_call


def test_agents_sdk_hosted_mcp_tool_with_approvals(gw: Gateway, streamable: Served) -> None:
    seen: list[str] = []

    def approve(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        seen.append(request.data.name)
        return {"approve": True}

    calls = streamable.recorder.count("tools/call")
    mcp_tool = HostedMCPTool(tool_config=tool(streamable.url), on_approval_request=approve)  # type: ignore[arg-type]
    result = asyncio.run(Runner.run(_agent(gw, mcp_tool, "add"), "Add 2 and 3."))
    assert seen == ["add"]
    assert result.final_output == "The sum is 5."
    assert streamable.recorder.count("tools/call") == calls + 1


# ------------------------------------------------------------------------------ a real upstream
def _chat_chunks(*deltas: JSON, finish: str) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return encode_chunks(chunks, "openai-chat")


def test_through_a_chat_completions_upstream(streamable: Served, tmp_path: Path) -> None:
    tool_call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "mcp__calc__add", "arguments": '{"a": 20, "b": 22}'},
    }
    with UpstreamMock() as upstream:
        upstream.reset(
            [
                stream_reply(
                    _chat_chunks({"role": "assistant", "tool_calls": [tool_call]}, finish="tool_calls")
                ),
                stream_reply(_chat_chunks({"role": "assistant", "content": "It is 42."}, finish="stop")),
            ]
        )
        provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-4o")
        provider.name = "chat"
        gateway = start_gateway([provider], tool_allow_networks=("127.0.0.1/32",))
        try:
            _, response = stream(
                gateway.base_url,
                model="chat",
                input="20+22?",
                tools=[tool(streamable.url, require_approval="never")],
            )
        finally:
            gateway.stop()
        first, second = (r.json for r in upstream.requests[-2:])
    assert [i["type"] for i in response["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert response["output"][1]["output"] == "42"
    assert "mcp__calc__add" in [t["function"]["name"] for t in first["tools"]]
    assistant, answer = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "mcp__calc__add",
        "arguments": '{"a": 20, "b": 22}',
    }
    assert answer == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "42"}


def _anthropic_events(block: JSON, delta: JSON, stop: str) -> bytes:
    msg = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    events: list[JSON] = [
        {"type": "message_start", "message": msg},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    return encode_chunks(events, "anthropic")


def test_approval_round_trip_through_an_anthropic_upstream(streamable: Served) -> None:
    """The approval asked in one response and given in the next request's input (no stored state):
    the call runs before the first turn and Anthropic reads it as a tool_use and its tool_result."""
    with UpstreamMock() as upstream:
        upstream.reset(
            [
                stream_reply(
                    _anthropic_events(
                        {"type": "tool_use", "id": "toolu_1", "name": "mcp__calc__add", "input": {}},
                        {"type": "input_json_delta", "partial_json": '{"a": 1, "b": 41}'},
                        "tool_use",
                    )
                ),
                stream_reply(
                    _anthropic_events(
                        {"type": "text", "text": ""}, {"type": "text_delta", "text": "42."}, "end_turn"
                    )
                ),
            ]
        )
        provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
        provider.name = "claude"
        gateway = start_gateway([provider], tool_allow_networks=("127.0.0.1/32",))
        try:
            _, first = stream(
                gateway.base_url, model="claude", input="1+41?", tools=[tool(streamable.url)], store=False
            )
            listing, request = first["output"]
            assert request["type"] == "mcp_approval_request" and request["name"] == "add"
            answer = {"type": "mcp_approval_response", "approve": True, "approval_request_id": request["id"]}
            _, second = stream(
                gateway.base_url,
                model="claude",
                input=[{"role": "user", "content": "1+41?"}, listing, request, answer],
                tools=[tool(streamable.url)],
                store=False,
            )
        finally:
            gateway.stop()
        sent = upstream.requests[-1].json
    mcp_call, message = second["output"]
    assert mcp_call["approval_request_id"] == request["id"] and mcp_call["output"] == "42"
    assert message["content"][0]["text"] == "42."
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    (tool_use,) = sent["messages"][1]["content"]
    assert tool_use["name"] == "mcp__calc__add" and tool_use["input"] == {"a": 1, "b": 41}
    (result,) = sent["messages"][2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == tool_use["id"]


# ------------------------------------------------------------------------------ SSRF
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("LOOPBACK", "non-public address (127.0.0.1)"),
        ("http://169.254.169.254/latest/meta-data/", "non-public address (169.254.169.254)"),
        ("http://[::1]:80/mcp", "non-public address (::1)"),
        ("http://10.0.0.1/mcp", "non-public address (10.0.0.1)"),
        ("http://[::ffff:127.0.0.1]/mcp", "non-public address"),
        ("http://localhost:9/mcp", "non-public address"),
        ("file:///etc/passwd", "must be http:// or https://"),
    ],
)
def test_private_addresses_are_refused(guarded: Gateway, streamable: Served, url: str, why: str) -> None:
    url = streamable.url if url == "LOOPBACK" else url
    lists = streamable.recorder.count("tools/list")
    got = httpx.post(
        f"{guarded.base_url}/responses",
        json={"model": "plain", "input": "x", "tools": [tool(url, require_approval="never")]},
    )
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["param"] == "tools[0].server_url" and why in error["message"], error
    assert streamable.recorder.count("tools/list") == lists


def test_the_host_allow_list(providers: dict[str, ScriptedProvider], streamable: Served) -> None:
    gateway = start_gateway(
        [providers["plain"]], tool_allow_hosts=("mcp.example.com",), tool_allow_networks=("127.0.0.0/8",)
    )
    try:
        got = httpx.post(
            f"{gateway.base_url}/responses",
            json={"model": "plain", "input": "x", "tools": [tool(streamable.url)]},
        )
    finally:
        gateway.stop()
    assert got.status_code == 400
    assert "allow-list" in got.json()["error"]["message"]


def test_bad_configs_are_400(gw: Gateway) -> None:
    for config, param in [
        (
            {"type": "mcp", "server_label": "bad label!", "server_url": "http://127.0.0.1/"},
            "tools[0].server_label",
        ),
        ({**tool("http://127.0.0.1/"), "require_approval": "sometimes"}, "tools[0].require_approval"),
        ({**tool("http://127.0.0.1/"), "headers": {"X": 1}}, "tools[0].headers"),
        ({**tool("http://127.0.0.1/"), "allowed_tools": "add"}, "tools[0].allowed_tools"),
    ]:
        got = httpx.post(f"{gw.base_url}/responses", json={"model": "plain", "input": "x", "tools": [config]})
        assert got.status_code == 400, got.text
        assert got.json()["error"]["param"] == param
    got = httpx.post(
        f"{gw.base_url}/responses",
        json={
            "model": "plain",
            "input": "x",
            "tools": [tool("http://127.0.0.1/"), {"type": "function", "name": "mcp__calc__x"}],
        },
    )
    assert got.status_code == 400 and "rename the function" in got.json()["error"]["message"]
    got = httpx.post(
        f"{gw.base_url}/responses",
        json={
            "model": "plain",
            "input": "x",
            "tools": [tool("http://127.0.0.1/"), tool("http://127.0.0.1/")],
        },
    )
    assert got.status_code == 400 and got.json()["error"]["param"] == "tools[1]"
    assert "'calc' is given twice" in got.json()["error"]["message"]
    many = [{**tool("http://127.0.0.1/"), "server_label": f"s{n}"} for n in range(17)]
    got = httpx.post(f"{gw.base_url}/responses", json={"model": "plain", "input": "x", "tools": many})
    assert got.status_code == 400 and got.json()["error"]["param"] == "tools[16]"


def test_models_file_names_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    from responses_gateway.config import ConfigError, parse_config

    text = (
        "models: []\n"
        "mcp_servers:\n"
        "  - label: docs\n"
        "    url: https://mcp.example.com/mcp\n"
        "    headers_env: {X-Api-Key: DOCS_KEY}\n"
        "    authorization_env: DOCS_TOKEN\n"
    )
    server = parse_config(text, "models.yaml").mcp_servers[0]
    assert (server.label, server.url, server.transport) == ("docs", "https://mcp.example.com/mcp", "auto")
    monkeypatch.setenv("DOCS_KEY", "k")
    monkeypatch.setenv("DOCS_TOKEN", "t")
    assert server.headers() == {"X-Api-Key": "k", "Authorization": "Bearer t"}
    monkeypatch.delenv("DOCS_TOKEN")
    with pytest.raises(ValueError, match="DOCS_TOKEN is not set"):
        server.headers()
    with pytest.raises(ConfigError, match=r"models.yaml:3: mcp_servers\[0\].url: must start with http"):
        parse_config("models: []\nmcp_servers:\n  - {label: a, url: ftp://x}\n", "models.yaml")


def test_serve_with_a_models_file(
    streamable: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``responses-gateway serve`` as a user starts it: the models file's MCP server (its header from
    the environment) by label, and a request-supplied loopback URL allowed by --tool-allow-network."""
    from serve_process import serving

    script = tmp_path / "echo.yaml"
    script.write_text(
        json.dumps(
            {
                "model": "echoer",
                "turns": [
                    {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["ok"]}]},
                    {
                        "steps": [
                            {"function_call": {"name": "mcp__conf__echo", "arguments": ['{"text": "yo"}']}}
                        ]
                    },
                ],
            }
        )
    )
    models = tmp_path / "models.yaml"
    models.write_text(
        "local: false\nmodels: []\nmcp_servers:\n"
        f"  - {{label: conf, url: '{streamable.url}', headers_env: {{X-Conf-Key: MCP_TEST_KEY}}}}\n"
    )
    monkeypatch.setenv("MCP_TEST_KEY", "from-env-789")  # (serve_process drops RG_* variables)
    with serving(
        tmp_path,
        "--no-local",
        "--config",
        str(models),
        "--script",
        str(script),
        "--tool-allow-network",
        "127.0.0.0/8",
    ) as served:
        _, response = stream(
            served.base_url,
            model="echoer",
            input="x",
            tools=[{"type": "mcp", "server_label": "conf", "require_approval": "never"}],
        )
        assert response["output"][1]["output"] == "yo"
        assert any(h.get("x-conf-key") == "from-env-789" for h in streamable.recorder.headers)
        got = httpx.post(
            f"{served.base_url}/responses",
            json={"model": "echoer", "input": "x", "tools": [tool("http://10.0.0.1/mcp")]},
        )
        assert got.status_code == 400 and "10.0.0.1" in got.json()["error"]["message"]


# ------------------------------------------------------------------------------ the builder (sans-IO)
def _mcp_builder() -> Any:
    from responses_gateway.protocol.builder import HostedSpec, StreamBuilder
    from responses_gateway.protocol.response import new_response

    builder = StreamBuilder(new_response("m"))
    fields = {"approval_request_id": None, "arguments": "", "error": None, "name": "add", "output": None}
    builder.hosted = {
        "mcp__calc__add": HostedSpec("mcp_call", {**fields, "server_label": "calc"}),
        "mcp__calc__rm": HostedSpec(
            "mcp_approval_request", {"arguments": "", "name": "rm", "server_label": "calc"}
        ),
    }
    builder.defer_finish = True
    builder.start()
    return builder


def test_builder_streams_mcp_arguments_and_closes_approval_requests_whole() -> None:
    builder = _mcp_builder()
    call = builder.open_function_call("mcp__calc__add", call_id="c1")
    builder.arguments_delta(call, '{"a": 1,')
    builder.arguments_delta(call, ' "b": 2}')
    builder.close_function_call(call)
    ask = builder.open_function_call("mcp__calc__rm", call_id="c2")
    builder.arguments_delta(ask, '{"path": "/"}')
    builder.close_function_call(ask)
    builder.complete()
    assert [it.kind for it in builder.hosted_pending()] == ["mcp_call"]  # the approval is not run
    (pending,) = builder.hosted_pending()
    builder.close_tool_call(pending, status="completed", output="3")
    builder.defer_finish = False
    builder.complete()
    events = builder.take()
    check_stream(events, strict=False)
    kinds = [e["type"] for e in events if "mcp" in e["type"] or e["type"].startswith("response.output_item")]
    assert kinds == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0] == {
        "id": ask.id,
        "type": "mcp_approval_request",
        "arguments": '{"path": "/"}',
        "name": "rm",
        "server_label": "calc",
    }
    assert done[1]["arguments"] == '{"a": 1, "b": 2}' and done[1]["output"] == "3"
    for event in events:
        EVENT.validate_python(event)


def test_builder_closes_a_cut_approval_request() -> None:
    builder = _mcp_builder()
    ask = builder.open_function_call("mcp__calc__rm", call_id="c2")
    builder.arguments_delta(ask, '{"pa')
    builder.incomplete("max_output_tokens")
    assert builder.hosted_pending() == []
    builder.defer_finish = False
    builder.incomplete("max_output_tokens")
    events = builder.take()
    check_stream(events, strict=False)
    (item,) = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert item["type"] == "mcp_approval_request" and item["arguments"] == '{"pa'
