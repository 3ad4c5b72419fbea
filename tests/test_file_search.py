"""file_search run by the gateway for any model, seen by real clients over HTTP.

Files are uploaded and put in a vector store with the openai SDK (the Vector Stores API,
``retrieval/``); the model is a scripted back end, a Chat Completions upstream and an Anthropic
upstream (mocks on loopback), each offered a ``file_search(queries)`` function. The client sees
``file_search_call`` items and events as the openai SDK types them, ``results`` only with
``include: ["file_search_call.results"]``, the next model turn reads the passages, and the answer's
``file_citation`` annotations point at the file it names. Every stream passes the checker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.scripted import ScriptedProvider
from test_documents import make_pdf
from upstream_mock import UpstreamMock, encode_chunks, stream_reply

JSON = dict[str, Any]
KEY_A, KEY_B = "fs-key-a", "fs-key-b"
RESULTS = ["file_search_call.results"]

CORPUS: dict[str, bytes] = {
    "cats.txt": b"Cats are small domesticated carnivores. A cat purrs when it is content, grooms its fur "
    b"with a rough tongue and hunts mice at night. Kittens open their eyes after about ten days.",
    "volcanoes.md": b"# Volcanoes\n\nA volcano is a rupture in the crust where magma reaches the surface "
    b"as lava. Eruptions throw out ash and gas; Mount Etna in Sicily erupts every few years.",
    "freedonia.pdf": make_pdf("The capital of Freedonia is Fredville.", "Its river is the Fredwater."),
}


def search_call(*queries: str, pieces: int = 2) -> JSON:
    arguments = json.dumps({"queries": list(queries)})
    cut = len(arguments) // pieces
    return {"function_call": {"name": "file_search", "arguments": [arguments[:cut], arguments[cut:]]}}


SCRIPTS: dict[str, Any] = {
    "librarian": {
        "turns": [
            {
                "when": {"input_has": "function_call_output"},
                "steps": [{"message": ["A cat purrs when it is content (see ", "cats.txt", ")."]}],
            },
            {"steps": [search_call("why do cats purr", "cat purring")]},
        ]
    },
    "capital": {
        "turns": [
            {
                "when": {"text_contains": "Fredville"},
                "steps": [{"message": ["Fredville, says freedonia.pdf."]}],
            },
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Not found."]}]},
            {"steps": [search_call("capital of Freedonia")]},
        ]
    },
    "broken": {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Sorry."]}]},
            {"steps": [{"function_call": {"name": "file_search", "arguments": ['{"q": 1}']}}]},
        ]
    },
}


@pytest.fixture(scope="module")
def providers() -> dict[str, ScriptedProvider]:
    return {name: ScriptedProvider(script, name=name) for name, script in SCRIPTS.items()}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def gw(
    providers: dict[str, ScriptedProvider], upstream: UpstreamMock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("fs")
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-4o")
    chat.name = "chat"
    claude = AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
    claude.name = "claude"
    gemini = GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")
    gemini.name = "gemini"
    gateway = start_gateway(
        [*providers.values(), chat, claude, gemini],
        store_url=f"sqlite://{data}/gateway.db",
        data_dir=str(data),
        api_keys=(KEY_A, KEY_B),
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def corpus(client: openai.OpenAI) -> tuple[str, dict[str, str]]:
    """A vector store with the corpus: its id, and the file ids by name."""
    if client.get("/vector_stores", cast_to=httpx.Response).status_code == 404:  # pragma: no cover
        pytest.skip("the Vector Stores API is not in this tree")
    store = client.vector_stores.create(name="library")
    ids = {
        name: client.files.create(file=(name, data), purpose="assistants").id for name, data in CORPUS.items()
    }
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id,
        files=[{"file_id": fid, "attributes": {"kind": name.rsplit(".", 1)[1]}} for name, fid in ids.items()],
        poll_interval_ms=100,
    )
    assert batch.status == "completed" and batch.file_counts.completed == len(CORPUS), batch
    return store.id, ids


EVENT = TypeAdapter(ResponseStreamEvent)


def _stream(client: openai.OpenAI, **body: Any) -> tuple[list[JSON], JSON]:
    """A streamed response whose events all validate against the SDK's types and pass the checker."""
    got = httpx.post(
        str(client.base_url) + "responses",
        json={"stream": True, **body},
        headers={"authorization": f"Bearer {client.api_key}"},
        timeout=60,
    )
    assert got.status_code == 200, got.text
    events = decode_sse(got.content)
    for event in events:
        typed = EVENT.validate_python(event)
        assert typed.to_dict() == event, event["type"]
    check_stream(events, strict=False)
    Response.model_validate(events[-1]["response"])
    return events, events[-1]["response"]


def tool(store_id: str, **extra: Any) -> JSON:
    return {"type": "file_search", "vector_store_ids": [store_id], **extra}


def test_a_streamed_search_with_results_and_a_citation(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider], corpus: tuple[str, dict[str, str]]
) -> None:
    store_id, ids = corpus
    events, response = _stream(
        client, model="librarian", input="Why do cats purr?", tools=[tool(store_id)], include=RESULTS
    )
    kinds = [e["type"] for e in events if "file_search" in e["type"]]
    assert kinds == [
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
    ]
    assert not any("function_call" in e["type"] for e in events)  # the client never sees the function
    item, message = response["output"]
    assert item["type"] == "file_search_call" and item["status"] == "completed"
    assert item["queries"] == ["why do cats purr", "cat purring"]
    results = item["results"]
    assert results[0]["filename"] == "cats.txt" and results[0]["file_id"] == ids["cats.txt"]
    assert "purrs when it is content" in results[0]["text"]
    assert results[0]["attributes"] == {"kind": "txt"}
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    # The answer names cats.txt: a file_citation just after the name.
    text = message["content"][0]["text"]
    assert text == "A cat purrs when it is content (see cats.txt)."
    assert message["content"][0]["annotations"] == [
        {
            "type": "file_citation",
            "file_id": ids["cats.txt"],
            "filename": "cats.txt",
            "index": text.index(")"),
        }
    ]
    assert response["tools"] == [tool(store_id)]  # echoed as the client sent it
    # The model was offered the function, then read the passages with their file names and ids.
    first, second = providers["librarian"].requests[-2:]
    (offered,) = first.tools
    assert offered["name"] == "file_search" and offered["parameters"]["required"] == ["queries"]
    call, output = second.input[-2:]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {
        "queries": ["why do cats purr", "cat purring"]
    }
    assert f"cats.txt (file_id: {ids['cats.txt']}" in output["output"]
    assert "purrs when it is content" in output["output"]
    # Stored as the client saw it.
    assert client.responses.retrieve(response["id"]).to_dict()["output"] == response["output"]


def test_not_streamed_without_include_there_are_no_results(
    client: openai.OpenAI, corpus: tuple[str, dict[str, str]]
) -> None:
    store_id, ids = corpus
    response = client.responses.create(model="capital", input="Capital of Freedonia?", tools=[tool(store_id)])
    item = response.output[0]
    assert item.type == "file_search_call" and item.results is None
    assert item.queries == ["capital of Freedonia"]
    assert response.output_text == "Fredville, says freedonia.pdf."  # the PDF's text reached the model
    (annotation,) = response.output[1].content[0].annotations  # type: ignore[union-attr]
    assert annotation.type == "file_citation" and annotation.file_id == ids["freedonia.pdf"]


def test_options_reach_the_search(client: openai.OpenAI, corpus: tuple[str, dict[str, str]]) -> None:
    store_id = corpus[0]
    only_md = tool(store_id, max_num_results=1, filters={"type": "eq", "key": "kind", "value": "md"})
    _, response = _stream(client, model="librarian", input="Why?", tools=[only_md], include=RESULTS)
    (result,) = response["output"][0]["results"]
    assert result["filename"] == "volcanoes.md"  # the filter kept the cat file out
    # The answer names cats.txt, which no search returned: no citation.
    assert response["output"][1]["content"][0]["annotations"] == []


def test_previous_response_id_carries_the_search(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider], corpus: tuple[str, dict[str, str]]
) -> None:
    store_id = corpus[0]
    first = client.responses.create(model="librarian", input="Why?", tools=[tool(store_id)])
    client.responses.create(model="librarian", input="Thanks.", previous_response_id=first.id)
    last = providers["librarian"].requests[-1]
    kinds = [i["type"] for i in last.input]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
    assert "purrs when it is content" in last.input[2]["output"]
    assert [t["name"] for t in last.tools] == ["file_search"] and last.tool_choice == "none"


def test_a_malformed_call_fails_the_item_not_the_response(
    client: openai.OpenAI, providers: dict[str, ScriptedProvider], corpus: tuple[str, dict[str, str]]
) -> None:
    _, response = _stream(client, model="broken", input="?", tools=[tool(corpus[0])])
    item = response["output"][0]
    assert item["status"] == "failed" and response["status"] == "completed"
    assert "queries" in providers["broken"].requests[-1].input[-1]["output"]


def test_mistakes_are_400s_naming_the_param(gw: Gateway, corpus: tuple[str, dict[str, str]]) -> None:
    store_id, _ = corpus
    other = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    mine = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    cases: list[tuple[openai.OpenAI, JSON, str]] = [
        (other, tool(store_id), "tools[0].vector_store_ids[0]"),  # another key's store
        (mine, tool("vs_nope"), "tools[0].vector_store_ids[0]"),
        (mine, {"type": "file_search", "vector_store_ids": []}, "tools[0].vector_store_ids"),
        (mine, tool(store_id, max_num_results=0), "tools[0].max_num_results"),
        (mine, tool(store_id, filters={"type": "nope"}), "tools[0].filters"),
    ]
    for who, config, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            who.responses.create(model="librarian", input="x", tools=[config])
        assert isinstance(info.value.body, dict) and info.value.body["param"] == param, info.value.body


def test_a_replayed_item_is_read_from_its_results_or_said_to_be_gone(
    client: openai.OpenAI,
    gw: Gateway,
    providers: dict[str, ScriptedProvider],
    corpus: tuple[str, dict[str, str]],
) -> None:
    # A client that kept the item (store: false, included results) sends it back: the model reads the
    # results from it; another key replaying the same item id gets nothing of the first key's memory.
    store_id, ids = corpus
    _, first = _stream(
        client, model="librarian", input="Why?", tools=[tool(store_id)], include=RESULTS, store=False
    )
    item = first["output"][0]
    question = {"role": "user", "content": "And kittens?"}
    _stream(client, model="librarian", input=[item, question], tools=[tool(store_id)])
    told = providers["librarian"].requests[-1].input[1]["output"]
    assert f"cats.txt (file_id: {ids['cats.txt']}" in told
    other = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    bare = {**item, "results": None}
    other.responses.create(model="librarian", input=[bare, question])
    assert "no longer available" in providers["librarian"].requests[-1].input[1]["output"]
    # An item this gateway never saw (no memory of it): read from its results, and the answer citing
    # cats.txt is annotated from them.
    replayed = {**item, "id": "fs_replayed_0001"}
    _, again = _stream(client, model="librarian", input=[replayed, question], tools=[tool(store_id)])
    assert f"cats.txt (file_id: {ids['cats.txt']}" in providers["librarian"].requests[-1].input[1]["output"]
    (annotation,) = again["output"][0]["content"][0]["annotations"]
    assert annotation["file_id"] == ids["cats.txt"]


# ------------------------------------------------------------------------------ real upstreams
# (The same mock replies as tests/test_code_interpreter.py, which skips where the sandbox cannot run.)
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


def test_through_a_chat_completions_upstream(
    client: openai.OpenAI, upstream: UpstreamMock, corpus: tuple[str, dict[str, str]]
) -> None:
    store_id, ids = corpus
    args = json.dumps({"queries": ["Freedonia capital"]})
    call = {
        "index": 0,
        "id": "call_up",
        "type": "function",
        "function": {"name": "file_search", "arguments": ""},
    }
    upstream.reset(
        [
            stream_reply(
                _chat_chunks(
                    {"role": "assistant", "tool_calls": [call]},
                    {"tool_calls": [{"index": 0, "function": {"arguments": args}}]},
                    finish="tool_calls",
                    usage=(100, 20),
                ),
                split=True,
                seed=3,
            ),
            stream_reply(
                _chat_chunks(
                    {"role": "assistant", "content": "Fredville (freedonia.pdf)."},
                    finish="stop",
                    usage=(150, 5),
                )
            ),
        ]
    )
    _, response = _stream(client, model="chat", input="Capital?", tools=[tool(store_id)], include=RESULTS)
    item, message = response["output"]
    assert item["queries"] == ["Freedonia capital"] and item["results"][0]["filename"] == "freedonia.pdf"
    assert message["content"][0]["annotations"][0]["file_id"] == ids["freedonia.pdf"]
    second = upstream.requests[-1].json
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert "The capital of Freedonia is Fredville." in second["messages"][2]["content"]


def test_through_an_anthropic_upstream(
    client: openai.OpenAI, upstream: UpstreamMock, corpus: tuple[str, dict[str, str]]
) -> None:
    store_id = corpus[0]
    args = json.dumps({"queries": ["volcano eruption"]})
    upstream.reset(
        [
            stream_reply(
                _anthropic_events(
                    [{"type": "tool_use", "id": "toolu_1", "name": "file_search", "input": {}}],
                    [{"type": "input_json_delta", "partial_json": args}],
                    "tool_use",
                    (80, 30),
                )
            ),
            stream_reply(
                _anthropic_events(
                    [{"type": "text", "text": ""}],
                    [{"type": "text_delta", "text": "Etna erupts every few years (volcanoes.md)."}],
                    "end_turn",
                    (120, 4),
                )
            ),
        ]
    )
    _, response = _stream(client, model="claude", input="Volcanoes?", tools=[tool(store_id)])
    item, message = response["output"]
    assert item["type"] == "file_search_call" and item["results"] is None
    assert message["content"][0]["annotations"][0]["filename"] == "volcanoes.md"
    second = upstream.requests[-1].json
    (result,) = second["messages"][2]["content"]
    assert result["type"] == "tool_result" and "Mount Etna" in json.dumps(result)


def _gemini_chunks(part: JSON) -> bytes:
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 7, "totalTokenCount": 57},
        "modelVersion": "gemini-2.0-flash",
    }
    return encode_chunks([chunk], "gemini")


def test_through_a_gemini_upstream(
    client: openai.OpenAI, upstream: UpstreamMock, corpus: tuple[str, dict[str, str]]
) -> None:
    store_id, ids = corpus
    upstream.reset(
        [
            stream_reply(
                _gemini_chunks({"functionCall": {"name": "file_search", "args": {"queries": ["Etna"]}}})
            ),
            stream_reply(_gemini_chunks({"text": "Etna is in Sicily (volcanoes.md)."})),
        ]
    )
    _, response = _stream(client, model="gemini", input="Etna?", tools=[tool(store_id)], include=RESULTS)
    item, message = response["output"]
    assert item["queries"] == ["Etna"] and item["results"][0]["file_id"] == ids["volcanoes.md"]
    assert message["content"][0]["annotations"][0]["file_id"] == ids["volcanoes.md"]
    contents = upstream.requests[-1].json["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    (answer,) = contents[2]["parts"]
    assert answer["functionResponse"]["name"] == "file_search"
    assert "Mount Etna" in json.dumps(answer["functionResponse"]["response"])


def test_the_agents_sdk_file_search_tool(gw: Gateway, corpus: tuple[str, dict[str, str]]) -> None:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, FileSearchTool, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    store_id, _ = corpus
    sdk = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    agent = Agent(
        name="librarian",
        instructions="Search the files.",
        model=OpenAIResponsesModel(model="librarian", openai_client=sdk),
        tools=[FileSearchTool(vector_store_ids=[store_id], max_num_results=3, include_search_results=True)],
    )
    result = asyncio.run(Runner.run(agent, "Why do cats purr?"))
    assert result.final_output == "A cat purrs when it is content (see cats.txt)."
    calls = [i.raw_item for i in result.new_items if getattr(i.raw_item, "type", None) == "file_search_call"]
    assert len(calls) == 1 and calls[0].results and calls[0].results[0].filename == "cats.txt"


@pytest.mark.model
def test_the_embedded_model_searches_and_reads_a_file(tmp_path: Any) -> None:
    """One embedded-model run: forced to search, it calls file_search with its own query (the grammar
    holds it to the schema), the gateway searches, and its next turn reads the passages; an input_file
    in the same request reaches it as text."""
    pytest.importorskip("llama_cpp")
    from responses_gateway.providers.local import LocalProvider

    # Seeded: a 270M model forced to call sometimes runs one query string on until the output limit
    # (the grammar bounds the form of the arguments, not their length); this seed gives short queries.
    local = LocalProvider(seed=1)
    local.load()
    gateway = start_gateway([local], store_url=f"sqlite://{tmp_path}/gateway.db", data_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=300)
        store = client.vector_stores.create(name="pets")
        done = client.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=("cats.txt", CORPUS["cats.txt"]), poll_interval_ms=100
        )
        assert done.status == "completed"
        note = "data:text/plain;base64," + base64.b64encode(b"The user's cat is called Tom.").decode()
        _, response = _stream(
            client,
            model="local",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_file", "filename": "note.txt", "file_data": note},
                        {"type": "input_text", "text": "Search my files: why do cats purr?"},
                    ],
                }
            ],
            tools=[tool(store.id)],
            tool_choice={"type": "file_search"},
            include=RESULTS,
            max_output_tokens=96,
        )
    finally:
        gateway.stop()
    item = response["output"][0]
    assert item["type"] == "file_search_call" and item["status"] == "completed", item
    assert item["queries"] and all(isinstance(q, str) and q for q in item["queries"])
    assert item["results"] and item["results"][0]["filename"] == "cats.txt"
    assert response["status"] in ("completed", "incomplete")
