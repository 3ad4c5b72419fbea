"""The stream checker: a valid stream is clean, every mutation is caught with its rule id."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from fixtures_loader import list_fixtures, load_fixture
from responses_gateway.protocol import EventStreamDecoder, StreamBuilder, new_response
from responses_gateway.protocol.checker import (
    PROFILES,
    RULES,
    SPEC_EVENTS,
    SPEC_RESPONSE_FIELDS,
    StreamChecker,
    Violation,
    check,
    check_response,
)

Events = list[dict[str, Any]]


def builder_stream(raw_reasoning: str = "reasoning_text") -> Events:
    """Reasoning (summary + raw), an annotated message, two interleaved function calls, usage."""
    b = StreamBuilder(new_response("m"), raw_reasoning=raw_reasoning)  # type: ignore[arg-type]
    b.start()
    r = b.open_reasoning()
    b.summary_delta(r, "Think")
    b.summary_delta(r, "ing.")
    b.reasoning_delta(r, "raw ")
    b.reasoning_delta(r, "thought")
    b.close_reasoning(r)
    m = b.open_message()
    b.text_delta(m, "Hel")
    b.text_delta(m, "lo")
    b.annotation(
        m, {"type": "url_citation", "url": "https://x", "start_index": 0, "end_index": 5, "title": "X"}
    )
    b.close_message(m)
    f = b.open_function_call("f")
    g = b.open_function_call("g")
    b.arguments_delta(f, '{"a"')
    b.arguments_delta(g, "{}")
    b.arguments_delta(f, ": 1}")
    b.set_usage(10, 20, cached_tokens=2, reasoning_tokens=5)
    b.complete()
    # Through the wire format, as a client sees it: no dicts shared between events.
    events: Events = orjson.loads(orjson.dumps(b.take()))
    return events


def events_of(name: str) -> Events:
    data = load_fixture(name)
    if isinstance(data, bytes):
        decoder = EventStreamDecoder()
        return decoder.feed(data) + decoder.flush()
    assert isinstance(data, list)
    return data


def rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def find(events: Events, etype: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == etype][nth]


def renumber(events: Events) -> Events:
    for i, e in enumerate(events):
        e["sequence_number"] = i
    return events


def drop(etype: str, nth: int = 0) -> Callable[[Events], Events]:
    def mutate(events: Events) -> Events:
        del events[find(events, etype, nth)]
        return renumber(events)

    return mutate


def edit(etype: str, change: Callable[[dict[str, Any]], None], nth: int = 0) -> Callable[[Events], Events]:
    def mutate(events: Events) -> Events:
        change(events[find(events, etype, nth)])
        return events

    return mutate


def append(make: Callable[[Events], dict[str, Any]]) -> Callable[[Events], Events]:
    def mutate(events: Events) -> Events:
        event = make(events)
        event["sequence_number"] = len(events)
        events.append(event)
        return events

    return mutate


def insert_before(etype: str, event: dict[str, Any]) -> Callable[[Events], Events]:
    def mutate(events: Events) -> Events:
        events.insert(find(events, etype), dict(event))
        return renumber(events)

    return mutate


def set_path(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(event: dict[str, Any]) -> None:
        target: Any = event
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def del_path(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(event: dict[str, Any]) -> None:
        target: Any = event
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def skip_sequence(events: Events) -> Events:
    for e in events[5:]:
        e["sequence_number"] += 1
    return events


def duplicate_sequence(events: Events) -> Events:
    events[5]["sequence_number"] = events[4]["sequence_number"]
    return events


def move_delta_after_done(events: Events) -> Events:
    delta = events.pop(find(events, "response.output_text.delta"))
    events.insert(find(events, "response.output_item.done", 1) + 1, delta)
    return renumber(events)


def duplicate_item_id(events: Events) -> Events:
    second = events[find(events, "response.output_item.added", 3)]
    second["item"]["id"] = events[find(events, "response.output_item.added", 2)]["item"]["id"]
    return events


def text_into_refusal(events: Events) -> Events:
    events[find(events, "response.content_part.added", 1)]["part"] = {"type": "refusal", "refusal": ""}
    return events


ERROR = {"type": "error", "code": "server_error", "message": "boom", "param": None}

# (mutation id, mutation, rule it must trigger)
MUTATIONS: list[tuple[str, Callable[[Events], Events], str]] = [
    ("drop-item-added", drop("response.output_item.added", 1), "item.not_open"),
    ("duplicate-seq", duplicate_sequence, "sequence.contiguous"),
    ("skip-seq", skip_sequence, "sequence.contiguous"),
    (
        "string-seq",
        edit("response.output_text.delta", set_path("sequence_number", value="7")),
        "sequence.integer",
    ),
    ("missing-seq", edit("response.created", del_path("sequence_number")), "sequence.integer"),
    (
        "wrong-item-id",
        edit("response.output_text.delta", set_path("item_id", value="msg_x")),
        "item.not_open",
    ),
    (
        "text-done-mismatch",
        edit("response.output_text.done", set_path("text", value="Help")),
        "delta.done_mismatch",
    ),
    (
        "args-done-mismatch",
        edit("response.function_call_arguments.done", set_path("arguments", value="{}")),
        "delta.done_mismatch",
    ),
    (
        "summary-done-mismatch",
        edit("response.reasoning_summary_text.done", set_path("text", value="x")),
        "delta.done_mismatch",
    ),
    (
        "part-done-mismatch",
        edit("response.content_part.done", set_path("part", "text", value="nope"), nth=1),
        "delta.done_mismatch",
    ),
    ("two-terminals", append(lambda ev: copy.deepcopy(ev[-1])), "lifecycle.terminal_duplicate"),
    ("event-after-terminal", append(lambda ev: copy.deepcopy(ev[1])), "lifecycle.after_terminal"),
    ("missing-created", drop("response.created"), "lifecycle.created_first"),
    (
        "response-id-change",
        edit("response.completed", set_path("response", "id", value="resp_other")),
        "lifecycle.response_id",
    ),
    (
        "status-mismatch",
        edit("response.completed", set_path("response", "status", value="in_progress")),
        "lifecycle.status",
    ),
    ("delta-without-part", drop("response.content_part.added", 1), "content.part_not_open"),
    ("summary-delta-without-part", drop("response.reasoning_summary_part.added"), "summary.part_not_open"),
    ("missing-item-done", drop("response.output_item.done", 2), "item.not_done"),
    ("missing-terminal", lambda ev: ev[:-1], "lifecycle.terminal_missing"),
    (
        "output-mismatch",
        edit("response.completed", set_path("response", "output", 1, "content", 0, "text", value="Hi")),
        "output.mismatch",
    ),
    (
        "output-missing-item",
        edit("response.completed", lambda e: e["response"]["output"].pop()),
        "output.mismatch",
    ),
    (
        "usage-float",
        edit("response.completed", set_path("response", "usage", "input_tokens", value=1.5)),
        "usage.shape",
    ),
    (
        "usage-no-details",
        edit("response.completed", del_path("response", "usage", "output_tokens_details")),
        "usage.shape",
    ),
    ("error-not-failed", insert_before("response.completed", ERROR), "error.not_failed"),
    ("error-at-end", lambda ev: [*ev[:-1], dict(ERROR, sequence_number=len(ev) - 1)], "error.not_failed"),
    (
        "error-without-message",
        insert_before("response.completed", {"type": "error", "code": "x"}),
        "error.shape",
    ),
    (
        "duplicate-output-index",
        edit("response.output_item.added", set_path("output_index", value=2), nth=3),
        "item.output_index",
    ),
    (
        "delta-output-index",
        edit("response.output_text.delta", set_path("output_index", value=0)),
        "item.output_index",
    ),
    ("duplicate-item-id", duplicate_item_id, "item.duplicate_id"),
    (
        "reasoning-added-without-summary",
        edit("response.output_item.added", del_path("item", "summary")),
        "item.shape",
    ),
    (
        "function-args-not-string",
        edit("response.output_item.done", set_path("item", "arguments", value={"a": 1}), nth=2),
        "item.shape",
    ),
    (
        "message-done-without-status",
        edit("response.output_item.done", del_path("item", "status"), nth=1),
        "item.shape",
    ),
    ("delta-without-item-id", edit("response.output_text.delta", del_path("item_id")), "event.field"),
    ("delta-after-item-done", move_delta_after_done, "item.not_open"),
    (
        "part-index-skip",
        edit("response.content_part.added", set_path("content_index", value=3), nth=1),
        "content.part_order",
    ),
    (
        "summary-index-skip",
        edit("response.reasoning_summary_part.added", set_path("summary_index", value=1)),
        "summary.part_order",
    ),
    ("text-into-refusal-part", text_into_refusal, "content.part_type"),
    ("item-done-with-open-part", drop("response.content_part.done", 1), "content.part_open"),
    (
        "item-done-type-change",
        edit("response.output_item.done", set_path("item", "type", value="custom"), nth=2),
        "item.done_mismatch",
    ),
    (
        "item-done-content-differs",
        edit("response.output_item.done", set_path("item", "content", 0, "text", value="Hey"), nth=1),
        "item.content_mismatch",
    ),
    ("part-without-text", edit("response.content_part.added", del_path("part", "text"), nth=1), "part.shape"),
    ("not-an-object", lambda ev: [*ev[:3], ["x"], *ev[3:]], "event.type"),  # type: ignore[list-item]
]


def test_builder_stream_is_clean_in_openai_profile() -> None:
    assert check(builder_stream()) == []


@pytest.mark.parametrize(("name", "mutate", "rule"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutation_is_caught(name: str, mutate: Callable[[Events], Events], rule: str) -> None:
    events = mutate(builder_stream())
    violations = check(events)
    assert rule in rules(violations), violations
    assert all(v.rule in RULES for v in violations)


def test_violation_points_at_the_offending_event() -> None:
    events = edit("response.output_text.done", set_path("text", value="Help"))(builder_stream())
    (violation,) = [v for v in check(events) if v.rule == "delta.done_mismatch"]
    assert violation.sequence_number == events[find(events, "response.output_text.done")]["sequence_number"]
    assert "Help" in violation.message and "Hello" in violation.message


def test_incremental_feed_reports_at_the_event() -> None:
    events = drop("response.content_part.added", 1)(builder_stream())
    checker = StreamChecker()
    first_bad = None
    for i, event in enumerate(events):
        if checker.feed(event) and first_bad is None:
            first_bad = i
    assert checker.finish() == []
    assert first_bad is not None and events[first_bad]["type"] == "response.output_text.delta"
    assert checker.violations == check(events)


def test_a_watcher_that_keeps_nothing_still_reports_and_counts() -> None:
    # The passthrough checks a long upstream stream with keep=False: what feed returns is all it gets.
    events = drop("response.content_part.added", 1)(builder_stream())
    watcher = StreamChecker(keep=False)
    returned = [v for event in events for v in watcher.feed(event)] + watcher.finish()
    assert returned == check(events) and returned
    assert watcher.violations == [] and watcher.violation_count == len(returned) and not watcher.ok


def test_finish_is_idempotent_and_feed_after_finish_raises() -> None:
    checker = StreamChecker()
    checker.feed_all(builder_stream()[:-3])
    assert rules(checker.finish()) == {"lifecycle.terminal_missing", "item.not_done"}
    assert checker.finish() == []
    with pytest.raises(RuntimeError):
        checker.feed({"type": "ping"})


def test_unknown_profile_rejected() -> None:
    with pytest.raises(ValueError):
        StreamChecker("anthropic")


def test_no_args_function_call_done_without_deltas_is_clean() -> None:
    b = StreamBuilder(new_response("m"))
    b.start()
    b.close_function_call(b.open_function_call("noargs"))
    b.complete()
    assert check(b.take()) == []


def test_incomplete_and_failed_builder_streams_are_clean() -> None:
    for finish in ("incomplete", "fail"):
        b = StreamBuilder(new_response("m"))
        b.start()
        m = b.open_message()
        b.text_delta(m, "partial")
        b.open_function_call("f")
        if finish == "incomplete":
            b.incomplete("max_output_tokens")
        else:
            b.fail("server_error", "upstream died")
        assert check(b.take()) == [], finish


# ------------------------------------------------------------------ profiles
def test_strict_spec_accepts_core_builder_stream() -> None:
    assert check(builder_stream(raw_reasoning="reasoning"), profile="strict-spec") == []


def test_strict_spec_rejects_openai_raw_reasoning_spelling() -> None:
    events = builder_stream()
    assert rules(check(events, profile="strict-spec")) == {"spec.raw_reasoning"}
    assert check(events, profile="openai") == []


def test_strict_spec_demands_every_response_resource_key() -> None:
    events = edit("response.created", del_path("response", "presence_penalty"))(builder_stream("reasoning"))
    assert rules(check(events, profile="strict-spec")) == {"spec.response_fields"}
    assert check(events) == []


def test_strict_spec_rejects_extension_items_and_events() -> None:
    b = StreamBuilder(new_response("m"))
    b.start()
    ws = b.open_tool_call("web_search_call")
    b.tool_progress(ws, "searching")
    b.close_tool_call(ws, action={"type": "search", "query": "q"})
    b.keepalive("ping")
    b.complete()
    events = b.take()
    assert check(events) == []
    assert rules(check(events, profile="strict-spec")) == {"spec.item_type", "event.unknown_type"}


def test_strict_spec_requires_nested_error_and_added_status() -> None:
    flat = insert_before("response.failed", {"type": "error", "message": "boom", "code": None})
    b = StreamBuilder(new_response("m"), error_event_on_failure=False)
    b.start()
    b.fail("server_error", "boom")
    events = flat(b.take())
    assert check(events) == []
    assert rules(check(events, profile="strict-spec")) == {"error.shape"}
    no_status = edit("response.output_item.added", del_path("item", "status"), nth=2)(
        builder_stream("reasoning")
    )
    assert check(no_status) == []
    assert rules(check(no_status, profile="strict-spec")) == {"item.shape"}


def test_codex_profile_flags_refusal_parts() -> None:
    b = StreamBuilder(new_response("m"))
    b.start()
    m = b.open_message()
    b.refusal_delta(m, "I can't")
    b.complete()
    events = b.take()
    assert check(events) == []
    assert rules(check(events, profile="codex")) == {"codex.refusal_part"}


def test_spec_tables_match_the_open_responses_models() -> None:
    spec = pytest.importorskip("openresponses_types")
    required = {name for name, field in spec.ResponseResource.model_fields.items() if field.is_required()}
    assert required == set(SPEC_RESPONSE_FIELDS)
    event_types = set()
    for model in vars(spec).values():
        if isinstance(model, type) and model.__name__.endswith("StreamingEvent"):
            event_types |= {member.value for member in model.model_fields["type"].annotation}
    assert event_types == SPEC_EVENTS


def test_every_rule_is_exercised() -> None:
    exercised = {rule for _, _, rule in MUTATIONS} | {
        "event.unknown_type",
        "spec.response_fields",
        "spec.item_type",
        "spec.raw_reasoning",
        "codex.refusal_part",
        "response.shape",
        # Reported by the CLI's URL probes; tests/test_cli_check.py triggers them.
        "http.response",
        "probe.function_call",
    }
    assert exercised == set(RULES)


def test_check_response_body() -> None:
    body = builder_stream("reasoning")[-1]["response"]
    assert check_response(body) == []
    assert check_response(body, profile="strict-spec") == []
    assert rules(check_response(dict(body, object="chat.completion"))) == {"response.shape"}
    assert rules(check_response(["x"])) == {"response.shape"}
    bad_item = dict(body, output=[{"id": "rs_1", "type": "reasoning"}])
    assert rules(check_response(bad_item)) == {"item.shape"}
    partial = {k: v for k, v in body.items() if k != "top_logprobs"}
    assert check_response(partial) == []
    assert rules(check_response(partial, profile="strict-spec")) == {"spec.response_fields"}


# ------------------------------------------------------------------ real recordings
# Recordings that break a rule themselves, and which rules (checked to be the recording's fault).
FIXTURE_EXCEPTIONS: dict[str, set[str]] = {
    # Hand-written by the vercel authors: no sequence_number on any event.
    "openai-responses__custom-tool-call-input-delta-gpt-5.2-codex__vercel-ai.chunks.jsonl": {
        "sequence.integer"
    },
    # OpenRouter reports different reasoning item ids in output_item.done and response.completed.
    "openai-responses__openrouter-reasoning-text-delta-raw-cot__pydantic-pydantic-ai.sse": {
        "output.mismatch"
    },
    # The recorders anonymised/shortened output_text.done, so it no longer equals the deltas.
    "openai-responses__reasoning-multiple-summary-parts-azure-gpt-5.4__vercel-ai.chunks.jsonl": {
        "delta.done_mismatch",
        "item.content_mismatch",
    },
    "openai-responses__shell-call-container-output-gpt-5.2__vercel-ai.chunks.jsonl": {
        "delta.done_mismatch",
        "item.content_mismatch",
    },
    # GitHub Copilot (and the capture tool) rotate every id per event: response and item ids never match.
    "openai-responses__reasoning-summary-then-text-gpt-5.3-codex__vercel-ai.chunks.jsonl": {
        "lifecycle.response_id",
        "item.not_open",
        "item.not_done",
        "output.mismatch",
    },
    # The sample file lacks the final blank line, so SSE discards the unterminated response.completed.
    "openai-responses__reasoning-then-function-call-args-delta__wavetermdev-waveterm.sse": {
        "lifecycle.terminal_missing"
    },
}
# Several responses recorded back to back in one file: each one is checked on its own.
CONCATENATED = {
    "openai-responses__multi-step-reasoning-summary-function-calls-gpt-5.1-codex-max__vercel-ai.chunks.jsonl"
}

OPENAI_STREAMS = list_fixtures("openai-responses__", (".sse", ".chunks.jsonl"))


def split_responses(events: Events) -> list[Events]:
    out: list[Events] = []
    for event in events:
        if event["type"] == "response.created" or not out:
            out.append([])
        out[-1].append(event)
    return out


def test_fixtures_present() -> None:
    assert len(OPENAI_STREAMS) >= 20
    assert set(FIXTURE_EXCEPTIONS) | CONCATENATED <= set(OPENAI_STREAMS)


@pytest.mark.parametrize("name", OPENAI_STREAMS)
def test_openai_recording_passes_openai_profile(name: str) -> None:
    events = events_of(name)
    streams = split_responses(events) if name in CONCATENATED else [events]
    if name in CONCATENATED:
        assert len(streams) > 1
    for stream in streams:
        assert rules(check(stream)) == FIXTURE_EXCEPTIONS.get(name, set()), check(stream)[:5]


def test_truncated_wavetermdev_recording_is_clean_once_terminated() -> None:
    name = "openai-responses__reasoning-then-function-call-args-delta__wavetermdev-waveterm.sse"
    decoder = EventStreamDecoder()
    events = decoder.feed(load_fixture(name) + b"\n\n")  # type: ignore[operator]
    assert check(events + decoder.flush()) == []


class _FullPathOnly(StreamChecker):
    """The checker with its delta fast path turned off: every event through the general rules."""

    def _fast_delta(self, event: dict[str, Any], fast: Any) -> bool:
        return False


_DELTA_EDITS: list[Callable[[dict[str, Any]], None]] = [
    set_path("sequence_number", value=True),
    set_path("sequence_number", value=10_000),
    set_path("item_id", value="nope"),
    set_path("item_id", value=7),
    set_path("output_index", value=9),
    set_path("output_index", value=False),
    set_path("content_index", value=5),
    set_path("summary_index", value=5),
    set_path("delta", value=None),
    lambda event: event.pop("delta", None),
    lambda event: event.pop("content_index", None),
]


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("name", [*(n for n in list_fixtures() if n.endswith(".sse")), "builder"])
def test_the_delta_fast_path_says_what_the_full_rules_say(name: str, profile: str) -> None:
    """Each delta of real recordings, edited one way at a time, or moved after its part's done, is
    judged the same with and without the fast path: same violations, in the same order."""
    clean = builder_stream() if name == "builder" else events_of(name)
    deltas = [i for i, e in enumerate(clean) if isinstance(e, dict) and str(e.get("type")).endswith(".delta")]
    variants: list[Events] = [clean]
    types = [e.get("type") for e in clean if isinstance(e, dict)]
    if "response.output_text.delta" in types and types.count("response.output_item.done") > 1:
        variants.append(move_delta_after_done(copy.deepcopy(clean)))
    for n, at in enumerate(deltas[:: max(1, len(deltas) // 6)]):
        variant = copy.deepcopy(clean)
        _DELTA_EDITS[n % len(_DELTA_EDITS)](variant[at])
        variants.append(variant)
    for events in variants:
        fast, full = StreamChecker(profile), _FullPathOnly(profile)
        got = [fast.feed(copy.deepcopy(e)) for e in events] + [fast.finish()]
        want = [full.feed(copy.deepcopy(e)) for e in events] + [full.finish()]
        assert got == want
