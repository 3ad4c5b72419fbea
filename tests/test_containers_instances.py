"""Hosted tools' state across gateway instances that share one store (SQLite file, or PostgreSQL).

Two gateways A and B (each its own data directory, so nothing is shared but the store) serve the same
scripted model. A container made or used on A is reached from B: B restores its files from the store
and holds it from then on; the model is told its variables did not move; A, asked again, takes it back
with B's files. A delete on one instance is a 404 on the other, never a silent fresh container. What a
call told the model (code_interpreter's logs, file_search's passages) reaches a later turn on the
other instance.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.engine.tools.containers import MOVED_NOTE
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.sandbox import probe
from responses_gateway.store.tool_results import ToolResults
from test_store_services import fresh_pg_database, require

JSON = dict[str, Any]

WHY = probe()
if WHY is not None:
    if os.environ.get("CI"):
        raise RuntimeError(f"the sandbox must work in CI (scripts/sandbox-deps.sh installs it): {WHY}")
    pytest.skip(f"the sandbox cannot start here: {WHY}", allow_module_level=True)


def call(code: str) -> JSON:
    return {"function_call": {"name": "code_interpreter", "arguments": [json.dumps({"code": code})]}}


# Each call prints a marker the next turn looks for (the scripted model matches on the whole input).
SCRIPT: JSON = {
    "turns": [
        {"when": {"text_contains": "THIRD-OUT"}, "steps": [{"message": ["done 3"]}]},
        {"when": {"text_contains": "third"}, "steps": [call("print('THIRD-OUT', open('b.txt').read())")]},
        {"when": {"text_contains": "SECOND-OUT"}, "steps": [{"message": ["done 2"]}]},
        {
            "when": {"text_contains": "second"},
            "steps": [
                call("print('SECOND-OUT', open('a.txt').read())\nopen('b.txt', 'w').write('B')\nprint(x)")
            ],
        },
        {"when": {"text_contains": "FIRST-OUT"}, "steps": [{"message": ["done 1"]}]},
        {"steps": [call("x = 41\nopen('a.txt', 'w').write('A')\nprint('FIRST-OUT', x)")]},
    ]
}


# A file_search call, then an answer.
SEARCHER: JSON = {
    "turns": [
        {"when": {"text_contains": "again"}, "steps": [{"message": ["As notes.txt says."]}]},
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Found it."]}]},
        {
            "steps": [
                {"function_call": {"name": "file_search", "arguments": [json.dumps({"queries": ["otters"]})]}}
            ]
        },
    ]
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JSON]:
    root = tmp_path_factory.mktemp(f"instances-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite://{root}/shared.db"
    else:
        require("postgres")
        url = fresh_pg_database("rg_containers_instances")
    providers = [ScriptedProvider(SCRIPT, name="nb"), ScriptedProvider(SCRIPT, name="nb")]
    searchers = [ScriptedProvider(SEARCHER, name="fs"), ScriptedProvider(SEARCHER, name="fs")]
    gateways: list[Gateway] = []
    try:
        for name, provider, searcher in zip("ab", providers, searchers, strict=True):
            data = root / name
            data.mkdir()
            gateways.append(start_gateway([provider, searcher], store_url=url, data_dir=str(data)))
        yield {
            "a": openai.OpenAI(base_url=gateways[0].base_url, api_key="k", max_retries=0),
            "b": openai.OpenAI(base_url=gateways[1].base_url, api_key="k", max_retries=0),
            "providers": providers,
            "searchers": searchers,
            "dirs": (root / "a" / "containers", root / "b" / "containers"),
        }
    finally:
        for gateway in gateways:
            gateway.stop()


def _logs(response: Any) -> str:
    item = response.output[0]
    assert item.type == "code_interpreter_call", item
    return "".join(o.logs for o in item.outputs or [] if o.type == "logs")


def test_a_container_moves_with_its_files_and_the_model_is_told(pair: JSON) -> None:
    a, b = pair["a"], pair["b"]
    include = ["code_interpreter_call.outputs"]
    tool: Any = {"type": "code_interpreter", "container": {"type": "auto"}}
    first = a.responses.create(model="nb", input="first", tools=[tool], include=include)
    assert _logs(first) == "FIRST-OUT 41\n"
    cid = first.output[0].container_id
    # B sees the container A made, through the Containers API, with the file A's code wrote.
    assert cid in [c.id for c in b.containers.list()]
    assert b.containers.retrieve(cid).id == cid
    # Continued on B: the files came along, the variables did not (a NameError, and the model is told).
    second = b.responses.create(
        model="nb", input="second", tools=[tool], include=include, previous_response_id=first.id
    )
    assert second.output[0].container_id == cid  # the same container, not a fresh one
    logs = _logs(second)
    assert logs.startswith("SECOND-OUT A\n") and "NameError" in logs
    told = pair["providers"][1].requests[-1].input[-1]
    assert told["type"] == "function_call_output" and told["output"].startswith(MOVED_NOTE)
    assert [p.read_text() for p in pair["dirs"][1].glob(f"{cid}*/a.txt")] == ["A"]
    # Back on A: its copy is stale (B holds the container now); A restores it with B's file.
    third = a.responses.create(
        model="nb", input="third", tools=[tool], include=include, previous_response_id=second.id
    )
    assert third.output[0].container_id == cid and _logs(third) == "THIRD-OUT B\n"
    paths = {f.path for f in a.containers.files.list(cid)}
    assert {"/mnt/data/a.txt", "/mnt/data/b.txt"} <= paths


def test_a_calls_result_reaches_the_model_on_the_other_instance(pair: JSON) -> None:
    a, b = pair["a"], pair["b"]
    tool: Any = {"type": "code_interpreter", "container": {"type": "auto"}}
    # Outputs not included: the model's view of the call is kept in the store, not on the item.
    first = a.responses.create(model="nb", input="first", tools=[tool])
    assert first.output[0].outputs is None
    b.responses.create(model="nb", input="thanks", previous_response_id=first.id)
    assert pair["providers"][1].requests[-1].tool_choice == "none"
    seen = pair["providers"][1].requests[-1].input
    outputs = [i["output"] for i in seen if i["type"] == "function_call_output"]
    # The text the model was told (with the files written), not one rebuilt from the item.
    assert outputs == ["FIRST-OUT 41\n\nFiles written: /mnt/data/a.txt"]


def test_a_container_deleted_on_one_instance_is_gone_on_the_other(pair: JSON, tmp_path: Path) -> None:
    a, b = pair["a"], pair["b"]
    container = a.containers.create(name="shared")
    uploaded = a.containers.files.create(container.id, file=("in.txt", b"hello"))
    # B reads the uploaded file's bytes (restored from the store).
    content = b.containers.files.content.retrieve(uploaded.id, container_id=container.id).read()
    assert content == b"hello"
    b.containers.delete(container.id)
    with pytest.raises(openai.NotFoundError):
        a.containers.retrieve(container.id)
    assert container.id not in [c.id for c in a.containers.list()]
    with pytest.raises(openai.BadRequestError) as refused:
        a.responses.create(
            model="nb", input="first", tools=[{"type": "code_interpreter", "container": container.id}]
        )
    assert "No container found" in str(refused.value)


def test_file_search_passages_and_citations_reach_the_other_instance(pair: JSON) -> None:
    a, b = pair["a"], pair["b"]
    uploaded = a.files.create(
        file=("notes.txt", b"Otters hold hands while they sleep."), purpose="assistants"
    )
    store = a.vector_stores.create(name="notes")
    attached = a.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=uploaded.id)
    assert attached.status == "completed", attached.last_error
    tool: Any = {"type": "file_search", "vector_store_ids": [store.id]}
    first = a.responses.create(model="fs", input="What do otters do?", tools=[tool])
    assert first.output[0].type == "file_search_call" and first.output[0].results is None
    told = [i for i in pair["searchers"][0].requests[-1].input if i["type"] == "function_call_output"]
    # Continued on B (the results were not included on the item): the model reads the same passages.
    b.responses.create(model="fs", input="Say it again.", previous_response_id=first.id)
    seen = [i for i in pair["searchers"][1].requests[-1].input if i["type"] == "function_call_output"]
    assert seen == told and "Otters hold hands" in seen[0]["output"]


def test_a_slow_store_still_has_the_search_results_when_the_response_ends(
    pair: JSON, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The passages the model read are stored before the response ends, however slow the store's
    write: a continuation on B sent the moment A answers reads them (they were written in the
    background, and B found them only if that write happened to win; CI's PostgreSQL run lost)."""
    a, b = pair["a"], pair["b"]
    put_result = ToolResults.put_result

    async def slow_put_result(self: ToolResults, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.5)
        await put_result(self, *args, **kwargs)

    monkeypatch.setattr(ToolResults, "put_result", slow_put_result)
    uploaded = a.files.create(file=("slow.txt", b"Otters use stones as tools."), purpose="assistants")
    store = a.vector_stores.create(name="slow")
    attached = a.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=uploaded.id)
    assert attached.status == "completed", attached.last_error
    tool: Any = {"type": "file_search", "vector_store_ids": [store.id]}
    first = a.responses.create(model="fs", input="What do otters do?", tools=[tool])
    b.responses.create(model="fs", input="Say it again.", previous_response_id=first.id)
    seen = [i for i in pair["searchers"][1].requests[-1].input if i["type"] == "function_call_output"]
    assert len(seen) == 1 and "Otters use stones" in seen[0]["output"], seen
