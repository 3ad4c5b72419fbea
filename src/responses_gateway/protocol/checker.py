"""Stream checker: validates a Responses event stream against the rules real clients enforce.

Everything that decides whether an event is acceptable lives in the tables at the top of this module
(``EVENT_RULES``, ``ITEM_SHAPES``, ``PART_SHAPES``, ``SPEC_EVENTS``…); :class:`StreamChecker` only walks
them. The event types themselves (family, piece, fields, spec or not) are declared once in
:mod:`.events`; ``EVENT_RULES`` is derived from that vocabulary at import. It is sans-IO and
incremental: feed events as they pass (a relay can check inline), then call
:meth:`StreamChecker.finish`. Delta events cost O(1): a table lookup, a few type checks and one
``list.append`` into the buffer that the matching ``*.done`` is compared against.

Profiles:

``openai``
    What OpenAI itself emits and what Codex, the openai SDK, the Agents SDK and the Vercel AI SDK
    require. A real OpenAI recording passes. Unknown event types are ignored (every client does).
``strict-spec``
    ``openai`` plus every field the Open Responses spec requires: full ResponseResource snapshots,
    only spec event types (so raw reasoning is ``response.reasoning.*``), core item types only, the
    nested ``error`` object on ``error`` events and the spec item shapes on ``output_item.added``.
``codex``
    ``openai`` plus Codex's parser quirks: a ``refusal`` content part makes Codex drop the whole
    message. OpenAI emits refusal parts itself, so the default profile accepts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from . import events
from .native import mypyc_attr

__all__ = [
    "PROFILES",
    "RULES",
    "Profile",
    "StreamChecker",
    "Violation",
    "check",
    "check_response",
]

Profile = Literal["openai", "strict-spec", "codex"]
PROFILES: Final[tuple[str, ...]] = ("openai", "strict-spec", "codex")

# Rule id -> (profiles it applies to, meaning). The ids are stable: tests and tools key on them.
_ALL = ("openai", "strict-spec", "codex")
RULES: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "event.type": (_ALL, "an event is not a JSON object with a non-empty string `type`"),
    "event.field": (_ALL, "a field the event type requires is missing or has the wrong JSON type"),
    "event.unknown_type": (("strict-spec",), "an event type the Open Responses spec does not define"),
    "sequence.integer": (_ALL, "`sequence_number` is missing or not an integer"),
    "sequence.contiguous": (_ALL, "`sequence_number` does not start at 0 and grow by exactly 1"),
    "lifecycle.created_first": (_ALL, "the first event is not `response.created`"),
    "lifecycle.response_id": (_ALL, "the response id changes between lifecycle events"),
    "lifecycle.status": (_ALL, "a lifecycle snapshot's `status` disagrees with its event type"),
    "lifecycle.terminal_missing": (_ALL, "the stream ends without completed/incomplete/failed"),
    "lifecycle.terminal_duplicate": (_ALL, "a second terminal event"),
    "lifecycle.after_terminal": (_ALL, "an event after the terminal event"),
    "item.not_open": (_ALL, "an item-scoped event names an item that was never added or is already done"),
    "item.output_index": (_ALL, "`output_index` is not the item's, or a new item's is not the next one"),
    "item.duplicate_id": (_ALL, "`output_item.added` reuses an item id"),
    "item.done_mismatch": (_ALL, "`output_item.done` changes the item's type or output_index"),
    "item.not_done": (_ALL, "an added item never gets `output_item.done`"),
    "item.shape": (_ALL, "an item lacks a field its type requires (see ITEM_SHAPES)"),
    "item.content_mismatch": (_ALL, "the `output_item.done` item disagrees with what was streamed"),
    "part.shape": (_ALL, "a content or summary part lacks a field its type requires"),
    "content.part_not_open": (_ALL, "a content event names a content part that is not open"),
    "content.part_order": (_ALL, "`content_part.added` is not the item's next content_index"),
    "content.part_type": (_ALL, "a delta of one kind streamed into a part of another kind"),
    "content.part_open": (_ALL, "`output_item.done` while one of its parts is still open"),
    "summary.part_not_open": (_ALL, "a summary event names a summary part that is not open"),
    "summary.part_order": (_ALL, "`reasoning_summary_part.added` is not the next summary_index"),
    "delta.done_mismatch": (_ALL, "a `*.done` value differs from the concatenated deltas"),
    "output.mismatch": (_ALL, "the terminal `output` differs from the items that were done"),
    "usage.shape": (_ALL, "usage counts are not integers or the detail objects are missing"),
    "error.not_failed": (_ALL, "an `error` event is not followed by `response.failed`"),
    "error.shape": (_ALL, "an `error` event carries no message (strict-spec: no nested `error` object)"),
    "response.shape": (_ALL, "a non-streamed Response body is not a Response object"),
    # Reported by `responses-gateway check URL` about the HTTP exchange rather than the events.
    "http.response": (_ALL, "a probe got a non-200 status, a wrong Content-Type or a non-JSON body"),
    "probe.function_call": (_ALL, "`tool_choice: required` was answered without a function_call item"),
    "spec.response_fields": (("strict-spec",), "a lifecycle snapshot lacks a ResponseResource key"),
    "spec.item_type": (("strict-spec",), "an output item type outside the spec's core item types"),
    "spec.raw_reasoning": (("strict-spec",), "raw reasoning named `response.reasoning_text.*`"),
    "codex.refusal_part": (("codex",), "a `refusal` message part (Codex drops the whole message)"),
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: its stable id, the offending event's sequence number (or index), and why."""

    rule: str
    sequence_number: int
    message: str

    def __str__(self) -> str:
        return f"#{self.sequence_number} [{self.rule}] {self.message}"


# ---------------------------------------------------------------------------------------------- tables
# Event scopes: how an event attaches to the stream's state.
LIFECYCLE = "lifecycle"  # carries a Response snapshot
ITEM_ADDED = "item_added"
ITEM_DONE = "item_done"
ITEM = "item"  # scoped to an open item by item_id
PART_ADDED = "part_added"
PART_DONE = "part_done"
CONTENT = "content"  # scoped to an open content part by (item_id, content_index)
SUMMARY_ADDED = "summary_added"
SUMMARY_DONE = "summary_done"
SUMMARY = "summary"  # scoped to an open summary part by (item_id, summary_index)
ERROR = "error"
GLOBAL = "global"

# JSON type names for required fields. ``int`` excludes ``bool`` (checked explicitly).
_FieldSpec = events.FieldSpec
_ITEM_FIELDS: _FieldSpec = (("item_id", str), ("output_index", int))
_CONTENT_FIELDS: _FieldSpec = (*_ITEM_FIELDS, ("content_index", int))
_SUMMARY_FIELDS: _FieldSpec = (*_ITEM_FIELDS, ("summary_index", int))


@dataclass(frozen=True, slots=True)
class EventRule:
    """What an event type needs: its scope, its required fields, and the delta channel it feeds."""

    scope: str
    fields: _FieldSpec = ()
    # Delta channel: deltas append ``delta`` to it, the ``done`` event's ``done_field`` must equal it.
    channel: str | None = None
    role: Literal["delta", "done"] | None = None
    done_field: str = ""


def _delta(scope: str, base: _FieldSpec, channel: str) -> EventRule:
    return EventRule(scope, (*base, ("delta", str)), channel, "delta")


def _done(scope: str, base: _FieldSpec, channel: str, field: str) -> EventRule:
    return EventRule(scope, (*base, (field, str)), channel, "done", field)


# How each family of the event vocabulary (events.py) attaches to the stream's state.
_FAMILY_SCOPES: Final[dict[str, str]] = {
    events.LIFECYCLE: LIFECYCLE,
    events.ITEM_ADDED: ITEM_ADDED,
    events.ITEM_DONE: ITEM_DONE,
    events.PART_ADDED: PART_ADDED,
    events.PART_DONE: PART_DONE,
    events.SUMMARY_PART_ADDED: SUMMARY_ADDED,
    events.SUMMARY_PART_DONE: SUMMARY_DONE,
    events.ANNOTATION: CONTENT,
    events.TOOL_PHASE: ITEM,
    events.PARTIAL_IMAGE: ITEM,
    events.ERROR: ERROR,
    events.KEEPALIVE: GLOBAL,
}
# A delta's or done's scope is where its piece lives.
_PIECE_SCOPES: Final[dict[str, str]] = {
    events.CONTENT_PART: CONTENT,
    events.SUMMARY_PART: SUMMARY,
    events.ITEM_FIELD: ITEM,
}
# The fields that address an event of each scope, before the ones its type adds.
_SCOPE_FIELDS: Final[dict[str, _FieldSpec]] = {
    LIFECYCLE: (),
    ITEM_ADDED: (("output_index", int),),
    ITEM_DONE: (("output_index", int),),
    PART_ADDED: _CONTENT_FIELDS,
    PART_DONE: _CONTENT_FIELDS,
    CONTENT: _CONTENT_FIELDS,
    SUMMARY_ADDED: _SUMMARY_FIELDS,
    SUMMARY_DONE: _SUMMARY_FIELDS,
    SUMMARY: _SUMMARY_FIELDS,
    ITEM: _ITEM_FIELDS,
    ERROR: (),
    GLOBAL: (),
}


def _rule(event: events.EventType) -> EventRule:
    piece = event.piece
    if piece is None:
        scope = _FAMILY_SCOPES[event.family]
        return EventRule(scope, (*_SCOPE_FIELDS[scope], *event.fields))
    scope = _PIECE_SCOPES[piece.scope]
    if piece.channel is None:
        raise ValueError(f"{event.name} is checked but its piece {piece.name!r} has no channel")
    if event.family == events.DELTA:
        return _delta(scope, _SCOPE_FIELDS[scope], piece.channel)
    return _done(scope, _SCOPE_FIELDS[scope], piece.channel, event.field)


# Every event type the checker validates, derived once from the vocabulary (events.EVENT_TYPES); built-in
# tool progress events (``response.web_search_call.searching``…) are plain item-scoped events.
EVENT_RULES: Final[dict[str, EventRule]] = {
    name: _rule(event) for name, event in events.EVENT_TYPES.items() if event.checked
}

TERMINAL: Final[frozenset[str]] = events.TERMINAL_EVENTS

# The status a lifecycle snapshot must report for each lifecycle event.
LIFECYCLE_STATUS: Final[dict[str, frozenset[str]]] = {
    name: event.statuses for name, event in events.EVENT_TYPES.items() if event.family == events.LIFECYCLE
}

# Event types the Open Responses spec (2026-04-24) defines; strict-spec rejects every other type.
SPEC_EVENTS: Final[frozenset[str]] = events.SPEC_EVENTS

# Every key of the spec's ResponseResource; all required (nullable ones present as null).
SPEC_RESPONSE_FIELDS: Final[tuple[str, ...]] = (
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
)

SPEC_ITEM_TYPES: Final[frozenset[str]] = frozenset(
    {"message", "function_call", "function_call_output", "reasoning", "compaction"}
)


@dataclass(frozen=True, slots=True)
class ItemShape:
    """Fields an item type needs in ``output_item.added`` and in ``output_item.done``."""

    added: _FieldSpec
    done: _FieldSpec


_ID_TYPE: _FieldSpec = (("id", str), ("type", str))
# From the clients: Codex drops reasoning without `summary` (even in .added), function calls without
# string `arguments`/`call_id`, custom calls without `input`; the Vercel SDK needs `status` on a done
# function call; @ai-sdk/open-responses needs `content` on a done message.
ITEM_SHAPES: Final[dict[str, ItemShape]] = {
    "message": ItemShape(
        (*_ID_TYPE, ("role", str), ("content", list)),
        (*_ID_TYPE, ("role", str), ("content", list), ("status", str)),
    ),
    "reasoning": ItemShape((*_ID_TYPE, ("summary", list)), (*_ID_TYPE, ("summary", list))),
    "function_call": ItemShape(
        (*_ID_TYPE, ("call_id", str), ("name", str), ("arguments", str)),
        (*_ID_TYPE, ("call_id", str), ("name", str), ("arguments", str), ("status", str)),
    ),
    "custom_tool_call": ItemShape(
        (*_ID_TYPE, ("call_id", str), ("name", str), ("input", str)),
        (*_ID_TYPE, ("call_id", str), ("name", str), ("input", str)),
    ),
}
_DEFAULT_SHAPE = ItemShape(_ID_TYPE, _ID_TYPE)

PART_SHAPES: Final[dict[str, _FieldSpec]] = {
    "output_text": (("text", str), ("annotations", list)),
    "refusal": (("refusal", str),),
    "reasoning_text": (("text", str),),
    "summary_text": (("text", str),),
}
# Where a part kind keeps its text inside the item, and which delta channels may feed it.
PART_TEXT_KEY: Final[dict[str, str]] = {
    piece.channel: piece.field
    for piece in events.PIECES.values()
    if piece.channel is not None and piece.scope != events.ITEM_FIELD
}

_USAGE_INTS = ("input_tokens", "output_tokens", "total_tokens")
_USAGE_DETAILS = (("input_tokens_details", "cached_tokens"), ("output_tokens_details", "reasoning_tokens"))


# ---------------------------------------------------------------------------------------------- state
class _Part:
    __slots__ = ("buf", "done_value", "kind", "open")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.buf: list[str] = []
        self.done_value: str | None = None
        self.open = True

    def value(self) -> str | None:
        """The part's final text as far as the stream told it.

        Deltas win over a contradicting ``*.done`` (already reported once), so one bad event is not
        reported again by every later event that repeats the text.
        """
        if self.buf:
            return "".join(self.buf)
        return self.done_value


class _Item:
    __slots__ = ("channels", "id", "kind", "next_part", "next_summary", "output_index", "parts", "summaries")

    def __init__(self, item_id: str, kind: str, output_index: int) -> None:
        self.id = item_id
        self.kind = kind
        self.output_index = output_index
        self.parts: dict[int, _Part] = {}
        self.summaries: dict[int, _Part] = {}
        self.next_part = 0
        self.next_summary = 0
        # Item-level delta channels (arguments, input, code, diff): a _Part without a part.
        self.channels: dict[str, _Part] = {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", dict: "object", list: "array"}
    if isinstance(expected, tuple):
        return " or ".join(names.get(t, t.__name__) for t in expected)
    return names.get(expected, expected.__name__)


@mypyc_attr(allow_interpreted_subclasses=True)
class StreamChecker:
    """Incremental checker: ``feed`` each event, then ``finish``; both return the new violations.

    ``keep=False`` is for long-lived watchers (the passthrough's upstream check): violations are only
    returned and counted, not kept in ``violations``, so a broken stream costs no memory per event.
    """

    def __init__(self, profile: Profile | str = "openai", *, keep: bool = True) -> None:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r} (expected one of {', '.join(PROFILES)})")
        self.profile = profile
        self._strict = profile == "strict-spec"
        self._codex = profile == "codex"
        self.violations: list[Violation] = []
        self.violation_count = 0
        self._keep = keep
        self._index = 0
        self._expected_seq = 0
        self._response_id: str | None = None
        self._terminal: str | None = None
        self._pending_error: int | None = None
        self._items: dict[str, _Item] = {}  # open items by id
        self._seen_ids: set[str] = set()
        self._done: list[dict[str, Any]] = []  # done items, in the order their done arrived
        self._done_by_index: dict[int, dict[str, Any]] = {}
        self._next_output_index = 0
        self._finished = False
        self._fast = _FAST_DELTAS_STRICT if self._strict else _FAST_DELTAS

    # ------------------------------------------------------------------ public
    def feed(self, event: Any) -> list[Violation]:
        """Check one event (a parsed JSON object) in stream order."""
        if self._finished:
            raise RuntimeError("finish() was already called")
        new: list[Violation] = []
        if type(event) is dict and self.feed_delta(event):
            return new
        index = self._index
        self._index += 1
        if not isinstance(event, dict) or not isinstance(event.get("type"), str) or not event["type"]:
            self._add(new, "event.type", index, f"event {index} has no string `type`")
            return new
        etype: str = event["type"]
        seq_raw = event.get("sequence_number")
        seq: int = seq_raw if isinstance(seq_raw, int) and not isinstance(seq_raw, bool) else index
        self._check_sequence(new, event, seq_raw, index)

        if index == 0 and etype != "response.created":
            self._add(new, "lifecycle.created_first", seq, f"first event is {etype!r}, not response.created")
        if self._pending_error is not None and etype != "response.failed":
            self._add(
                new,
                "error.not_failed",
                self._pending_error,
                f"`error` event #{self._pending_error} is followed by {etype!r}, not response.failed",
            )
        self._pending_error = None
        if self._terminal is not None:
            if etype in TERMINAL:
                self._add(new, "lifecycle.terminal_duplicate", seq, f"{etype} after {self._terminal}")
            else:
                self._add(new, "lifecycle.after_terminal", seq, f"{etype} after {self._terminal}")

        rule = EVENT_RULES.get(etype)
        if self._strict and etype not in SPEC_EVENTS:
            if etype.startswith("response.reasoning_text."):
                self._add(
                    new,
                    "spec.raw_reasoning",
                    seq,
                    f"{etype}: the spec names raw reasoning response.reasoning.*",
                )
            else:
                self._add(new, "event.unknown_type", seq, f"{etype} is not an Open Responses event type")
        if rule is None:
            self._check_unknown(new, event, etype, seq)
            return new
        if not self._check_fields(new, event, etype, rule.fields, seq):
            return new
        handler = _HANDLERS[rule.scope]
        handler(self, new, event, etype, rule, seq)
        return new

    def feed_delta(self, event: dict[str, Any]) -> bool:
        """:meth:`feed`'s fast path alone: True when ``event`` is a text or reasoning delta that the
        full rules take without a word (it has then been fed); False, with nothing changed, when
        :meth:`feed` must judge it. A relay that already holds the parsed event calls this first."""
        etype = event.get("type")
        if type(etype) is not str:
            return False
        fast = self._fast.get(etype)
        seq = event.get("sequence_number")
        if (
            fast is None
            or type(seq) is not int
            or seq != self._expected_seq
            or not self._index
            or self._terminal is not None
            or self._pending_error is not None
            or self._finished
            or not self._fast_delta(event, fast)
        ):
            return False
        self._index += 1
        self._expected_seq = seq + 1
        return True

    def feed_all(self, events: Iterable[Any]) -> list[Violation]:
        """Feed several events; return the violations they produced."""
        out: list[Violation] = []
        for event in events:
            out.extend(self.feed(event))
        return out

    def finish(self) -> list[Violation]:
        """End of stream: report what never happened (terminal event, item dones, failed after error)."""
        if self._finished:
            return []
        self._finished = True
        new: list[Violation] = []
        at = self._expected_seq
        if self._pending_error is not None:
            self._add(new, "error.not_failed", self._pending_error, "the stream ends after an `error` event")
        if self._terminal is None:
            self._add(new, "lifecycle.terminal_missing", at, "no response.completed/incomplete/failed")
            self._report_open_items(new, at)
        return new

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    @property
    def done_items(self) -> list[dict[str, Any]]:
        """The items of every ``output_item.done`` seen so far, in arrival order."""
        return list(self._done)

    # ------------------------------------------------------------------ helpers
    def _fast_delta(self, event: dict[str, Any], fast: _FastDelta) -> bool:
        """A delta into an open part that the full rules would take without a word: append it and
        say so; anything else (a wrong type, a closed part…) returns False for the full rules to judge.

        Same outcome as ``_check_fields`` then ``_on_content``/``_on_summary`` for the events that make
        up most of a stream, at a fraction of their cost (the passthrough checks every upstream event).
        """
        fields, summary, channel = fast
        for name, expected in fields:
            if type(event.get(name)) is not expected:
                return False
        item = self._items.get(event["item_id"])
        if item is None or event["output_index"] != item.output_index:
            return False
        if summary:
            part = item.summaries.get(event["summary_index"])
        else:
            part = item.parts.get(event["content_index"])
        if part is None or not part.open or (not summary and part.kind != channel):
            return False
        part.buf.append(event["delta"])
        return True

    def _add(self, new: list[Violation], rule: str, seq: int, message: str) -> None:
        violation = Violation(rule, seq, message)
        new.append(violation)
        self.violation_count += 1
        if self._keep:
            self.violations.append(violation)

    def _check_sequence(self, new: list[Violation], event: dict[str, Any], seq_raw: Any, index: int) -> None:
        if not isinstance(seq_raw, int) or isinstance(seq_raw, bool):
            what = "missing" if "sequence_number" not in event else f"{seq_raw!r}"
            self._add(new, "sequence.integer", index, f"{event['type']}: sequence_number is {what}")
            # Assume it held its slot so one bad event does not cascade into contiguity errors.
            self._expected_seq += 1
            return
        if seq_raw != self._expected_seq:
            self._add(
                new,
                "sequence.contiguous",
                seq_raw,
                f"{event['type']}: sequence_number {seq_raw}, expected {self._expected_seq}",
            )
        self._expected_seq = seq_raw + 1

    def _check_fields(
        self,
        new: list[Violation],
        obj: dict[str, Any],
        what: str,
        fields: _FieldSpec,
        seq: int,
        rule: str = "event.field",
        show_value: bool = True,
    ) -> bool:
        ok = True
        for name, expected in fields:
            value = obj.get(name)
            # (A type test inlined, rather than two calls: this runs for every field of every event.)
            if expected is int:
                if isinstance(value, int) and not isinstance(value, bool):
                    continue
            elif isinstance(value, expected):
                continue
            state = "missing" if name not in obj else f"not {_type_name(expected)}"
            if show_value and name in obj:
                state += f": {value!r:.60}"
            self._add(new, rule, seq, f"{what}: `{name}` {state}")
            ok = False
        return ok

    def _check_shape(
        self, new: list[Violation], rule: str, obj: dict[str, Any], what: str, fields: _FieldSpec, seq: int
    ) -> None:
        self._check_fields(new, obj, what, fields, seq, rule, show_value=False)

    def _open_item(self, new: list[Violation], event: dict[str, Any], etype: str, seq: int) -> _Item | None:
        item_id = event["item_id"]
        item = self._items.get(item_id)
        if item is None:
            state = "already done" if item_id in self._seen_ids else "never added"
            self._add(new, "item.not_open", seq, f"{etype}: item {item_id!r} is {state}")
            return None
        if event["output_index"] != item.output_index:
            self._add(
                new,
                "item.output_index",
                seq,
                f"{etype}: output_index {event['output_index']}, item {item_id!r} is at {item.output_index}",
            )
        return item

    def _check_unknown(self, new: list[Violation], event: dict[str, Any], etype: str, seq: int) -> None:
        """Unknown types are ignored by clients, but an item they name must still be open."""
        if isinstance(event.get("item_id"), str) and _is_int(event.get("output_index")):
            self._open_item(new, event, etype, seq)

    def _report_open_items(self, new: list[Violation], seq: int) -> None:
        for item in self._items.values():
            self._add(new, "item.not_done", seq, f"{item.kind} {item.id!r} was added but never done")

    def _check_usage(self, new: list[Violation], usage: Any, etype: str, seq: int) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            self._add(new, "usage.shape", seq, f"{etype}: usage is not an object")
            return
        for key in _USAGE_INTS:
            if not _is_int(usage.get(key)):
                self._add(
                    new, "usage.shape", seq, f"{etype}: usage.{key} is {usage.get(key)!r}, not an integer"
                )
        for details, key in _USAGE_DETAILS:
            obj = usage.get(details)
            if not isinstance(obj, dict) or not _is_int(obj.get(key)):
                self._add(new, "usage.shape", seq, f"{etype}: usage.{details}.{key} is not an integer")

    # ------------------------------------------------------------------ scopes
    def _on_lifecycle(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        response: dict[str, Any] = event["response"]
        rid = response.get("id")
        if not isinstance(rid, str):
            self._add(new, "event.field", seq, f"{etype}: response.id is not a string")
        elif self._response_id is None:
            self._response_id = rid
        elif rid != self._response_id:
            self._add(
                new, "lifecycle.response_id", seq, f"{etype}: response id {rid!r}, was {self._response_id!r}"
            )
        status = response.get("status")
        if status not in LIFECYCLE_STATUS[etype]:
            self._add(new, "lifecycle.status", seq, f"{etype}: response.status is {status!r}")
        self._check_usage(new, response.get("usage"), etype, seq)
        if self._strict:
            missing = [key for key in SPEC_RESPONSE_FIELDS if key not in response]
            if missing:
                self._add(new, "spec.response_fields", seq, f"{etype}: response lacks {', '.join(missing)}")
        if etype in TERMINAL and self._terminal is None:
            self._terminal = etype
            self._report_open_items(new, seq)
            self._check_output(new, response.get("output"), etype, seq)

    def _check_output(self, new: list[Violation], output: Any, etype: str, seq: int) -> None:
        if not isinstance(output, list):
            self._add(new, "event.field", seq, f"{etype}: response.output is not an array")
            return
        expected = [self._done_by_index[i] for i in sorted(self._done_by_index)]
        # A failed response may drop its partial output; what it does list must still match.
        if etype == "response.failed" and not output:
            return
        if len(output) != len(expected):
            got_ids = [o.get("id") if isinstance(o, dict) else o for o in output]
            want_ids = [o.get("id") for o in expected]
            self._add(new, "output.mismatch", seq, f"{etype}: output ids {got_ids}, items done {want_ids}")
            return
        for position, (got, want) in enumerate(zip(output, expected, strict=True)):
            if _comparable(got) != _comparable(want):
                got_id = got.get("id") if isinstance(got, dict) else got
                self._add(
                    new,
                    "output.mismatch",
                    seq,
                    f"{etype}: output[{position}] ({got_id!r}) differs from its output_item.done item "
                    f"({want.get('id')!r}){_first_difference(got, want)}",
                )

    def _on_item_added(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        item: dict[str, Any] = event["item"]
        kind = item.get("type")
        shape = ITEM_SHAPES.get(kind, _DEFAULT_SHAPE) if isinstance(kind, str) else _DEFAULT_SHAPE
        # The spec's item models require the done fields (e.g. `status`) already in `.added`.
        self._check_shape(
            new, "item.shape", item, f"{etype} {kind}", shape.done if self._strict else shape.added, seq
        )
        self._check_item_extras(new, item, kind, etype, seq)
        item_id = item.get("id")
        if not isinstance(item_id, str) or not isinstance(kind, str):
            return
        if event["output_index"] != self._next_output_index:
            self._add(
                new,
                "item.output_index",
                seq,
                f"{etype}: output_index {event['output_index']}, expected {self._next_output_index}",
            )
        self._next_output_index = max(self._next_output_index, event["output_index"]) + 1
        if item_id in self._seen_ids:
            self._add(new, "item.duplicate_id", seq, f"{etype}: item id {item_id!r} was already used")
            if item_id in self._items:
                return
        self._seen_ids.add(item_id)
        state = _Item(item_id, kind, event["output_index"])
        code = item.get("code")
        if kind == "code_interpreter_call" and isinstance(code, str) and code:
            state.channels["code"] = _Part("code")
            state.channels["code"].buf.append(code)
        self._items[item_id] = state

    def _check_item_extras(
        self, new: list[Violation], item: dict[str, Any], kind: Any, etype: str, seq: int
    ) -> None:
        if self._strict and isinstance(kind, str) and kind not in SPEC_ITEM_TYPES:
            self._add(
                new, "spec.item_type", seq, f"{etype}: item type {kind!r} is an extension, not core spec"
            )
        if kind == "message" and isinstance(item.get("content"), list):
            for part in item["content"]:
                if isinstance(part, dict):
                    self._check_part(new, part, f"{etype} message part", seq)

    def _check_part(self, new: list[Violation], part: dict[str, Any], what: str, seq: int) -> None:
        ptype = part.get("type")
        if not isinstance(ptype, str):
            self._add(new, "part.shape", seq, f"{what}: part has no string `type`")
            return
        self._check_shape(new, "part.shape", part, f"{what} {ptype}", PART_SHAPES.get(ptype, ()), seq)
        if self._codex and ptype == "refusal":
            self._add(new, "codex.refusal_part", seq, f"{what}: a refusal part makes Codex drop the message")

    def _on_item_done(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        item: dict[str, Any] = event["item"]
        kind = item.get("type")
        shape = ITEM_SHAPES.get(kind, _DEFAULT_SHAPE) if isinstance(kind, str) else _DEFAULT_SHAPE
        self._check_shape(new, "item.shape", item, f"{etype} {kind}", shape.done, seq)
        self._check_item_extras(new, item, kind, etype, seq)
        item_id = item.get("id")
        if not isinstance(item_id, str):
            return
        state = self._items.pop(item_id, None)
        if state is None:
            what = "already done" if item_id in self._seen_ids else "never added"
            self._add(new, "item.not_open", seq, f"{etype}: item {item_id!r} is {what}")
            return
        if state.kind != kind or state.output_index != event["output_index"]:
            self._add(
                new,
                "item.done_mismatch",
                seq,
                f"{etype}: item {item_id!r} was added as {state.kind} #{state.output_index}, "
                f"done as {kind} #{event['output_index']}",
            )
        for index, part in list(state.parts.items()) + list(state.summaries.items()):
            if part.open:
                self._add(new, "content.part_open", seq, f"{etype}: {part.kind} part {index} is still open")
        self._check_done_content(new, state, item, seq)
        self._done.append(item)
        self._done_by_index[state.output_index] = item

    def _check_done_content(self, new: list[Violation], state: _Item, item: dict[str, Any], seq: int) -> None:
        """The done item must hold what its deltas and ``*.done`` events said."""
        for container, parts in (("content", state.parts), ("summary", state.summaries)):
            listed = item.get(container)
            for index, part in parts.items():
                value = part.value()
                if value is None:
                    continue
                got = None
                if isinstance(listed, list) and index < len(listed) and isinstance(listed[index], dict):
                    got = listed[index].get(PART_TEXT_KEY.get(part.kind, "text"))
                if got != value:
                    self._add(
                        new,
                        "item.content_mismatch",
                        seq,
                        f"output_item.done {state.id!r}: {container}[{index}] is {got!r:.60}, "
                        f"streamed {value!r:.60}",
                    )
        for field, channel in state.channels.items():
            value = channel.value()
            if value is not None and field in item and item[field] != value:
                self._add(
                    new,
                    "item.content_mismatch",
                    seq,
                    f"output_item.done {state.id!r}: {field} is {item[field]!r:.60}, streamed {value!r:.60}",
                )

    def _on_item(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        item = self._open_item(new, event, etype, seq)
        if item is None or rule.channel is None:
            return
        channel = item.channels.get(rule.channel)
        if channel is None:
            channel = item.channels[rule.channel] = _Part(rule.channel)
        self._feed_channel(new, channel, event, etype, rule, seq)

    def _feed_channel(
        self, new: list[Violation], part: _Part, event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        if rule.role == "delta":
            part.buf.append(event["delta"])
            return
        value: str = event[rule.done_field]
        # A done without any delta is how OpenAI delivers unstreamed text (and the builder a no-argument
        # call's "{}"); only a done that contradicts streamed deltas is wrong.
        if part.buf:
            streamed = "".join(part.buf)
            if streamed != value:
                self._add(
                    new,
                    "delta.done_mismatch",
                    seq,
                    f"{etype}: {rule.done_field} {value!r:.60} differs from the deltas {streamed!r:.60}",
                )
        part.done_value = value

    def _on_part_added(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        self._part_added(new, event, etype, seq, "content_index", "content")

    def _on_summary_added(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        self._part_added(new, event, etype, seq, "summary_index", "summary")

    def _part_added(
        self, new: list[Violation], event: dict[str, Any], etype: str, seq: int, key: str, family: str
    ) -> None:
        item = self._open_item(new, event, etype, seq)
        part: dict[str, Any] = event["part"]
        self._check_part(new, part, etype, seq)
        if item is None:
            return
        index: int = event[key]
        parts, expected = (
            (item.parts, item.next_part) if family == "content" else (item.summaries, item.next_summary)
        )
        if index != expected:
            self._add(new, f"{family}.part_order", seq, f"{etype}: {key} {index}, expected {expected}")
        ptype = part.get("type")
        parts[index] = state = _Part(ptype if isinstance(ptype, str) else "")
        initial = part.get(PART_TEXT_KEY.get(state.kind, "text"))
        if isinstance(initial, str) and initial:
            state.buf.append(initial)
        if family == "content":
            item.next_part = max(expected, index) + 1
        else:
            item.next_summary = max(expected, index) + 1

    def _find_part(
        self, new: list[Violation], event: dict[str, Any], etype: str, seq: int, key: str, family: str
    ) -> _Part | None:
        item = self._open_item(new, event, etype, seq)
        if item is None:
            return None
        index = event[key]
        part = (item.parts if family == "content" else item.summaries).get(index)
        if part is None or not part.open:
            state = "already done" if part is not None else "never added"
            self._add(
                new, f"{family}.part_not_open", seq, f"{etype}: {key} {index} of {item.id!r} is {state}"
            )
            return None
        return part

    def _on_content(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        part = self._find_part(new, event, etype, seq, "content_index", "content")
        if part is None or rule.channel is None:
            return
        if part.kind != rule.channel:
            self._add(new, "content.part_type", seq, f"{etype} into a {part.kind!r} part")
            return
        self._feed_channel(new, part, event, etype, rule, seq)

    def _on_summary(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        part = self._find_part(new, event, etype, seq, "summary_index", "summary")
        if part is not None:
            self._feed_channel(new, part, event, etype, rule, seq)

    def _on_part_done(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        self._part_done(new, event, etype, seq, "content_index", "content")

    def _on_summary_done(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        self._part_done(new, event, etype, seq, "summary_index", "summary")

    def _part_done(
        self, new: list[Violation], event: dict[str, Any], etype: str, seq: int, key: str, family: str
    ) -> None:
        part = self._find_part(new, event, etype, seq, key, family)
        payload: dict[str, Any] = event["part"]
        self._check_part(new, payload, etype, seq)
        if part is None:
            return
        part.open = False
        text = payload.get(PART_TEXT_KEY.get(part.kind, "text"))
        value = part.value()
        if payload.get("type") != part.kind:
            self._add(
                new,
                "content.part_type",
                seq,
                f"{etype}: part type {payload.get('type')!r}, added as {part.kind!r}",
            )
        elif value is not None and text != value:
            self._add(
                new,
                "delta.done_mismatch",
                seq,
                f"{etype}: part text {text!r:.60} differs from the streamed {value!r:.60}",
            )
        if isinstance(text, str):
            part.done_value = text

    def _on_error(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        nested = event.get("error")
        if self._strict:
            if not isinstance(nested, dict):
                self._add(new, "error.shape", seq, "error: no nested `error` object")
            else:
                self._check_shape(
                    new, "error.shape", nested, "error.error", (("type", str), ("message", str)), seq
                )
        elif not isinstance(event.get("message"), str) and not (
            isinstance(nested, dict) and isinstance(nested.get("message"), str)
        ):
            self._add(new, "error.shape", seq, "error: no `message`, top-level or nested")
        self._pending_error = seq

    def _on_global(
        self, new: list[Violation], event: dict[str, Any], etype: str, rule: EventRule, seq: int
    ) -> None:
        return


# Delta events the checker takes on its fast path (``StreamChecker._fast_delta``): their required
# fields with the one exact type each must have, whether they address a summary part, their channel.
_FastDelta = tuple[tuple[tuple[str, type], ...], bool, str]


def _fast_deltas(strict: bool) -> dict[str, _FastDelta]:
    out: dict[str, _FastDelta] = {}
    for name, rule in EVENT_RULES.items():
        if rule.role != "delta" or rule.scope not in (CONTENT, SUMMARY) or rule.channel is None:
            continue
        if strict and name not in SPEC_EVENTS:
            continue
        fields = tuple((field, expected) for field, expected in rule.fields if isinstance(expected, type))
        if len(fields) != len(rule.fields):
            continue
        out[name] = (fields, rule.scope == SUMMARY, rule.channel)
    return out


_FAST_DELTAS: Final[dict[str, _FastDelta]] = _fast_deltas(strict=False)
_FAST_DELTAS_STRICT: Final[dict[str, _FastDelta]] = _fast_deltas(strict=True)

_HANDLERS = {
    LIFECYCLE: StreamChecker._on_lifecycle,
    ITEM_ADDED: StreamChecker._on_item_added,
    ITEM_DONE: StreamChecker._on_item_done,
    ITEM: StreamChecker._on_item,
    PART_ADDED: StreamChecker._on_part_added,
    PART_DONE: StreamChecker._on_part_done,
    CONTENT: StreamChecker._on_content,
    SUMMARY_ADDED: StreamChecker._on_summary_added,
    SUMMARY_DONE: StreamChecker._on_summary_done,
    SUMMARY: StreamChecker._on_summary,
    ERROR: StreamChecker._on_error,
    GLOBAL: StreamChecker._on_global,
}


# OpenAI re-encrypts reasoning state for every snapshot, so ``encrypted_content`` legitimately differs
# between an item's ``output_item.done`` and the terminal ``output``; it is opaque, never compared.
_VOLATILE_ITEM_KEYS = frozenset({"encrypted_content"})


def _comparable(item: Any) -> Any:
    if isinstance(item, dict) and not _VOLATILE_ITEM_KEYS.isdisjoint(item):
        return {k: v for k, v in item.items() if k not in _VOLATILE_ITEM_KEYS}
    return item


def _first_difference(got: Any, want: Any) -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted((set(got) | set(want)) - _VOLATILE_ITEM_KEYS):
            if got.get(key) != want.get(key):
                return f": `{key}` differs"
    return ""


def check(events: Iterable[Any], *, profile: Profile | str = "openai") -> list[Violation]:
    """Check a whole stream of parsed events; an empty list means it is clean."""
    checker = StreamChecker(profile)
    checker.feed_all(events)
    checker.finish()
    return checker.violations


_FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "queued", "in_progress", "cancelled"})


def check_response(body: Any, *, profile: Profile | str = "openai") -> list[Violation]:
    """Check a non-streamed Response body (``stream: false``): the shapes its items and usage need."""
    checker = StreamChecker(profile)
    new: list[Violation] = []
    if not isinstance(body, dict):
        checker._add(new, "response.shape", 0, "the body is not a JSON object")
        return new
    if body.get("object") != "response":
        checker._add(new, "response.shape", 0, f"`object` is {body.get('object')!r}, not 'response'")
    checker._check_fields(new, body, "response", (("id", str), ("status", str), ("output", list)), 0)
    if isinstance(body.get("status"), str) and body["status"] not in _FINAL_STATUSES:
        checker._add(new, "response.shape", 0, f"`status` is {body['status']!r}")
    checker._check_usage(new, body.get("usage"), "response", 0)
    if checker._strict:
        missing = [key for key in SPEC_RESPONSE_FIELDS if key not in body]
        if missing:
            checker._add(new, "spec.response_fields", 0, f"response lacks {', '.join(missing)}")
    for position, item in enumerate(body.get("output") or ()):
        if not isinstance(item, dict):
            checker._add(new, "item.shape", 0, f"output[{position}] is not an object")
            continue
        kind = item.get("type")
        shape = ITEM_SHAPES.get(kind, _DEFAULT_SHAPE) if isinstance(kind, str) else _DEFAULT_SHAPE
        checker._check_shape(new, "item.shape", item, f"output[{position}] {kind}", shape.done, 0)
        checker._check_item_extras(new, item, kind, f"output[{position}]", 0)
    return new
