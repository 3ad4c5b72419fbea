"""`responses-gateway serve --config models.yaml` as a user runs it: a real server process in front of
mock upstreams (real HTTP on loopback), reached with the openai SDK and raw HTTP.

Covers routing by name and alias, what each upstream receives (model, path, auth header from the
environment, per-model defaults), fallback before the first byte (429 with Retry-After, 503, refused
connection), no fallback after it, GET /v1/models, start-up errors with file:line, and that upstream
keys appear neither in the server's log nor in any error body.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from conftest import check_stream, decode_sse
from fixtures_loader import load_chunks
from upstream_mock import UpstreamMock, error_reply, fixture_reply, json_reply, stream_reply

ANTHROPIC_PLAIN = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
CHAT_PLAIN = "openai-chat__plain-text-include-usage-final-chunk-gpt-4.1-nano__vercel-ai.chunks.jsonl"

ANTHROPIC_KEY = "sk-ant-api03-ROUTINGTESTSECRET-0123456789abcdef"
CHAT_KEY = "sk-proj-CHATROUTINGSECRET-fedcba9876543210"
EXE = Path(sys.executable).parent / "responses-gateway"


def _anthropic_text() -> str:
    return "".join(
        c["delta"]["text"] for c in load_chunks(ANTHROPIC_PLAIN) if c.get("type") == "content_block_delta"
    )


def _chat_text() -> str:
    return "".join(
        (choice.get("delta") or {}).get("content") or ""
        for c in load_chunks(CHAT_PLAIN)
        for choice in c.get("choices") or []
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RG_CONFIG", None)
    # Keep whatever the server persists inside the test's directory.
    env.update({"RG_DATA_DIR": str(tmp), "XDG_DATA_HOME": str(tmp), "HOME": str(tmp)})
    return env


def _spawn(config: Path, tmp: Path, env: dict[str, str], *extra: str) -> Served:
    port = _free_port()
    log_path = tmp / f"serve-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(EXE), "serve", "--config", str(config), "--port", str(port), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    served = Served(proc, port, log_path)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{served.log()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"serve did not come up:\n{served.log()}")
        time.sleep(0.05)


def _stop(served: Served) -> None:
    served.proc.terminate()
    try:
        served.proc.wait(10)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait(5)


@dataclass
class Setup:
    served: Served
    anthropic: UpstreamMock  # "claude" (alias "sonnet")
    chat: UpstreamMock  # "qwen"
    primary: UpstreamMock  # "primary": anthropic, falls back to "qwen"
    bodies: list[str]  # every HTTP body the tests received, checked for keys at the end


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("serve-config")
    refused = _free_port()  # nothing listens here
    with UpstreamMock() as anthropic, UpstreamMock() as chat, UpstreamMock() as primary:
        config = tmp / "models.yaml"
        config.write_text(
            f"""\
local: false
upstream:
  pool_limit: 0
models:
  - name: claude
    provider: anthropic
    upstream_model: claude-sonnet-4-5
    base_url: {anthropic.url}
    api_key_env: RG_TEST_ANTHROPIC_KEY
    aliases: [sonnet]
    retries: 0
    options: {{max_output_tokens: 1000, reasoning_effort: low}}
  - name: qwen
    provider: openai-chat
    upstream_model: Qwen/Qwen3-8B
    base_url: {chat.url}/v1
    api_key_env: RG_TEST_CHAT_KEY
    retries: 0
    options:
      max_output_tokens: 333
      reasoning_effort: high
  - name: primary
    provider: anthropic
    upstream_model: claude-primary
    base_url: {primary.url}
    api_key_env: RG_TEST_ANTHROPIC_KEY
    fallbacks: [qwen]
    retries: 1
    timeouts: {{connect: 2, read: 20}}
  - name: dead
    provider: openai-chat
    upstream_model: nobody-home
    base_url: http://127.0.0.1:{refused}/v1
    api_key_env: RG_TEST_CHAT_KEY
    fallbacks: [sonnet]
    retries: 0
"""
        )
        env = _env(tmp)
        env["RG_TEST_ANTHROPIC_KEY"] = ANTHROPIC_KEY
        env["RG_TEST_CHAT_KEY"] = CHAT_KEY
        # Every process of the server logs each module it imports ("import time: ...", on stderr):
        # test_a_gateway_loads_no_client_it_does_not_use reads them.
        env["PYTHONPROFILEIMPORTTIME"] = "1"
        served = _spawn(config, tmp, env, "--no-local", "--log-level", "debug")
        state = Setup(served, anthropic, chat, primary, [])
        try:
            yield state
        finally:
            _stop(served)
        log = served.log()
        assert "responses_gateway.server: serving claude" in log  # the log was captured
        for key in (ANTHROPIC_KEY, CHAT_KEY):
            assert key not in log, "an upstream key reached the server log"
            assert key[10:30] not in log
            for body in state.bodies:
                assert key not in body and key[10:30] not in body, "an upstream key reached a client"


@pytest.fixture(autouse=True)
def _fresh(setup: Setup) -> None:
    for mock in (setup.anthropic, setup.chat, setup.primary):
        mock.reset()


def _client(setup: Setup) -> openai.OpenAI:
    return openai.OpenAI(base_url=setup.served.base_url, api_key="client-key", max_retries=0)


def _sdk_stream(setup: Setup, model: str) -> tuple[list[dict[str, Any]], str]:
    """``responses.create(stream=True)``: the events as the SDK parsed them, checked, and the text."""
    stream = _client(setup).responses.create(model=model, input="Hello, how are you?", stream=True)
    events = [event.to_dict() for event in stream]
    check_stream(events)
    setup.bodies.append(orjson.dumps(events).decode())
    final = events[-1]["response"]
    text = "".join(p["text"] for item in final["output"] for p in item.get("content") or [])
    assert text == "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return events, text


def _raw_stream(setup: Setup, model: str) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{setup.served.base_url}/responses",
        json={"model": model, "input": "Hello", "stream": True},
        timeout=30,
    )
    setup.bodies.append(response.text)
    assert response.status_code == 200, response.text
    events = decode_sse(response.content)
    check_stream(events)
    return events


# ------------------------------------------------------------------------------------------ routing
def test_sdk_streams_through_an_anthropic_model(setup: Setup) -> None:
    setup.anthropic.enqueue(fixture_reply(ANTHROPIC_PLAIN, split=True, seed=3))
    events, text = _sdk_stream(setup, "claude")
    assert text == _anthropic_text()
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["model"] == "claude"
    (sent,) = setup.anthropic.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in sent.headers
    body = sent.json
    assert body["model"] == "claude-sonnet-4-5" and body["stream"] is True
    # Per-model options: the default max_output_tokens and reasoning effort of the models file.
    # (Anthropic counts thinking within max_tokens: the provider adds the "low" budget to the answer's.)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 1000 + 2048


def test_sdk_streams_through_an_openai_chat_model(setup: Setup) -> None:
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN, split=True, seed=5))
    events, text = _sdk_stream(setup, "qwen")
    assert text == _chat_text()
    assert events[-1]["type"] == "response.completed"
    (sent,) = setup.chat.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {CHAT_KEY}"
    body = sent.json
    assert body["model"] == "Qwen/Qwen3-8B"
    assert body["max_tokens"] == 333 and body["reasoning_effort"] == "high"


def test_client_values_win_over_model_defaults(setup: Setup) -> None:
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN))
    response = _client(setup).responses.create(
        model="qwen", input="hi", max_output_tokens=50, reasoning={"effort": "low"}
    )
    assert response.output_text == _chat_text()
    body = setup.chat.requests[0].json
    assert body["max_tokens"] == 50 and body["reasoning_effort"] == "low"


def test_an_alias_reaches_its_model(setup: Setup) -> None:
    setup.anthropic.enqueue(fixture_reply(ANTHROPIC_PLAIN))
    events = _raw_stream(setup, "sonnet")
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["model"] == "sonnet"
    assert setup.anthropic.requests[0].json["model"] == "claude-sonnet-4-5"


def test_models_lists_names_and_aliases_with_their_provider(setup: Setup) -> None:
    listed = _client(setup).models.list()
    assert [(m.id, m.owned_by) for m in listed.data] == [
        ("claude", "anthropic"),
        ("sonnet", "anthropic"),
        ("qwen", "openai-chat"),
        ("primary", "anthropic"),
        ("dead", "openai-chat"),
    ]
    assert _client(setup).models.retrieve("sonnet").owned_by == "anthropic"
    missing = httpx.post(f"{setup.served.base_url}/responses", json={"model": "gemma-3-270m", "input": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


# ------------------------------------------------------------------------------------------ fallback
def test_429_with_retry_after_is_waited_then_the_fallback_serves(setup: Setup) -> None:
    limited = error_reply(
        429,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        headers={"retry-after": "1"},
    )
    setup.primary.enqueue(limited)
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN, split=True))
    started = time.monotonic()
    events, text = _sdk_stream(setup, "primary")
    elapsed = time.monotonic() - started
    # retries: 1 -> the primary is asked twice, Retry-After (1 s) apart, then the fallback answers.
    assert len(setup.primary.requests) == 2 and elapsed >= 1.0
    assert setup.primary.requests[0].headers["x-api-key"] == ANTHROPIC_KEY
    assert len(setup.chat.requests) == 1
    assert text == _chat_text()
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1 and types[-1] == "response.completed"
    assert events[-1]["response"]["model"] == "primary"


def test_503_falls_back(setup: Setup) -> None:
    setup.primary.enqueue(
        error_reply(503, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN))
    events = _raw_stream(setup, "primary")
    assert len(setup.primary.requests) == 2 and len(setup.chat.requests) == 1
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == _chat_text()


def test_refused_connection_falls_back(setup: Setup) -> None:
    setup.anthropic.enqueue(fixture_reply(ANTHROPIC_PLAIN))
    events = _raw_stream(setup, "dead")
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == _anthropic_text()
    assert len(setup.anthropic.requests) == 1


def test_a_failure_after_the_first_byte_fails_the_response_without_fallback(setup: Setup) -> None:
    head = [c for c in load_chunks(ANTHROPIC_PLAIN)][:4]  # message_start, block start, ping, "Hello"
    body = b"".join(b"event: %s\ndata: %s\n\n" % (c["type"].encode(), orjson.dumps(c)) for c in head)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body += b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
    setup.primary.enqueue(stream_reply(body))
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN))
    events = _raw_stream(setup, "primary")
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_is_overloaded"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello"
    assert len(setup.primary.requests) == 1
    assert setup.chat.requests == []  # nothing was retried or sent to the fallback


def test_all_back_ends_failing_is_an_http_error_in_openai_shape(setup: Setup) -> None:
    setup.primary.enqueue(error_reply(503, {"error": {"message": "down"}}))
    setup.chat.enqueue(
        json_reply({"error": {"message": f"Incorrect API key provided: {CHAT_KEY}"}}, status=401)
    )
    response = httpx.post(f"{setup.served.base_url}/responses", json={"model": "primary", "input": "hi"})
    setup.bodies.append(response.text)
    assert response.status_code >= 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert CHAT_KEY not in response.text  # the upstream echoed the key; the gateway must not


# ------------------------------------------------------------------------------------------ start-up
def _start_fails(tmp: Path, text: str, env: dict[str, str] | None = None) -> str:
    config = tmp / "models.yaml"
    config.write_text(text)
    proc = subprocess.run(
        [str(EXE), "serve", "--config", str(config), "--no-local", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=env or _env(tmp),
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr


def test_unknown_provider_names_file_line_and_known_providers(tmp_path: Path) -> None:
    err = _start_fails(tmp_path, "models:\n  - name: a\n    provider: bedrock\n    upstream_model: x\n")
    assert f"{tmp_path / 'models.yaml'}:3: models[0].provider:" in err
    for name in ("anthropic", "gemini", "local", "openai", "openai-chat", "scripted"):
        assert name in err
    assert "responses_gateway.providers" in err  # how third parties add one


def test_missing_key_variable_is_a_start_up_error_naming_it(tmp_path: Path) -> None:
    text = (
        "models:\n  - name: a\n    provider: gemini\n    upstream_model: gemini-2.5-pro\n"
        "    api_key_env: RG_TEST_UNSET_GEMINI_KEY\n"
    )
    err = _start_fails(tmp_path, text)
    assert f"{tmp_path / 'models.yaml'}:5: models[0].api_key_env:" in err
    assert "RG_TEST_UNSET_GEMINI_KEY is not set" in err


def test_bad_option_and_bad_yaml_name_the_line(tmp_path: Path) -> None:
    text = (
        "models:\n  - name: a\n    provider: anthropic\n    upstream_model: m\n"
        "    options:\n      max_output_tokens: 10\n      thinking_outptu: none\n"
    )
    err = _start_fails(tmp_path, text)
    assert ":7: models[0].options.thinking_outptu: unknown option for provider 'anthropic'" in err
    assert "thinking_output" in err  # the known options are listed
    err = _start_fails(tmp_path, "models:\n  - name: [\n")
    assert f"{tmp_path / 'models.yaml'}:3: invalid YAML" in err


def test_the_env_variable_names_the_config_and_the_key_never_prints(tmp_path: Path) -> None:
    secret = "sk-ant-DO-NOT-PRINT-THIS-0000"
    config = tmp_path / "env-models.yaml"
    config.write_text(
        "models:\n  - name: a\n    provider: anthropic\n    upstream_model: m\n"
        "    api_key_env: RG_TEST_KEY_A\n    options: {betas: notalist}\n"
    )
    env = _env(tmp_path)
    env["RG_CONFIG"] = str(config)
    env["RG_TEST_KEY_A"] = secret
    proc = subprocess.run(
        [str(EXE), "serve", "--no-local", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{config}:6: models[0].options.betas: must be a list" in proc.stderr
    assert secret not in proc.stderr + proc.stdout


def test_a_script_cannot_shadow_a_configured_model(tmp_path: Path) -> None:
    script = tmp_path / "demo.yaml"
    script.write_text('- message: "hi"\n')
    config = tmp_path / "models.yaml"
    config.write_text(
        "local: false\nmodels:\n  - name: demo\n    provider: scripted\n    script: demo.yaml\n"
    )
    proc = subprocess.run(
        [str(EXE), "serve", "--config", str(config), "--script", str(script), "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 2
    assert "the model name 'demo' is already served" in proc.stderr


def test_a_gateway_loads_no_client_it_does_not_use(setup: Setup) -> None:
    """On the default SQLite store, without Redis or proxies, no process of the server imports the
    PostgreSQL driver, the Redis client or aiohttp (the proxy-aware client), nor numpy while it
    holds no vector store: ~38 MB per process (docs/performance.md, "What a process holds at
    start"). The streams, fallbacks and refused connection of the tests above ran through it; one
    more stream here in case this test runs alone."""
    setup.chat.enqueue(fixture_reply(CHAT_PLAIN, split=True, seed=11))
    _events, text = _sdk_stream(setup, "qwen")
    assert text == _chat_text()
    imported = {
        line.split("|")[-1].strip()
        for line in setup.served.log().splitlines()
        if line.startswith("import time:")
    }
    assert "responses_gateway.server.app" in imported  # the import log was captured
    assert "responses_gateway.providers.transport" in imported
    loaded = {name.split(".")[0] for name in imported} & {"asyncpg", "redis", "aiohttp", "numpy"}
    assert not loaded, f"loaded without being used: {sorted(loaded)}"
