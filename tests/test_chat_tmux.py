"""``responses-gateway chat`` in a real terminal: tmux runs it, the test types keys and reads the screen.

The gateway serves two scripted models with a store. The screen must show the streamed answer, the
reasoning marked ``[thinking]`` (and dimmed), a tool call on its own ``⚙`` line, a status line per
answer; the second turn must reach the model with the first one's context (previous_response_id),
``/reset`` must drop it, ``/model`` must list and switch, ``/save`` must write the conversation.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import responses_gateway
from conftest import Gateway, start_gateway
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, fixture_reply

KEY = "sk-chat-tmux"

if shutil.which("tmux") is None:
    if os.environ.get("CI"):
        raise RuntimeError("tmux must be installed in CI (scripts/terminal-deps.sh)")
    pytest.skip("tmux is not installed (scripts/terminal-deps.sh)", allow_module_level=True)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("chat")
    thinker = ScriptedProvider(
        {
            "turns": [
                # Only with the first turn's output in its input (previous_response_id) does it remember.
                {"when": {"input_has": "reasoning"}, "steps": [{"message": ["I remember ", "our talk."]}]},
                {
                    "steps": [
                        {"reasoning": {"summary": [["ponder", "ing"]]}},
                        {"message": ["First ", "answer."]},
                        {"usage": {"input_tokens": 6, "output_tokens": 2}},
                    ]
                },
            ]
        },
        name="thinker",
    )
    tooly = ScriptedProvider(
        [
            {
                "function_call": {
                    "name": "get_weather",
                    "arguments": ['{"city": ', '"Paris"}'],
                    "call_id": "call_9",
                }
            }
        ],
        name="tooly",
    )
    gateway = start_gateway([thinker, tooly], api_keys=(KEY,), store_url=f"sqlite:///{tmp / 'store.db'}")
    yield gateway
    gateway.stop()


class Terminal:
    """A tmux session on its own server socket, running one command."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.socket = f"rg-chat-test-{os.getpid()}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        self._tmux("new-session", "-d", "-s", "chat", "-x", "150", "-y", "60", f"env {exports} {command}")

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=10
        )

    def screen(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "chat").stdout

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "chat", "-l", text)
        self._tmux("send-keys", "-t", "chat", "Enter")

    def wait_for(self, text: str, count: int = 1, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if screen.count(text) >= count:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} (x{count}) never appeared; the screen:\n{screen}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "chat").returncode == 0

    def close(self) -> None:
        self._tmux("kill-server")


def test_chat_in_a_terminal(gw: Gateway, tmp_path: Path) -> None:
    src = str(Path(responses_gateway.__file__).resolve().parents[1])
    env = {"PYTHONPATH": src, "RG_API_KEY": KEY, "TERM": "xterm-256color"}
    command = (
        f"{shlex.quote(sys.executable)} -m responses_gateway.cli chat --url {gw.base_url} --model thinker"
    )
    term = Terminal(command, env)
    try:
        term.wait_for("you>")
        term.type("hello there")
        screen = term.wait_for("[completed")
        assert "[thinking] pondering" in screen
        assert "thinker> First answer." in screen
        assert "6 in / 2 out" in screen
        # Reasoning is dimmed, the answer is not.
        styled = term.screen(escapes=True)
        assert "\x1b[2m[thinking] pondering" in styled

        term.type("and do you remember?")
        term.wait_for("thinker> I remember our talk.")

        saved = tmp_path / "talk.json"
        term.type(f"/save {saved}")
        term.wait_for(f"(saved 2 turns to {saved})")
        record = json.loads(saved.read_text())
        first, second = record["turns"]
        assert first["request"]["input"] == "hello there"
        assert second["request"]["previous_response_id"] == first["response"]["id"]
        assert second["response"]["output"][0]["content"][0]["text"] == "I remember our talk."

        term.type("/reset")
        term.wait_for("(new conversation)")
        term.type("who are you?")
        term.wait_for("thinker> First answer.", count=2)  # no context: the first turn's answer again

        term.type("/model")
        screen = term.wait_for("   tooly")
        assert " * thinker" in screen
        term.type("/model tooly")
        term.wait_for("(model: tooly")
        term.type("weather in Paris?")
        screen = term.wait_for('⚙ call get_weather({"city": "Paris"})')
        assert "tooly>" not in screen.split("weather in Paris?")[-1]  # a call, not an answer

        term.type("/nope")
        term.wait_for("unknown command /nope")
        term.type("/quit")
        deadline = time.monotonic() + 10
        while term.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not term.alive(), "chat did not exit on /quit"
    finally:
        term.close()


def test_chat_with_another_server(tmp_path: Path) -> None:
    """Not our gateway: a mock replaying streams recorded from OpenAI (reasoning summary then text,
    with ``store: false``; then two parallel function calls), cut at random byte boundaries."""
    reasoning = "openai-responses__reasoning-summary-then-text-gpt-5.3-codex__vercel-ai.chunks.jsonl"
    calls = "openai-responses__two-parallel-function-calls-stream-gpt-4o__mirascope-mirascope.sse"
    src = str(Path(responses_gateway.__file__).resolve().parents[1])
    with UpstreamMock() as upstream:
        upstream.enqueue(
            fixture_reply(reasoning, split=True, seed=1), fixture_reply(calls, split=True, seed=2)
        )
        command = (
            f"{shlex.quote(sys.executable)} -m responses_gateway.cli chat --url {upstream.url}/v1 "
            "--model gpt-5.3-codex --api-key sk-other"
        )
        term = Terminal(command, {"PYTHONPATH": src, "TERM": "xterm-256color"})
        try:
            term.wait_for("you>")
            term.type("how many r in strawberry?")
            screen = term.wait_for("[completed")
            assert "[thinking] **Counting character occurrences**" in screen
            assert "gpt-5.3-codex> There are **3** letter" in screen
            term.type("now the secrets")
            screen = term.wait_for("[completed", count=2)
            assert '⚙ call secret_retrieval_tool({"password":"mellon"})' in screen
            assert '⚙ call secret_retrieval_tool({"password":"radiance"})' in screen
            term.type("/quit")
        finally:
            term.close()
        first, second = (r.json for r in upstream.requests)
    assert first["stream"] is True and first["input"] == "how many r in strawberry?"
    headers = {k.lower(): v for k, v in upstream.requests[0].headers.items()}
    assert headers["authorization"] == "Bearer sk-other"
    # The first response was not stored (store: false): the second turn carries the conversation.
    assert "previous_response_id" not in second
    assert second["input"][0] == {"role": "user", "content": "how many r in strawberry?"}
    assert second["input"][1]["role"] == "assistant"
    assert second["input"][1]["content"].startswith("There are **3** letter")
    assert second["input"][2] == {"role": "user", "content": "now the secrets"}


def test_chat_piped_without_a_model_or_a_terminal(gw: Gateway) -> None:
    """No --model: the server's first model. Not a terminal: plain text, no ANSI styles."""
    src = str(Path(responses_gateway.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "RG_API_KEY": KEY}
    done = subprocess.run(
        [sys.executable, "-m", "responses_gateway.cli", "chat", "--url", gw.base_url],
        input="hello\n/model\n/quit\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    assert "[thinking] pondering\nthinker> First answer.\n[completed · 6 in / 2 out · resp_" in done.stdout
    assert " * thinker" in done.stdout and "   tooly" in done.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "responses_gateway.cli", "chat", "--url", gw.base_url],
        input="",
        capture_output=True,
        text=True,
        env={**env, "RG_API_KEY": "wrong"},
        timeout=30,
    )
    assert wrong.returncode == 2
    assert "cannot list the models" in wrong.stderr and "401" in wrong.stderr
