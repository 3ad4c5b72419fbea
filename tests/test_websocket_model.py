"""WebSocket mode in front of the embedded model (slow: loads the GGUF): two responses on one
connection, the second continuing the first with ``store: false`` from the connection's memory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response
from websockets.sync.client import connect

from conftest import check_stream, start_gateway
from responses_gateway.server.registry import LOCAL_MODEL, default_registry

pytestmark = pytest.mark.model

JSON = dict[str, Any]


def test_embedded_model_over_a_websocket_with_continuation() -> None:
    pytest.importorskip("llama_cpp")
    registry = default_registry()
    gw = start_gateway(registry, preload=True, request_log=False)
    try:
        with connect(f"ws://127.0.0.1:{gw.port}/v1/responses") as ws:

            def turn(**body: Any) -> JSON:
                ws.send(json.dumps({"type": "response.create", "model": LOCAL_MODEL, "store": False, **body}))
                events: list[JSON] = []
                while not events or not events[-1]["type"].startswith(("response.completed", "response.inc")):
                    events.append(json.loads(ws.recv(timeout=120)))
                    assert events[-1]["type"] not in ("error", "response.failed"), events[-1]
                check_stream(events)
                response = events[-1]["response"]
                Response.model_validate(response)
                return dict(response)

            first = turn(input="My name is Ada. Say hello.", max_output_tokens=12)
            second = turn(previous_response_id=first["id"], input="What is my name?", max_output_tokens=12)
            assert second["previous_response_id"] == first["id"]
            assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    finally:
        gw.stop()
