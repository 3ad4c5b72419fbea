"""The Responses streaming event vocabulary: every event type, declared once.

Each :class:`EventType` says what an event is (its family), which item type it belongs to, which
streamed piece its delta or done carries and in which field, which further fields it requires, whether
the Open Responses spec defines it, whether the checker validates it, and the legacy spellings tolerant
readers accept for it. The checker (``EVENT_RULES``), the accumulator (``HANDLERS``) and the builder
(``TOOL_PHASES``, the events only it may produce) derive their tables from here once, at import, so
adding an event is one edit in this module. Data only: no I/O, and it imports nothing of the package.

A :class:`Piece` is one streamed string inside an item (a text part, a summary part, the arguments…):
the deltas of every spelling that carry it append to it, and its ``done`` events settle it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALIASES",
    "ANNOTATION",
    "COMMAND_ADDED",
    "CONTENT_PART",
    "DELTA",
    "DONE",
    "ERROR",
    "EVENT_TYPES",
    "ITEM_ADDED",
    "ITEM_DONE",
    "ITEM_FIELD",
    "KEEPALIVE",
    "LIFECYCLE",
    "LIFECYCLE_EVENTS",
    "OUTPUT_IMAGE",
    "PARTIAL_IMAGE",
    "PART_ADDED",
    "PART_DONE",
    "PIECES",
    "SHELL_OUTPUT_DELTA",
    "SHELL_OUTPUT_DONE",
    "SPEC_EVENTS",
    "SPELLINGS",
    "SUMMARY_PART",
    "SUMMARY_PART_ADDED",
    "SUMMARY_PART_DONE",
    "TERMINAL_EVENTS",
    "TOOL_CALLS",
    "TOOL_PHASE",
    "EventType",
    "FieldSpec",
    "Piece",
    "ToolCall",
]

# ---------------------------------------------------------------------------------------------- families
LIFECYCLE = "lifecycle"  # carries a Response snapshot; ``terminal`` ends the stream
ITEM_ADDED = "item_added"
ITEM_DONE = "item_done"
PART_ADDED = "part_added"  # a content part of a message or reasoning item
PART_DONE = "part_done"
SUMMARY_PART_ADDED = "summary_part_added"  # a summary part of a reasoning item
SUMMARY_PART_DONE = "summary_part_done"
ANNOTATION = "annotation"
DELTA = "delta"  # appends to a piece
DONE = "done"  # a piece's final value
TOOL_PHASE = "tool_phase"  # ``response.<tool call type>.<phase>``: the item's status
PARTIAL_IMAGE = "partial_image"
ERROR = "error"
KEEPALIVE = "keepalive"
# Read by the accumulator only (other servers' events with a shape of their own).
OUTPUT_IMAGE = "output_image"
COMMAND_ADDED = "command_added"
SHELL_OUTPUT_DELTA = "shell_output_delta"
SHELL_OUTPUT_DONE = "shell_output_done"

# Where a piece lives, and so which fields address it.
CONTENT_PART = "content"  # item.content[content_index]
SUMMARY_PART = "summary"  # item.summary[summary_index]
ITEM_FIELD = "item"  # a field of the item itself (maybe indexed, e.g. command_index)

# Required fields and their JSON types (``int`` excludes ``bool``).
FieldSpec = tuple[tuple[str, type | tuple[type, ...]], ...]


@dataclass(frozen=True, slots=True)
class Piece:
    """One streamed string inside an item."""

    name: str  # the accumulator's piece kind (and its name in findings)
    item_type: str  # the item type a delta implies when its item was never added
    scope: str  # CONTENT_PART, SUMMARY_PART or ITEM_FIELD
    index_field: str | None  # the event field holding the piece's index, if it has one
    field: str  # where its value is kept: the part's field, or the item's
    # The checker's delta channel: the part type for a part, the item field for an item-level piece;
    # None when the checker does not follow the piece.
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class EventType:
    """One streaming event type."""

    name: str
    family: str
    item_type: str = ""  # the item type it belongs to ("" when any or none)
    piece: Piece | None = None  # DELTA and DONE: the piece it carries
    field: str = ""  # DELTA: "delta"; DONE: the field holding the final value
    fields: FieldSpec = ()  # further fields it requires (besides its family's addressing fields)
    aliases: tuple[str, ...] = ()  # legacy spellings tolerant readers accept (the checker does not)
    spec: bool = False  # defined by the Open Responses spec (2026-04-24)
    checked: bool = True  # validated by the checker; False: only the accumulator reads it
    terminal: bool = False  # LIFECYCLE: completed, incomplete or failed
    statuses: frozenset[str] = frozenset()  # LIFECYCLE: the status its snapshot must report


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A built-in tool call item type and the phases of its ``response.<kind>.<phase>`` events."""

    kind: str
    progress: tuple[str, ...]  # between ``in_progress`` (opening) and the end (closing)
    ends: tuple[str, ...] = ("completed",)
    aliases: tuple[str, ...] = ()  # legacy spellings of ``kind`` in event types

    @property
    def phases(self) -> tuple[str, ...]:
        return ("in_progress", *self.progress, *self.ends)


# ---------------------------------------------------------------------------------------------- pieces
_TEXT = Piece("text", "message", CONTENT_PART, "content_index", "text", "output_text")
_REFUSAL = Piece("refusal", "message", CONTENT_PART, "content_index", "refusal", "refusal")
_REASONING = Piece("reasoning", "reasoning", CONTENT_PART, "content_index", "text", "reasoning_text")
_SUMMARY = Piece("summary", "reasoning", SUMMARY_PART, "summary_index", "text", "summary_text")
_STDOUT = Piece("stdout", "shell_call_output", ITEM_FIELD, "command_index", "stdout")
_STDERR = Piece("stderr", "shell_call_output", ITEM_FIELD, "command_index", "stderr")
_ARGUMENTS = Piece("arguments", "function_call", ITEM_FIELD, None, "arguments", "arguments")
_INPUT = Piece("input", "custom_tool_call", ITEM_FIELD, None, "input", "input")
_CODE = Piece("code", "code_interpreter_call", ITEM_FIELD, None, "code", "code")
_DIFF = Piece("diff", "apply_patch_call", ITEM_FIELD, None, "diff", "diff")  # item.operation.diff
_COMMAND = Piece("command", "shell_call", ITEM_FIELD, "command_index", "command")  # action.commands[i]
_LOGS = Piece("logs", "code_interpreter_call", ITEM_FIELD, None, "logs")  # the item's logs output

PIECES: Final[dict[str, Piece]] = {
    piece.name: piece
    for piece in (
        _TEXT,
        _REFUSAL,
        _REASONING,
        _SUMMARY,
        _STDOUT,
        _STDERR,
        _ARGUMENTS,
        _INPUT,
        _CODE,
        _DIFF,
        _COMMAND,
        _LOGS,
    )
}


def _delta(name: str, piece: Piece, *aliases: str, item_type: str = "", spec: bool = False) -> EventType:
    return EventType(name, DELTA, item_type or piece.item_type, piece, "delta", aliases=aliases, spec=spec)


def _done(
    name: str, piece: Piece, field: str, *aliases: str, item_type: str = "", spec: bool = False
) -> EventType:
    return EventType(name, DONE, item_type or piece.item_type, piece, field, aliases=aliases, spec=spec)


def _lifecycle(name: str, *statuses: str, terminal: bool = False) -> EventType:
    return EventType(
        name,
        LIFECYCLE,
        fields=(("response", dict),),
        spec=True,
        terminal=terminal,
        statuses=frozenset(statuses),
    )


# ---------------------------------------------------------------------------------------------- tools
TOOL_CALLS: Final[dict[str, ToolCall]] = {
    call.kind: call
    for call in (
        ToolCall("web_search_call", ("searching",)),
        ToolCall("file_search_call", ("searching",)),
        ToolCall(
            "code_interpreter_call", ("interpreting",), aliases=("code_interpreter", "code_interpreter.call")
        ),
        ToolCall("image_generation_call", ("generating",)),
        ToolCall("mcp_call", (), ("completed", "failed")),
        ToolCall("mcp_list_tools", (), ("completed", "failed")),
    )
}
# Phases older servers report that no tool call declares.
_LEGACY_TOOL_PHASES = ("calling",)
# Tolerant readers take any known phase under any tool call spelling (servers mix them).
_ANY_TOOL_PHASE = tuple(
    dict.fromkeys(
        [phase for call in TOOL_CALLS.values() for phase in call.phases] + list(_LEGACY_TOOL_PHASES)
    )
)


def _tool_phases() -> list[EventType]:
    return [
        EventType(
            f"response.{call.kind}.{phase}",
            TOOL_PHASE,
            call.kind,
            aliases=tuple(f"response.{alias}.{phase}" for alias in call.aliases),
            checked=phase in call.phases,
        )
        for call in TOOL_CALLS.values()
        for phase in _ANY_TOOL_PHASE
    ]


# ---------------------------------------------------------------------------------------------- events
_DECLARED: tuple[EventType, ...] = (
    _lifecycle("response.created", "in_progress", "queued"),
    _lifecycle("response.queued", "queued"),
    _lifecycle("response.in_progress", "in_progress"),
    _lifecycle("response.completed", "completed", terminal=True),
    _lifecycle("response.incomplete", "incomplete", terminal=True),
    _lifecycle("response.failed", "failed", terminal=True),
    EventType("response.output_item.added", ITEM_ADDED, fields=(("item", dict),), spec=True),
    EventType("response.output_item.done", ITEM_DONE, fields=(("item", dict),), spec=True),
    EventType("response.content_part.added", PART_ADDED, fields=(("part", dict),), spec=True),
    EventType("response.content_part.done", PART_DONE, fields=(("part", dict),), spec=True),
    _delta("response.output_text.delta", _TEXT, spec=True),
    _done("response.output_text.done", _TEXT, "text", "response.text.done", spec=True),
    EventType(
        "response.output_text.annotation.added",
        ANNOTATION,
        "message",
        fields=(("annotation_index", int), ("annotation", dict)),
        aliases=("response.output_text_annotation.added",),
        spec=True,
    ),
    _delta("response.refusal.delta", _REFUSAL, spec=True),
    _done("response.refusal.done", _REFUSAL, "refusal", spec=True),
    # Raw reasoning: OpenAI's spelling, then the spec's.
    _delta("response.reasoning_text.delta", _REASONING),
    _done("response.reasoning_text.done", _REASONING, "text"),
    _delta("response.reasoning.delta", _REASONING, spec=True),
    _done("response.reasoning.done", _REASONING, "text", spec=True),
    EventType(
        "response.reasoning_summary_part.added",
        SUMMARY_PART_ADDED,
        "reasoning",
        fields=(("part", dict),),
        spec=True,
    ),
    EventType(
        "response.reasoning_summary_part.done",
        SUMMARY_PART_DONE,
        "reasoning",
        fields=(("part", dict),),
        spec=True,
    ),
    _delta("response.reasoning_summary_text.delta", _SUMMARY, "response.reasoning_summary.delta", spec=True),
    _done(
        "response.reasoning_summary_text.done", _SUMMARY, "text", "response.reasoning_summary.done", spec=True
    ),
    _delta(
        "response.function_call_arguments.delta",
        _ARGUMENTS,
        "response.function_call.arguments.delta",
        spec=True,
    ),
    _done(
        "response.function_call_arguments.done",
        _ARGUMENTS,
        "arguments",
        "response.function_call.arguments.done",
        spec=True,
    ),
    _delta("response.custom_tool_call_input.delta", _INPUT),
    _done("response.custom_tool_call_input.done", _INPUT, "input"),
    _delta(
        "response.mcp_call_arguments.delta",
        _ARGUMENTS,
        "response.mcp_call.arguments.delta",
        item_type="mcp_call",
    ),
    _done(
        "response.mcp_call_arguments.done",
        _ARGUMENTS,
        "arguments",
        "response.mcp_call.arguments.done",
        item_type="mcp_call",
    ),
    _delta("response.code_interpreter_call_code.delta", _CODE, "response.code_interpreter.call.code.delta"),
    _done(
        "response.code_interpreter_call_code.done", _CODE, "code", "response.code_interpreter.call.code.done"
    ),
    _delta("response.apply_patch_call_operation_diff.delta", _DIFF),
    _done("response.apply_patch_call_operation_diff.done", _DIFF, "diff"),
    EventType(
        "response.image_generation_call.partial_image",
        PARTIAL_IMAGE,
        "image_generation_call",
        fields=(("partial_image_b64", str), ("partial_image_index", int)),
    ),
    *_tool_phases(),
    EventType("error", ERROR, spec=True),
    EventType("ping", KEEPALIVE, aliases=("keepalive",)),
    # Other servers' events, read by the accumulator only.
    EventType(
        "response.code_interpreter.output_text.delta",
        DELTA,
        "code_interpreter_call",
        _LOGS,
        "delta",
        checked=False,
    ),
    EventType(
        "response.code_interpreter.output_image.delta", OUTPUT_IMAGE, "code_interpreter_call", checked=False
    ),
    EventType("response.shell_call_command.added", COMMAND_ADDED, "shell_call", checked=False),
    EventType("response.shell_call_command.delta", DELTA, "shell_call", _COMMAND, "delta", checked=False),
    EventType("response.shell_call_command.done", DONE, "shell_call", _COMMAND, "command", checked=False),
    EventType(
        "response.shell_call_output_content.delta", SHELL_OUTPUT_DELTA, "shell_call_output", checked=False
    ),
    EventType(
        "response.shell_call_output_content.done", SHELL_OUTPUT_DONE, "shell_call_output", checked=False
    ),
)


def _index(declared: tuple[EventType, ...]) -> tuple[dict[str, EventType], dict[str, EventType]]:
    types: dict[str, EventType] = {}
    aliases: dict[str, EventType] = {}
    for event in declared:
        for name, table in ((event.name, types), *((alias, aliases) for alias in event.aliases)):
            if name in types or name in aliases:
                raise ValueError(f"event type {name!r} is declared twice")
            table[name] = event
    return types, aliases


# Event type -> its declaration; legacy spelling -> the declaration it spells; both together.
# (Each annotated on its own: mypyc cannot infer a tuple assignment's parts across the package's modules.)
_INDEXED = _index(_DECLARED)
EVENT_TYPES: Final[dict[str, EventType]] = _INDEXED[0]
ALIASES: Final[dict[str, EventType]] = _INDEXED[1]
SPELLINGS: Final[dict[str, EventType]] = {**EVENT_TYPES, **ALIASES}

TERMINAL_EVENTS: Final[frozenset[str]] = frozenset(
    name for name, event in EVENT_TYPES.items() if event.family == LIFECYCLE and event.terminal
)
LIFECYCLE_EVENTS: Final[frozenset[str]] = frozenset(
    name for name, event in EVENT_TYPES.items() if event.family == LIFECYCLE and not event.terminal
)
SPEC_EVENTS: Final[frozenset[str]] = frozenset(name for name, event in EVENT_TYPES.items() if event.spec)
