"""The real Codex CLI in WebSocket mode (``supports_websockets = true`` on its provider), and Codex
compacting a long session, against a real ``responses-gateway serve`` process.

Codex then opens one WebSocket to ``/v1/responses`` per session: a ``generate: false`` warm-up, then
each model turn as ``response.create`` with ``previous_response_id`` and only the new items, always
with ``store: false``, so every continuation is served from the connection's own memory. The scripted
model answers the last turn only when the first turn's prompt is still in its context, so a lost
continuation shows up as a different answer. The gateway's log says the turns went over WebSocket.

Compaction: with ``model_auto_compact_token_limit`` below what the model reports using, Codex 0.169
compacts a custom provider's session itself (its summarising turn with ``compact_prompt``, through
``POST /v1/responses`` like any turn: it sends no ``/responses/compact``, ``context_management`` or
``compaction_trigger`` to a provider that is not OpenAI's), then goes on from the summary alone; over
HTTP and over a WebSocket the session finishes from the notes. A provider *named* ``OpenAI`` (any
``base_url``) is taken for OpenAI's: Codex then compacts remotely, sending its history ending in a
``compaction_trigger`` item and then the sealed ``compaction`` item the gateway answered, which the
gateway expands (the notes reach the model only that way).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import serving
from test_real_codex import KEY, RecordingProxy, Setup, codex_binary, run_codex, write_catalog

PROMPT = "Write hi to out.txt over the websocket"
COMPACT_PROMPT = "SUMMARIZE-THE-SESSION-NOW"
COMPACTING = {
    "model": "codex-compacting",
    "turns": [
        {
            "when": {"text_contains": COMPACT_PROMPT},
            "steps": [{"message": ["NOTES: ran echo into out.txt."]}],
        },
        # Only the summary can lead here: the history before it is gone from Codex's next request.
        {"when": {"text_contains": "NOTES: ran echo"}, "steps": [{"message": ["Done ", "from the notes."]}]},
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": "Done without compacting."}]},
        {
            "steps": [
                {"function_call": {"name": "exec_command", "arguments": ['{"cmd": "echo hi > out.txt"}']}},
                # More than the limit below: Codex compacts before its next request.
                {"usage": {"input_tokens": 9000, "output_tokens": 5}},
            ]
        },
    ],
}
# The same session with a provider named "OpenAI": Codex asks the gateway to compact
# (``compaction_trigger``); the gateway's summarising turn runs on this model.
REMOTE_COMPACTING = {
    "model": "codex-remote-compacting",
    "turns": [
        {
            "when": {"text_contains": "Summarize the conversation so far"},
            "steps": [{"message": ["NOTES: ran echo into out.txt."]}],
        },
        # Only the summary, expanded from the compaction item Codex sent back, can lead here.
        {"when": {"text_contains": "NOTES: ran echo"}, "steps": [{"message": ["Done ", "from the notes."]}]},
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": "Done without compacting."}]},
        {
            "steps": [
                {"function_call": {"name": "exec_command", "arguments": ['{"cmd": "echo hi > out.txt"}']}},
                {"usage": {"input_tokens": 9000, "output_tokens": 5}},
            ]
        },
    ],
}
COMPACT_CONFIG = ("model_auto_compact_token_limit = 2000", f'compact_prompt = "{COMPACT_PROMPT}"')

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
    scripts: list[str] = ["--script", str(script)]
    for name, content in (("codex-compacting", COMPACTING), ("codex-remote-compacting", REMOTE_COMPACTING)):
        (tmp / f"{name}.json").write_text(json.dumps(content))
        scripts += ["--script", str(tmp / f"{name}.json")]
    catalog = write_catalog(tmp / "catalog.json", ["codex-ws", "codex-compacting", "codex-remote-compacting"])
    args = ("--no-local", "--api-key", KEY, "--keepalive-interval", "0.3", "--log-level", "info")
    with serving(tmp, *args, *scripts) as served:
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


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
def test_codex_compacts_a_long_session_and_goes_on(setup: Setup, tmp_path: Path, websockets: bool) -> None:
    run = run_codex(
        setup,
        tmp_path,
        "codex-compacting",
        "Write hi to out.txt",
        websockets=websockets,
        config=COMPACT_CONFIG,
    )
    assert run.code == 0, run.explain()
    assert (run.workdir / "out.txt").read_text() == "hi\n"
    assert [m["text"] for m in run.items("agent_message")] == ["Done from the notes."], run.explain()
    assert run.items("error") == [], run.explain()
    if not websockets:
        bodies = [e.body for e in setup.proxy.responses("codex-compacting")]
        summary_turn, last = bodies[-2], bodies[-1]
        assert COMPACT_PROMPT in json.dumps(summary_turn["input"])
        # After compacting, Codex sends the summary, not the tool call and its output.
        kinds = {item.get("type") for item in last["input"]}
        assert "function_call" not in kinds and "NOTES: ran echo" in json.dumps(last["input"])


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
def test_codex_named_openai_compacts_through_the_gateway(
    setup: Setup, tmp_path: Path, websockets: bool
) -> None:
    """With a provider named ``OpenAI`` Codex compacts remotely in the middle of the turn: the history
    ending in ``compaction_trigger``, answered by one sealed ``compaction`` item, which Codex then
    sends in place of the history; the gateway expands it, so the turn goes on from the summary."""
    run = run_codex(
        setup,
        tmp_path,
        "codex-remote-compacting",
        "Write hi to out.txt",
        websockets=websockets,
        config=("model_auto_compact_token_limit = 2000",),
        provider_name="OpenAI",
    )
    assert run.code == 0, run.explain()
    assert (run.workdir / "out.txt").read_text() == "hi\n"
    assert [m["text"] for m in run.items("agent_message")] == ["Done from the notes."], run.explain()
    assert run.items("error") == [], run.explain()
    if websockets:
        return
    first, trigger, after = setup.proxy.responses("codex-remote-compacting")
    assert not any(item["type"] == "compaction_trigger" for item in first.body["input"])
    assert trigger.body["input"][-1] == {"type": "compaction_trigger"}
    assert "function_call_output" in {item["type"] for item in trigger.body["input"]}
    (item,) = trigger.events[-1]["response"]["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("rgs1.")
    sent = [entry for entry in after.body["input"] if entry.get("type") == "compaction"]
    assert sent == [{"type": "compaction", "id": item["id"], "encrypted_content": item["encrypted_content"]}]
    # The summary is sealed: Codex never sees it, only the model does once the gateway expands it.
    assert "NOTES" not in json.dumps(after.body)
