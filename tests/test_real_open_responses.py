"""The real Open Responses provider for the AI SDK (`@ai-sdk/open-responses` + `ai`, pinned in
tests/clients/open-responses) against a real ``responses-gateway serve`` process.

Each case runs one of the Node scripts in tests/clients/open-responses with ``node``; the script calls
``generateText`` / ``streamText`` on ``createOpenResponses({name: "gateway", url: BASE/responses})(model)``
and prints what the SDK returned and every request it sent (and, for some, the raw bodies the gateway
answered with), as JSON. The models are scripted (``--script``).

What this provider does, read from its source (2.0.36) and checked here:

- It validates nothing in the stream (``z.any()``) and ignores event types it does not know (``ping``,
  repeated ``response.in_progress``); SSE comments never reach it. So every keepalive mode works.
- Reasoning deltas are read from ``response.reasoning_summary_text.delta`` and
  ``response.reasoning_text.delta`` (OpenAI's spelling, the gateway's default). The Open Responses
  spec's ``response.reasoning.delta`` (``--raw-reasoning-events reasoning``) is NOT read: streamed, the
  raw reasoning then only reaches the user in the reasoning part's provider metadata (from the
  ``output_item.done`` item); ``generateText`` reads the item's ``content`` either way.
- It reads no response id from the stream: ``streamText``'s response id is the SDK's own.
- Requests: ``input`` as typed ``message`` items, ``tool_choice: "auto"`` even without tools, no
  ``store`` (so the gateway stores), no ``include``; step 2 of a tool loop sends the reasoning item
  back inline with its id, summary and ``encrypted_content`` (as the stream carried it), the
  ``function_call`` with its ``fc_`` id, and the ``function_call_output``.
- A mid-stream failure: the gateway's ``error`` event and its ``response.failed`` each become an error
  part with the gateway's message (the user sees it twice; onError is called twice).
- HTTP errors: the provider's error schema wants ``param`` and ``code`` as strings, so an OpenAI-shaped
  body with ``"param": null`` fails it and the thrown error's message is the HTTP status text; the
  gateway's message is in ``responseBody``. A refusal that names its param reaches the user whole.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_clients import ensure_client
from serve_process import Served, serve, serving, stop

JSON = dict[str, Any]
NAME = "gateway"  # the provider name the scripts give createOpenResponses: the providerMetadata key

HELLO = """\
model: hello
steps:
  - reasoning: {summary: [["Thinking ", "hard"]], encrypted_content: "opaque-hello-state"}
  - message: ["Hel", "lo ", "world"]
  - usage: {input_tokens: 11, output_tokens: 7, reasoning_tokens: 3}
"""

RAW = """\
model: raw
steps:
  - reasoning: {text: ["Let me ", "think."]}
  - message: ["Done."]
  - usage: {input_tokens: 4, output_tokens: 5, reasoning_tokens: 3}
"""

WEATHER = """\
model: weather
turns:
  - when: {input_has: function_call_output}
    steps:
      - message: ["It is sunny ", "in Paris, 21 °C."]
      - usage: {input_tokens: 40, output_tokens: 9}
  - steps:
      - reasoning: {summary: [["Checking ", "the weather"]], encrypted_content: "opaque-weather-state"}
      - function_call: {name: get_weather, arguments: ['{"city":', '"Paris"}'], call_id: call_weather_1}
      - usage: {input_tokens: 20, output_tokens: 12, reasoning_tokens: 4}
"""

BROKEN = """\
model: broken
turns:
  - when: {text_contains: "rate limit"}
    steps:
      - error: {status: 429, code: rate_limit_exceeded, message: "Slow down.", retry_after: 2}
  - steps:
      - message: ["Partial ", "answer"]
      - fail: {code: server_error, message: "The upstream model crashed."}
"""

# Silent before its first output and between its two deltas, longer than the keepalive interval.
SLOW = """\
model: slow
steps:
  - sleep: 1.0
  - message: ["Before the pause, ", "after it."]
    delay: 1.0
  - usage: {input_tokens: 5, output_tokens: 6}
"""

TOOL_RESULT = {"city": "Paris", "sky": "sunny", "celsius": 21}
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}


@pytest.fixture(scope="module")
def client() -> Path:
    return ensure_client("open-responses")


def _scripts(tmp: Path, *models: tuple[str, str]) -> list[str]:
    args = []
    for name, text in models:
        path = tmp / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        args += ["--script", str(path)]
    return args


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("open-responses-scripted")
    models = (("hello", HELLO), ("raw", RAW), ("weather", WEATHER), ("broken", BROKEN))
    served = serve(tmp, "--no-local", *_scripts(tmp, *models))
    yield served
    stop(served)


def _node(client: Path, script: str, served: Served, model: str, timeout: float = 30, **options: Any) -> JSON:
    """Run ``node SCRIPT BASE_URL MODEL OPTIONS`` and return the JSON it printed."""
    env = {**os.environ, "SCRIPT_TIMEOUT_MS": str(int((timeout - 2) * 1000))}
    done = subprocess.run(
        ["node", script, served.base_url, model, json.dumps(options)],
        cwd=client,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, (
        f"node {script} exited {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}\n"
        f"gateway log: {served.log.read_text(errors='replace')}"
    )
    result: JSON = json.loads(lines[-1])
    return result


def _ok(result: JSON) -> JSON:
    assert "thrown" not in result, json.dumps(result["thrown"], indent=1)
    return result


def _events(raw: str) -> list[JSON]:
    """The JSON events of a raw SSE body."""
    return [json.loads(line[len("data: ") :]) for line in raw.splitlines() if line.startswith("data: ")]


def _response_id(raw: str) -> str:
    """The gateway's response id from a raw body: a JSON Response or an SSE stream."""
    if raw.startswith("{"):
        return str(json.loads(raw)["id"])
    return str(_events(raw)[0]["response"]["id"])


# --- a) text
def _check_hello(result: JSON) -> None:
    assert result["text"] == "Hello world"
    assert result["reasoningText"] == "Thinking hard"
    (reasoning,) = result["reasoning"]
    meta = reasoning["providerMetadata"][NAME]
    assert meta["reasoningSummary"] == [{"type": "summary_text", "text": "Thinking hard"}]
    assert meta["itemId"].startswith("rs_")
    assert result["finishReason"] == "stop"
    usage = result["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (11, 7, 18)
    assert usage["outputTokenDetails"] == {"textTokens": 4, "reasoningTokens": 3}
    assert result["warnings"] == []
    (request,) = result["requests"]
    assert request["headers"]["content-type"] == "application/json"
    assert "authorization" not in request["headers"]  # no apiKey given


def test_generate_text(client: Path, scripted: Served) -> None:
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode="generate"))
    _check_hello(result)
    (request,) = result["requests"]
    assert request["url"] == f"{scripted.base_url}/responses"
    # Typed message items, tool_choice even without tools; nothing else (no store, no stream).
    assert request["body"] == {"model": "hello", "input": [USER], "tool_choice": "auto"}
    # The id the SDK reports is the gateway's stored response.
    stored = scripted.get(f"/v1/responses/{result['response']['id']}").json()
    assert stored["status"] == "completed"
    assert stored["output"][1]["content"][0]["text"] == "Hello world"


def test_stream_text(client: Path, scripted: Served) -> None:
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode="stream"))
    _check_hello(result)
    (request,) = result["requests"]
    assert request["body"] == {"model": "hello", "input": [USER], "tool_choice": "auto", "stream": True}
    assert result["deltas"] == ["Hel", "lo ", "world"]
    assert result["errors"] == []
    parts = result["parts"]
    assert [p for p in parts if p.startswith("reasoning-delta")] == [
        "reasoning-delta:Thinking ",
        "reasoning-delta:hard",
    ]
    assert parts.count("text-delta") == 3
    assert parts.index("reasoning-end") < parts.index("text-start") < parts.index("text-end")
    assert parts[-2:] == ["finish-step", "finish"]
    # The provider takes no id from the stream: the result's id is the SDK's own, not the gateway's.
    assert not result["response"]["id"].startswith("resp_")


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_call_settings_are_sent_and_honoured(client: Path, scripted: Served, mode: str) -> None:
    """System prompt, sampling, budget, penalties and reasoning options: none is refused.

    ``presencePenalty`` / ``frequencyPenalty`` were a 400 ``unknown_parameter`` before the gateway
    accepted the spec's ``presence_penalty`` / ``frequency_penalty``.
    """
    settings: JSON = {
        "system": "Be brief.",
        "temperature": 0.2,
        "topP": 0.9,
        "maxOutputTokens": 100,
        "presencePenalty": 0.1,
        "frequencyPenalty": 0.2,
        "providerOptions": {NAME: {"reasoningEffort": "low", "reasoningSummary": "auto"}},
    }
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode=mode, **settings))
    assert result["text"] == "Hello world" and result["warnings"] == []
    (request,) = result["requests"]
    body = request["body"]
    assert body["instructions"] == "Be brief."
    assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.2, 0.9, 100)
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.1, 0.2)
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    if mode == "generate":
        stored = scripted.get(f"/v1/responses/{result['response']['id']}").json()
        assert stored["instructions"] == "Be brief."
        assert (stored["presence_penalty"], stored["frequency_penalty"]) == (0.1, 0.2)
        assert stored["reasoning"] == {"effort": "low", "summary": "auto"}


def test_top_level_reasoning_setting(client: Path, scripted: Served) -> None:
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode="stream", reasoning="high"))
    assert result["requests"][0]["body"]["reasoning"] == {"effort": "high"}
    assert result["reasoningText"] == "Thinking hard"


# --- b) tool loop
@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_tool_loop(client: Path, scripted: Served, mode: str) -> None:
    result = _ok(_node(client, "tools.mjs", scripted, "weather", mode=mode))
    assert result["executed"] == [{"city": "Paris"}]  # the tool ran once, with the exact arguments
    assert result["text"] == "It is sunny in Paris, 21 °C."
    assert result["finishReason"] == "stop"
    if mode == "stream":
        assert result["deltas"] == ["It is sunny ", "in Paris, 21 °C."] and result["errors"] == []
    first, second = result["steps"]
    assert first["finishReason"] == "tool-calls"
    assert first["reasoningText"] == "Checking the weather"
    (call,) = first["toolCalls"]
    assert {k: call[k] for k in ("toolCallId", "toolName", "input")} == {
        "toolCallId": "call_weather_1",
        "toolName": "get_weather",
        "input": {"city": "Paris"},
    }
    assert call["itemId"].startswith("fc_")
    assert first["toolResults"] == [{"toolCallId": "call_weather_1", "output": TOOL_RESULT}]
    assert (first["usage"]["inputTokens"], first["usage"]["outputTokens"]) == (20, 12)
    assert second["finishReason"] == "stop" and second["toolCalls"] == []
    assert (second["usage"]["inputTokens"], second["usage"]["outputTokens"]) == (40, 9)
    assert first["warnings"] == [] and second["warnings"] == []

    one, two = (r["body"] for r in result["requests"])
    (tool,) = one["tools"]
    assert (tool["type"], tool["name"], tool["description"]) == (
        "function",
        "get_weather",
        "The weather in a city.",
    )
    assert tool["parameters"]["properties"] == {"city": {"type": "string"}}
    assert tool["parameters"]["required"] == ["city"]
    assert one["tool_choice"] == "auto" and two["tools"] == one["tools"]
    assert "store" not in one and "store" not in two and "include" not in two
    user = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
    }
    assert one["input"] == [user]
    # Step 2: the whole turn inline, the reasoning with its id and state as the gateway gave them.
    step1 = scripted.get(f"/v1/responses/{_response_id(result['raw'][0])}").json()
    reasoning_item, call_item = step1["output"]
    assert two["input"] == [
        user,
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "Checking the weather"}],
            "id": reasoning_item["id"],
            "encrypted_content": "opaque-weather-state",
        },
        {
            "type": "function_call",
            "id": call_item["id"],
            "call_id": "call_weather_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_weather_1",
            "output": json.dumps(TOOL_RESULT, separators=(",", ":")),
        },
    ]
    # The gateway stored step 2's input as sent, ids kept.
    step2_id = _response_id(result["raw"][1])
    items = scripted.get(f"/v1/responses/{step2_id}/input_items?order=asc").json()["data"]
    assert [i["type"] for i in items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert (items[1]["id"], items[2]["id"]) == (reasoning_item["id"], call_item["id"])


# --- c) raw reasoning text
def test_raw_reasoning_with_openai_event_names(client: Path, scripted: Served) -> None:
    """The default ``response.reasoning_text.delta`` is what this provider streams as reasoning."""
    streamed = _ok(_node(client, "text.mjs", scripted, "raw", mode="stream"))
    assert streamed["reasoningText"] == "Let me think."
    assert [p for p in streamed["parts"] if p.startswith("reasoning-delta")] == [
        "reasoning-delta:Let me ",
        "reasoning-delta:think.",
    ]
    meta = streamed["reasoning"][0]["providerMetadata"][NAME]
    assert meta["reasoningContent"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert meta["reasoningSummary"] == []
    assert streamed["text"] == "Done."
    generated = _ok(_node(client, "text.mjs", scripted, "raw", mode="generate"))
    assert generated["reasoningText"] == "Let me think." and generated["text"] == "Done."


def test_raw_reasoning_with_the_spec_event_names(client: Path, tmp_path: Path) -> None:
    """``--raw-reasoning-events reasoning``: this provider does not read ``response.reasoning.delta``.

    Streamed, the reasoning text is empty and only the ``output_item.done`` item's content (provider
    metadata) carries it; ``generateText`` reads the item and sees it whole. For this client, keep the
    default event names.
    """
    args = _scripts(tmp_path, ("raw", RAW))
    with serving(tmp_path, "--no-local", "--raw-reasoning-events", "reasoning", *args) as served:
        streamed = _ok(_node(client, "text.mjs", served, "raw", mode="stream"))
        generated = _ok(_node(client, "text.mjs", served, "raw", mode="generate"))
    assert streamed["text"] == "Done." and streamed["errors"] == []
    assert not any(p.startswith("reasoning-delta") for p in streamed["parts"])
    assert streamed["reasoningText"] in (None, "")
    (reasoning,) = streamed["reasoning"]
    assert reasoning["text"] == ""
    assert reasoning["providerMetadata"][NAME]["reasoningContent"] == [
        {"type": "reasoning_text", "text": "Let me think."}
    ]
    assert generated["reasoningText"] == "Let me think." and generated["text"] == "Done."


# --- d) keepalives
def _keepalives(raw: str, mode: str) -> int:
    if mode == "comment":
        return sum(1 for line in raw.splitlines() if line == ": keepalive")
    kind = "ping" if mode == "ping" else "response.in_progress"
    return sum(1 for event in _events(raw) if event["type"] == kind) - (mode == "in_progress")


@pytest.mark.parametrize("mode", ["in_progress", "ping", "comment"])
def test_keepalives_during_model_silence_do_not_break_the_stream(
    client: Path, tmp_path: Path, mode: str
) -> None:
    """2 s of silence with a 0.4 s keepalive interval; ``in_progress`` is the default mode."""
    args = ["--keepalive-interval", "0.4", *_scripts(tmp_path, ("slow", SLOW))]
    if mode != "in_progress":
        args += ["--keepalive", mode]
    with serving(tmp_path, "--no-local", *args) as served:
        result = _ok(_node(client, "keepalive.mjs", served, "slow"))
    assert result["text"] == "Before the pause, after it."
    assert result["finishReason"] == "stop"
    assert (result["usage"]["inputTokens"], result["usage"]["outputTokens"]) == (5, 6)
    assert result["errors"] == []
    assert [p["text"] for p in result["parts"] if p["type"] == "text-delta"] == [
        "Before the pause, ",
        "after it.",
    ]
    assert "error" not in [p["type"] for p in result["parts"]]
    (raw,) = result["raw"]
    assert _keepalives(raw, mode) >= 2, raw  # the keepalives really were sent, before and mid-message
    assert _events(raw)[-1]["type"] == "response.completed"


# --- e) failures
def test_mid_stream_failure_is_an_error_part_with_the_message(client: Path, scripted: Served) -> None:
    result = _node(client, "fail.mjs", scripted, "broken", mode="stream")
    parts = result["parts"]
    assert [p["text"] for p in parts if p["type"] == "text-delta"] == ["Partial ", "answer"]
    errors = [p["error"] for p in parts if p["type"] == "error"]
    # One error part for the `error` event, one for `response.failed`: both carry the message.
    assert [(e["name"], e["message"]) for e in errors] == [
        ("AI_StreamProviderError", "The upstream model crashed."),
        ("AI_StreamProviderError", "The upstream model crashed."),
    ]
    assert [e["data"]["type"] for e in errors] == ["error", "response.failed"]
    assert errors[0]["data"]["error"]["code"] == "server_error"
    assert errors[1]["data"]["response"]["error"] == {
        "code": "server_error",
        "message": "The upstream model crashed.",
    }
    assert [e["message"] for e in result["onError"]] == ["The upstream model crashed."] * 2
    assert parts[-1] == {"type": "finish", "finishReason": "error"}
    assert result["finishReason"] == "error"
    assert result["iterationError"] is None


def test_failure_without_streaming_is_thrown_with_the_message_in_its_body(
    client: Path, scripted: Served
) -> None:
    result = _node(client, "fail.mjs", scripted, "broken", mode="generate")
    thrown = result["thrown"]
    assert (thrown["name"], thrown["statusCode"]) == ("AI_APICallError", 500)
    # The provider's error schema rejects OpenAI's `"param": null`: its message is the status text.
    assert thrown["message"] == "Internal Server Error"
    body = json.loads(thrown["responseBody"])
    assert body["error"]["message"] == "The upstream model crashed."
    assert body["error"]["code"] == "server_error"


def test_rate_limit_before_the_stream_is_a_retryable_api_call_error(client: Path, scripted: Served) -> None:
    result = _node(client, "fail.mjs", scripted, "broken", mode="stream", prompt="rate limit")
    errors = [p["error"] for p in result["parts"] if p["type"] == "error"]
    assert [(e["name"], e["statusCode"], e["isRetryable"]) for e in errors] == [
        ("AI_APICallError", 429, True)
    ]
    body = json.loads(errors[0]["responseBody"])
    assert body["error"]["message"] == "Slow down. Please try again in 2s."
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert result["finishError"]["name"] == "AI_NoOutputGeneratedError"


def test_a_refused_request_reaches_the_user_with_its_message(client: Path, scripted: Served) -> None:
    """A 400 that names its param passes the provider's error schema: the user reads the reason."""
    result = _node(client, "text.mjs", scripted, "hello", mode="generate", presencePenalty=3)
    thrown = result["thrown"]
    assert (thrown["name"], thrown["statusCode"], thrown["isRetryable"]) == ("AI_APICallError", 400, False)
    assert "presence_penalty" in thrown["message"]
    assert thrown["data"]["error"]["param"] == "presence_penalty"
    assert thrown["data"]["error"]["code"] == "decimal_above_max_value"
