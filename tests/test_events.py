"""The event vocabulary (protocol/events.py) and the tables derived from it."""

from __future__ import annotations

from responses_gateway.protocol import events
from responses_gateway.protocol.accumulator import HANDLERS, PIECES
from responses_gateway.protocol.builder import TERMINAL_EVENTS, TOOL_PHASES
from responses_gateway.protocol.checker import EVENT_RULES, SPEC_EVENTS


def test_every_spelling_is_read_and_only_checked_types_are_checked() -> None:
    assert set(HANDLERS) == set(events.SPELLINGS)
    assert set(EVENT_RULES) == {name for name, event in events.EVENT_TYPES.items() if event.checked}
    assert not set(events.ALIASES) & set(EVENT_RULES)
    assert set(EVENT_RULES) >= SPEC_EVENTS


def test_every_piece_can_be_read_and_written() -> None:
    assert set(PIECES) == set(events.PIECES)
    for event in events.EVENT_TYPES.values():
        if event.family in (events.DELTA, events.DONE):
            assert event.piece is not None and event.field, event.name
            assert event.piece.channel is not None or not event.checked, event.name


def test_tool_phases_and_terminal_events_come_from_the_vocabulary() -> None:
    assert {"response.completed", "response.incomplete", "response.failed"} == TERMINAL_EVENTS
    assert {kind: call.progress for kind, call in events.TOOL_CALLS.items()} == TOOL_PHASES
    for kind, call in events.TOOL_CALLS.items():
        for phase in call.phases:
            assert f"response.{kind}.{phase}" in EVENT_RULES
