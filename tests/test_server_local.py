"""The default registry serves the embedded model end to end (slow: loads the GGUF)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import Gateway, stream_events
from responses_gateway.server.registry import LOCAL_MAX_OUTPUT_TOKENS, LOCAL_MODEL, default_registry

pytestmark = pytest.mark.model


def test_embedded_model_streams_through_the_default_registry(
    gateway: Callable[..., Gateway], assert_valid_stream: Callable[..., None]
) -> None:
    pytest.importorskip("llama_cpp")
    gw = gateway(default_registry(), preload=True)
    events = stream_events(
        gw.url("/v1/responses"),
        {"model": LOCAL_MODEL, "input": "Say hello.", "stream": True, "max_output_tokens": 16},
    )
    assert_valid_stream(events)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert events[-1]["response"]["model"] == LOCAL_MODEL
    assert gw.registry.get_loaded(LOCAL_MODEL) is not None
    # With no limit of its own, a request the model would go on with ends at the default limit, in
    # seconds, instead of filling the 16k context (minutes on a laptop).
    events = stream_events(
        gw.url("/v1/responses"),
        {
            "model": LOCAL_MODEL,
            "input": "Write a very long story about the sea, in many chapters.",
            "stream": True,
        },
    )
    assert_valid_stream(events)
    final = events[-1]["response"]
    assert final["usage"]["output_tokens"] <= LOCAL_MAX_OUTPUT_TOKENS
    if final["status"] == "incomplete":
        assert final["incomplete_details"] == {"reason": "max_output_tokens"}
