"""Hostile request bodies and query strings get a clear 400 naming the param, never a 500 or a dropped
connection: objects nested past the limit anywhere in a body, and integers past what the store holds."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.protocol.request import MAX_NESTING
from responses_gateway.providers.scripted import ScriptedProvider

JSON = dict[str, Any]


def nested(levels: int) -> JSON:
    value: JSON = {"type": "string"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"a": value}}
    return value


def deep_list(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    gateway = start_gateway(
        [ScriptedProvider([{"message": "ok"}], name="m")],
        store_url=f"sqlite:///{tmp / 'store.db'}",
        data_dir=str(tmp / "data"),
    )
    yield gateway
    gateway.stop()


def tool(parameters: Any) -> JSON:
    return {"type": "function", "name": "f", "parameters": parameters}


DEEP = 130  # past the limit, and (with the envelopes the gateway adds) past orjson's 255 when doubled
CASES: list[tuple[str, JSON, str]] = [
    ("tool parameters", {"tools": [tool(nested(DEEP))]}, "tools[0].parameters"),
    ("second tool", {"tools": [tool({"type": "object"}), tool(nested(DEEP))]}, "tools[1].parameters"),
    (
        "schema",
        {"text": {"format": {"type": "json_schema", "name": "s", "schema": nested(DEEP)}}},
        "text.format",
    ),
    ("input content", {"input": [{"role": "user", "content": deep_list(300)}]}, "input[0].content"),
    ("client metadata", {"client_metadata": {"a": deep_list(300)}}, "client_metadata.a"),
]


@pytest.mark.parametrize(("label", "extra", "param"), CASES, ids=[c[0] for c in CASES])
def test_deep_nesting_is_a_400_naming_the_param(gw: Gateway, label: str, extra: JSON, param: str) -> None:
    for stream in (False, True):
        body = {"model": "m", "input": "hi", "stream": stream, **extra}
        got = httpx.post(gw.url("/v1/responses"), content=json.dumps(body), timeout=10)
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert error["param"] == param, error
        assert error["type"] == "invalid_request_error"
        assert str(MAX_NESTING) in error["message"]


def test_nesting_at_the_limit_is_accepted(gw: Gateway) -> None:
    body = {"model": "m", "input": "hi", "tools": [tool(nested((MAX_NESTING - 6) // 2))]}
    got = httpx.post(gw.url("/v1/responses"), json=body, timeout=10)
    assert got.status_code == 200, got.text


def test_deep_conversation_items_are_a_400(gw: Gateway) -> None:
    body = {"items": [{"type": "message", "role": "user", "content": deep_list(300)}]}
    got = httpx.post(gw.url("/v1/conversations"), content=json.dumps(body), timeout=10)
    assert got.status_code == 400, got.text
    assert got.json()["error"]["param"] == "items[0].content"


@pytest.mark.parametrize("value", [str(2**63), str(2**64 + 5), "9" * 40, "1e3", "%D9%A1%D9%A2"])
def test_query_integers_out_of_range_are_a_400_before_any_header(gw: Gateway, value: str) -> None:
    created = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi"}, timeout=10).json()
    # A raw request, to see exactly what the server sends: a complete 400, not headers then a drop.
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        path = f"/v1/responses/{created['id']}?stream=true&starting_after={value}"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data[:300]
    assert orjson.loads(body)["error"]["param"] == "starting_after"


def test_starting_after_at_the_maximum_is_served(gw: Gateway) -> None:
    created = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi"}, timeout=10).json()
    got = httpx.get(
        gw.url(f"/v1/responses/{created['id']}?stream=true&starting_after={2**63 - 1}"), timeout=10
    )
    assert got.status_code == 200, got.text
