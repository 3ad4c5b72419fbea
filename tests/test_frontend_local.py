"""Both front ends over the embedded model (slow: loads the GGUF once for the module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.server.registry import LOCAL_MODEL, default_registry

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    pytest.importorskip("llama_cpp")
    gateway = start_gateway(default_registry(), preload=True)
    yield gateway
    gateway.stop()


def test_chat_completions_stream_from_the_embedded_model(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
    with client.chat.completions.stream(
        model=LOCAL_MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_completion_tokens=12,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.current_completion_snapshot
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 12


def test_messages_from_the_embedded_model(gw: Gateway) -> None:
    client = anthropic.Anthropic(base_url=gw.origin, api_key="unused", max_retries=0, timeout=120)
    message = client.messages.create(
        model=LOCAL_MODEL, max_tokens=12, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 12


def test_seed_and_stop_on_the_embedded_model(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
    ask: dict[str, Any] = {
        "model": LOCAL_MODEL,
        "messages": [
            {"role": "user", "content": "Write the numbers one to twenty in words, separated by commas."}
        ],
        "max_completion_tokens": 24,
        "temperature": 0.9,
        "seed": 11,
    }
    # A first run leaves the prompt in the model's cache, so the runs compared below both evaluate it
    # the same way (the same seed samples the same tokens only from the same logits).
    client.chat.completions.create(**ask)
    text = client.chat.completions.create(**ask).choices[0].message.content or ""
    assert len(text) >= 8
    # A stop sequence from the middle of that answer: the same seed samples the same run again,
    # cut just before it.
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    with client.chat.completions.stream(**ask, stop=stop, stream_options={"include_usage": True}) as stream:
        cut = stream.get_final_completion()
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # The cut run's usage: the prompt, and the tokens sampled until the gateway stopped the model.
    assert cut.usage is not None and cut.usage.prompt_tokens > 0
    assert 0 < cut.usage.completion_tokens <= 24
