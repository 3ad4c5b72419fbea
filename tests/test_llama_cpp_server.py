"""The gateway in front of a real local server: llama-cpp-python's ``python -m llama_cpp.server``
serving the bundled Gemma GGUF, reached through the ``openai-chat`` back end with its
``llama-cpp-python`` dialect, used with the openai SDK.

That server takes structured output as ``{"type": "json_object", "schema": …}`` and answers
``json_schema`` with a 500 whose text carries a Python traceback: the dialect spells it the server's
way, and without the dialect the client gets a clear 502 with no traceback in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from serve_process import Served, free_port, serve, shared_model_path

pytestmark = pytest.mark.model

HERE = Path(__file__).parent
SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "string", "enum": ["Paris", "Rome", "Madrid"]}},
    "required": ["capital"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "llama_server_main.py"),
                "--model",
                str(shared_model_path()),
                "--model_alias",
                "gemma",
                "--chat_format",
                "gemma",  # the bundled GGUF carries no chat template
                "--n_ctx",
                "2048",
                "--n_threads",
                "2",
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"llama_cpp.server exited:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"llama_cpp.server did not start:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def gateway(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("gateway")
    config = tmp / "models.yaml"
    config.write_text(
        "local: false\n"
        "models:\n"
        "  - name: local-gemma\n"
        "    provider: openai-chat\n"
        f"    base_url: {llama_server}\n"
        "    upstream_model: gemma\n"
        "    options: {dialect: llama-cpp-python}\n"
        "  - name: undialected\n"
        "    provider: openai-chat\n"
        f"    base_url: {llama_server}\n"
        "    upstream_model: gemma\n"
    )
    served = serve(tmp, "--no-local", "--config", str(config))
    yield served
    served.proc.terminate()
    served.proc.wait(10)


def test_text_streams_and_is_stored(gateway: Served) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key="unused")
    events = list(
        client.responses.create(
            model="local-gemma", input="Say hello.", max_output_tokens=12, temperature=0, stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    terminal = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(terminal) == 1, [e.type for e in events]
    final = terminal[0].response  # type: ignore[union-attr]
    assert deltas and "".join(deltas) == final.output_text
    assert final.status in ("completed", "incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.model == "local-gemma"
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == final.status
    follow = client.responses.create(
        model="local-gemma", previous_response_id=final.id, input="Again.", max_output_tokens=8
    )
    items = client.responses.input_items.list(follow.id)
    assert [getattr(i, "role", None) for i in items.data] == ["user"]  # this turn's input only
    assert follow.output_text


def test_structured_output_in_the_servers_own_spelling(gateway: Served) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key="unused")
    response = client.responses.create(
        model="local-gemma",
        input="What is the capital of France? Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    assert response.status == "completed", response
    answer = json.loads(response.output_text)
    assert set(answer) == {"capital"} and answer["capital"] in ("Paris", "Rome", "Madrid")


def test_without_the_dialect_the_upstreams_refusal_is_clear(gateway: Served) -> None:
    got = httpx.post(
        f"{gateway.base_url}/responses",
        json={
            "model": "undialected",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}},
            "max_output_tokens": 10,
        },
        timeout=60,
    )
    assert got.status_code == 502, got.text
    message = got.json()["error"]["message"]
    assert "Input should be 'text' or 'json_object'" in message
    assert 'File "' not in message and "Traceback" not in message and "\n" not in message
