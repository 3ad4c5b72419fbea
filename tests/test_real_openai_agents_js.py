"""The real OpenAI Agents SDK for JavaScript (`@openai/agents`, pinned in tests/clients/openai-agents)
against a real ``responses-gateway serve`` process with scripted models.

tests/clients/openai-agents/agent.mjs runs an agent with one function tool (``get_weather``, with
``execute``) through ``setDefaultOpenAIClient(new OpenAI({baseURL}))`` and prints the final output, the
run's items, and every request body the SDK sent, as JSON:

- ``run`` and ``run(…, {stream: true})``: the tool loop sends the whole history back (reasoning with its
  ``encrypted_content``, the call with its ``id``/``status``, the output with ``status``);
- ``previousResponseId``: server-side state, each request carries only the new items;
- ``store: false`` in the model settings: nothing stored, the loop still closes;
- a failure mid-stream and without streaming: the thrown error carries the gateway's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_clients import ensure_client
from serve_process import Served, serve, stop
from test_real_vercel_ai import _node

JSON = dict[str, Any]

AGENT = """\
model: agent
turns:
  - when: {input_has: function_call_output, text_contains: "Hello! Ask"}
    steps:
      - message: ["It is sunny in Paris, 21 °C, as I said I would check."]
  - when: {input_has: function_call_output}
    steps:
      - message: ["It is sunny ", "in Paris, 21 °C."]
      - usage: {input_tokens: 40, output_tokens: 9}
  - when: {text_contains: weather}
    steps:
      - reasoning: {summary: [["Checking ", "the weather"]], encrypted_content: "opaque-agent-state"}
      - function_call: {name: get_weather, arguments: ['{"city":', '"Paris"}'], call_id: call_agent_1}
      - usage: {input_tokens: 20, output_tokens: 12, reasoning_tokens: 4}
  - steps:
      - message: ["Hello! Ask me about the weather."]
"""

BROKEN = """\
model: broken
steps:
  - message: ["Partial ", "answer"]
  - fail: {code: server_error, message: "The upstream model crashed."}
"""

USER = {"role": "user", "content": "What is the weather in Paris?"}
OUTPUT = {
    "type": "function_call_output",
    "call_id": "call_agent_1",
    "output": '{"city":"Paris","sky":"sunny","celsius":21}',
    "status": "completed",
}


@pytest.fixture(scope="module")
def client() -> Path:
    return ensure_client("openai-agents")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("agents-js")
    scripts = []
    for name, text in (("agent", AGENT), ("broken", BROKEN)):
        path = tmp / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        scripts += ["--script", str(path)]
    gateway = serve(tmp, "--no-local", *scripts)
    yield gateway
    stop(gateway)


def _run(client: Path, served: Served, model: str = "agent", **options: Any) -> JSON:
    return _node(client, "agent.mjs", served, model, **options)


def _check_loop(result: JSON) -> list[JSON]:
    """The run as the user sees it; returns the request bodies."""
    assert "thrown" not in result, result["thrown"]
    assert result["finalOutput"] == "It is sunny in Paris, 21 °C."
    assert result["executed"] == [{"city": "Paris"}]
    assert [i["type"] for i in result["newItems"]] == [
        "reasoning_item",
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
    ]
    call = result["newItems"][1]["raw"]
    assert (call["callId"], call["name"], call["arguments"]) == (
        "call_agent_1",
        "get_weather",
        '{"city":"Paris"}',
    )
    bodies = [r["body"] for r in result["requests"]]
    for body in bodies:
        assert body["model"] == "agent" and body["instructions"] == "Be helpful and brief."
        (tool,) = body["tools"]
        assert (tool["name"], tool["strict"]) == ("get_weather", True)
    return bodies


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_sends_the_whole_history_back(client: Path, served: Served, stream: bool) -> None:
    result = _run(client, served, stream=stream)
    one, two = _check_loop(result)
    assert one["stream"] is stream and two["stream"] is stream
    assert one["input"] == [USER]
    reasoning, call = (i["raw"] for i in result["newItems"][:2])
    # Step 2: the reasoning item with the state the gateway streamed (no include: as the back end made
    # it), the call with its id and status, the output: the gateway takes all of it.
    assert two["input"] == [
        USER,
        {
            "id": reasoning["id"],
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "Checking the weather"}],
            "encrypted_content": "opaque-agent-state",
        },
        {
            "id": call["id"],
            "type": "function_call",
            "name": "get_weather",
            "call_id": "call_agent_1",
            "arguments": '{"city":"Paris"}',
            "status": "completed",
        },
        OUTPUT,
    ]
    last = served.get(f"/v1/responses/{result['responseIds'][1]}").json()
    assert last["status"] == "completed"
    assert last["output"][0]["content"][0]["text"] == "It is sunny in Paris, 21 °C."
    if stream:
        events = result["events"]
        assert events.count("output_text_delta") == 2
        for name in ("tool_called", "tool_output", "message_output_created"):
            assert f"run_item_stream_event:{name}" in events
        assert events.count("response_done") == 2


def test_previous_response_id_sends_only_the_new_items(client: Path, served: Served) -> None:
    result = _run(client, served, stream=True, chain=True)
    assert result["before"]["finalOutput"] == "Hello! Ask me about the weather."
    hello, one, two = (r["body"] for r in result["requests"])
    assert "previous_response_id" not in hello
    assert one["previous_response_id"] == result["before"]["lastResponseId"]
    assert one["input"] == [USER]
    first_step = result["responseIds"][0]
    assert two["previous_response_id"] == first_step
    assert two["input"] == [OUTPUT]
    # The model saw the whole chain (the scripted turn that answers needs the first run's greeting).
    assert result["finalOutput"] == "It is sunny in Paris, 21 °C, as I said I would check."
    assert result["executed"] == [{"city": "Paris"}]
    # The stored input of the last step is what was sent: the tool output alone.
    items = served.get(f"/v1/responses/{result['responseIds'][1]}/input_items?order=asc").json()["data"]
    assert [(i["type"], i["call_id"]) for i in items] == [("function_call_output", "call_agent_1")]


def test_store_false_stores_nothing(client: Path, served: Served) -> None:
    result = _run(client, served, store=False)
    for body in _check_loop(result):
        assert body["store"] is False
    for response_id in result["responseIds"]:
        assert served.get(f"/v1/responses/{response_id}").status_code == 404


@pytest.mark.parametrize("stream", [False, True])
def test_failure_is_thrown_with_the_message(client: Path, served: Served, stream: bool) -> None:
    result = _run(client, served, model="broken", stream=stream)
    thrown = result["thrown"]
    assert thrown["message"] == (
        "The upstream model crashed." if stream else "500 The upstream model crashed."
    )
    assert result["executed"] == []
