"""parse_request: what real clients send is accepted and normalized; the echo fields are right."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_gateway.protocol.request import FIELDS, RequestError, parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.base import Capabilities
from responses_gateway.providers.scripted import DEFAULT_CAPABILITIES
from responses_gateway.server.capabilities import check_capabilities
from responses_gateway.server.run import add_serve_arguments, build_app, serve

# The shape of a Codex CLI turn (client-requirements.md): every field and tool type it sends.
CODEX_BODY: dict[str, Any] = {
    "model": "m",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "env"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA", "content": None},
        {"type": "function_call", "name": "shell", "arguments": '{"cmd":["ls"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "call_2"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "phase": "final_answer",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        },
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "run",
            "strict": False,
            "parameters": {"type": "object"},
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {"type": "web_search", "external_web_access": False},
        {
            "type": "namespace",
            "name": "mcp__fs",
            "description": "fs",
            "tools": [{"type": "function", "name": "read"}],
        },
        {"type": "tool_search"},
        {"type": "image_generation", "output_format": "png"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "conv-1",
    "client_metadata": {"originator": "codex_cli_rs"},
    "service_tier": "auto",
    "text": {"verbosity": "low"},
}


def test_codex_request_is_accepted() -> None:
    req = parse_request(CODEX_BODY)
    assert req.stream and not req.store and not req.parallel_tool_calls
    assert [t["type"] for t in req.tools][:2] == ["function", "custom"]
    assert req.include == ["reasoning.encrypted_content"]
    assert req.prompt_cache_key == "conv-1"
    assert req.client_metadata == {"originator": "codex_cli_rs"}
    assert req.raw is CODEX_BODY


def test_input_normalization() -> None:
    req = parse_request(
        {
            "model": "m",
            "input": [
                {"role": "system", "content": "sys"},
                {"role": "assistant", "content": "earlier"},
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}],
                },
            ],
        }
    )
    assert req.input == [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "earlier", "annotations": []}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}],
        },
    ]


def test_echo_fields_build_a_response() -> None:
    req = parse_request(
        {
            "model": "m",
            "input": "x",
            "reasoning": {"effort": "low", "generate_summary": "auto"},
            "metadata": {"k": "v"},
            "tool_choice": "none",
            "truncation": "auto",
            "user": "u1",
        }
    )
    response = new_response("m", **req.echo())
    assert response["reasoning"] == {"effort": "low", "summary": "auto"}
    assert response["metadata"] == {"k": "v"}
    assert response["tool_choice"] == "none"
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert response["truncation"] == "auto"
    assert response["user"] == "u1"
    assert response["temperature"] == 1.0


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": 3}, "model", "invalid_type"),
        ({"model": "m", "temperature": True}, "temperature", "invalid_type"),
        ({"model": "m", "max_output_tokens": 16.5}, "max_output_tokens", "invalid_type"),
        ({"model": "m", "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        (
            {"model": "m", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
            "missing_required_parameter",
        ),
        ({"model": "m", "text": {"colour": 1}}, "text.colour", "unknown_parameter"),
        ({"model": "m", "reasoning": {"effort": "low", "x": 1}}, "reasoning.x", "unknown_parameter"),
        ({"model": "m", "include": ["everything"]}, "include[0]", "invalid_value"),
        ({"model": "m", "metadata": {"k": 1}}, "metadata.k", "invalid_value"),
        ({"model": "m", "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        (
            {"model": "m", "tools": [{"type": "function", "name": "bad name"}]},
            "tools[0].name",
            "invalid_value",
        ),
        ({"model": "m", "tools": [{"type": "teleport"}]}, "tools[0].type", "invalid_value"),
        ({"model": "m", "input": [{"type": "nonsense"}]}, "input[0].type", "invalid_value"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            "input[0].content[0].type",
            "invalid_value",
        ),
        (
            {"model": "m", "input": [{"type": "reasoning", "summary": [{"type": "x"}]}]},
            "input[0].summary[0].type",
            "invalid_value",
        ),
        ({"model": "m", "conversation": {"name": "x"}}, "conversation.id", "missing_required_parameter"),
        ({"model": "m", "conversation": 3}, "conversation", "invalid_type"),
        ({"model": "m", "previous_response_id": 3}, "previous_response_id", "invalid_type"),
        ({"model": "m", "background": "yes"}, "background", "invalid_type"),
        ({"model": "m", "input": [{"type": "item_reference"}]}, "input[0].id", "missing_required_parameter"),
        ({"model": "m", "prompt": {"id": "pmpt_1"}}, "prompt", None),
    ],
)
def test_rejections_name_the_param(body: dict[str, Any], param: str, code: str | None) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(body)
    assert (info.value.param, info.value.code, info.value.status) == (param, code, 400)


def test_serve_arguments_and_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "demo.yaml"
    script.write_text("model: demo\nsteps: [{message: hi}]\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    monkeypatch.setenv("RG_API_KEYS", "env-key, other")
    args = parser.parse_args(
        [
            "--no-local",
            "--script",
            str(script),
            "--keepalive",
            "ping",
            "--keepalive-interval",
            "2",
            "--api-key",
            "k",
        ]
    )
    assert (args.host, args.port, args.max_body_bytes, args.access_log) == (
        "127.0.0.1",
        8080,
        16 * 1024 * 1024,
        False,
    )
    app = build_app(args)
    assert app.registry.names() == ["demo"]
    assert app.config.keepalive == "ping"
    assert app.config.keepalive_interval == 2
    assert app.config.api_keys == ("k", "env-key", "other")
    # The default registry is the embedded model, registered without importing llama_cpp.
    local = build_app(parser.parse_args([]))
    assert local.registry.names() == ["gemma-3-270m"]
    assert local.registry.get_loaded("gemma-3-270m") is None
    # Nothing to serve is a usage error, reported before binding a port.
    assert serve(parser.parse_args(["--no-local"])) == 2
    assert serve(parser.parse_args(["--no-local", "--script", str(tmp_path / "missing.yaml")])) == 2


TYPICAL_KEYS = [
    "type",
    "role",
    "content",
    "text",
    "name",
    "call_id",
    "output",
    "arguments",
    "format",
    "summary",
]
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 40)
    | st.floats(-3, 3)
    | st.sampled_from(["", "user", "function", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(TYPICAL_KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FIELDS)), _json, max_size=6))
def test_any_body_is_accepted_or_refused_cleanly(body: dict[str, Any]) -> None:
    body.setdefault("model", "m")
    try:
        req = parse_request(body)
    except RequestError as exc:
        assert exc.status == 400
        assert exc.param is None or isinstance(exc.param, str)
        return
    # What is accepted is normalized: every input item is an object with a type.
    assert all(isinstance(item, dict) and isinstance(item.get("type"), str) for item in req.input)
    new_response("m", **req.echo())
    for caps in (Capabilities(), DEFAULT_CAPABILITIES):
        try:
            check_capabilities(req, caps)
        except RequestError as exc:
            assert exc.param
