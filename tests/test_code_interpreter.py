"""code_interpreter run by the gateway for any model, seen by real clients over HTTP.

The model is a scripted back end (deterministic), a Chat Completions upstream and an Anthropic upstream
(mocks on loopback): each is offered a ``code_interpreter`` function; the client sees
``code_interpreter_call`` items and events as the openai SDK types them, the code runs in the sandbox
(bubblewrap), and the next model turn reads its output. Every stream passes the checker.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.sandbox import probe
from upstream_mock import UpstreamMock, encode_chunks, stream_reply

JSON = dict[str, Any]

WHY = probe()
if WHY is not None:
    if os.environ.get("CI"):
        raise RuntimeError(f"the sandbox must work in CI (scripts/sandbox-deps.sh installs it): {WHY}")
    pytest.skip(f"the sandbox cannot start here: {WHY}", allow_module_level=True)

TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}
OUTPUTS = ["code_interpreter_call.outputs"]


def call(code: str, *pieces: str) -> JSON:
    """A scripted turn calling the hosted function with ``code`` (its JSON arguments cut in pieces)."""
    arguments = json.dumps({"code": code})
    cuts = [0, *[arguments.index(p) for p in pieces], len(arguments)]
    return {
        "function_call": {
            "name": "code_interpreter",
            "arguments": [arguments[a:b] for a, b in itertools.pairwise(cuts) if b > a],
        }
    }


SCRIPTS: dict[str, Any] = {
    # One call, then an answer that uses its output.
    "calc": {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["The answer is 42."]}]},
            {"steps": [call("x = 6 * 7\nprint('x is', x)\nx", "print", "\\nx")]},
        ]
    },
    # Variables survive from one response to the next (previous_response_id).
    "notebook": {
        "turns": [
            {"when": {"text_contains": "second-run"}, "steps": [{"message": ["done 2"]}]},
            {"when": {"text_contains": "again"}, "steps": [call("print(f'second-run {x + 1}')")]},
            {"when": {"text_contains": "first-run"}, "steps": [{"message": ["done 1"]}]},
            {"steps": [call("x = 42\nprint(f'first-run {x}')")]},
        ]
    },
    "plot": {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Here is the plot."]}]},
            {
                "steps": [
                    call(
                        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\n"
                        "open('/mnt/data/data.csv', 'w').write('a,b\\n1,2\\n')"
                    )
                ]
            },
        ]
    },
    "error": {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["It failed."]}]},
            {"steps": [call("1 / 0")]},
        ]
    },
    # Reads a file uploaded through the Containers API, writes one, and names it in the answer.
    "files": {
        "turns": [
            {
                "when": {"input_has": "function_call_output"},
                "steps": [{"message": ["Totals are in sandbox:/mnt/data/out/total.txt."]}],
            },
            {
                "steps": [
                    call(
                        "import csv, os\nrows = list(csv.DictReader(open('/mnt/data/data.csv')))\n"
                        "os.makedirs('out', exist_ok=True)\n"
                        "open('out/total.txt', 'w').write(str(sum(int(r['a']) for r in rows)))\n"
                        "print(len(rows), 'rows')"
                    )
                ]
            },
        ]
    },
    # Calls until stopped: max_tool_calls must end it.
    "loop": [call("print('again')")],
    # A call cut at the output limit: its (partial) code must not run.
    "cut": [
        {
            "function_call": {
                "name": "code_interpreter",
                "arguments": ["{\"code\": \"open('/mnt/data/cut', 'w').write('x')\\nimport os; os.remove("],
            }
        },
        {"incomplete": "max_output_tokens"},
    ],
}


@pytest.fixture(scope="module")
def providers() -> dict[str, ScriptedProvider]:
    return {name: ScriptedProvider(script, name=name) for name, script in SCRIPTS.items()}


@pytest.fixture(scope="module")
def gw(providers: dict[str, ScriptedProvider], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("ci")
    gateway = start_gateway(
        list(providers.values()), store_url=f"sqlite://{data}/gateway.db", data_dir=str(data)
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


EVENT = TypeAdapter(ResponseStreamEvent)


def _stream(client: openai.OpenAI, **kwargs: Any) -> tuple[list[JSON], JSON]:
    """A streamed response: every event validates against the openai SDK's types (strictly: no
    event type or field it does not know), the stream passes the checker; the events and the Response."""
    with httpx.Client(timeout=60) as http:
        body = {"stream": True, **kwargs}
        got = http.post(
            str(client.base_url) + "responses",
            json=body,
            headers={"authorization": f"Bearer {client.api_key}"},
        )
        assert got.status_code == 200, got.text
    events = decode_sse(got.content)
    for event in events:
        typed = EVENT.validate_python(event)
        assert typed.to_dict() == event, event["type"]  # nothing the SDK's type drops
    check_stream(events, strict=False)
    Response.model_validate(events[-1]["response"])
    return events, events[-1]["response"]


def test_a_streamed_call_runs_and_the_model_reads_its_output(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider], gw: Gateway
) -> None:
    events, response = _stream(client, model="calc", input="Compute 6*7.", tools=[TOOL], include=OUTPUTS)
    kinds = [e["type"] for e in events]
    ci = [k for k in kinds if "code_interpreter" in k]
    assert ci == [
        "response.code_interpreter_call.in_progress",
        *["response.code_interpreter_call_code.delta"] * 3,
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
    ]
    # The function call the model made never reaches the client.
    assert not any("function_call" in k for k in kinds)
    code = "x = 6 * 7\nprint('x is', x)\nx"
    assert "".join(e["delta"] for e in events if e["type"].endswith("_code.delta")) == code
    item, message = response["output"]
    assert item["type"] == "code_interpreter_call" and item["status"] == "completed"
    assert item["code"] == code and item["container_id"].startswith("cntr_")
    assert item["outputs"] == [{"type": "logs", "logs": "x is 42\n42\n"}]
    assert message["content"][0]["text"] == "The answer is 42."
    assert response["tools"] == [TOOL]  # echoed as the client sent it
    # The model was offered a function, and its next turn read the call and the output.
    first, second = providers["calc"].requests[-2:]
    assert [t["name"] for t in first.tools] == ["code_interpreter"]
    assert first.tools[0]["parameters"]["required"] == ["code"]
    fc, out = second.input[-2:]
    assert fc["type"] == "function_call" and json.loads(fc["arguments"]) == {"code": code}
    assert out == {"type": "function_call_output", "call_id": fc["call_id"], "output": "x is 42\n42\n"}
    assert second.tool_choice == "auto"
    # The stored response is what the client saw.
    stored = client.responses.retrieve(response["id"]).to_dict()
    assert stored["output"] == response["output"]


def test_not_streamed_the_sdk_types_the_items(client: openai.OpenAI) -> None:
    response = client.responses.create(model="calc", input="Compute.", tools=[TOOL])
    item = response.output[0]
    assert item.type == "code_interpreter_call"
    assert item.code.startswith("x = 6 * 7") and item.outputs is None  # no include: no outputs
    assert response.output_text == "The answer is 42."
    assert response.usage is not None


def test_previous_response_id_keeps_the_containers_variables(client: openai.OpenAI) -> None:
    _, first = _stream(client, model="notebook", input="start", tools=[TOOL], include=OUTPUTS)
    _, second = _stream(
        client,
        model="notebook",
        input="again",
        previous_response_id=first["id"],
        tools=[TOOL],
        include=OUTPUTS,
    )
    (c1, _), (c2, m2) = first["output"], second["output"]
    assert c2["outputs"] == [{"type": "logs", "logs": "second-run 43\n"}]
    assert c2["container_id"] == c1["container_id"]
    assert m2["content"][0]["text"] == "done 2"
    # A container id given explicitly works too, and an unknown one is a 400.
    _, third = _stream(
        client,
        model="notebook",
        input="again",
        tools=[{"type": "code_interpreter", "container": c1["container_id"]}],
        include=OUTPUTS,
    )
    assert third["output"][0]["outputs"] == [{"type": "logs", "logs": "second-run 43\n"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="notebook", input="x", tools=[{"type": "code_interpreter", "container": "cntr_nope"}]
        )
    assert err.value.body["param"] == "tools[0].container"  # type: ignore[index]


def test_a_plot_becomes_an_image_output_and_files_are_reported(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider]
) -> None:
    pytest.importorskip("matplotlib")
    _, response = _stream(client, model="plot", input="Plot it.", tools=[TOOL], include=OUTPUTS)
    item = response["output"][0]
    images = [o for o in item["outputs"] if o["type"] == "image"]
    assert len(images) == 1 and images[0]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    told = providers["plot"].requests[-1].input[-1]["output"]
    assert "Figures saved: /mnt/data/" in told and "Files written: /mnt/data/data.csv" in told


def test_an_exception_in_the_code_is_the_calls_output_not_a_failed_response(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider]
) -> None:
    _, response = _stream(client, model="error", input="Divide.", tools=[TOOL], include=OUTPUTS)
    assert response["status"] == "completed"
    logs = response["output"][0]["outputs"][0]["logs"]
    assert "ZeroDivisionError: division by zero" in logs
    assert "ZeroDivisionError" in providers["error"].requests[-1].input[-1]["output"]


def test_max_tool_calls_ends_the_loop(client: openai.OpenAI, providers: dict[str, ScriptedProvider]) -> None:
    _, response = _stream(client, model="loop", input="Go.", tools=[TOOL], max_tool_calls=2)
    calls = [i for i in response["output"] if i["type"] == "code_interpreter_call"]
    assert [c["status"] for c in calls] == ["completed", "completed", "incomplete"]
    assert response["status"] == "completed"
    # After the budget is spent the model answers: the tool stays declared (its calls are in the
    # history) but may not be called; the call over the budget is not run, and the model is told so.
    last = providers["loop"].requests[-1]
    assert last.tool_choice == "none"
    assert last.input[-1]["output"] == "again\n"


def test_a_call_cut_short_is_never_run(client: openai.OpenAI, providers: dict[str, ScriptedProvider]) -> None:
    # The model's turn ends at the output limit in the middle of its code: nothing runs.
    _, response = _stream(client, model="cut", input="Go.", tools=[TOOL], include=OUTPUTS)
    (item,) = response["output"]
    assert item["status"] == "incomplete" and item["outputs"] is None
    assert item["code"] == "open('/mnt/data/cut', 'w').write('x')\nimport os; os.remove("
    assert response["status"] == "incomplete"
    assert len(providers["cut"].requests) == 1


def test_a_later_request_without_the_tool_still_carries_the_history(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider]
) -> None:
    _, first = _stream(client, model="calc", input="Compute.", tools=[TOOL])
    client.responses.create(model="calc", input="Thanks.", previous_response_id=first["id"])
    last = providers["calc"].requests[-1]
    # Back ends that refuse tool calls in a history without tools (Anthropic) get the function
    # declared, not callable; the model still reads the output (not included for the client).
    assert [t["name"] for t in last.tools] == ["code_interpreter"] and last.tool_choice == "none"
    kinds = [i["type"] for i in last.input]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
    assert last.input[2]["output"] == "x is 42\n42\n"


def test_another_key_cannot_read_a_calls_output_or_use_its_container(tmp_path: Path) -> None:
    provider = ScriptedProvider(SCRIPTS["calc"], name="calc")
    gateway = start_gateway([provider], api_keys=("key-a", "key-b"), data_dir=str(tmp_path))
    try:
        a = openai.OpenAI(base_url=gateway.base_url, api_key="key-a", max_retries=0)
        b = openai.OpenAI(base_url=gateway.base_url, api_key="key-b", max_retries=0)
        _, response = _stream(a, model="calc", input="Compute.", tools=[TOOL], store=False)
        item = response["output"][0]
        # Key b replays key a's item (id and container): the output is not a's, the container not reachable.
        b.responses.create(model="calc", input=[{**item, "outputs": None}, {"role": "user", "content": "?"}])
        assert provider.requests[-1].input[1]["output"] == "(The output of this call is no longer available.)"
        with pytest.raises(openai.BadRequestError):
            b.responses.create(
                model="calc",
                input="x",
                tools=[{"type": "code_interpreter", "container": item["container_id"]}],
            )
    finally:
        gateway.stop()


def test_forcing_the_tool_and_mistakes_are_plain_400s(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider], gw: Gateway
) -> None:
    client.responses.create(
        model="calc", input="Compute.", tools=[TOOL], tool_choice={"type": "code_interpreter"}
    )
    first, second = providers["calc"].requests[-2:]
    assert first.tool_choice == {"type": "function", "name": "code_interpreter"}
    assert second.tool_choice == "auto"  # forced once, not every turn
    bad = [
        (
            {"tools": [{"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file_1"]}}]},
            "tools[0].container.file_ids[0]",
        ),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "big"}}]}, "tools[0].container"),
        ({"tools": [TOOL, {"type": "function", "name": "code_interpreter", "parameters": {}}]}, "tools[0]"),
        ({"tools": [], "tool_choice": {"type": "code_interpreter"}}, "tool_choice.type"),
    ]
    for extra, param in bad:
        got = httpx.post(f"{gw.base_url}/responses", json={"model": "calc", "input": "x", **extra})
        assert got.status_code == 400, (extra, got.text)
        assert got.json()["error"]["param"] == param, got.json()


def test_an_unavailable_sandbox_is_a_400_naming_why(gw: Gateway) -> None:
    pool = gw.app.containers
    saved = pool.unavailable()
    pool._why = "bubblewrap is not installed"  # what probe() says on a machine without it
    try:
        got = httpx.post(f"{gw.base_url}/responses", json={"model": "calc", "input": "x", "tools": [TOOL]})
    finally:
        pool._why = saved
    assert got.status_code == 400
    error = got.json()["error"]
    assert error["param"] == "tools[0]" and "bubblewrap is not installed" in error["message"]


# ------------------------------------------------------------------------------ real upstreams
def _chat_chunks(*deltas: JSON, finish: str, usage: tuple[int, int]) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append(
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        }
    )
    return encode_chunks(chunks, "openai-chat")


def _anthropic_events(blocks: list[JSON], deltas: list[JSON], stop: str, usage: tuple[int, int]) -> bytes:
    msg = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }
    events: list[JSON] = [{"type": "message_start", "message": msg}]
    for i, (block, delta) in enumerate(zip(blocks, deltas, strict=True)):
        events.append({"type": "content_block_start", "index": i, "content_block": block})
        events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": usage[1]},
        }
    )
    events.append({"type": "message_stop"})
    return encode_chunks(events, "anthropic")


CODE = "x = 2 ** 10\nprint(x)"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def test_through_a_chat_completions_upstream(upstream: UpstreamMock, tmp_path: Path) -> None:
    args = json.dumps({"code": CODE})
    upstream.reset(
        [
            stream_reply(
                _chat_chunks(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_up",
                                "type": "function",
                                "function": {"name": "code_interpreter", "arguments": ""},
                            }
                        ],
                    },
                    {"tool_calls": [{"index": 0, "function": {"arguments": args[:14]}}]},
                    {"tool_calls": [{"index": 0, "function": {"arguments": args[14:]}}]},
                    finish="tool_calls",
                    usage=(100, 20),
                ),
                split=True,
                seed=1,
            ),
            stream_reply(
                _chat_chunks({"role": "assistant", "content": "It is 1024."}, finish="stop", usage=(150, 5))
            ),
        ]
    )
    provider = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-4o")
    provider.name = "chat"
    gateway = start_gateway([provider], data_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        _, response = _stream(client, model="chat", input="2^10?", tools=[TOOL], include=OUTPUTS)
    finally:
        gateway.stop()
    item, message = response["output"]
    assert item["code"] == CODE and item["outputs"] == [{"type": "logs", "logs": "1024\n"}]
    assert message["content"][0]["text"] == "It is 1024."
    assert response["usage"]["input_tokens"] == 250 and response["usage"]["output_tokens"] == 25
    first, second = (r.json for r in upstream.requests[-2:])
    assert [t["function"]["name"] for t in first["tools"]] == ["code_interpreter"]
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert second["messages"][1]["tool_calls"][0]["function"] == {
        "name": "code_interpreter",
        "arguments": json.dumps({"code": CODE}),
    }
    assert second["messages"][2]["content"] == "1024\n"


def test_through_an_anthropic_upstream(upstream: UpstreamMock, tmp_path: Path) -> None:
    args = json.dumps({"code": CODE})
    upstream.reset(
        [
            stream_reply(
                _anthropic_events(
                    [{"type": "tool_use", "id": "toolu_1", "name": "code_interpreter", "input": {}}],
                    [{"type": "input_json_delta", "partial_json": args}],
                    "tool_use",
                    (80, 30),
                ),
                split=True,
                seed=2,
            ),
            stream_reply(
                _anthropic_events(
                    [{"type": "text", "text": ""}],
                    [{"type": "text_delta", "text": "1024."}],
                    "end_turn",
                    (120, 4),
                )
            ),
        ]
    )
    provider = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
    provider.name = "claude"
    gateway = start_gateway([provider], data_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        _, response = _stream(client, model="claude", input="2^10?", tools=[TOOL], include=OUTPUTS)
    finally:
        gateway.stop()
    item, message = response["output"]
    assert item["outputs"] == [{"type": "logs", "logs": "1024\n"}]
    assert message["content"][0]["text"] == "1024."
    second = upstream.requests[-1].json
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    (tool_use,) = second["messages"][1]["content"]
    assert tool_use["type"] == "tool_use" and tool_use["input"] == {"code": CODE}
    (result,) = second["messages"][2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == tool_use["id"]


def test_the_agents_sdk_code_interpreter_tool(gw: Gateway) -> None:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    import asyncio

    from agents import Agent, CodeInterpreterTool, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    agent = Agent(
        name="calc",
        instructions="Use code.",
        model=OpenAIResponsesModel(model="calc", openai_client=client),
        tools=[CodeInterpreterTool(tool_config={"type": "code_interpreter", "container": {"type": "auto"}})],
    )
    result = asyncio.run(Runner.run(agent, "Compute 6*7."))
    assert result.final_output == "The answer is 42."
    raw = [item.raw_item for item in result.new_items]
    assert any(getattr(r, "type", None) == "code_interpreter_call" for r in raw)


# ------------------------------------------------------------------------------ the Containers API
def test_containers_api_files_in_and_out_with_citations(client: openai.OpenAI, gw: Gateway) -> None:
    expiry: Any = {"anchor": "last_active_at", "minutes": 5}
    container = client.containers.create(name="analysis", expires_after=expiry)
    assert container.id.startswith("cntr_") and container.name == "analysis" and container.status == "running"
    uploaded = client.containers.files.create(container.id, file=("data.csv", b"a,b\n1,2\n3,4\n"))
    assert uploaded.path == "/mnt/data/data.csv" and uploaded.bytes == 12 and uploaded.source == "user"
    tool = {"type": "code_interpreter", "container": container.id}
    _, response = _stream(client, model="files", input="Sum column a.", tools=[tool], include=OUTPUTS)
    item, message = response["output"]
    assert item["container_id"] == container.id
    assert item["outputs"] == [{"type": "logs", "logs": "2 rows\n"}]
    # The file the code wrote is listed, downloadable, and cited where the answer names it.
    files = {f.path: f for f in client.containers.files.list(container.id)}
    written = files["/mnt/data/out/total.txt"]
    assert written.source == "assistant" and written.bytes == 1
    assert client.containers.files.content.retrieve(written.id, container_id=container.id).read() == b"4"
    text = message["content"][0]["text"]
    (citation,) = message["content"][0]["annotations"]
    assert citation == {
        "type": "container_file_citation",
        "container_id": container.id,
        "file_id": written.id,
        "filename": "total.txt",
        "start_index": text.index("sandbox:"),
        "end_index": text.index("total.txt") + len("total.txt"),
    }
    # List, retrieve, delete a file and the container.
    assert container.id in [c.id for c in client.containers.list(name="analysis")]
    assert client.containers.retrieve(container.id).last_active_at >= container.created_at
    client.containers.files.delete(uploaded.id, container_id=container.id)
    assert "/mnt/data/data.csv" not in {f.path for f in client.containers.files.list(container.id)}
    client.containers.delete(container.id)
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(container.id)


def test_a_plot_is_downloadable_from_the_container(client: openai.OpenAI) -> None:
    pytest.importorskip("matplotlib")
    _, response = _stream(client, model="plot", input="Plot it.", tools=[TOOL])
    cid = response["output"][0]["container_id"]
    pngs = [f for f in client.containers.files.list(cid) if f.path.endswith(".png")]
    assert len(pngs) == 1 and pngs[0].source == "assistant"
    data = client.containers.files.content.retrieve(pngs[0].id, container_id=cid).read()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_containers_api_refusals(gw: Gateway) -> None:
    url = f"{gw.base_url}/containers"
    cases = [
        ({}, "name"),
        ({"name": "x", "expires_after": {"anchor": "created_at", "minutes": 5}}, "expires_after.anchor"),
        ({"name": "x", "expires_after": {"anchor": "last_active_at", "minutes": 0}}, "expires_after.minutes"),
        ({"name": "x", "file_ids": ["file_1"]}, "file_ids[0]"),
        ({"name": "x", "memory_limit": "4g"}, "memory_limit"),
        ({"name": "x", "network_policy": {"type": "allowlist", "domains": ["a.b"]}}, "network_policy"),
        ({"name": "x", "colour": "red"}, "colour"),
    ]
    for body, param in cases:
        got = httpx.post(url, json=body)
        assert got.status_code == 400 and got.json()["error"]["param"] == param, (body, got.text)
    cid = httpx.post(url, json={"name": "x"}).json()["id"]
    for name in [".", "..", ""]:
        got = httpx.post(f"{url}/{cid}/files", files={"file": (name, b"x")})
        assert got.status_code == 400, (name, got.text)
    # A client's directories are dropped from the name (as browsers do): it lands in /mnt/data.
    got = httpx.post(f"{url}/{cid}/files", files={"file": ("../../escape.txt", b"x")})
    assert got.json()["path"] == "/mnt/data/escape.txt"
    assert httpx.post(f"{url}/{cid}/files", json={"file_id": "file_1"}).status_code == 404
    assert httpx.post(f"{url}/{cid}/files", json={"name": "x"}).status_code == 400
    assert httpx.get(f"{url}/{cid}/files/cfile_nope").status_code == 404
    assert httpx.get(f"{url}?limit=0").json()["error"]["param"] == "limit"


def test_a_link_planted_by_code_is_never_followed_by_the_host(client: openai.OpenAI, gw: Gateway) -> None:
    # Code makes /mnt/data/leak a link to a host file; the host must not serve or overwrite it.
    container = client.containers.create(name="links")
    found = gw.app.containers._containers[container.id]
    secret = found.directory.parent / "host-secret.txt"
    secret.write_text("secret")
    (found.directory / "leak").symlink_to(secret)
    entry = found.file_for("leak", "assistant")
    got = httpx.get(f"{gw.base_url}/containers/{container.id}/files/{entry.id}/content")
    assert got.status_code == 404 and b"secret" not in got.content
    url = f"{gw.base_url}/containers/{container.id}/files"
    up = httpx.post(url, files={"file": ("leak", b"overwritten")})
    assert up.status_code == 200
    assert secret.read_text() == "secret"  # the link was replaced, its target untouched
