"""The real Vercel AI SDK (`ai` + `@ai-sdk/openai`, pinned in tests/clients/vercel-ai) against a real
``responses-gateway serve`` process.

Each case runs one of the Node scripts in tests/clients/vercel-ai with ``node``; the script makes the SDK
call through ``createOpenAI({baseURL}).responses(model)`` and prints what the SDK returned (text, steps,
usage, errors…) and every request body it sent, as JSON. The models are scripted (``--script``), except
structured output, which the scripted provider refuses and the embedded gemma-3-270m follows:

- ``generateText`` / ``streamText``: text, deltas, reasoning, usage, finish reason, the response id;
- a tool loop with ``execute`` and ``stopWhen: stepCountIs(3)``: with the store on, step 2 sends the
  reasoning back as an ``item_reference`` the gateway resolves; with ``store: false`` and ``include``
  it goes back inline with its (sealed) ``encrypted_content``;
- ``Output.object`` (``text.format`` json_schema);
- a failure mid-stream: the SDK's ``error`` part and thrown error carry the gateway's message.
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
from serve_process import Served, serve, stop

JSON = dict[str, Any]

HELLO = """\
model: hello
steps:
  - reasoning: {summary: [["Thinking ", "hard"]], encrypted_content: "opaque-hello-state"}
  - message: ["Hel", "lo ", "world"]
  - usage: {input_tokens: 11, output_tokens: 7, reasoning_tokens: 3}
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
  - when: {text_contains: "early"}
    steps:
      - fail: {code: server_error, message: "Failed before any output."}
  - steps:
      - message: ["Partial ", "answer"]
      - fail: {code: server_error, message: "The upstream model crashed."}
"""

CHAT = """\
model: chat
turns:
  - when: {text_contains: "second topic"}
    steps:
      - message: ["About the second topic."]
  - steps:
      - reasoning: {summary: ["Recalling"], encrypted_content: "opaque-chat-state"}
      - message: ["About the first topic."]
"""

TOOL_RESULT = {"city": "Paris", "sky": "sunny", "celsius": 21}


@pytest.fixture(scope="module")
def client() -> Path:
    return ensure_client("vercel-ai")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("vercel-scripted")
    scripts = []
    for name, text in (("hello", HELLO), ("weather", WEATHER), ("broken", BROKEN), ("chat", CHAT)):
        path = tmp / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        scripts += ["--script", str(path)]
    served = serve(tmp, "--no-local", *scripts)
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


# --- a) text
def _check_hello(result: JSON, served: Served) -> None:
    assert result["text"] == "Hello world"
    assert result["reasoningText"] == "Thinking hard"
    assert result["finishReason"] == "stop"
    usage = result["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (11, 7, 18)
    assert usage["outputTokenDetails"]["reasoningTokens"] == 3
    assert result["warnings"] == []
    # The id the SDK reports is the gateway's stored response.
    response_id = result["providerMetadata"]["openai"]["responseId"]
    stored = served.get(f"/v1/responses/{response_id}").json()
    assert stored["status"] == "completed"
    assert [i["type"] for i in stored["output"]] == ["reasoning", "message"]
    assert stored["output"][1]["content"][0]["text"] == "Hello world"
    # What the SDK sent: the prompt as one user message, nothing the gateway had to refuse.
    (request,) = result["requests"]
    assert request["url"] == f"{served.base_url}/responses"
    assert request["body"]["model"] == "hello"
    assert request["body"]["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}
    ]


def test_generate_text(client: Path, scripted: Served) -> None:
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode="generate"))
    _check_hello(result, scripted)
    assert "stream" not in result["requests"][0]["body"]


def test_stream_text(client: Path, scripted: Served) -> None:
    result = _ok(_node(client, "text.mjs", scripted, "hello", mode="stream"))
    _check_hello(result, scripted)
    assert result["requests"][0]["body"]["stream"] is True
    assert result["deltas"] == ["Hel", "lo ", "world"]
    assert result["errors"] == []
    parts = result["parts"]
    assert parts.count("reasoning-delta") == 2 and parts.count("text-delta") == 3
    assert parts.index("reasoning-end") < parts.index("text-start") < parts.index("text-end")
    assert parts[-2:] == ["finish-step", "finish"]


# --- b) tool loop
def _check_tool_loop(result: JSON) -> tuple[JSON, JSON]:
    """The loop as the user sees it; returns the two request bodies."""
    assert result["executed"] == [{"city": "Paris"}]  # the tool ran once, with the exact arguments
    assert result["text"] == "It is sunny in Paris, 21 °C."
    assert result["finishReason"] == "stop"
    first, second = result["steps"]
    assert first["finishReason"] == "tool-calls"
    assert first["reasoningText"] == "Checking the weather"
    assert first["toolCalls"] == [
        {"toolCallId": "call_weather_1", "toolName": "get_weather", "input": {"city": "Paris"}}
    ]
    assert first["toolResults"] == [{"toolCallId": "call_weather_1", "output": TOOL_RESULT}]
    assert second["finishReason"] == "stop" and second["toolCalls"] == []
    assert first["warnings"] == [] and second["warnings"] == []
    one, two = (r["body"] for r in result["requests"])
    tool = one["tools"][0]
    assert (tool["type"], tool["name"], tool["parameters"]["required"]) == (
        "function",
        "get_weather",
        ["city"],
    )
    assert one["tool_choice"] == "auto"
    user = {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}
    assert one["input"] == [user]
    assert two["input"][0] == user
    assert two["input"][2:] == [
        {
            "type": "function_call",
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
    return one, two


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_tool_loop_with_store_resolves_the_reasoning_item_reference(
    client: Path, scripted: Served, mode: str
) -> None:
    result = _ok(_node(client, "tools.mjs", scripted, "weather", mode=mode))
    one, two = _check_tool_loop(result)
    assert "store" not in one and "store" not in two  # the SDK relies on OpenAI's default: stored
    # Step 2 names step 1's reasoning item by id instead of sending it.
    first, second = result["steps"]
    reasoning_id = first["reasoning"][0]["providerMetadata"]["openai"]["itemId"]
    assert two["input"][1] == {"type": "item_reference", "id": reasoning_id}
    step1 = scripted.get(f"/v1/responses/{first['responseId']}").json()
    assert step1["output"][0]["type"] == "reasoning" and step1["output"][0]["id"] == reasoning_id
    # The gateway resolved it: step 2 was answered, and its stored input holds the reasoning item itself.
    items = scripted.get(f"/v1/responses/{second['responseId']}/input_items?order=asc").json()["data"]
    assert [i["type"] for i in items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert items[1]["id"] == reasoning_id
    assert items[1]["summary"] == [{"type": "summary_text", "text": "Checking the weather"}]
    assert "item_reference" not in json.dumps(items)


def test_tool_loop_without_store_sends_the_reasoning_back_inline(client: Path, scripted: Served) -> None:
    options = {"openai": {"store": False, "include": ["reasoning.encrypted_content"]}}
    result = _ok(_node(client, "tools.mjs", scripted, "weather", mode="stream", providerOptions=options))
    one, two = _check_tool_loop(result)
    for body in (one, two):
        assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    first, second = result["steps"]
    meta = first["reasoning"][0]["providerMetadata"]["openai"]
    # The state left the gateway sealed (not the back end's own text) and came back unchanged.
    sealed = meta["reasoningEncryptedContent"]
    assert sealed.startswith("rgs1.") and "opaque-weather-state" not in sealed
    assert two["input"][1] == {
        "type": "reasoning",
        "id": meta["itemId"],
        "encrypted_content": sealed,
        "summary": [{"type": "summary_text", "text": "Checking the weather"}],
    }
    # Nothing was stored.
    for step in (first, second):
        assert scripted.get(f"/v1/responses/{step['responseId']}").status_code == 404


def test_chat_history_from_response_messages_is_resolved(client: Path, scripted: Served) -> None:
    """``messages: [...history, ...result.response.messages]``: the stored turn goes back by reference."""
    result = _ok(_node(client, "chat.mjs", scripted, "chat"))
    assert result["texts"] == ["About the first topic.", "About the second topic."]
    _, two = (r["body"] for r in result["requests"])
    first = scripted.get(f"/v1/responses/{result['responseIds'][0]}").json()
    reasoning, message = first["output"]
    # User messages go as role-only items (no "type"), the stored turn as two references.
    assert [i.get("type", i.get("role")) for i in two["input"]] == [
        "user",
        "item_reference",
        "item_reference",
        "user",
    ]
    assert [i.get("id") for i in two["input"][1:3]] == [reasoning["id"], message["id"]]
    items = scripted.get(f"/v1/responses/{result['responseIds'][1]}/input_items?order=asc").json()["data"]
    assert [(i["type"], i.get("role"), i["id"]) for i in items[1:3]] == [
        ("reasoning", None, reasoning["id"]),
        ("message", "assistant", message["id"]),
    ]
    assert items[2]["content"][0]["text"] == "About the first topic."
    assert items[3]["content"][0]["text"] == "And the second topic?"


# --- c) structured output
@pytest.mark.model
def test_structured_output_with_the_embedded_model(client: Path, tmp_path: Path) -> None:
    served = serve(tmp_path)  # the embedded gemma-3-270m: the scripted provider refuses json_schema
    try:
        # The first request loads the model (and, on a fresh machine, assembles it): a generous limit.
        result = _ok(
            _node(
                client, "object.mjs", served, "gemma-3-270m", timeout=180, maxOutputTokens=64, temperature=0
            )
        )
    finally:
        stop(served)
    (request,) = result["requests"]
    fmt = request["body"]["text"]["format"]
    assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "weather", True)
    assert fmt["schema"]["required"] == ["city", "celsius"]
    assert request["body"]["max_output_tokens"] == 64
    # The grammar-constrained output parsed and passed the SDK's zod schema.
    output = result["output"]
    assert set(output) == {"city", "celsius"}
    assert output["city"] == "Paris"
    assert isinstance(output["celsius"], int | float)
    assert json.loads(result["text"]) == output
    assert result["finishReason"] == "stop"


# --- d) failure
def test_mid_stream_failure_is_an_error_part_with_the_message(client: Path, scripted: Served) -> None:
    result = _node(client, "fail.mjs", scripted, "broken", mode="stream")
    parts = result["parts"]
    assert [p["text"] for p in parts if p["type"] == "text-delta"] == ["Partial ", "answer"]
    errors = [p["error"] for p in parts if p["type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["message"] == "The upstream model crashed."
    assert errors[0]["data"]["error"]["code"] == "server_error"
    assert [e["message"] for e in result["onError"]] == ["The upstream model crashed."]
    assert parts[-1] == {"type": "finish", "finishReason": "error"}
    assert result["finishReason"] == "error"
    assert result["iterationError"] is None


def test_failure_before_any_output_is_an_api_call_error(client: Path, scripted: Served) -> None:
    """Failed before the first output item, the SDK reports the stream's error as an APICallError."""
    result = _node(client, "fail.mjs", scripted, "broken", mode="stream", prompt="fail early")
    errors = [p["error"] for p in result["parts"] if p["type"] == "error"]
    assert [(e["name"], e["message"], e["statusCode"]) for e in errors] == [
        ("AI_APICallError", "Failed before any output.", 500)
    ]
    assert errors[0]["data"]["error"]["code"] == "server_error"
    assert [p["type"] for p in result["parts"] if p["type"] in ("text-delta", "finish")] == []
    assert result["finishError"]["name"] == "AI_NoOutputGeneratedError"


def test_failure_without_streaming_is_thrown_with_the_message(client: Path, scripted: Served) -> None:
    result = _node(client, "fail.mjs", scripted, "broken", mode="generate")
    thrown = result["thrown"]
    assert thrown["name"] == "AI_APICallError"
    assert thrown["message"] == "The upstream model crashed."
    assert thrown["statusCode"] == 500
    assert thrown["data"]["error"]["code"] == "server_error"
