"""ScriptedProvider ``delay``: an output step's deltas arrive spaced out, as from a slow upstream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.scripted import ScriptedProvider, ScriptError

DELTA_TYPES = (
    "response.output_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
)


def _timed(provider: ScriptedProvider) -> list[tuple[float, dict[str, Any]]]:
    request = parse_request({"model": provider.name, "input": "hi"})
    builder = StreamBuilder(new_response(request.model, **request.echo()))
    builder.start()

    async def run() -> list[tuple[float, dict[str, Any]]]:
        out: list[tuple[float, dict[str, Any]]] = []
        t0 = time.monotonic()
        async for _ in provider.stream(request, builder):
            out += [(time.monotonic() - t0, e) for e in builder.take()]
        return out

    return asyncio.run(run())


def test_delay_spaces_every_delta(assert_valid_stream: Callable[..., None]) -> None:
    script = [
        {"reasoning": {"summary": [["a", "b"]]}, "delay": 0.05},
        {"message": ["x", "y", "z"], "delay": 0.05},
        {"function_call": {"name": "f", "arguments": ['{"a":', "1}"]}, "delay": 0.05},
        {"message": ["fast", "er"]},
    ]
    timed = _timed(ScriptedProvider(script, name="m"))
    assert_valid_stream([e for _, e in timed])
    delays = [t for t, e in timed if e["type"] in DELTA_TYPES]
    assert len(delays) == 2 + 3 + 2 + 2
    slow, fast = delays[:7], delays[7:]
    # Each slow delta comes at least ~one delay after the previous one (and the first after one delay).
    gaps = [b - a for a, b in zip([0.0, *slow], slow, strict=False)]
    assert all(gap >= 0.04 for gap in gaps), gaps
    # Without a delay the deltas come back to back.
    assert fast[1] - slow[-1] < 0.04


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"message": "a", "delay": -1}, "non-negative"),
        ({"message": "a", "delay": "1"}, "non-negative"),
        ({"message": "a", "delay": True}, "non-negative"),
        ({"usage": {}, "delay": 0.1}, "only output steps"),
        ({"sleep": 1, "delay": 0.1}, "only output steps"),
    ],
)
def test_bad_delay_is_refused_naming_the_step(step: dict[str, Any], message: str) -> None:
    with pytest.raises(ScriptError, match=rf"steps\[0\]\.delay: .*{message}"):
        ScriptedProvider([step])
