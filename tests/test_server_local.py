"""The default registry serves the embedded model end to end (slow: loads the GGUF)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import Gateway, stream_events
from responses_gateway.server.registry import LOCAL_MODEL, default_registry

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
