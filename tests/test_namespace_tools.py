"""Namespace tools on back ends without namespaces: flattened for the model, reported back namespaced.

Codex 0.169 sends ``{"type": "namespace", "name": "multi_agent_v1", "tools": [...]}`` on every request
(found by tests/test_real_codex.py); before this the gateway answered 400 for every back end but the
OpenAI passthrough, so Codex could not start a turn.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, stream_events
from responses_gateway.protocol.request import parse_request
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.server.config import ServerConfig
from responses_gateway.server.namespaces import flat_name, flatten_namespaces
from responses_gateway.server.run import add_serve_arguments

Factory = Callable[..., Gateway]

AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "list_agents",
            "description": "List live agents.",
            "strict": False,
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}},
    ],
}
MCP = {"type": "namespace", "name": "mcp__fs__", "tools": [{"type": "function", "name": "read"}]}
SHELL = {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}


def test_flat_names() -> None:
    assert flat_name("multi_agent_v1", "list_agents") == "multi_agent_v1__list_agents"
    assert flat_name("mcp__fs__", "read") == "mcp__fs__read"


def test_flatten_replaces_namespaces_by_their_members_and_renames_earlier_calls() -> None:
    call = {
        "type": "function_call",
        "call_id": "c1",
        "namespace": "multi_agent_v1",
        "name": "close_agent",
        "arguments": "{}",
    }
    request = parse_request(
        {
            "model": "m",
            "tools": [SHELL, AGENTS, MCP],
            "input": [call, {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
            "tool_choice": {"type": "function", "name": "read", "namespace": "mcp__fs__"},
        }
    )
    flattening = flatten_namespaces(request)
    assert flattening.names == {
        "multi_agent_v1__list_agents": ("multi_agent_v1", "list_agents"),
        "multi_agent_v1__close_agent": ("multi_agent_v1", "close_agent"),
        "mcp__fs__read": ("mcp__fs__", "read"),
    }
    assert [(t["type"], t["name"]) for t in request.tools] == [
        ("function", "exec_command"),
        ("function", "multi_agent_v1__list_agents"),
        ("function", "multi_agent_v1__close_agent"),
        ("function", "mcp__fs__read"),
    ]
    # A member keeps its description, schema and strictness.
    assert request.tools[1]["parameters"] == AGENTS["tools"][0]["parameters"]  # type: ignore[index]
    assert request.tools[1]["description"] == "List live agents."
    assert request.input[0]["name"] == "multi_agent_v1__close_agent"
    assert "namespace" not in request.input[0]
    assert call["name"] == "close_agent"  # the caller's item is not changed
    assert request.tool_choice == {"type": "function", "name": "mcp__fs__read"}
    # A refusal about a tool the back end was given names the tool as the client sent it.
    assert flattening.client_param("tools[0].parameters") == "tools[0].parameters"
    assert flattening.client_param("tools[2].strict") == "tools[1].tools[1].strict"
    assert flattening.client_param("'tools[3].type' (x)") == "'tools[2].tools[0].type' (x)"


def test_flatten_leaves_a_request_without_namespaces_alone() -> None:
    request = parse_request({"model": "m", "tools": [SHELL], "input": "hi"})
    tools, inputs = request.tools, request.input
    assert flatten_namespaces(request).names == {}
    assert request.tools is tools and request.input is inputs


def test_a_namespaced_call_round_trips_over_http(gateway: Factory) -> None:
    script = {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": "Two agents."}]},
            {"steps": [{"function_call": {"name": "multi_agent_v1__list_agents", "arguments": "{}"}}]},
        ]
    }
    provider = ScriptedProvider(script, name="m")
    gw = gateway([provider])
    body: dict[str, Any] = {
        "model": "m",
        "input": "who is running?",
        "tools": [SHELL, AGENTS],
        "stream": True,
        "store": False,
    }
    events = stream_events(gw.url("/v1/responses"), body)
    check_stream(events)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert len(done) == 1
    call = done[0]
    # The client sees the call under the namespace it declared, as OpenAI reports it.
    assert call["type"] == "function_call"
    assert (call["namespace"], call["name"]) == ("multi_agent_v1", "list_agents")
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    assert (added["namespace"], added["name"]) == ("multi_agent_v1", "list_agents")
    completed = events[-1]["response"]
    assert completed["output"][0]["namespace"] == "multi_agent_v1"
    # The Response echoes the tools as sent; the back end saw plain functions.
    assert completed["tools"][1]["type"] == "namespace"
    assert [t["name"] for t in provider.requests[0].tools] == [
        "exec_command",
        "multi_agent_v1__list_agents",
        "multi_agent_v1__close_agent",
    ]

    # Next turn: the history carries the namespaced call back (as Codex sends it).
    history = {k: v for k, v in call.items() if k not in ("id", "status")}
    second = {
        **body,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "who?"}]},
            history,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "[]"},
        ],
    }
    events = stream_events(gw.url("/v1/responses"), second)
    check_stream(events)
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Two agents."
    seen = provider.requests[1].input[1]
    assert seen["name"] == "multi_agent_v1__list_agents" and "namespace" not in seen


def test_a_non_streamed_response_keeps_the_namespace(gateway: Factory) -> None:
    script = [{"function_call": {"name": "mcp__fs__read", "arguments": '{"path": "a"}'}}]
    gw = gateway([ScriptedProvider(script, name="m")])
    answer = httpx.post(
        gw.url("/v1/responses"), json={"model": "m", "input": "read a", "tools": [MCP]}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert (output[0]["namespace"], output[0]["name"]) == ("mcp__fs__", "read")


def test_a_refused_tool_after_a_namespace_is_named_by_the_clients_index(gateway: Factory) -> None:
    provider = ScriptedProvider([{"message": "never"}], name="m")
    gw = gateway([provider])
    body = {"model": "m", "input": "hi", "tools": [SHELL, AGENTS, {"type": "web_search"}]}
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    # tools[2] as sent (the back end was given it as tools[3], after the two namespace members).
    assert error["param"] == "tools[2].type"
    assert error["message"].startswith(
        "Unsupported parameter: 'tools[2].type' (web_search) is not supported with this model"
    )
    assert "no search back end is configured" in error["message"]  # and how to configure one
    assert provider.requests == []


# ---- serve --drop-unsupported-tool: an offered hosted tool the back end cannot run is left out


def test_dropped_web_search_lets_the_request_run_and_the_response_says_what_the_model_had(
    gateway: Factory,
) -> None:
    provider = ScriptedProvider([{"message": "No search needed."}], name="m")
    gw = gateway([provider], drop_unsupported_tools=("web_search",))
    body: dict[str, Any] = {
        "model": "m",
        "input": "hi",
        "tools": [{"type": "web_search", "external_web_access": False}, SHELL, AGENTS],
        "stream": True,
        "store": False,
    }
    events = stream_events(gw.url("/v1/responses"), body)
    check_stream(events)
    completed = events[-1]["response"]
    assert completed["status"] == "completed"
    assert completed["output"][0]["content"][0]["text"] == "No search needed."
    # The model had the shell and the namespace (flattened), not the search.
    assert [t["type"] for t in completed["tools"]] == ["function", "namespace"]
    assert [t["name"] for t in provider.requests[0].tools] == [
        "exec_command",
        "multi_agent_v1__list_agents",
        "multi_agent_v1__close_agent",
    ]


def test_without_the_option_the_same_request_is_refused(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([{"message": "never"}], name="m")])
    body = {"model": "m", "input": "hi", "tools": [{"type": "web_search"}, SHELL]}
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools[0].type"


def test_a_dropped_type_the_tool_choice_asks_for_is_still_refused(gateway: Factory) -> None:
    provider = ScriptedProvider([{"message": "never"}], name="m")
    gw = gateway([provider], drop_unsupported_tools=("web_search",))
    forced = {
        "model": "m",
        "input": "hi",
        "tools": [{"type": "web_search"}],
        "tool_choice": {"type": "web_search"},
    }
    allowed = {
        **forced,
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "web_search"}]},
    }
    for body in (forced, allowed):
        answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"].startswith(("tool_choice", "tools[0]"))
    assert provider.requests == []


def test_a_tool_not_dropped_is_refused_at_the_clients_index(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([{"message": "never"}], name="m")], drop_unsupported_tools=("web_search",))
    body = {"model": "m", "input": "hi", "tools": [{"type": "web_search"}, {"type": "image_generation"}]}
    answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "tools[1].type"


def test_only_hosted_tool_types_can_be_dropped() -> None:
    for kind in ("function", "custom", "namespace", "nonsense"):
        with pytest.raises(ValueError, match="not a hosted tool type"):
            ServerConfig(drop_unsupported_tools=(kind,))


def test_serve_option_reaches_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        ["--drop-unsupported-tool", "web_search", "--drop-unsupported-tool", "web_search"]
    )
    assert args.drop_unsupported_tool == ["web_search", "web_search"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--drop-unsupported-tool", "function"])
