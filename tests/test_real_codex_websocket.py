"""The real Codex CLI in WebSocket mode (``supports_websockets = true`` on its provider) against a real
``responses-gateway serve`` process.

Codex then opens one WebSocket to ``/v1/responses`` per session: a ``generate: false`` warm-up, then
each model turn as ``response.create`` with ``previous_response_id`` and only the new items, always
with ``store: false``, so every continuation is served from the connection's own memory. The scripted
model answers the last turn only when the first turn's prompt is still in its context, so a lost
continuation shows up as a different answer. The gateway's log says the turns went over WebSocket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import serving
from test_real_codex import KEY, RecordingProxy, Setup, codex_binary, run_codex, write_catalog

PROMPT = "Write hi to out.txt over the websocket"
SCRIPT = {
    "model": "codex-ws",
    "turns": [
        {
            # The command's output, with the user's prompt still in context (from the connection).
            "when": {"input_has": "function_call_output", "text_contains": PROMPT},
            "steps": [{"message": ["The file ", "is written."]}],
        },
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": "I lost the context."}]},
        {
            "steps": [
                {"reasoning": {"summary": ["I will write the file."], "encrypted_content": "ws-state-1"}},
                {
                    "function_call": {
                        "name": "exec_command",
                        "arguments": ['{"cmd": "echo hi from codex ', '> out.txt"}'],
                        "call_id": "call_ws_1",
                    }
                },
            ]
        },
    ],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    codex = codex_binary()
    tmp = tmp_path_factory.mktemp("real-codex-ws")
    script = tmp / "codex-ws.json"
    script.write_text(json.dumps(SCRIPT))
    catalog = write_catalog(tmp / "catalog.json", ["codex-ws"])
    args = ("--no-local", "--api-key", KEY, "--keepalive-interval", "0.3", "--log-level", "info")
    with serving(tmp, *args, "--script", str(script)) as served:
        proxy = RecordingProxy(f"http://127.0.0.1:{served.port}")
        try:
            yield Setup(codex, proxy, served.port, served.log, catalog)
        finally:
            proxy.close()


def test_codex_runs_a_tool_loop_over_one_websocket(setup: Setup, tmp_path: Path) -> None:
    run = run_codex(setup, tmp_path, "codex-ws", PROMPT, websockets=True)
    assert run.code == 0, run.explain()
    assert (run.workdir / "out.txt").read_text() == "hi from codex\n"
    assert [m["text"] for m in run.items("agent_message")] == ["The file is written."], run.explain()
    assert run.items("error") == [], run.explain()
    # Nothing went through HTTP (the proxy saw no request); the gateway served one connection with
    # Codex's warm-up and its two model turns.
    assert setup.proxy.exchanges == []
    log = setup.gateway_log.read_text(errors="replace")
    assert "WebSocket connection opened on /v1/responses" in log
    assert "WebSocket connection closed after 3 message(s)" in log, log[-3000:]


def test_a_wrong_key_is_refused_at_the_handshake(setup: Setup, tmp_path: Path) -> None:
    run = run_codex(setup, tmp_path, "codex-ws", "Say hello", key="not-the-key", websockets=True)
    assert run.code != 0
    failed = [e for e in run.events if e["type"] == "turn.failed"]
    assert failed, run.explain()
    assert "401" in failed[-1]["error"]["message"] or "invalid_api_key" in failed[-1]["error"]["message"]
    # Refused before the upgrade, in OpenAI's shape, with no handshake error in uvicorn's log.
    assert "ASGI callable returned without completing handshake" not in setup.gateway_log.read_text()
