"""The real Codex CLI compacting a session through the embedded model (slow: loads the GGUF).

Codex 0.169 compacts remotely ("remote compaction v2") only with a provider it takes for OpenAI's,
which is a provider *named* ``OpenAI`` whatever its ``base_url``; any other provider gets Codex's own
summarising turn (tests/test_real_codex_websocket.py). Before a turn whose context is past
``model_auto_compact_token_limit`` Codex sends the history ending in a ``compaction_trigger`` item,
keeps the one ``compaction`` item the answer holds, and from then on sends that item in place of the
history. Here the gateway serves the embedded Gemma 3 270M: it runs the summarising turn, seals the
summary into the item, and expands the item into context when Codex sends it back.

The prompt is sized for a 270M model on 2 shared cores. Codex's model metadata (a catalog entry, as
for any model Codex does not know) gives short base instructions and no reasoning, verbosity,
``apply_patch`` or skills usage; the config turns off subagents, goals, ``view_image``,
``request_user_input``, the environment context and the permissions / apps / collaboration-mode
instructions. What is left (base instructions, ``exec_command`` and ``write_stdin``, the user's
prompt) is ~760 tokens for the embedded model. With Codex's full default prompt (~23 KB of JSON,
~4,900 tokens) one turn alone took 237 s here on a loaded machine; the environment context (paths,
date) also made the model echo it at length, for minutes once.

The flow is a user's: ``codex exec`` (a recorded session) answers one turn whose ~760 tokens are past
the limit (500); ``codex exec resume --last`` compacts before its turn, then runs the turn on the
compacted history. The model's answers are whatever a 270M model makes of Codex's prompt: the test
asserts the protocol, never the wording.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.responses import Response

from conftest import check_stream
from serve_process import serving, shared_model_path
from test_real_codex import KEY, Exchange, RecordingProxy, Run, Setup, codex_binary, run_codex

pytestmark = pytest.mark.model

MODEL = "codex-local"
LIMIT = 500  # model_auto_compact_token_limit: below one turn of the trimmed prompt
RUN_TIMEOUT = 240  # seconds for one `codex exec` (each took 5-20 s on a loaded 2-core machine)

# Codex's metadata for the embedded model: what it is (no reasoning, no verbosity, no freeform
# apply_patch, its real context window) and short base instructions instead of Codex's long ones.
CATALOG_ENTRY: dict[str, Any] = {
    "slug": MODEL,
    "display_name": MODEL,
    "base_instructions": "You are Codex, a coding agent. Answer in one short line.",
    "apply_patch_tool_type": None,
    "shell_type": "shell_command",
    "visibility": "list",
    "supported_in_api": True,
    "priority": 1,
    "supported_reasoning_levels": [],
    "default_reasoning_level": None,
    "supports_reasoning_summaries": False,
    "default_reasoning_summary": "auto",
    "support_verbosity": False,
    "default_verbosity": None,
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "experimental_supported_tools": [],
    "context_window": 16384,
    "include_skills_usage_instructions": False,
    "include_apps_usage_instructions": False,
    "include_plugin_usage_instructions": False,
}
CONFIG = (
    f"model_auto_compact_token_limit = {LIMIT}",
    "include_permissions_instructions = false",
    "include_environment_context = false",
    "include_apps_instructions = false",
    "include_collaboration_mode_instructions = false",
    "[features]",
    "goals = false",
    "view_image = false",
    "[agents]",
    "enabled = false",
    "[skills]",
    "include_instructions = false",
    "[tools.experimental_request_user_input]",
    "enabled = false",
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    pytest.importorskip("llama_cpp")
    codex = codex_binary()
    tmp = tmp_path_factory.mktemp("real-codex-compaction-model")
    catalog = tmp / "catalog.json"
    catalog.write_text(json.dumps({"models": [CATALOG_ENTRY]}))
    # One thread: with other work on the 2 cores, llama.cpp's two threads wait on each other (prompt
    # evaluation measured 124 tokens/s with one thread, 47 with two, on this loaded machine).
    models = tmp / "models.yaml"
    models.write_text(
        "models:\n"
        f"  - name: {MODEL}\n"
        "    provider: local\n"
        f"    model_path: {shared_model_path()}\n"
        "    options:\n"
        "      n_threads: 1\n"
        "      seed: 7\n"
    )
    args = ("--config", str(models), "--no-local", "--api-key", KEY, "--log-level", "info")
    with serving(tmp, *args, "--preload") as served:
        # The summarising turn streams nothing until the summary is written: no read timeout below
        # Codex's own.
        proxy = RecordingProxy(f"http://127.0.0.1:{served.port}", timeout=RUN_TIMEOUT)
        try:
            yield Setup(codex, proxy, served.port, served.log, catalog)
        finally:
            proxy.close()


def _answered(exchange: Exchange) -> dict[str, Any]:
    """The final Response of a recorded stream, after checking the stream and the Response's shape."""
    assert exchange.status == 200, exchange.events
    check_stream(exchange.events, strict=False)
    final = exchange.events[-1]
    assert final["type"] == "response.completed", final
    Response.model_validate(final["response"])
    return dict(final["response"])


def _explain(setup: Setup, run: Run) -> str:
    return run.explain() + "\ngateway:\n" + setup.gateway_log.read_text(errors="replace")[-3000:]


def _post(setup: Setup, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{setup.gateway_port}{path}",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=120,
    )


def test_codex_compacts_through_the_embedded_model_and_goes_on(setup: Setup, tmp_path: Path) -> None:
    def codex(prompt: str, *, resume: bool) -> Run:
        return run_codex(
            setup,
            tmp_path,
            MODEL,
            prompt,
            config=CONFIG,
            provider_name="OpenAI",
            keep=True,
            resume=resume,
            idle_timeout_ms=120_000,
            timeout=RUN_TIMEOUT,
        )

    # 1. One turn, answered by the embedded model; it used more than the limit.
    first = codex("Say hello", resume=False)
    assert first.code == 0, _explain(setup, first)
    assert first.items("agent_message") and first.items("error") == [], _explain(setup, first)
    (turn1,) = setup.proxy.responses(MODEL)
    assert not any(item["type"] == "compaction_trigger" for item in turn1.body["input"])
    assert _answered(turn1)["usage"]["input_tokens"] > LIMIT

    # 2. The session resumed: Codex compacts before the turn, then the turn runs on the compacted history.
    second = codex("Say it again", resume=True)
    assert second.code == 0, _explain(setup, second)
    assert second.items("error") == [], _explain(setup, second)
    assert second.items("agent_message"), _explain(setup, second)
    trigger, turn2 = setup.proxy.responses(MODEL)[1:]

    # The compaction request: the whole history, then the trigger; answered by one sealed item.
    assert trigger.body["input"][-1] == {"type": "compaction_trigger"}
    history = json.dumps(trigger.body["input"])
    assert "Say hello" in history and "Say it again" not in history
    compacted = _answered(trigger)
    (item,) = compacted["output"]
    assert item["type"] == "compaction"
    sealed = item["encrypted_content"]
    assert sealed.startswith("rgs1.") and "hello" not in sealed

    # The next request carries that item in place of the first turn's answer, then the new prompt.
    sent = turn2.body["input"]
    (position,) = [i for i, entry in enumerate(sent) if entry.get("type") == "compaction"]
    assert sent[position]["encrypted_content"] == sealed
    assert not any(entry.get("role") == "assistant" for entry in sent)
    assert sent[-1]["role"] == "user" and "Say it again" in json.dumps(sent[-1])
    answered = _answered(turn2)
    assert any(out["type"] == "message" for out in answered["output"])

    # The gateway expanded the item into what the model read: the turn's input tokens are exactly the
    # count with the item, more than without it (the summary is context again).
    counted = _post(setup, "/v1/responses/input_tokens", turn2.body)
    assert counted.status_code == 200, counted.text
    without = copy.deepcopy(turn2.body)
    del without["input"][position]
    counted_without = _post(setup, "/v1/responses/input_tokens", without)
    assert counted_without.status_code == 200, counted_without.text
    assert answered["usage"]["input_tokens"] == counted.json()["input_tokens"]
    assert counted.json()["input_tokens"] > counted_without.json()["input_tokens"] + 10

    # The same request with the item altered is refused, naming it, before the model runs.
    tampered = copy.deepcopy(turn2.body)
    middle = len(sealed) // 2
    flipped = "A" if sealed[middle] != "A" else "B"
    tampered["input"][position]["encrypted_content"] = sealed[:middle] + flipped + sealed[middle + 1 :]
    refused = _post(setup, "/v1/responses", tampered)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_encrypted_content"
    assert error["param"] == f"input[{position}].encrypted_content"
