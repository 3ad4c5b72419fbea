"""A back end that plays a declared script through the StreamBuilder: for tests, demos and client checks.

A script is a list of steps, each a dict with one action key::

    - message: ["Hel", "lo"]            # text deltas (a string is one delta); optional `phase`
    - refusal: "I can't help with that"
    - reasoning: {summary: [["Think", "ing"], "part 2"], text: ["raw"], encrypted_content: "…"}
    - function_call: {name: get_weather, arguments: ['{"city":', '"Paris"}'], call_id: call_1}
    - custom_tool_call: {name: apply_patch, input: ["*** Begin Patch", "…"]}
    - usage: {input_tokens: 12, output_tokens: 5, cached_tokens: 0, reasoning_tokens: 0}
    - sleep: 0.5                         # seconds of silence
    - message: ["a", "b", "c"], delay: 0.1   # any output step: seconds of silence before each delta
    - error: {status: 429, message: "slow down", code: rate_limit_exceeded, retry_after: 2}
    - fail: {code: server_error, message: "upstream broke"}   # response.failed mid-stream
    - incomplete: max_output_tokens
    - raise: "boom"                      # an unexpected exception (a bug in a provider)

Multi-turn scripts choose their steps by looking at the input: ``{"turns": [{"when": {...},
"steps": [...]}, …]}``; the first turn whose ``when`` matches is played (``input_has: <item type>``,
``input_lacks: <item type>``, ``text_contains: <substring>``; an empty or missing ``when`` always
matches). A file may hold either form, plus ``model: <name>``.

``error`` raises :class:`ProviderError`: as the first step it becomes an HTTP error, later it ends the
stream with ``response.failed``. The response completes after the last step unless a step finished it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..protocol.builder import StreamBuilder
from ..protocol.request import JSON, RequestError, ResponseRequest
from .base import Capabilities, Provider, ProviderError

__all__ = ["ScriptError", "ScriptedProvider", "load_script"]

ACTIONS = frozenset(
    {
        "message",
        "refusal",
        "reasoning",
        "function_call",
        "custom_tool_call",
        "usage",
        "sleep",
        "error",
        "fail",
        "incomplete",
        "raise",
    }
)
# Steps that stream deltas; they accept ``delay`` (seconds before each delta), for slow streams.
OUTPUT_ACTIONS = frozenset({"message", "refusal", "reasoning", "function_call", "custom_tool_call"})
WHEN_KEYS = frozenset({"input_has", "input_lacks", "text_contains"})

# Honest by default: it can stream, call function and custom tools and emit reasoning; it cannot read
# images, follow a JSON schema or produce logprobs.
DEFAULT_CAPABILITIES = Capabilities(
    streaming=True,
    tools=True,
    parallel_tool_calls=True,
    reasoning=True,
    structured_output=False,
    images=False,
    tool_types=frozenset({"function", "custom"}),
)


class ScriptError(ValueError):
    """A script that cannot be played; the message names the step."""


def _chunks(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        return list(value)
    raise ScriptError(f"{where}: expected a string or a list of strings")


def _check_step(step: Any, where: str) -> JSON:
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: a step is an object with one action key")
    actions = [k for k in step if k in ACTIONS]
    if len(actions) != 1:
        raise ScriptError(f"{where}: expected exactly one of {', '.join(sorted(ACTIONS))}")
    action = actions[0]
    value = step[action]
    delay = step.get("delay")
    if delay is not None:
        if action not in OUTPUT_ACTIONS:
            raise ScriptError(
                f"{where}.delay: only output steps ({', '.join(sorted(OUTPUT_ACTIONS))}) take a delay"
            )
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ScriptError(f"{where}.delay: expected a non-negative number of seconds")
    if action in ("message", "refusal"):
        _chunks(value, f"{where}.{action}")
    elif action == "reasoning":
        if not isinstance(value, dict):
            raise ScriptError(f"{where}.reasoning: expected an object")
        for i, part in enumerate(value.get("summary", [])):
            _chunks(part, f"{where}.reasoning.summary[{i}]")
        if "text" in value:
            _chunks(value["text"], f"{where}.reasoning.text")
    elif action in ("function_call", "custom_tool_call"):
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise ScriptError(f"{where}.{action}: expected an object with a name")
        key = "arguments" if action == "function_call" else "input"
        if action == "function_call" and isinstance(value.get(key), dict):
            return {**step, action: {**value, key: [json.dumps(value[key])]}}
        _chunks(value.get(key, ""), f"{where}.{action}.{key}")
    elif action == "sleep":
        if not isinstance(value, int | float) or value < 0:
            raise ScriptError(f"{where}.sleep: expected a non-negative number of seconds")
    elif action in ("usage", "error", "fail") and not isinstance(value, dict):
        raise ScriptError(f"{where}.{action}: expected an object")
    elif action in ("incomplete", "raise") and not isinstance(value, str):
        raise ScriptError(f"{where}.{action}: expected a string")
    return step


def _check_turns(script: Any) -> list[tuple[JSON, list[JSON]]]:
    if isinstance(script, list):
        return [({}, [_check_step(s, f"steps[{i}]") for i, s in enumerate(script)])]
    if not isinstance(script, dict) or not isinstance(script.get("turns"), list):
        raise ScriptError("a script is a list of steps or an object with 'turns'")
    turns = []
    for t, turn in enumerate(script["turns"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("steps"), list):
            raise ScriptError(f"turns[{t}]: expected an object with 'steps'")
        when = turn.get("when") or {}
        if not isinstance(when, dict) or set(when) - WHEN_KEYS:
            raise ScriptError(f"turns[{t}].when: keys must be among {', '.join(sorted(WHEN_KEYS))}")
        steps = [_check_step(s, f"turns[{t}].steps[{i}]") for i, s in enumerate(turn["steps"])]
        turns.append((when, steps))
    return turns


def _input_text(request: ResponseRequest) -> str:
    texts = [request.instructions or ""]
    for item in request.input:
        for part in item.get("content") or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        output = item.get("output")
        if isinstance(output, str):
            texts.append(output)
    return "\n".join(texts)


def _matches(when: JSON, request: ResponseRequest) -> bool:
    types = {item.get("type") for item in request.input}
    if "input_has" in when and when["input_has"] not in types:
        return False
    if "input_lacks" in when and when["input_lacks"] in types:
        return False
    return "text_contains" not in when or str(when["text_contains"]) in _input_text(request)


def load_script(path: str | Path) -> tuple[str | None, Any]:
    """Read a script file (YAML or JSON): returns (model name if given, script)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScriptError(f"{path}: not YAML or JSON: {exc}") from None
    if isinstance(data, dict) and "model" in data:
        model = data["model"]
        if not isinstance(model, str):
            raise ScriptError(f"{path}: 'model' must be a string")
        if "turns" in data:
            return model, {"turns": data["turns"]}
        return model, data.get("steps")
    return None, data


class ScriptedProvider(Provider):
    """Plays a script; records the requests it served and the streams the client abandoned."""

    def __init__(
        self,
        script: Any,
        *,
        name: str = "scripted",
        capabilities: Capabilities = DEFAULT_CAPABILITIES,
    ) -> None:
        self.name = name
        self.capabilities = capabilities
        self._turns = _check_turns(script)
        self.requests: list[ResponseRequest] = []
        # Streams stopped by the server before the script ended (client disconnects).
        self.cancelled = 0

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None) -> ScriptedProvider:
        model, script = load_script(path)
        return cls(script, name=name or model or Path(path).stem)

    def check_request(self, request: ResponseRequest) -> None:
        if request.top_logprobs:
            raise RequestError(
                "Unsupported parameter: 'top_logprobs' is not supported with this model.",
                param="top_logprobs",
            )
        if "message.output_text.logprobs" in request.include:
            raise RequestError(
                "Unsupported value: 'message.output_text.logprobs' is not supported with this model.",
                param="include",
            )

    def steps_for(self, request: ResponseRequest) -> list[JSON]:
        """The steps this request plays."""
        for when, steps in self._turns:
            if _matches(when, request):
                return steps
        raise ProviderError(
            "No scripted turn matches this input.",
            status=400,
            type="invalid_request_error",
            code=None,
            param="input",
        )

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        self.requests.append(request)
        steps = self.steps_for(request)
        output_tokens = 0
        usage_set = False
        try:
            for step in steps:
                action = next(k for k in step if k in ACTIONS)
                value = step[action]
                if action == "sleep":
                    await asyncio.sleep(value)
                elif action == "error":
                    status = int(value.get("status", 500))
                    code = value.get("code", "server_error")
                    # OpenAI's convention: 5xx are server_error, 429s are typed by their code.
                    default_type = "server_error" if status >= 500 else code if status == 429 else None
                    raise ProviderError(
                        str(value.get("message", "Scripted upstream error.")),
                        status=status,
                        code=code,
                        type=str(value.get("type") or default_type or "invalid_request_error"),
                        param=value.get("param"),
                        retry_after=value.get("retry_after"),
                    )
                elif action == "raise":
                    raise RuntimeError(value)
                elif action == "fail":
                    builder.fail(str(value.get("code", "server_error")), str(value.get("message", "")))
                    yield
                    return
                elif action == "incomplete":
                    builder.incomplete(value)
                    yield
                    return
                elif action == "usage":
                    builder.set_usage(
                        int(value.get("input_tokens", 0)),
                        int(value.get("output_tokens", 0)),
                        cached_tokens=int(value.get("cached_tokens", 0)),
                        reasoning_tokens=int(value.get("reasoning_tokens", 0)),
                    )
                    usage_set = True
                else:
                    async for count in self._play(action, value, step, builder):
                        output_tokens += count
                        yield
            if not usage_set:
                builder.set_usage(len(_input_text(request).split()), output_tokens)
            builder.complete()
            yield
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1
            raise

    async def _play(self, action: str, value: Any, step: JSON, builder: StreamBuilder) -> AsyncIterator[int]:
        """Run one output step, yielding (with the number of deltas sent) whenever events are ready."""
        delay = float(step.get("delay") or 0)

        async def pace() -> None:
            # ``delay``: each delta waits first, so the step arrives as slowly as a real upstream's.
            if delay:
                await asyncio.sleep(delay)

        if action in ("message", "refusal"):
            item = builder.open_message(phase=step.get("phase"))
            for chunk in _chunks(value, action):
                await pace()
                if action == "message":
                    builder.text_delta(item, chunk)
                else:
                    builder.refusal_delta(item, chunk)
                yield 1
            builder.close_message(item)
            yield 0
        elif action == "reasoning":
            item = builder.open_reasoning(encrypted_content=value.get("encrypted_content"))
            for part in value.get("summary", []):
                builder.open_summary_part(item)
                for chunk in _chunks(part, "summary"):
                    await pace()
                    builder.summary_delta(item, chunk)
                    yield 1
                builder.close_summary_part(item)
            for chunk in _chunks(value.get("text", []), "text"):
                await pace()
                builder.reasoning_delta(item, chunk)
                yield 1
            builder.close_reasoning(item)
            yield 0
        elif action == "function_call":
            item = builder.open_function_call(value["name"], call_id=value.get("call_id"))
            for chunk in _chunks(value.get("arguments", ""), "arguments"):
                await pace()
                builder.arguments_delta(item, chunk)
                yield 1
            builder.close_function_call(item)
            yield 0
        else:
            item = builder.open_custom_tool_call(value["name"], call_id=value.get("call_id"))
            for chunk in _chunks(value.get("input", ""), "input"):
                await pace()
                builder.custom_input_delta(item, chunk)
                yield 1
            builder.close_custom_tool_call(item)
            yield 0
