"""WebSocket mode on ``/v1/responses`` against a real gateway (uvicorn + the ``websockets`` protocol),
with the ``websockets`` client and the openai SDK's ``responses.connect()``.

What a client sees: each ``response.create`` answered with the same events as the SSE stream (one
JSON message each, every stream passing the checker, the final Response valid for the SDK); several
responses in sequence on one connection; ``previous_response_id`` continuing within the connection
with ``store: false`` (and ``previous_response_not_found`` on another connection, or after a failed
continuation evicted it, as the Open Responses suite checks); ``generate: false``; bad messages
answered with an ``error`` message while the connection stays open; a disconnect mid-response
stopping the generation; the key checked at the handshake (HTTP 401); the lifetime limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from conftest import Gateway, check_stream, start_gateway
from responses_gateway.providers.scripted import ScriptedProvider

spec = pytest.importorskip("openresponses_types")

JSON = dict[str, Any]
KEY = "rg-ws-test-key-0123456789"
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}

SCRIPT = {
    "turns": [
        # Only answerable when the first answer is in the context: the continuation worked.
        {
            "when": {"text_contains": "I will remember the code word"},
            "steps": [{"message": ["The code word ", "is in my context."]}],
        },
        {
            "when": {"input_has": "function_call_output"},
            "steps": [{"message": "The tool answered."}],
        },
        {
            "when": {"text_contains": "call a tool"},
            "steps": [
                {"function_call": {"name": "lookup", "arguments": ['{"q":', '"x"}'], "call_id": "call_1"}}
            ],
        },
        {
            "steps": [
                {"message": ["I will remember ", "the code word."]},
                {"usage": {"input_tokens": 12, "output_tokens": 6}},
            ]
        },
    ]
}
SLOW = [{"message": ["tick "] * 200, "delay": 0.05}]


@pytest.fixture(scope="module")
def models() -> dict[str, ScriptedProvider]:
    return {
        "ws": ScriptedProvider(SCRIPT, name="ws"),
        "slow": ScriptedProvider(SLOW, name="slow"),
        "quiet": ScriptedProvider([{"sleep": 0.6}, {"message": "after the silence"}], name="quiet"),
    }


@pytest.fixture(scope="module")
def gw(models: dict[str, ScriptedProvider]) -> Iterator[Gateway]:
    gateway = start_gateway(
        models.values(), ws_max_message_bytes=64 * 1024, keepalive_interval=0.2, request_log=False
    )
    yield gateway
    gateway.stop()


def ws_url(gw: Gateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/responses"


def create(ws: ClientConnection, **body: Any) -> None:
    ws.send(json.dumps({"type": "response.create", **body}))


def turn(ws: ClientConnection) -> list[JSON]:
    """The messages of one response (to its terminal event) or one error message."""
    events: list[JSON] = []
    while True:
        event = json.loads(ws.recv(timeout=15))
        events.append(event)
        if event["type"] in TERMINAL or (event["type"] == "error" and len(events) == 1):
            return events


def response_of(events: list[JSON]) -> JSON:
    """The final Response of a stream that passes the checker and validates for the SDK and against
    the Open Responses schema (what its compliance suite checks of every WebSocket turn)."""
    check_stream(events)
    final = events[-1]["response"]
    Response.model_validate(final)
    spec.ResponseResource.model_validate(final)
    return final


def error_of(ws: ClientConnection) -> JSON:
    """The one ``error`` message answering a request that could not run (valid for the schema)."""
    [error] = turn(ws)
    assert error["type"] == "error", error
    spec.WebSocketErrorEvent.model_validate(error)
    return error


def text_of(response: JSON) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def test_sequential_responses_and_continuation_with_store_false(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        create(ws, model="ws", store=False, input="Remember the code word: cobalt.")
        first = response_of(turn(ws))
        assert first["status"] == "completed" and text_of(first) == "I will remember the code word."
        assert first["store"] is False

        # Another response on the same connection, not chained: the model has no context.
        create(ws, model="ws", store=False, input="Something else.")
        second = response_of(turn(ws))
        assert second["id"] != first["id"] and text_of(second) == "I will remember the code word."

        # Chained to the first: only the new input is sent, the connection supplies the rest.
        create(ws, model="ws", store=False, previous_response_id=first["id"], input="What is it?")
        third = response_of(turn(ws))
        assert text_of(third) == "The code word is in my context."
        assert third["previous_response_id"] == first["id"]


def test_previous_response_not_found_on_another_connection(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        create(ws, model="ws", store=False, input="Remember the code word: copper.")
        rid = response_of(turn(ws))["id"]
    with connect(ws_url(gw)) as ws:
        create(ws, model="ws", store=False, previous_response_id=rid, input="Continue.")
        error = error_of(ws)
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["error"]["param"] == "previous_response_id"
        # The connection survives: a new chain starts cleanly.
        create(ws, model="ws", store=False, input="Start again.")
        assert response_of(turn(ws))["status"] == "completed"


def test_stored_responses_continue_on_any_connection(tmp_path: Any) -> None:
    gw = start_gateway(
        [ScriptedProvider(SCRIPT, name="ws")], store_url=f"sqlite:///{tmp_path}/gateway.db", request_log=False
    )
    try:
        with connect(ws_url(gw)) as ws:
            create(ws, model="ws", input="Remember the code word: teal.")  # store defaults to true
            first = response_of(turn(ws))
            assert first["store"] is True
        with connect(ws_url(gw)) as ws:  # a new connection: continued from the store
            create(ws, model="ws", previous_response_id=first["id"], input="Which word?")
            assert text_of(response_of(turn(ws))) == "The code word is in my context."
        stored = httpx.get(gw.url(f"/v1/responses/{first['id']}"), timeout=10).json()
        assert stored["status"] == "completed" and stored["output"] == first["output"]
    finally:
        gw.stop()


def test_failed_continuation_evicts_the_previous_response(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        create(ws, model="ws", store=False, input="Remember the code word: ember.")
        rid = response_of(turn(ws))["id"]
        orphan = {"type": "function_call_output", "call_id": "call_missing", "output": "no such call"}
        create(ws, model="ws", store=False, previous_response_id=rid, input=[orphan])
        error = error_of(ws)
        assert error["status"] == 400 and "call_missing" in error["error"]["message"]
        create(ws, model="ws", store=False, previous_response_id=rid, input="Try again.")
        again = error_of(ws)
        assert again["error"]["code"] == "previous_response_not_found"


def test_tool_loop_over_one_connection(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
        create(ws, model="ws", store=False, tools=tools, input="Please call a tool.")
        call = response_of(turn(ws))
        [item] = call["output"]
        assert item["type"] == "function_call" and item["arguments"] == '{"q":"x"}'
        # Echoed as OpenAI does: every function tool with description, parameters and strict.
        assert call["tools"] == [{**tools[0], "description": None, "strict": None}]
        output = {"type": "function_call_output", "call_id": item["call_id"], "output": "42"}
        create(ws, model="ws", store=False, tools=tools, previous_response_id=call["id"], input=[output])
        assert text_of(response_of(turn(ws))) == "The tool answered."


def test_generate_false_prepares_a_response_to_continue(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        create(ws, model="ws", store=False, generate=False, input="I will remember the code word: slate.")
        warm = response_of(turn(ws))
        assert warm["status"] == "completed" and warm["output"] == []
        create(ws, model="ws", store=False, previous_response_id=warm["id"], input="Go.")
        assert text_of(response_of(turn(ws))) == "The code word is in my context."


def test_bad_messages_get_error_events_and_the_connection_stays(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        ws.send("{not json")
        error = error_of(ws)
        assert error["status"] == 400 and error["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "session.update"}))
        error = error_of(ws)
        assert error["error"]["param"] == "type"
        create(ws, model="nope", input="hi")
        error = error_of(ws)
        assert error["status"] == 404 and error["error"]["code"] == "model_not_found"
        create(ws, model="ws", input="hi", temperature=7)
        error = error_of(ws)
        assert error["status"] == 400 and error["error"]["param"] == "temperature"
        create(ws, model="ws", input="hi", background=True)
        error = error_of(ws)
        assert error["error"]["param"] == "background"
        create(ws, model="ws", input="x" * (70 * 1024))
        error = error_of(ws)
        assert error["status"] == 413 and error["error"]["code"] == "request_too_large"
        # `stream` is implied and accepted; the connection still answers.
        create(ws, model="ws", stream=True, store=False, input="Still there?")
        assert response_of(turn(ws))["status"] == "completed"


def test_keepalive_while_the_model_is_silent(gw: Gateway) -> None:
    with connect(ws_url(gw)) as ws:
        create(ws, model="quiet", store=False, input="wait")
        events = turn(ws)
        response_of(events)
        assert sum(e["type"] == "response.in_progress" for e in events) >= 2


def test_disconnect_mid_response_stops_the_generation(
    gw: Gateway, models: dict[str, ScriptedProvider]
) -> None:
    slow = models["slow"]
    before = slow.cancelled
    ws = connect(ws_url(gw))
    create(ws, model="slow", store=False, input="Go slowly.")
    deltas = 0
    while deltas < 3:
        if json.loads(ws.recv(timeout=10))["type"] == "response.output_text.delta":
            deltas += 1
    ws.close()
    deadline = time.monotonic() + 5
    while slow.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert slow.cancelled == before + 1  # the provider was closed, 200 deltas were never played


def test_the_openai_sdk_connects_and_continues(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused")
    with client.responses.connect() as connection:
        connection.response.create(model="ws", store=False, input="Remember the code word: cobalt.")
        events = []
        for event in connection:
            events.append(event.model_dump(mode="json", exclude_unset=True))
            if event.type == "response.completed":
                break
        first = response_of(events)
        connection.response.create(model="ws", store=False, previous_response_id=first["id"], input="Well?")
        for event in connection:
            if event.type == "response.completed":
                assert event.response.output_text == "The code word is in my context."
                break


def test_api_key_is_checked_at_the_handshake() -> None:
    gw = start_gateway([ScriptedProvider([{"message": "hi"}], name="m")], api_keys=(KEY,))
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(gw), additional_headers={"Authorization": "Bearer wrong"})
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["type"] == "invalid_request_error"
        with pytest.raises(InvalidStatus) as missing:
            connect(
                f"ws://127.0.0.1:{gw.port}/v1/chat", additional_headers={"Authorization": f"Bearer {KEY}"}
            )
        assert missing.value.response.status_code == 404
        with connect(ws_url(gw), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            create(ws, model="m", input="hi")
            assert response_of(turn(ws))["status"] == "completed"
        # Plain HTTP on the same path still answers as before.
        assert httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "x"}).status_code == 401
    finally:
        gw.stop()


def test_connection_lifetime_limit() -> None:
    gw = start_gateway([ScriptedProvider([{"message": "hi"}], name="m")], ws_max_lifetime=0.5)
    try:
        with connect(ws_url(gw)) as ws:
            create(ws, model="m", input="hi")
            assert response_of(turn(ws))["status"] == "completed"
            error = error_of(ws)
            assert error["error"]["code"] == "websocket_connection_limit_reached"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=5)
    finally:
        gw.stop()
