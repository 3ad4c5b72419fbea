"""HTTP errors at the edge: each bad request gets its status and OpenAI's full error body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conftest import Gateway, stream_events
from responses_gateway.providers.base import Capabilities, ProviderError
from responses_gateway.providers.scripted import ScriptedProvider


def _err(
    message: str, param: str | None = None, code: str | None = None, etype: str = "invalid_request_error"
):
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


@pytest.fixture(scope="module")
def gw() -> Any:
    from conftest import start_gateway

    plain = ScriptedProvider(
        [{"message": "ok"}],
        name="plain",
        capabilities=Capabilities(streaming=False, tools=False, tool_types=frozenset()),
    )
    server = start_gateway([ScriptedProvider([{"message": "ok"}], name="m"), plain], max_body_bytes=4096)
    yield server
    server.stop()


MSG = [{"role": "user", "content": "hi"}]

# (body, status, error body)
BAD_REQUESTS: list[tuple[Any, int, dict[str, Any]]] = [
    (
        {"input": "hi"},
        400,
        _err("Missing required parameter: 'model'.", "model", "missing_required_parameter"),
    ),
    (
        {"model": "m", "input": "hi", "bogus": 1},
        400,
        _err("Unknown parameter: 'bogus'.", "bogus", "unknown_parameter"),
    ),
    (
        {"model": "m", "input": "hi", "temperature": "hot"},
        400,
        _err(
            "Invalid type for 'temperature': expected a decimal, but got a string instead.",
            "temperature",
            "invalid_type",
        ),
    ),
    (
        {"model": "m", "input": "hi", "temperature": -1},
        400,
        _err(
            "Invalid 'temperature': decimal below minimum value. Expected a value >= 0, but got -1 instead.",
            "temperature",
            "decimal_below_min_value",
        ),
    ),
    (
        {"model": "m", "input": "hi", "top_p": 1.5},
        400,
        _err(
            "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 1.5 instead.",
            "top_p",
            "decimal_above_max_value",
        ),
    ),
    (
        {"model": "m", "input": "hi", "max_output_tokens": 0},
        400,
        _err(
            "Invalid 'max_output_tokens': integer below minimum value. "
            "Expected a value >= 1, but got 0 instead.",
            "max_output_tokens",
            "integer_below_min_value",
        ),
    ),
    (
        {"model": "m", "input": "hi", "stream": "yes"},
        400,
        _err(
            "Invalid type for 'stream': expected a boolean, but got a string instead.",
            "stream",
            "invalid_type",
        ),
    ),
    (
        {"model": "m", "input": [*MSG, MSG[0], {"role": "robot", "content": "x"}]},
        400,
        _err(
            "Invalid value: 'robot'. Supported values are: 'user', 'assistant', 'system', and 'developer'.",
            "input[2].role",
            "invalid_value",
        ),
    ),
    (
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        400,
        _err(
            "Missing required parameter: 'input[0].content[0].text'.",
            "input[0].content[0].text",
            "missing_required_parameter",
        ),
    ),
    (
        {"model": "m", "input": [{"type": "function_call_output", "output": "x"}]},
        400,
        _err(
            "Missing required parameter: 'input[0].call_id'.",
            "input[0].call_id",
            "missing_required_parameter",
        ),
    ),
    (
        {"model": "m", "input": 7},
        400,
        _err(
            "Invalid type for 'input': expected an array, but got an integer instead.",
            "input",
            "invalid_type",
        ),
    ),
    (
        {"model": "m", "input": "hi", "tools": [{"type": "function"}]},
        400,
        _err("Missing required parameter: 'tools[0].name'.", "tools[0].name", "missing_required_parameter"),
    ),
    (
        {"model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "nope"}},
        400,
        _err("Tool choice 'function' not found in 'tools' parameter.", "tool_choice"),
    ),
    (
        {"model": "m", "input": "hi", "text": {"format": {"type": "xml"}}},
        400,
        _err(
            "Invalid value: 'xml'. Supported values are: 'text', 'json_schema', and 'json_object'.",
            "text.format.type",
            "invalid_value",
        ),
    ),
    (
        {"model": "m", "input": "hi", "reasoning": {"effort": "huge"}},
        400,
        _err(
            "Invalid value: 'huge'. Supported values are: 'none', 'minimal', 'low', 'medium', 'high', and "
            "'xhigh'.",
            "reasoning.effort",
            "invalid_value",
        ),
    ),
    (
        {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
        400,
        _err(
            "Unsupported parameter: 'previous_response_id' needs stored state, and this gateway runs "
            "without a store (serve --store none). Send the whole conversation in 'input' instead.",
            "previous_response_id",
        ),
    ),
    (
        {"model": "m", "input": "hi", "background": True},
        400,
        _err(
            "Unsupported parameter: 'background' needs stored state, and this gateway runs without a "
            "store (serve --store none). Send the whole conversation in 'input' instead.",
            "background",
        ),
    ),
    (
        {"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]},
        400,
        _err(
            "Unsupported parameter: 'input[0]' (item_reference) needs stored state, and this gateway runs "
            "without a store (serve --store none). Send the whole conversation in 'input' instead.",
            "input[0]",
        ),
    ),
    # Capabilities of the chosen back end.
    (
        {"model": "m", "input": "hi", "tools": [{"type": "image_generation"}]},
        400,
        _err(
            "Unsupported parameter: 'tools[0].type' (image_generation) is not supported with this model.",
            "tools[0].type",
        ),
    ),
    (
        {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}},
        400,
        _err(
            "Unsupported parameter: 'text.format' (json_object) is not supported with this model.",
            "text.format",
        ),
    ),
    (
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}],
        },
        400,
        _err(
            "Unsupported parameter: 'input[0].content[0]' (input_image) is not supported with this model.",
            "input[0].content[0]",
        ),
    ),
    (
        {"model": "m", "input": "hi", "top_logprobs": 3},
        400,
        _err("Unsupported parameter: 'top_logprobs' is not supported with this model.", "top_logprobs"),
    ),
    (
        {"model": "plain", "input": "hi", "reasoning": {"effort": "high", "summary": "auto"}},
        400,
        _err(
            "Unsupported parameter: 'reasoning.effort' is not supported with this model.", "reasoning.effort"
        ),
    ),
    (
        {"model": "plain", "input": "hi", "stream": True},
        400,
        _err("Unsupported parameter: 'stream' is not supported with this model.", "stream"),
    ),
    (
        {"model": "plain", "input": "hi", "tools": [{"type": "function", "name": "f"}]},
        400,
        _err("Unsupported parameter: 'tools' is not supported with this model.", "tools"),
    ),
    (
        {"model": "m", "input": "hi", "tool_choice": {"type": "web_search"}},
        400,
        _err(
            "Unsupported parameter: 'tool_choice.type' (web_search) is not supported with this model.",
            "tool_choice.type",
        ),
    ),
    (
        {"model": "m"},
        400,
        _err(
            "Nothing to respond to: send 'input', or continue with 'previous_response_id' or 'conversation'.",
            "input",
            "missing_required_parameter",
        ),
    ),
    (
        {"model": "m", "input": [], "instructions": "Say hi."},
        400,
        _err(
            "Nothing to respond to: send 'input', or continue with 'previous_response_id' or 'conversation'.",
            "input",
            "missing_required_parameter",
        ),
    ),
    (
        {"model": "nope", "input": "hi"},
        404,
        _err("The model 'nope' does not exist. This gateway serves: m, plain.", "model", "model_not_found"),
    ),
    (
        [1, 2],
        400,
        _err(
            "Invalid type for request body: expected an object, but got an array instead.",
            None,
            "invalid_type",
        ),
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "error"), BAD_REQUESTS, ids=[str(i) for i in range(len(BAD_REQUESTS))]
)
def test_bad_request(gw: Gateway, body: Any, status: int, error: dict[str, Any]) -> None:
    response = httpx.post(gw.url("/v1/responses"), json=body)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == error


def test_a_model_that_does_not_reason_accepts_a_summary_request(gw: Gateway) -> None:
    # What Codex sends to a model it has no metadata for: nothing to summarize, nothing refused.
    for reasoning in ({"summary": "auto"}, {"summary": "detailed", "effort": "none"}):
        body = {
            "model": "plain",
            "input": "hi",
            "reasoning": reasoning,
            "include": ["reasoning.encrypted_content"],
        }
        answer = httpx.post(gw.url("/v1/responses"), json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        response = answer.json()
        assert response["status"] == "completed" and response["output"][0]["content"][0]["text"] == "ok"
        assert [item["type"] for item in response["output"]] == ["message"]


def test_malformed_json_and_wrong_content_type(gw: Gateway) -> None:
    response = httpx.post(
        gw.url("/v1/responses"), content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["message"].startswith("We could not parse the JSON body")
    # A JSON body sent as text/plain is still read.
    ok = httpx.post(
        gw.url("/v1/responses"), content=b'{"model":"m","input":"hi"}', headers={"content-type": "text/plain"}
    )
    assert ok.status_code == 200
    assert ok.json()["status"] == "completed"


def test_body_too_large(gw: Gateway) -> None:
    big = {"model": "m", "input": "x" * 5000}
    response = httpx.post(gw.url("/v1/responses"), json=big)
    assert response.status_code == 413
    assert response.json() == _err(
        "Request body too large: the limit is 4096 bytes.", None, "request_too_large"
    )

    # Chunked upload without Content-Length is counted as it arrives.
    def chunks() -> Any:
        yield b'{"model":"m","input":"'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    response = httpx.post(gw.url("/v1/responses"), content=chunks())
    assert response.status_code == 413


def test_unknown_route_and_wrong_method(gw: Gateway) -> None:
    response = httpx.post(gw.url("/v1/completions"), json={})
    assert response.status_code == 404
    assert response.json() == _err("Invalid URL (POST /v1/completions)", None, "not_found")
    response = httpx.get(gw.url("/v1/responses"))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(gw.url("/health")).json()["status"] == "ok"


def test_unexpected_exception_is_generic_and_leaks_nothing(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    secret = "sk-very-secret-token"
    gw = gateway(
        [
            ScriptedProvider([{"raise": secret}], name="m"),
            ScriptedProvider([{"message": "a"}, {"raise": secret}], name="late"),
        ]
    )
    response = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True})
    assert response.status_code == 500
    assert secret not in response.text
    assert response.json()["error"]["code"] == "server_error"
    events = stream_events(gw.url("/v1/responses"), {"model": "late", "input": "hi", "stream": True})
    assert_valid_stream(events)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert secret not in str(events)


def test_api_keys(gateway: Callable[..., Gateway]) -> None:
    gw = gateway([ScriptedProvider([{"message": "ok"}], name="m")], api_keys=("key-one", "key-two"))
    body = {"model": "m", "input": "hi"}
    missing = httpx.post(gw.url("/v1/responses"), json=body)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(gw.url("/v1/responses"), json=body, headers={"authorization": "Bearer key-three"})
    assert wrong.status_code == 401
    assert wrong.json() == _err("Incorrect API key provided.", None, "invalid_api_key")
    assert "key-" not in wrong.text
    for key in ("key-one", "key-two"):
        ok = httpx.post(gw.url("/v1/responses"), json=body, headers={"authorization": f"Bearer {key}"})
        assert ok.status_code == 200
    assert httpx.get(gw.url("/v1/models")).status_code == 401
    # Health stays open for load balancers.
    assert httpx.get(gw.url("/health")).status_code == 200


def test_failures_outside_the_stream_keep_the_error_shape(gateway: Callable[..., Gateway]) -> None:
    class RefusesAtCall(ScriptedProvider):
        def stream(self, request: Any, builder: Any) -> Any:
            raise ProviderError("Payment required upstream.", status=402, code="insufficient_quota")

    class BuggyCheck(ScriptedProvider):
        def check_request(self, request: Any) -> None:
            raise KeyError("sk-hidden")

    gw = gateway([RefusesAtCall([], name="call"), BuggyCheck([], name="check")])
    refused = httpx.post(gw.url("/v1/responses"), json={"model": "call", "input": "hi", "stream": True})
    assert refused.status_code == 402
    assert refused.json() == _err("Payment required upstream.", None, "insufficient_quota", "server_error")
    buggy = httpx.post(gw.url("/v1/responses"), json={"model": "check", "input": "hi"})
    assert buggy.status_code == 500
    assert buggy.json()["error"]["code"] == "server_error"
    assert "sk-hidden" not in buggy.text
