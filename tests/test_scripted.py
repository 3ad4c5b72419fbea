"""ScriptedProvider: script validation, turn selection, and the streams it plays (no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import RequestError, parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.scripted import ScriptedProvider, ScriptError, load_script


def _play(provider: ScriptedProvider, body: dict[str, Any]) -> list[dict[str, Any]]:
    request = parse_request({"model": provider.name, **body})
    builder = StreamBuilder(new_response(request.model, **request.echo()))
    builder.start()

    async def run() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async for _ in provider.stream(request, builder):
            events += builder.take()
        return events + builder.take()

    return asyncio.run(run())


def test_every_step_kind_plays_a_valid_stream(assert_valid_stream: Callable[..., None]) -> None:
    script = [
        {"reasoning": {"summary": [["a", "b"], "c"], "text": ["raw"], "encrypted_content": "enc"}},
        {"message": ["Hel", "lo"], "phase": "commentary"},
        {"refusal": "no"},
        {"function_call": {"name": "f", "arguments": {"x": 1}, "call_id": "call_1"}},
        {"custom_tool_call": {"name": "apply_patch", "input": ["*** Begin", " Patch"]}},
        {"usage": {"input_tokens": 4, "output_tokens": 9, "reasoning_tokens": 2}},
    ]
    events = _play(ScriptedProvider(script, name="m"), {"input": "hi"})
    assert_valid_stream(events, strict=False)
    final = events[-1]["response"]
    assert final["status"] == "completed"
    reasoning, message, refusal, call, custom = final["output"]
    assert [s["text"] for s in reasoning["summary"]] == ["ab", "c"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "raw"}]
    assert reasoning["encrypted_content"] == "enc"
    assert message["phase"] == "commentary"
    assert message["content"][0]["text"] == "Hello"
    assert refusal["content"] == [{"type": "refusal", "refusal": "no"}]
    assert (call["arguments"], call["call_id"]) == ('{"x": 1}', "call_1")
    assert custom["input"] == "*** Begin Patch"
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    assert final["usage"]["total_tokens"] == 13


def test_default_usage_counts_input_words_and_deltas() -> None:
    events = _play(ScriptedProvider([{"message": ["a", "b", "c"]}], name="m"), {"input": "one two three"})
    usage = events[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (3, 3)


def test_fail_and_incomplete_steps_end_the_response() -> None:
    failed = _play(
        ScriptedProvider([{"fail": {"code": "server_error", "message": "x"}}], name="m"), {"input": "hi"}
    )
    assert [e["type"] for e in failed[-2:]] == ["error", "response.failed"]
    cut = _play(ScriptedProvider([{"message": "a"}, {"incomplete": "content_filter"}, {"message": "b"}]), {})
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert len(cut[-1]["response"]["output"]) == 1


def test_error_step_raises_provider_error_with_status() -> None:
    provider = ScriptedProvider([{"error": {"status": 429, "code": "rate_limit_exceeded", "retry_after": 3}}])
    with pytest.raises(ProviderError) as info:
        _play(provider, {"input": "hi"})
    assert (info.value.status, info.value.code, info.value.retry_after) == (429, "rate_limit_exceeded", 3)


def test_turns_are_chosen_by_the_input() -> None:
    provider = ScriptedProvider(
        {
            "turns": [
                {"when": {"input_has": "function_call_output"}, "steps": [{"message": "after tool"}]},
                {"when": {"text_contains": "weather"}, "steps": [{"function_call": {"name": "w"}}]},
                {"steps": [{"message": "default"}]},
            ]
        }
    )
    assert _play(provider, {"input": "the weather?"})[-1]["response"]["output"][0]["type"] == "function_call"
    assert _play(provider, {"input": "hello"})[-1]["response"]["output"][0]["content"][0]["text"] == "default"
    with_output = [
        {"type": "function_call", "call_id": "c", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "sunny"},
    ]
    final = _play(provider, {"input": with_output})[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "after tool"
    assert len(provider.requests) == 3


def test_no_matching_turn_is_a_400() -> None:
    provider = ScriptedProvider({"turns": [{"when": {"input_lacks": "message"}, "steps": []}]})
    with pytest.raises(ProviderError) as info:
        _play(provider, {"input": "hi"})
    assert (info.value.status, info.value.param) == (400, "input")


@pytest.mark.parametrize(
    ("script", "where"),
    [
        ({"steps": []}, "a script is a list of steps"),
        ([{"mesage": "typo"}], "steps[0]"),
        ([{"message": "a", "refusal": "b"}], "steps[0]"),
        ([{"message": 3}], "steps[0].message"),
        ([{"sleep": -1}], "steps[0].sleep"),
        ([{"function_call": {"arguments": "{}"}}], "steps[0].function_call"),
        ({"turns": [{"when": {"colour": "red"}, "steps": []}]}, "turns[0].when"),
        ({"turns": [{"steps": [{"incomplete": 5}]}]}, "turns[0].steps[0].incomplete"),
    ],
)
def test_bad_scripts_name_the_step(script: Any, where: str) -> None:
    with pytest.raises(ScriptError) as info:
        ScriptedProvider(script)
    assert str(info.value).startswith(where)


def test_capability_hooks_reject_logprobs() -> None:
    provider = ScriptedProvider([])
    with pytest.raises(RequestError) as info:
        provider.check_request(parse_request({"model": "m", "input": "x", "top_logprobs": 2}))
    assert info.value.param == "top_logprobs"


def test_script_files_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "demo.yaml"
    yaml_file.write_text("model: demo-model\nsteps:\n  - message: [Hi, ' there']\n", encoding="utf-8")
    provider = ScriptedProvider.from_file(yaml_file)
    assert provider.name == "demo-model"
    assert _play(provider, {"input": "x"})[-1]["response"]["output"][0]["content"][0]["text"] == "Hi there"
    json_file = tmp_path / "plain.json"
    json_file.write_text('[{"message": "ok"}]', encoding="utf-8")
    assert load_script(json_file) == (None, [{"message": "ok"}])
    assert ScriptedProvider.from_file(json_file).name == "plain"
