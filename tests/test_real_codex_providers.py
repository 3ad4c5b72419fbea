"""The real Codex CLI through the gateway to upstream providers (Anthropic, Chat Completions, Gemini).

``responses-gateway serve --config models.yaml --no-local`` runs as a process; its models point at an
:class:`upstream_mock.UpstreamMock` on loopback, which replays the vendor streams each test enqueues and
records what the gateway sent. ``codex exec`` (tests/test_real_codex.py's :func:`run_codex`, its model
catalog and :class:`RecordingProxy`) asks for a shell command; the first upstream reply calls Codex's
``exec_command`` tool with the provider's own reasoning (an Anthropic ``thinking`` block with its
signature, DeepSeek's ``reasoning_content``, a Gemini ``thoughtSignature``), the second answers.

Codex sends ``store: false`` and ``include: ["reasoning.encrypted_content"]``: the provider's reasoning
state goes to Codex sealed in ``encrypted_content`` and must come back to the upstream intact in the
second request, next to the call and its output, in the vendor's own shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_process import serving
from test_real_codex import KEY, RecordingProxy, Run, Setup, codex_binary, run_codex, write_catalog
from upstream_mock import UpstreamMock, encode_chunks, stream_reply

UPSTREAM_KEYS = {
    "UPSTREAM_TEST_ANTHROPIC_KEY": "sk-ant-upstream-test",
    "UPSTREAM_TEST_DEEPSEEK_KEY": "sk-deepseek-upstream-test",
    "UPSTREAM_TEST_GEMINI_KEY": "AIza-upstream-test",
}
MODELS = {
    "codex-claude": ("anthropic", "claude-sonnet-4-5", "", "UPSTREAM_TEST_ANTHROPIC_KEY"),
    "codex-deepseek": ("openai-chat", "deepseek-reasoner", "/v1", "UPSTREAM_TEST_DEEPSEEK_KEY"),
    "codex-gemini": ("gemini", "gemini-2.5-pro", "/v1beta", "UPSTREAM_TEST_GEMINI_KEY"),
}
# Anthropic signatures are base64: '+', '/' and '=' must survive every hop unchanged.
SIGNATURE = "EqQBCkgIBxABGAIqQPm+sig/for+codex==Zk9yIHRoZSB0ZXN0"
GEMINI_SIGNATURE = "CiQB0e2Kb+thought/signature+for+codex=="


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamMock) -> Iterator[Setup]:
    codex = codex_binary()
    tmp = tmp_path_factory.mktemp("real-codex-providers")
    lines = ["models:"]
    for name, (provider, upstream_model, path, key_env) in MODELS.items():
        lines += [
            f"  - name: {name}",
            f"    provider: {provider}",
            f"    upstream_model: {upstream_model}",
            f"    base_url: {upstream.url}{path}",
            f"    api_key_env: {key_env}",
            "    retries: 0",
        ]
    config = tmp / "models.yaml"
    config.write_text("\n".join(lines) + "\n")
    catalog = write_catalog(tmp / "catalog.json", MODELS)
    with pytest.MonkeyPatch.context() as env:
        for var, value in UPSTREAM_KEYS.items():
            env.setenv(var, value)
        with serving(tmp, "--config", str(config), "--no-local", "--api-key", KEY) as served:
            proxy = RecordingProxy(f"http://127.0.0.1:{served.port}")
            try:
                yield Setup(codex, proxy, served.port, served.log, catalog)
            finally:
                proxy.close()


def _sent(upstream: UpstreamMock) -> list[dict[str, Any]]:
    return [r.json for r in upstream.requests]


def _codex_output(setup: Setup, model: str, call_id: str) -> str:
    """The ``function_call_output`` Codex sent back for ``call_id`` (in its last request)."""
    (output,) = [
        item
        for item in setup.proxy.responses(model)[-1].body["input"]
        if item["type"] == "function_call_output" and item["call_id"] == call_id
    ]
    assert isinstance(output["output"], str)
    return output["output"]


def _ran(run: Run, text: str) -> None:
    """Codex ran the command (``tee`` wrote the file) and showed the answer."""
    assert run.code == 0, run.explain()
    assert (run.workdir / "out.txt").read_text() == text + "\n", run.explain()
    (command,) = run.items("command_execution")
    assert command["exit_code"] == 0 and command["status"] == "completed"
    assert text in command["aggregated_output"]
    assert [m["text"] for m in run.items("agent_message")] == ["The file is written."]
    assert run.last_message.strip() == "The file is written."
    assert run.items("error") == [], run.explain()


# ---------------------------------------------------------------------------------------- Anthropic
def _anthropic_tool_turn(calls: dict[str, str]) -> bytes:
    """A thinking block with its signature, then one ``exec_command`` tool_use per ``{id: command}``."""
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 120, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": text}}
            for text in ("I should ", "write the file with tee.")
        ),
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": SIGNATURE},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    for index, (call_id, command) in enumerate(calls.items(), 1):
        block = {"type": "tool_use", "id": call_id, "name": "exec_command", "input": {}}
        arguments = json.dumps({"cmd": command})
        events += [
            {"type": "content_block_start", "index": index, "content_block": block},
            *(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
                for piece in (arguments[:9], arguments[9:20], arguments[20:])
            ),
            {"type": "content_block_stop", "index": index},
        ]
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 42},
        },
        {"type": "message_stop"},
    ]
    return encode_chunks(events, "anthropic")


def _anthropic_text_turn(text: str) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_02",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 200, "output_tokens": 1},
    }
    return encode_chunks(
        [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}},
            {"type": "message_stop"},
        ],
        "anthropic",
    )


def test_anthropic_thinking_and_tool_loop(setup: Setup, upstream: UpstreamMock, tmp_path: Path) -> None:
    command = "echo hi-from-claude | tee out.txt"
    upstream.reset(
        [
            stream_reply(_anthropic_tool_turn({"toolu_01Codex": command}), split=True, seed=3),
            stream_reply(_anthropic_text_turn("The file is written.")),
        ]
    )
    run = run_codex(setup, tmp_path, "codex-claude", "Write hi-from-claude to out.txt")
    _ran(run, "hi-from-claude")
    assert [r["text"] for r in run.items("reasoning")] == ["I should write the file with tee."]

    assert [r.path for r in upstream.requests] == ["/v1/messages", "/v1/messages"]
    assert upstream.requests[0].headers["x-api-key"] == UPSTREAM_KEYS["UPSTREAM_TEST_ANTHROPIC_KEY"]
    first, second = _sent(upstream)
    assert first["thinking"]["type"] == "enabled"
    assert any(t["name"] == "exec_command" for t in first["tools"])
    # Turn 2: the assistant turn with the thinking block exactly as Anthropic sent it, then the call...
    assistant, results = second["messages"][-2:]
    assert assistant["role"] == "assistant"
    thinking, tool_use = assistant["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "I should write the file with tee.",
        "signature": SIGNATURE,
    }
    assert tool_use["type"] == "tool_use"
    assert (tool_use["id"], tool_use["name"], tool_use["input"]) == (
        "toolu_01Codex",
        "exec_command",
        {"cmd": command},
    )
    # ...and the user turn answering it with the command's output.
    assert results["role"] == "user"
    result = results["content"][0]
    assert (result["type"], result["tool_use_id"]) == ("tool_result", "toolu_01Codex")
    assert result["content"] == _codex_output(setup, "codex-claude", "toolu_01Codex")
    assert "Process exited with code 0" in result["content"] and "hi-from-claude" in result["content"]
    assert second["thinking"]["type"] == "enabled"

    # What Codex got and gave back: the signature only inside the gateway's sealed encrypted_content.
    first_codex, second_codex = setup.proxy.responses("codex-claude")
    reasoning = first_codex.events[-1]["response"]["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith("rgs1.")
    assert SIGNATURE not in json.dumps(first_codex.events)
    returned = [item for item in second_codex.body["input"] if item["type"] == "reasoning"]
    assert [item["encrypted_content"] for item in returned] == [reasoning["encrypted_content"]]


def test_anthropic_parallel_tool_uses_share_the_thinking_turn(
    setup: Setup, upstream: UpstreamMock, tmp_path: Path
) -> None:
    """Two tool_use blocks after one thinking block: Codex runs both and sends back the reasoning, both
    calls, then both outputs; Anthropic must get them back as one assistant turn (starting with the
    signed thinking block) and one user turn of tool_results, or it refuses the request."""
    calls = {"toolu_01A": "echo a | tee a.txt", "toolu_01B": "echo b | tee b.txt"}
    upstream.reset(
        [
            stream_reply(_anthropic_tool_turn(calls)),
            stream_reply(_anthropic_text_turn("Both files are written.")),
        ]
    )
    run = run_codex(setup, tmp_path, "codex-claude", "Write a.txt and b.txt")
    assert run.code == 0, run.explain()
    assert (run.workdir / "a.txt").read_text() == "a\n" and (run.workdir / "b.txt").read_text() == "b\n"
    assert [m["text"] for m in run.items("agent_message")] == ["Both files are written."]

    codex_second = setup.proxy.responses("codex-claude")[-1]
    kinds = [(item["type"], item.get("call_id")) for item in codex_second.body["input"]][-5:]
    assert kinds == [
        ("reasoning", None),
        ("function_call", "toolu_01A"),
        ("function_call", "toolu_01B"),
        ("function_call_output", "toolu_01A"),
        ("function_call_output", "toolu_01B"),
    ]
    assistant, results = upstream.requests[-1].json["messages"][-2:]
    assert assistant["role"] == "assistant"
    assert [block["type"] for block in assistant["content"]] == ["thinking", "tool_use", "tool_use"]
    assert assistant["content"][0]["signature"] == SIGNATURE
    assert [(b["id"], b["input"]) for b in assistant["content"][1:]] == [
        (call_id, {"cmd": command}) for call_id, command in calls.items()
    ]
    assert results["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [
        ("tool_result", call_id) for call_id in calls
    ]
    assert [b["content"] for b in results["content"]] == [
        _codex_output(setup, "codex-claude", call_id) for call_id in calls
    ]


# ------------------------------------------------------------------- Chat Completions (DeepSeek, vLLM)
def _chat_chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "chatcmpl-codex",
        "object": "chat.completion.chunk",
        "created": 1763900000,
        "model": "deepseek-reasoner",
        "choices": choices,
        **extra,
    }


def test_chat_completions_reasoning_content_and_tool_calls(
    setup: Setup, upstream: UpstreamMock, tmp_path: Path
) -> None:
    command = "echo hi-from-deepseek | tee out.txt"
    arguments = json.dumps({"cmd": command})
    first_reply: list[dict[str, Any]] = [
        _chat_chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
        _chat_chunk({"reasoning_content": "The user wants "}),
        _chat_chunk({"reasoning_content": "a file; tee shows the output."}),
        _chat_chunk(
            {
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_0_deepseek",
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": ""},
                    }
                ],
            }
        ),
        *(
            _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in (arguments[:5], arguments[5:17], arguments[17:30], arguments[30:])
        ),
        _chat_chunk({}, "tool_calls"),
        _chat_chunk(
            None,
            usage={
                "prompt_tokens": 150,
                "completion_tokens": 40,
                "total_tokens": 190,
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        ),
    ]
    second_reply: list[dict[str, Any]] = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk({"content": "The file "}),
        _chat_chunk({"content": "is written."}),
        _chat_chunk({}, "stop"),
        _chat_chunk(None, usage={"prompt_tokens": 220, "completion_tokens": 5, "total_tokens": 225}),
    ]
    upstream.reset(
        [
            stream_reply(encode_chunks(first_reply, "openai-chat"), split=True, seed=5),
            stream_reply(encode_chunks(second_reply, "openai-chat")),
        ]
    )
    run = run_codex(setup, tmp_path, "codex-deepseek", "Write hi-from-deepseek to out.txt")
    _ran(run, "hi-from-deepseek")
    assert [r["text"] for r in run.items("reasoning")] == ["The user wants a file; tee shows the output."]
    # The usage chunk after finish_reason reached Codex (first turn 190 + second 225).
    assert run.events[-1]["usage"]["input_tokens"] == 370
    assert run.events[-1]["usage"]["output_tokens"] == 45

    assert [r.path for r in upstream.requests] == ["/v1/chat/completions"] * 2
    assert (
        upstream.requests[0].headers["authorization"]
        == f"Bearer {UPSTREAM_KEYS['UPSTREAM_TEST_DEEPSEEK_KEY']}"
    )
    first, second = _sent(upstream)
    assert first["stream"] is True and first["reasoning_effort"] == "medium"
    assistant, tool = second["messages"][-2:]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {
            "id": "call_0_deepseek",
            "type": "function",
            "function": {"name": "exec_command", "arguments": arguments},
        }
    ]
    # DeepSeek refuses a tool loop whose reasoning_content was not passed back (pitfall 15).
    assert assistant["reasoning_content"] == "The user wants a file; tee shows the output."
    assert tool == {
        "role": "tool",
        "tool_call_id": "call_0_deepseek",
        "content": _codex_output(setup, "codex-deepseek", "call_0_deepseek"),
    }
    assert "Process exited with code 0" in tool["content"] and "hi-from-deepseek" in tool["content"]
    assert second["messages"][-3]["role"] == "user"


# ------------------------------------------------------------------------------------------- Gemini
def test_gemini_thought_signature_and_function_call(
    setup: Setup, upstream: UpstreamMock, tmp_path: Path
) -> None:
    command = "echo hi-from-gemini | tee out.txt"
    first_reply: list[dict[str, Any]] = [
        {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": "Writing it with tee.", "thought": True}]}}
            ],
            "modelVersion": "gemini-2.5-pro",
        },
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {
                                "functionCall": {"name": "exec_command", "args": {"cmd": command}},
                                "thoughtSignature": GEMINI_SIGNATURE,
                            }
                        ],
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 150, "candidatesTokenCount": 20, "thoughtsTokenCount": 10},
            "modelVersion": "gemini-2.5-pro",
        },
    ]
    second_reply: list[dict[str, Any]] = [
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": "The file is written."}]},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 230, "candidatesTokenCount": 5},
        }
    ]
    upstream.reset(
        [
            stream_reply(encode_chunks(first_reply, "gemini"), split=True, seed=9),
            stream_reply(encode_chunks(second_reply, "gemini")),
        ]
    )
    run = run_codex(setup, tmp_path, "codex-gemini", "Write hi-from-gemini to out.txt")
    _ran(run, "hi-from-gemini")
    assert [r["text"] for r in run.items("reasoning")] == ["Writing it with tee."]

    assert [r.path for r in upstream.requests] == ["/v1beta/models/gemini-2.5-pro:streamGenerateContent"] * 2
    assert upstream.requests[0].query == {"alt": "sse"}
    assert upstream.requests[0].headers["x-goog-api-key"] == UPSTREAM_KEYS["UPSTREAM_TEST_GEMINI_KEY"]
    first, second = _sent(upstream)
    assert first["generationConfig"]["thinkingConfig"]["includeThoughts"] is True
    model_turn, results = second["contents"][-2:]
    assert model_turn["role"] == "model"
    # The call goes back with the signature Gemini put on it, byte for byte (Gemini 3 refuses without).
    (call_part,) = [p for p in model_turn["parts"] if "functionCall" in p]
    assert call_part["thoughtSignature"] == GEMINI_SIGNATURE
    assert call_part["functionCall"]["name"] == "exec_command"
    assert call_part["functionCall"]["args"] == {"cmd": command}
    # Gemini 2.5 sent no call id: the one the gateway made up for Codex pairs the call and its result.
    (streamed_call,) = [
        item
        for item in setup.proxy.responses("codex-gemini")[0].events[-1]["response"]["output"]
        if item["type"] == "function_call"
    ]
    call_id = streamed_call["call_id"]
    assert call_part["functionCall"]["id"] == call_id
    assert results["role"] == "user"
    (response_part,) = results["parts"]
    response = response_part["functionResponse"]
    assert (response["id"], response["name"]) == (call_id, "exec_command")
    assert response["response"] == {"output": _codex_output(setup, "codex-gemini", call_id)}
    assert "hi-from-gemini" in response["response"]["output"]


# ------------------------------------------------------------------------------ a long session compacted
def _chat_text_turn(text: str, prompt_tokens: int) -> bytes:
    chunks = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk({"content": text}),
        _chat_chunk({}, "stop"),
        _chat_chunk(None, usage={"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": 0}),
    ]
    return encode_chunks(chunks, "openai-chat")


def _chat_call_turn(call_id: str, arguments: str, *, prompt_tokens: int) -> bytes:
    """A Chat Completions turn calling Codex's ``exec_command`` once, reporting ``prompt_tokens``."""
    chunks = [
        _chat_chunk({"role": "assistant", "content": None}),
        _chat_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": arguments},
                    }
                ]
            }
        ),
        _chat_chunk({}, "tool_calls"),
        _chat_chunk(
            None,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 10,
                "total_tokens": prompt_tokens + 10,
            },
        ),
    ]
    return encode_chunks(chunks, "openai-chat")


def test_codex_compacts_a_long_session_through_a_chat_completions_upstream(
    setup: Setup, upstream: UpstreamMock, tmp_path: Path
) -> None:
    """Past ``model_auto_compact_token_limit`` Codex summarises the session itself (through the gateway
    like any turn) and goes on from the summary: the upstream's next request carries the notes, not the
    tool call and its output."""
    arguments = json.dumps({"cmd": "echo compacted | tee out.txt"})
    upstream.reset(
        [
            # More than the limit Codex is given below: it compacts before its next request.
            stream_reply(_chat_call_turn("call_0_compact", arguments, prompt_tokens=9000)),
            stream_reply(_chat_text_turn("NOTES: wrote out.txt with tee.", 300)),
            stream_reply(_chat_text_turn("The file is written.", 200)),
        ]
    )
    run = run_codex(
        setup,
        tmp_path,
        "codex-deepseek",
        "Write compacted to out.txt",
        config=("model_auto_compact_token_limit = 2000", 'compact_prompt = "SUMMARIZE-THE-SESSION-NOW"'),
    )
    _ran(run, "compacted")
    first, summary, after = _sent(upstream)
    assert "SUMMARIZE-THE-SESSION-NOW" not in json.dumps(first["messages"])
    assert "SUMMARIZE-THE-SESSION-NOW" in json.dumps(summary["messages"])
    assert "call_0_compact" in json.dumps(summary["messages"])  # the summary turn saw the whole session
    sent = json.dumps(after["messages"])
    assert "NOTES: wrote out.txt with tee." in sent and "call_0_compact" not in sent


def test_codex_named_openai_compacts_remotely_through_a_chat_completions_upstream(
    setup: Setup, upstream: UpstreamMock, tmp_path: Path
) -> None:
    """With a provider named ``OpenAI`` Codex compacts remotely (its history ending in a
    ``compaction_trigger``): the gateway's summarising turn goes to the Chat Completions upstream, Codex
    gets one sealed ``compaction`` item and sends it back, and the upstream's next request carries the
    summary the gateway expanded from it."""
    arguments = json.dumps({"cmd": "echo remote | tee out.txt"})
    upstream.reset(
        [
            stream_reply(_chat_call_turn("call_0_remote", arguments, prompt_tokens=9000)),
            stream_reply(_chat_text_turn("NOTES: wrote out.txt with tee remotely.", 300)),
            stream_reply(_chat_text_turn("The file is written.", 200)),
        ]
    )
    run = run_codex(
        setup,
        tmp_path,
        "codex-deepseek",
        "Write remote to out.txt",
        config=("model_auto_compact_token_limit = 2000",),
        provider_name="OpenAI",
    )
    _ran(run, "remote")
    first, summary, after = _sent(upstream)
    assert "call_0_remote" in json.dumps(summary["messages"])  # the summary turn saw the whole session
    assert "compacting a conversation" in json.dumps(summary["messages"])  # the gateway's own instructions
    # Only the gateway's summary turn wrote the notes, and only the sealed item Codex sent back can
    # have carried them to this request (the call it was waiting on stays: the turn goes on from it).
    sent = json.dumps(after["messages"])
    assert "NOTES: wrote out.txt with tee remotely." in sent
    assert "compacting a conversation" not in json.dumps(first["messages"])
