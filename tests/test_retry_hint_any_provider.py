"""A rate limit with a known delay tells the client the delay in its message, whatever provider raised it.

Codex reads the delay of a failed stream only from "Please try again in Ns/Nms" in the message. The HTTP
providers already write it (test_retry_hint); a scripted or third-party provider that raises
``ProviderError(code="rate_limit_exceeded", retry_after=...)`` did not get it, so Codex retried at once
(found by tests/test_real_codex.py). The server now adds it where a ProviderError reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, stream_events
from responses_gateway.providers.scripted import ScriptedProvider

Factory = Callable[..., Gateway]


def _limited(message: str, retry_after: float | None, code: str = "rate_limit_exceeded") -> dict[str, Any]:
    error: dict[str, Any] = {"status": 429, "code": code, "message": message}
    if retry_after is not None:
        error["retry_after"] = retry_after
    return {"error": error}


def test_mid_stream_rate_limit_names_its_delay(gateway: Factory) -> None:
    script = [{"message": ["Part"]}, _limited("Slow down", 1.5)]
    gw = gateway([ScriptedProvider(script, name="m")])
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    check_stream(events)
    error, failed = events[-2:]
    expected = {"code": "rate_limit_exceeded", "message": "Slow down. Please try again in 1.5s."}
    assert failed["response"]["error"] == expected
    assert (error["code"], error["message"]) == (expected["code"], expected["message"])


def test_pre_stream_rate_limit_names_its_delay_and_sets_retry_after(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([_limited("Slow down.", 0.25)], name="m")])
    answer = httpx.post(
        gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}, timeout=30
    )
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["message"] == "Slow down. Please try again in 250ms."
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("step", "message"),
    [
        # Already there: left alone.
        (
            _limited("Rate limit reached. Please try again in 7s.", 2),
            "Rate limit reached. Please try again in 7s.",
        ),
        # No known delay: nothing to say.
        (_limited("Slow down.", None), "Slow down."),
        # Not a rate limit: Codex does not read a delay there.
        (_limited("Busy.", 3, code="server_is_overloaded"), "Busy."),
    ],
)
def test_the_message_is_left_alone_otherwise(gateway: Factory, step: dict[str, Any], message: str) -> None:
    gw = gateway([ScriptedProvider([{"message": ["Part"]}, step], name="m")])
    events = stream_events(gw.url("/v1/responses"), {"model": "m", "input": "hi", "stream": True})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == message
