"""Every recorded OpenAI Responses stream decodes, splits anywhere, and accumulates to its own output."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fixtures_loader import list_fixtures, load_chunks, load_sse, reconstructed_sse_path
from responses_gateway.protocol.accumulator import Accumulator, accumulate
from responses_gateway.protocol.sse import EventStreamDecoder

STREAMS = list_fixtures("openai-responses__", (".sse", ".chunks.jsonl"))
SSE_STREAMS = [name for name in STREAMS if name.endswith(".sse")]
CHUNK_STREAMS = [name for name in STREAMS if name.endswith(".chunks.jsonl")]

# Recordings that are themselves imperfect, and exactly what the accumulator must say about them.
IMPERFECT: dict[str, list[str]] = {
    # OpenRouter streams the reasoning item as rs_tmp_2kbe7x16sax but lists it as another id at the end.
    "openai-responses__openrouter-reasoning-text-delta-raw-cot__pydantic-pydantic-ai.sse": [
        "terminal output[0] reasoning rs_tmp_ku4i7pagjwn differs from the streamed item in id",
    ],
    # The recorder shortened the deltas to 'X' but kept the real text in the done events.
    "openai-responses__reasoning-multiple-summary-parts-azure-gpt-5.4__vercel-ai.chunks.jsonl": [
        "output[1] message msg_anonymized_synth_001: text[0] deltas give 'X', "
        "response.output_text.done says 'Anonymized assistant response text.'",
    ],
    "openai-responses__shell-call-container-output-gpt-5.2__vercel-ai.chunks.jsonl": [
        "output[2] message msg_0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e52: text[0] deltas give "
        "'The command ran successfully.', response.output_text.done says \"The command ran successfully in "
        "the container. Here's the output:\\n\\n- The echo...\"",
    ],
    # GitHub Copilot gives every event a fresh id, the response's and the items' alike.
    "openai-responses__reasoning-summary-then-text-gpt-5.3-codex__vercel-ai.chunks.jsonl": [
        "response.in_progress: response id 'capture-id-2' differs from the earlier 'capture-id-1'",
        "output[0] reasoning capture-id-3: output_item.done has id 'capture-id-8'",
        "output[1] message capture-id-9: output_item.done has id 'capture-id-68'",
        "response.completed: response id 'capture-id-69' differs from the earlier 'capture-id-2'",
        "terminal output[0] reasoning capture-id-70 differs from the streamed item in id",
        "terminal output[1] message capture-id-71 differs from the streamed item in id",
    ],
}
# Recordings whose final item ids differ from the streamed ones (reported above); compared without ids.
ID_MISMATCH = {
    "openai-responses__openrouter-reasoning-text-delta-raw-cot__pydantic-pydantic-ai.sse",
    "openai-responses__reasoning-summary-then-text-gpt-5.3-codex__vercel-ai.chunks.jsonl",
}
# The sample file lacks the blank line after its last event (response.completed), so by the SSE rules,
# which the openai SDK follows too, the stream ends after the last output_item.done.
NO_TERMINAL = {"openai-responses__reasoning-then-function-call-args-delta__wavetermdev-waveterm.sse"}


def decode_whole(data: bytes, truncated: bool = False, lenient: bool = False) -> list[dict[str, Any]]:
    decoder = EventStreamDecoder()
    events = decoder.feed(data) + decoder.flush(dispatch_incomplete=lenient)
    assert decoder.truncated == truncated
    return events


def load_events(name: str, lenient: bool = False) -> list[dict[str, Any]]:
    if name.endswith(".sse"):
        return decode_whole(load_sse(name), truncated=name in NO_TERMINAL, lenient=lenient)
    return load_chunks(name)


def responses_in(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split a recording into its responses (one vercel fixture concatenates four agent steps)."""
    groups: list[list[dict[str, Any]]] = []
    for event in events:
        if event.get("type") == "response.created" or not groups:
            groups.append([])
        groups[-1].append(event)
    return groups


def opaque(items: list[Any], drop_ids: bool = False) -> list[Any]:
    """Items with reasoning ciphertexts masked: OpenAI re-encrypts ``encrypted_content`` in each event."""
    out = []
    for item in items:
        item = dict(item)
        if isinstance(item.get("encrypted_content"), str):
            item["encrypted_content"] = "<opaque>"
        if drop_ids:
            item.pop("id", None)
        out.append(item)
    return out


def test_fixtures_found() -> None:
    assert len(STREAMS) >= 26, "recordings missing from tests/fixtures/recordings"
    assert set(IMPERFECT) | ID_MISMATCH | NO_TERMINAL <= set(STREAMS)


@pytest.mark.parametrize("name", STREAMS)
def test_accumulates_to_terminal_output(name: str) -> None:
    events = load_events(name)
    groups = responses_in(events)
    discrepancies: list[str] = []
    for group in groups:
        acc = accumulate(group)
        discrepancies += acc.discrepancies
        assert acc.unknown_events == []
        if name in NO_TERMINAL:
            assert acc.terminal is None
            assert acc.response["status"] == "incomplete"
            done_items = [e["item"] for e in group if e["type"] == "response.output_item.done"]
            assert acc.items == done_items
            assert acc.response["output"] == done_items
            continue
        assert acc.terminal is not None and acc.terminal is group[-1]
        terminal = acc.terminal["response"]
        drop_ids = name in ID_MISMATCH
        assert opaque(acc.items, drop_ids) == opaque(terminal["output"], drop_ids)
        # The Response is the terminal snapshot as sent.
        assert acc.response == terminal
        assert acc.status == terminal["status"]
    assert discrepancies == IMPERFECT.get(name, [])


@pytest.mark.parametrize("name", SSE_STREAMS)
def test_sse_random_splits_decode_identically(name: str) -> None:
    data = load_sse(name)
    expected = decode_whole(data, truncated=name in NO_TERMINAL)
    rng = random.Random(name)
    for _ in range(3):
        decoder = EventStreamDecoder()
        events: list[dict[str, Any]] = []
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 97)
            events += decoder.feed(data[pos : pos + step])
            pos += step
        events += decoder.flush()
        assert events == expected
    # Accumulating while decoding chunk by chunk gives the same Response as the whole body.
    acc = Accumulator()
    decoder = EventStreamDecoder()
    for pos in range(0, len(data), 13):
        for event in decoder.feed(data[pos : pos + 13]):
            acc.feed(event)
    for event in decoder.flush():
        acc.feed(event)
    acc.end()
    whole = accumulate(expected)
    assert acc.response == whole.response
    assert acc.discrepancies == whole.discrepancies


@pytest.mark.parametrize("name", CHUNK_STREAMS)
def test_reconstructed_sse_copy_decodes_to_the_chunks(name: str) -> None:
    path = reconstructed_sse_path(name)
    if not path.exists():
        pytest.skip(f"no SSE-framed copy of {name}")
    assert decode_whole(path.read_bytes()) == load_chunks(name)


@pytest.mark.parametrize("name", sorted(NO_TERMINAL))
def test_unterminated_last_event_is_recovered_when_lenient(name: str) -> None:
    events = load_events(name, lenient=True)
    assert events[-1]["type"] == "response.completed"
    acc = accumulate(events)
    assert acc.discrepancies == []
    assert opaque(acc.items) == opaque(events[-1]["response"]["output"])
    assert acc.response["status"] == "completed"


def test_truncated_stream_reads_as_incomplete() -> None:
    name = "openai-responses__two-parallel-function-calls-stream-gpt-4o__mirascope-mirascope.sse"
    events = load_events(name)
    # Cut the stream right after the first call's arguments finished.
    cut = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.done")
    acc = accumulate(events[: cut + 1])
    response = acc.response
    assert response["status"] == "incomplete"
    first = response["output"][0]
    assert first["type"] == "function_call" and first["status"] == "incomplete"
    assert first["arguments"] == events[cut]["arguments"]
    final = accumulate(events).response["output"][0]
    assert {k: v for k, v in first.items() if k != "status"} == {
        k: v for k, v in final.items() if k != "status"
    }
