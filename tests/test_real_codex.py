"""The real Codex CLI (npm ``@openai/codex``, pinned in tests/clients/codex) against a real gateway process.

``responses-gateway serve`` runs scripted models; ``codex exec --json`` is pointed at it through a
temporary ``CODEX_HOME/config.toml`` (a ``model_providers.gateway`` entry with ``wire_api = "responses"``
and ``env_key``), exactly as the README tells users to. Between the two sits a small recording proxy, so
the tests can also assert what Codex sent (Codex sends ``store: false``: nothing is kept by the gateway).

A model catalog (``model_catalog_json``) gives the scripted models the metadata of a current OpenAI
coding model (freeform ``apply_patch``, reasoning summaries, verbosity), so Codex sends what it sends to
OpenAI; without it Codex uses fallback metadata and offers no ``apply_patch``. The only thing turned off
is ``web_search``: the scripted back end cannot search, and the gateway refuses that hosted tool with a
400 (CR::test_codex_hosted_tools_a_back_end_cannot_run_are_refused_naming_the_param), unless the gateway
is started with ``--drop-unsupported-tool web_search`` (the last web search test).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from node_clients import ensure_client
from serve_process import serving

KEY = "rg-codex-test-key-0123456789"
CODEX_VERSION = "0.169.0"
RUN_TIMEOUT = 60  # seconds for one `codex exec` (each normally takes 1-5 s)

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello from apply_patch\n*** End Patch\n"

SCRIPTS: dict[str, Any] = {
    # a) reasoning summary, then text in several deltas.
    "codex-plain": {
        "steps": [
            {"reasoning": {"summary": [["Thinking ", "about it"]]}},
            {"message": ["Hello ", "from the ", "gateway"]},
            {"usage": {"input_tokens": 40, "output_tokens": 7, "reasoning_tokens": 3}},
        ]
    },
    # b) Codex's shell tool (`exec_command` in this version), then an answer once the output is back.
    "codex-shell": {
        "turns": [
            {
                "when": {"input_has": "function_call_output"},
                "steps": [{"message": ["The file ", "is written."]}],
            },
            {
                "steps": [
                    {"reasoning": {"summary": ["I will write the file."], "encrypted_content": "state-1"}},
                    {
                        "function_call": {
                            "name": "exec_command",
                            "arguments": ['{"cmd": "echo hi from codex ', '> out.txt"}'],
                            "call_id": "call_shell_1",
                        }
                    },
                ]
            },
        ]
    },
    # b) the freeform `apply_patch` custom tool.
    "codex-patch": {
        "turns": [
            {"when": {"input_has": "custom_tool_call_output"}, "steps": [{"message": "Patched hello.txt."}]},
            {
                "steps": [
                    {
                        "custom_tool_call": {
                            "name": "apply_patch",
                            "input": [PATCH[:20], PATCH[20:]],
                            "call_id": "call_patch_1",
                        }
                    }
                ]
            },
        ]
    },
    # b) a member of the `multi_agent_v1` namespace, given to this back end as a plain tool.
    "codex-namespace": {
        "turns": [
            {
                "when": {"input_has": "function_call_output"},
                "steps": [{"message": "That agent does not exist."}],
            },
            {
                "steps": [
                    {
                        "function_call": {
                            "name": "multi_agent_v1__close_agent",
                            "arguments": '{"target": "no-such-agent"}',
                            "call_id": "call_agents_1",
                        }
                    }
                ]
            },
        ]
    },
    # A model silent mid-stream for longer than Codex's idle timeout (set to 1 s below).
    "codex-slow": {
        "steps": [{"reasoning": {"summary": ["Thinking."]}}, {"sleep": 2.5}, {"message": "Still here."}]
    },
    # c) a failure after some text has streamed.
    "codex-fail": {
        "steps": [
            {"message": ["Partial ", "answer"]},
            {"fail": {"code": "server_error", "message": "The upstream broke mid-stream."}},
        ]
    },
    # c) rate limited after the stream began: response.failed with rate_limit_exceeded.
    "codex-429-mid": {
        "steps": [
            {"message": ["Partial"]},
            {
                "error": {
                    "status": 429,
                    "code": "rate_limit_exceeded",
                    "message": "Rate limit reached for scripted tokens.",
                    "retry_after": 1.5,
                }
            },
        ]
    },
    # c) rate limited before the first byte: HTTP 429 with Retry-After.
    "codex-429": {
        "steps": [
            {
                "error": {
                    "status": 429,
                    "code": "rate_limit_exceeded",
                    "message": "Rate limit reached for scripted requests.",
                    "retry_after": 0.2,
                }
            }
        ]
    },
}


def _catalog_entry(slug: str) -> dict[str, Any]:
    """Codex's model metadata for ``slug``, as its bundled catalog describes current coding models."""
    return {
        "slug": slug,
        "display_name": slug,
        "base_instructions": "You are a scripted test model behind responses-gateway.",
        "apply_patch_tool_type": "freeform",
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "supported_reasoning_levels": [{"effort": "medium", "description": "medium"}],
        "default_reasoning_level": "medium",
        "supports_reasoning_summaries": True,
        "default_reasoning_summary": "auto",
        "support_verbosity": True,
        "default_verbosity": "low",
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "experimental_supported_tools": [],
        "context_window": 272000,
    }


# ------------------------------------------------------------------------------------ recording proxy
@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    at: float = field(default_factory=time.monotonic)


class RecordingProxy:
    """Forwards every request to the gateway byte for byte (streaming) and records both sides."""

    def __init__(self, upstream: str, *, timeout: float = 30) -> None:
        """``timeout``: for each read from the gateway (a slow model may say nothing for a while)."""
        self.exchanges: list[Exchange] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(size) if size else b""
                exchange = Exchange(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    json.loads(raw) if raw else None,
                )
                proxy.exchanges.append(exchange)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                data = bytearray()
                with (
                    httpx.Client(timeout=timeout) as client,
                    client.stream(self.command, upstream + self.path, content=raw, headers=headers) as reply,
                ):
                    exchange.status = reply.status_code
                    self.send_response(reply.status_code)
                    for k, v in reply.headers.items():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                            self.send_header(k, v)
                    self.send_header("connection", "close")
                    self.end_headers()
                    for chunk in reply.iter_raw():
                        data += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                for line in bytes(data).split(b"\n"):
                    if line.startswith(b"data: "):
                        exchange.events.append(json.loads(line[6:]))
                self.close_connection = True

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def responses(self, model: str) -> list[Exchange]:
        return [
            e for e in self.exchanges if e.path == "/v1/responses" and (e.body or {}).get("model") == model
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------- fixtures
@dataclass
class Setup:
    codex: Path
    proxy: RecordingProxy
    gateway_port: int
    gateway_log: Path
    catalog: Path


def codex_binary() -> Path:
    """The pinned Codex CLI, installed if needed (its version checked)."""
    codex = ensure_client("codex") / "node_modules" / ".bin" / "codex"
    version = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=30)
    assert version.stdout.split() == ["codex-cli", CODEX_VERSION], version.stdout + version.stderr
    return codex


def write_catalog(path: Path, models: Iterable[str]) -> Path:
    """A ``model_catalog_json`` file giving ``models`` the metadata of a current OpenAI coding model."""
    path.write_text(json.dumps({"models": [_catalog_entry(name) for name in models]}))
    return path


def _setup(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[Setup]:
    codex = codex_binary()
    tmp = tmp_path_factory.mktemp("real-codex")
    scripts = []
    for name, script in SCRIPTS.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps({"model": name, **script}))
        scripts += ["--script", str(path)]
    catalog = write_catalog(tmp / "catalog.json", SCRIPTS)
    gateway = ["--no-local", "--api-key", KEY, "--keepalive-interval", "0.3", *extra, *scripts]
    with serving(tmp, *gateway) as served:
        proxy = RecordingProxy(f"http://127.0.0.1:{served.port}")
        try:
            yield Setup(codex, proxy, served.port, served.log, catalog)
        finally:
            proxy.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _setup(tmp_path_factory)


@pytest.fixture(scope="module")
def dropping_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """A gateway started with ``--drop-unsupported-tool web_search``."""
    yield from _setup(tmp_path_factory, "--drop-unsupported-tool", "web_search")


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str
    workdir: Path
    last_message: str

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [e["item"] for e in self.events if e["type"] == "item.completed" and e["item"]["type"] == kind]

    def explain(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-3000:]}"


def run_codex(
    setup: Setup,
    tmp_path: Path,
    model: str,
    prompt: str,
    *,
    key: str = KEY,
    web_search: str | None = "disabled",
    idle_timeout_ms: int = 20000,
    websockets: bool = False,
    config: tuple[str, ...] = (),
    provider_name: str = "responses-gateway",
    keep: bool = False,
    resume: bool = False,
    timeout: float = RUN_TIMEOUT,
) -> Run:
    """``codex exec --json`` as a user runs it, in an empty working directory, with a fresh CODEX_HOME.

    ``websockets``: the provider says ``supports_websockets = true`` and points at the gateway itself
    (the recording proxy relays HTTP only), so Codex talks WebSocket mode. ``config``: more top-level
    ``config.toml`` lines. ``provider_name``: the provider's display ``name`` (Codex 0.169 treats a
    provider named ``OpenAI`` as OpenAI's: it compacts remotely). ``keep``: the session is recorded
    (not ``--ephemeral``); ``resume``: this run goes on with the last one recorded in the same
    ``tmp_path`` (``codex exec resume --last``)."""
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir(exist_ok=resume)
    work.mkdir(exist_ok=resume)
    lines = [
        f'model = "{model}"',
        'model_provider = "gateway"',
        f'model_catalog_json = "{setup.catalog}"',
        "check_for_update_on_startup = false",
        *([f'web_search = "{web_search}"'] if web_search else []),
        *config,
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[model_providers.gateway]",
        f'name = "{provider_name}"',
        f'base_url = "http://127.0.0.1:{setup.gateway_port if websockets else setup.proxy.port}/v1"',
        'wire_api = "responses"',
        *(["supports_websockets = true"] if websockets else []),
        'env_key = "GATEWAY_KEY"',
        # Bounded retries keep a failing test short (Codex's defaults are 4 and 5).
        "request_max_retries = 1",
        "stream_max_retries = 1",
        f"stream_idle_timeout_ms = {idle_timeout_ms}",
    ]
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "CODEX_", "RG_")) and k not in ("HOME", "GATEWAY_KEY")
    }
    env.update({"CODEX_HOME": str(home), "HOME": str(tmp_path), "GATEWAY_KEY": key, "NO_COLOR": "1"})
    last = tmp_path / "last-message.txt"
    last.unlink(missing_ok=True)
    done = subprocess.run(
        [
            str(setup.codex),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            *(() if keep or resume else ("--ephemeral",)),
            "--color",
            "never",
            "-C",
            str(work),
            "-o",
            str(last),
            *(("resume", "--last") if resume else ()),
            prompt,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=work,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Run(
        done.returncode,
        events,
        done.stdout,
        done.stderr,
        work,
        last.read_text() if last.exists() else "",
    )


@pytest.fixture
def codex(setup: Setup, tmp_path: Path) -> Any:
    def run(model: str, prompt: str, **kwargs: Any) -> Run:
        return run_codex(setup, tmp_path, model, prompt, **kwargs)

    return run


# ------------------------------------------------------------------------------------------- tests
def test_plain_answer_with_reasoning(setup: Setup, codex: Any) -> None:
    run = codex("codex-plain", "Say hello")
    assert run.code == 0, run.explain()
    assert [m["text"] for m in run.items("agent_message")] == ["Hello from the gateway"]
    assert run.last_message.strip() == "Hello from the gateway"
    assert [r["text"] for r in run.items("reasoning")] == ["Thinking about it"]
    assert run.events[-1]["type"] == "turn.completed"
    assert run.events[-1]["usage"]["output_tokens"] == 7
    # No error item: Codex found the model's metadata and nothing it received was out of shape.
    assert run.items("error") == [], run.explain()

    # What Codex sent, through the gateway's --api-key check.
    (exchange,) = setup.proxy.responses("codex-plain")
    assert exchange.status == 200
    assert exchange.headers["authorization"] == f"Bearer {KEY}"
    assert exchange.headers["accept"] == "text/event-stream"
    body = exchange.body
    assert body["stream"] is True and body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert body["text"] == {"verbosity": "low"}
    tools = {(t["type"], t.get("name")) for t in body["tools"]}
    # The shell tool, the freeform apply_patch and the multi-agent namespace (flattened by the gateway).
    assert {("function", "exec_command"), ("custom", "apply_patch"), ("namespace", "multi_agent_v1")} <= tools
    assert exchange.events[-1]["type"] == "response.completed"


def test_a_wrong_key_is_reported_by_codex(setup: Setup, codex: Any) -> None:
    run = codex("codex-plain", "Say hello", key="not-the-key")
    assert run.code != 0
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    assert "401" in failed[-1]["error"]["message"] or "invalid_api_key" in failed[-1]["error"]["message"]
    assert all(e.status == 401 for e in setup.proxy.responses("codex-plain")[1:])


def test_shell_tool_loop(setup: Setup, codex: Any) -> None:
    run = codex("codex-shell", "Write hi to out.txt")
    assert run.code == 0, run.explain()
    # Codex ran the command the scripted model asked for...
    assert (run.workdir / "out.txt").read_text() == "hi from codex\n"
    (command,) = run.items("command_execution")
    assert "echo hi from codex > out.txt" in command["command"]
    assert command["exit_code"] == 0 and command["status"] == "completed"
    # ...and showed the answer the model gave once it had the command's output.
    assert [m["text"] for m in run.items("agent_message")] == ["The file is written."]
    assert run.last_message.strip() == "The file is written."

    first, second = setup.proxy.responses("codex-shell")
    assert first.events[-1]["response"]["output"][-1]["call_id"] == "call_shell_1"
    kinds = [item["type"] for item in second.body["input"]]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    call, output = second.body["input"][-2:]
    assert (call["name"], call["call_id"]) == ("exec_command", "call_shell_1")
    assert json.loads(call["arguments"]) == {"cmd": "echo hi from codex > out.txt"}
    assert output["call_id"] == "call_shell_1"
    assert "exit code 0" in str(output["output"]).lower() or "exited with code 0" in str(output["output"])
    # The reasoning item comes back with the state the gateway sealed (and accepted again: 200).
    sealed = first.events[-1]["response"]["output"][0]["encrypted_content"]
    assert sealed.startswith("rgs1.") and "state-1" not in sealed
    assert second.body["input"][-3]["encrypted_content"] == sealed
    assert second.status == 200


def test_apply_patch_custom_tool(setup: Setup, codex: Any) -> None:
    run = codex("codex-patch", "Create hello.txt")
    assert run.code == 0, run.explain()
    assert (run.workdir / "hello.txt").read_text() == "hello from apply_patch\n"
    assert [m["text"] for m in run.items("agent_message")] == ["Patched hello.txt."]
    changes = run.items("file_change")
    assert changes and changes[0]["status"] == "completed", run.explain()
    first, second = setup.proxy.responses("codex-patch")
    streamed = first.events[-1]["response"]["output"][-1]
    assert (streamed["type"], streamed["input"]) == ("custom_tool_call", PATCH)
    call, output = second.body["input"][-2:]
    assert (call["type"], call["name"], call["input"]) == ("custom_tool_call", "apply_patch", PATCH)
    assert (output["type"], output["call_id"]) == ("custom_tool_call_output", "call_patch_1")


def test_namespaced_tool_call_reaches_codex(setup: Setup, codex: Any) -> None:
    run = codex("codex-namespace", "Close agent no-such-agent")
    assert run.code == 0, run.explain()
    assert [m["text"] for m in run.items("agent_message")] == ["That agent does not exist."]
    first, second = setup.proxy.responses("codex-namespace")
    streamed = first.events[-1]["response"]["output"][-1]
    assert (streamed["namespace"], streamed["name"]) == ("multi_agent_v1", "close_agent")
    call, output = second.body["input"][-2:]
    assert (call.get("namespace"), call["name"]) == ("multi_agent_v1", "close_agent")
    assert output["call_id"] == "call_agents_1"
    # Codex ran its own close_agent, which refused the made-up id; a call without the namespace gets
    # "unsupported call: close_agent" instead (what Codex answered before the gateway mapped it back).
    assert "unsupported call" not in output["output"]
    assert "invalid agent id no-such-agent" in output["output"], output


def test_mid_stream_failure_is_reported(setup: Setup, codex: Any) -> None:
    run = codex("codex-fail", "Answer me")
    assert run.code != 0
    # The text that streamed before the failure is shown, then the retry, then the failure itself.
    assert run.items("agent_message")[0]["text"] == "Partial answer"
    errors = [e["message"] for e in run.events if e["type"] == "error"]
    assert errors[0].startswith("Reconnecting... 1/1"), run.explain()
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    assert (
        failed[-1]["error"]["message"]
        == "stream disconnected before completion: The upstream broke mid-stream."
    )
    # server_error is retryable: the stream was tried again (stream_max_retries = 1), then given up.
    exchanges = setup.proxy.responses("codex-fail")
    assert len(exchanges) == 2
    assert all(e.events[-1]["type"] == "response.failed" for e in exchanges)
    assert exchanges[0].events[-1]["response"]["error"]["code"] == "server_error"


def test_rate_limit_is_retried_then_reported(setup: Setup, codex: Any) -> None:
    run = codex("codex-429", "Answer me")
    assert run.code != 0
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    # Codex names the status, not the message, of an HTTP error it gave up retrying.
    assert failed[-1]["error"]["message"] == "exceeded retry limit, last status: 429 Too Many Requests"
    exchanges = setup.proxy.responses("codex-429")
    assert len(exchanges) == 2  # request_max_retries = 1
    assert all(e.status == 429 for e in exchanges)
    # The gateway's Retry-After (0.2 s rounded up to 1) is what Codex waited before retrying.
    assert exchanges[1].at - exchanges[0].at >= 0.95


def test_mid_stream_rate_limit_waits_the_delay_the_gateway_names(setup: Setup, codex: Any) -> None:
    run = codex("codex-429-mid", "Answer me")
    assert run.code != 0
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    message = failed[-1]["error"]["message"]
    assert message == "rate limit exceeded: Rate limit reached for scripted tokens. Please try again in 1.5s."
    first, second = setup.proxy.responses("codex-429-mid")
    assert first.events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"
    # Codex parsed the delay out of the message and waited it (without it: its ~0.2 s backoff).
    assert second.at - first.at >= 1.5


def test_codex_default_web_search_is_refused_clearly(setup: Setup, codex: Any) -> None:
    """Codex offers web search unless told not to; a back end that cannot search refuses the tool and
    the user is told which one, rather than it being dropped (so README's Codex set-up says
    ``web_search = "disabled"`` for such back ends)."""
    run = codex("codex-plain", "Say hello", web_search=None)
    assert run.code != 0
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    (exchange,) = setup.proxy.responses("codex-plain")[-1:]
    assert exchange.status == 400
    # Live search here (the sandbox is off); in Codex's default sandbox it is cached (access false).
    index = exchange.body["tools"].index({"type": "web_search", "external_web_access": True})
    # Named by its place in Codex's own request (the namespace before it is flattened for the back end).
    assert any(t["type"] == "namespace" for t in exchange.body["tools"][:index])
    message = failed[-1]["error"]["message"]
    assert f"'tools[{index}].type' (web_search) is not supported with this model" in message


def test_codex_default_web_search_is_left_out_by_a_gateway_told_to(
    dropping_setup: Setup, tmp_path: Path
) -> None:
    """``serve --drop-unsupported-tool web_search``: Codex with its default config (web search offered)
    gets its answer from a back end that cannot search."""
    run = run_codex(dropping_setup, tmp_path, "codex-plain", "Say hello", web_search=None)
    assert run.code == 0, run.explain()
    assert [m["text"] for m in run.items("agent_message")] == ["Hello from the gateway"]
    (exchange,) = dropping_setup.proxy.responses("codex-plain")
    assert exchange.status == 200
    assert any(t["type"] == "web_search" for t in exchange.body["tools"])


def test_keepalive_resets_codex_idle_timer(setup: Setup, codex: Any) -> None:
    # Codex gives up on a stream silent for stream_idle_timeout_ms; the gateway's default keepalive (a
    # repeated response.in_progress every 0.3 s here) is data Codex counts as activity.
    run = codex("codex-slow", "Take your time", idle_timeout_ms=1000)
    assert run.code == 0, run.explain()
    assert [m["text"] for m in run.items("agent_message")] == ["Still here."]
    (exchange,) = setup.proxy.responses("codex-slow")
    kinds = [e["type"] for e in exchange.events]
    assert kinds.count("response.in_progress") >= 5
