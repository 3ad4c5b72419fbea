"""Accumulator: turns a Responses event stream back into the Response it describes.

It reads the stream the way a tolerant client does. Items start from ``output_item.added`` and grow
from the deltas; every ``.done`` value (the piece's, then the item's) is the server's final word and
replaces the reconstruction, and where the two disagree the finding goes to :attr:`discrepancies`.
The terminal snapshot, when the stream has one, is the final Response; its ``output`` is checked
against the streamed items.

Besides OpenAI's spelling it reads the dialects seen in the wild: the Open Responses spec
(``response.reasoning.*``, ``response.output_text_annotation.added``, object deltas) and older servers
(``response.text.done``, ``response.function_call.arguments.*``, ``response.code_interpreter.call.*``).
Every spelling, legacy ones included, is declared once in :mod:`.events`; ``HANDLERS`` is derived from
that vocabulary at import.

Events are located by ``item_id``, falling back to ``output_index`` (some servers rotate item ids
between events), then ``call_id``. Text arrives in many small deltas, so pieces are kept as lists of
strings and joined only when a value is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from . import events

__all__ = ["Accumulator", "accumulate"]

JSON = dict[str, Any]


# ---------------------------------------------------------------------------------------------- pieces
# A "piece" is one streamed string inside an item: a text part, a summary part, the arguments... Each
# kind knows how to read and write its value in an item, and how to create its container when a
# delta arrives before (or without) its ``added`` event.


def _part(item: JSON, key: str, index: int, factory: Callable[[], JSON]) -> JSON:
    parts = item.get(key)
    if not isinstance(parts, list):
        parts = item[key] = []
    while len(parts) <= index:
        parts.append(factory())
    part: JSON = parts[index]
    return part


def _get_part(item: JSON, key: str, index: int, field: str) -> Any:
    parts = item.get(key)
    if isinstance(parts, list) and 0 <= index < len(parts) and isinstance(parts[index], dict):
        return parts[index].get(field)
    return None


def _output_text() -> JSON:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}


def _refusal() -> JSON:
    return {"type": "refusal", "refusal": ""}


def _reasoning_text() -> JSON:
    return {"type": "reasoning_text", "text": ""}


def _summary_text() -> JSON:
    return {"type": "summary_text", "text": ""}


def _shell_output() -> JSON:
    return {"stdout": "", "stderr": ""}


def _part_piece(key: str, field: str, factory: Callable[[], JSON]) -> tuple[Reader, Writer]:
    def read(item: JSON, index: int) -> Any:
        return _get_part(item, key, index, field)

    def write(item: JSON, index: int, value: str) -> None:
        _part(item, key, index, factory)[field] = value

    return read, write


def _field_piece(field: str) -> tuple[Reader, Writer]:
    def read(item: JSON, index: int) -> Any:
        return item.get(field)

    def write(item: JSON, index: int, value: str) -> None:
        item[field] = value

    return read, write


def _read_diff(item: JSON, index: int) -> Any:
    operation = item.get("operation")
    return operation.get("diff") if isinstance(operation, dict) else None


def _write_diff(item: JSON, index: int, value: str) -> None:
    operation = item.get("operation")
    if not isinstance(operation, dict):
        operation = item["operation"] = {}
    operation["diff"] = value


def _commands(item: JSON) -> list[Any]:
    action = item.get("action")
    if not isinstance(action, dict):
        action = item["action"] = {}
    commands = action.get("commands")
    if not isinstance(commands, list):
        commands = action["commands"] = []
    return commands


def _read_command(item: JSON, index: int) -> Any:
    action = item.get("action")
    commands = action.get("commands") if isinstance(action, dict) else None
    return commands[index] if isinstance(commands, list) and 0 <= index < len(commands) else None


def _write_command(item: JSON, index: int, value: str) -> None:
    commands = _commands(item)
    while len(commands) <= index:
        commands.append("")
    commands[index] = value


def _read_logs(item: JSON, index: int) -> Any:
    for output in item.get("outputs") or ():
        if isinstance(output, dict) and output.get("type") == "logs":
            return output.get("logs")
    return None


def _write_logs(item: JSON, index: int, value: str) -> None:
    outputs = item.get("outputs")
    if not isinstance(outputs, list):
        outputs = item["outputs"] = []
    for output in outputs:
        if isinstance(output, dict) and output.get("type") == "logs":
            output["logs"] = value
            return
    outputs.append({"type": "logs", "logs": value})


Reader = Callable[[JSON, int], Any]
Writer = Callable[[JSON, int, str], None]

PIECES: dict[str, tuple[Reader, Writer]] = {
    "text": _part_piece("content", "text", _output_text),
    "refusal": _part_piece("content", "refusal", _refusal),
    "reasoning": _part_piece("content", "text", _reasoning_text),
    "summary": _part_piece("summary", "text", _summary_text),
    "stdout": _part_piece("output", "stdout", _shell_output),
    "stderr": _part_piece("output", "stderr", _shell_output),
    "arguments": _field_piece("arguments"),
    "input": _field_piece("input"),
    "code": _field_piece("code"),
    "diff": (_read_diff, _write_diff),
    "command": (_read_command, _write_command),
    "logs": (_read_logs, _write_logs),
}

# The item type a piece implies, for streams that send deltas for an item they never added.
PIECE_ITEM_TYPES: dict[str, str] = {name: piece.item_type for name, piece in events.PIECES.items()}

# Every spelling of a delta or done, derived from the vocabulary (events.py) once:
# event type -> (piece kind, the event field holding the piece index or None)
DELTA_EVENTS: dict[str, tuple[str, str | None]] = {
    name: (event.piece.name, event.piece.index_field)
    for name, event in events.SPELLINGS.items()
    if event.family == events.DELTA and event.piece is not None
}
# event type -> (piece kind, index field, the event field holding the final value)
DONE_EVENTS: dict[str, tuple[str, str | None, str]] = {
    name: (event.piece.name, event.piece.index_field, event.field)
    for name, event in events.SPELLINGS.items()
    if event.family == events.DONE and event.piece is not None
}


def _text_of(value: Any) -> str:
    """A delta or final value as text: spec dialects wrap text as ``{"text": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    if value is None:
        return ""
    return orjson.dumps(value).decode()


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _copy(value: JSON) -> JSON:
    # Items from ``added`` events are mutated as deltas arrive; the caller's event must stay intact.
    copied: JSON = orjson.loads(orjson.dumps(value))
    return copied


class _Slot:
    """One output item being reconstructed."""

    __slots__ = ("bufs", "done", "index", "item", "merged_args", "partial_image", "settled")

    def __init__(self, index: int, item: JSON) -> None:
        self.index = index
        self.item = item
        self.bufs: dict[tuple[str, int], list[str]] = {}
        self.done = False
        self.merged_args: JSON | None = None
        self.partial_image: str | None = None
        # Pieces whose value came from a ``.done`` event rather than from deltas alone.
        self.settled: set[tuple[str, int]] = set()

    def label(self) -> str:
        return f"output[{self.index}] {self.item.get('type')} {self.item.get('id')}"

    def materialize(self) -> JSON:
        """Write every buffered piece into the item and return it."""
        item = self.item
        for (kind, index), buf in self.bufs.items():
            if len(buf) > 1:
                buf[:] = ["".join(buf)]
            PIECES[kind][1](item, index, buf[0] if buf else "")
        return item


class Accumulator:
    """Feed events one at a time with :meth:`feed`; read :attr:`response`, :attr:`items` and findings."""

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}
        self._by_id: dict[str, _Slot] = {}
        self._by_call: dict[str, _Slot] = {}
        self.snapshot: JSON | None = None
        self.terminal: JSON | None = None
        self.status: str | None = None
        self.unknown_events: list[JSON] = []
        self.errors: list[JSON] = []
        self.discrepancies: list[str] = []
        self.ended = False
        self.event_count = 0

    # ------------------------------------------------------------------ feeding
    def feed(self, event: JSON) -> None:
        """Take one event (a parsed dict)."""
        self.event_count += 1
        kind = event.get("type")
        if self.terminal is not None and kind != "ping":
            self.discrepancies.append(f"event {kind!r} after the terminal {self.terminal.get('type')!r}")
            return
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self.unknown_events.append(event)
            return
        handler(self, event)

    def feed_all(self, events: Iterable[JSON]) -> Accumulator:
        """Feed many events; returns self so calls chain."""
        for event in events:
            self.feed(event)
        return self

    def end(self) -> None:
        """Mark the end of the stream (a stream without a terminal event then reads as incomplete)."""
        self.ended = True

    @property
    def finished(self) -> bool:
        """Whether a terminal event (completed, incomplete or failed) arrived."""
        return self.terminal is not None

    # ------------------------------------------------------------------ results
    @property
    def items(self) -> list[JSON]:
        """The reconstructed output items, in output order."""
        return [self._slots[i].materialize() for i in sorted(self._slots)]

    @property
    def response(self) -> JSON:
        """The Response: the terminal snapshot (with streamed items if it has no output), else built."""
        items = self.items
        if self.terminal is not None:
            resp = dict(self.terminal.get("response") or {})
            output = resp.get("output")
            if output is None or (not output and items):
                resp["output"] = items
            return resp
        resp = dict(self.snapshot) if self.snapshot is not None else {"object": "response"}
        if not self.ended:
            resp["status"] = self.status or "in_progress"
            resp["output"] = items
            return resp
        if self.errors:
            resp["status"] = "failed"
            resp["error"] = _error_object(self.errors[-1])
        else:
            resp["status"] = "incomplete"
        # Items the stream never finished are cut short, as the server would have marked them.
        resp["output"] = [
            dict(slot.item, status="incomplete")
            if not slot.done and slot.item.get("status") == "in_progress"
            else slot.item
            for slot in (self._slots[i] for i in sorted(self._slots))
        ]
        return resp

    # ------------------------------------------------------------------ lifecycle
    def _check_response_id(self, event: JSON, resp: JSON) -> None:
        previous = self.snapshot
        if previous is not None and previous.get("id") != resp.get("id"):
            self.discrepancies.append(
                f"{event['type']}: response id {resp.get('id')!r} differs from the earlier "
                f"{previous.get('id')!r}"
            )

    def _on_lifecycle(self, event: JSON) -> None:
        resp = event.get("response")
        if not isinstance(resp, dict):
            self.discrepancies.append(f"{event['type']} without a response object")
            return
        self._check_response_id(event, resp)
        self.snapshot = resp
        self.status = resp.get("status") or event["type"].removeprefix("response.")

    def _on_terminal(self, event: JSON) -> None:
        resp = event.get("response")
        if not isinstance(resp, dict):
            self.discrepancies.append(f"{event['type']} without a response object")
            resp = {}
            event = dict(event, response=resp)
        self._check_response_id(event, resp)
        self.terminal = event
        self.status = resp.get("status") or event["type"].removeprefix("response.")
        for slot in self._slots.values():
            if not slot.done:
                self.discrepancies.append(f"{slot.label()}: no output_item.done before {event['type']}")
        output = resp.get("output")
        if isinstance(output, list) and (output or not self._slots):
            self._compare_output(output)
        elif self._slots:
            self.discrepancies.append(
                f"{event['type']}: snapshot has no output, the stream produced {len(self._slots)} item(s)"
            )

    def _compare_output(self, output: list[Any]) -> None:
        items = self.items
        if len(output) != len(items):
            self.discrepancies.append(
                f"terminal output has {len(output)} item(s), the stream produced {len(items)}"
            )
        for index, (ours, theirs) in enumerate(zip(items, output, strict=False)):
            if ours == theirs:
                continue
            if not isinstance(theirs, dict):
                self.discrepancies.append(f"terminal output[{index}] is not an object")
                continue
            keys = sorted(
                k for k in set(ours) | set(theirs) if not _same_field(k, ours.get(k), theirs.get(k))
            )
            if not keys:
                continue
            self.discrepancies.append(
                f"terminal output[{index}] {theirs.get('type')} {theirs.get('id')} differs from the "
                f"streamed item in {', '.join(keys)}"
            )

    def _on_error(self, event: JSON) -> None:
        self.errors.append(event)

    # ------------------------------------------------------------------ locating items
    def _new_slot(self, index: int, item: JSON) -> _Slot:
        slot = _Slot(index, item)
        self._slots[index] = slot
        self._index_slot(slot)
        return slot

    def _index_slot(self, slot: _Slot) -> None:
        item_id = slot.item.get("id")
        if isinstance(item_id, str):
            self._by_id[item_id] = slot
        call_id = slot.item.get("call_id")
        if isinstance(call_id, str):
            self._by_call[call_id] = slot

    def _find(self, event: JSON) -> _Slot | None:
        item_id = event.get("item_id")
        if item_id is not None:
            slot = self._by_id.get(item_id)
            if slot is not None:
                return slot
        index = event.get("output_index")
        if isinstance(index, int):
            slot = self._slots.get(index)
            if slot is not None:
                return slot
        call_id = event.get("call_id")
        if isinstance(call_id, str):
            return self._by_call.get(call_id)
        return None

    def _slot_for(self, event: JSON, piece: str) -> _Slot:
        """The slot an event is about, created (and reported) when the item was never added."""
        slot = self._find(event)
        if slot is not None:
            return slot
        index = event.get("output_index")
        if not isinstance(index, int) or index in self._slots:
            index = max(self._slots, default=-1) + 1
        item: JSON = {"type": PIECE_ITEM_TYPES.get(piece, "unknown"), "status": "in_progress"}
        for key in ("item_id", "call_id"):
            if isinstance(event.get(key), str):
                item["id" if key == "item_id" else key] = event[key]
        self.discrepancies.append(f"{event['type']} for an item that was never added (output[{index}])")
        return self._new_slot(index, item)

    # ------------------------------------------------------------------ items
    def _on_item_added(self, event: JSON) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            self.discrepancies.append("response.output_item.added without an item")
            return
        index = event.get("output_index")
        if not isinstance(index, int):
            index = max(self._slots, default=-1) + 1
        if index in self._slots:
            self.discrepancies.append(f"output_item.added reuses output_index {index}")
        self._new_slot(index, _copy(item))

    def _on_item_done(self, event: JSON) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            self.discrepancies.append("response.output_item.done without an item")
            return
        index = event.get("output_index")
        slot = self._slots.get(index) if isinstance(index, int) else None
        if slot is None and isinstance(item.get("id"), str):
            slot = self._by_id.get(item["id"])
        if slot is None:
            # A complete item with no ``added`` before it: take it as it is.
            if not isinstance(index, int) or index in self._slots:
                index = max(self._slots, default=-1) + 1
            self.discrepancies.append(
                f"output[{index}] {item.get('type')} {item.get('id')}: done without added"
            )
            slot = self._new_slot(index, item)
            slot.done = True
            return
        ours = slot.materialize()
        label = slot.label()
        if ours.get("id") != item.get("id"):
            self.discrepancies.append(f"{label}: output_item.done has id {item.get('id')!r}")
        if ours.get("type") != item.get("type"):
            self.discrepancies.append(f"{label}: output_item.done has type {item.get('type')!r}")
        for (kind, piece_index), buf in slot.bufs.items():
            final = PIECES[kind][0](item, piece_index)
            streamed = buf[0] if buf else ""
            if final is not None and _text_of(final) != streamed:
                self.discrepancies.append(
                    f"{label}: {kind}[{piece_index}] is {_short(streamed)} from earlier events, "
                    f"output_item.done has {_short(final)}"
                )
        for index_, part in enumerate(ours.get("content") or ()):
            annotations = part.get("annotations") if isinstance(part, dict) else None
            if annotations:
                final_annotations = _get_part(item, "content", index_, "annotations")
                if final_annotations is not None and final_annotations != annotations:
                    self.discrepancies.append(f"{label}: annotations of content[{index_}] differ from done")
        image = slot.partial_image
        if image is not None and not item.get("result") and item.get("type") == "image_generation_call":
            # The last partial image is the best result a client has when the final one is missing.
            item = dict(item, result=image)
        slot.item = item
        slot.bufs = {}
        slot.done = True
        self._index_slot(slot)

    # ------------------------------------------------------------------ parts
    def _on_content_part(self, event: JSON) -> None:
        slot = self._slot_for(event, "text")
        part = event.get("part")
        index = event.get("content_index", 0)
        if isinstance(part, dict) and isinstance(index, int):
            _set_part(slot.item, "content", index, dict(part))

    def _on_content_part_done(self, event: JSON) -> None:
        slot = self._slot_for(event, "text")
        part = event.get("part")
        index = event.get("content_index", 0)
        if not isinstance(part, dict) or not isinstance(index, int):
            return
        kind = {"refusal": "refusal", "reasoning_text": "reasoning"}.get(part.get("type", ""), "text")
        field = "refusal" if kind == "refusal" else "text"
        self._settle(slot, event, kind, index, part.get(field))
        _set_part(slot.item, "content", index, part)

    def _on_summary_part(self, event: JSON) -> None:
        slot = self._slot_for(event, "summary")
        part = event.get("part")
        index = event.get("summary_index", 0)
        if isinstance(index, int):
            _set_part(slot.item, "summary", index, dict(part) if isinstance(part, dict) else _summary_text())

    def _on_summary_part_done(self, event: JSON) -> None:
        slot = self._slot_for(event, "summary")
        part = event.get("part")
        index = event.get("summary_index", 0)
        if not isinstance(part, dict) or not isinstance(index, int):
            return
        self._settle(slot, event, "summary", index, part.get("text"))
        _set_part(slot.item, "summary", index, part)

    def _on_annotation(self, event: JSON) -> None:
        slot = self._slot_for(event, "text")
        index = event.get("content_index", 0)
        annotation = event.get("annotation")
        if not isinstance(index, int) or annotation is None:
            return
        part = _part(slot.item, "content", index, _output_text)
        annotations = part.get("annotations")
        if not isinstance(annotations, list):
            annotations = part["annotations"] = []
        position = event.get("annotation_index")
        if isinstance(position, int) and position < len(annotations):
            annotations[position] = annotation
        else:
            if isinstance(position, int) and position != len(annotations):
                self.discrepancies.append(
                    f"{slot.label()}: annotation_index {position} where {len(annotations)} was next"
                )
            annotations.append(annotation)

    # ------------------------------------------------------------------ streamed pieces
    def _on_delta(self, event: JSON, kind: str, index_field: str | None) -> None:
        slot = self._slot_for(event, kind)
        index = event.get(index_field, 0) if index_field else 0
        delta = event.get("delta")
        if kind == "arguments" and isinstance(delta, dict) and "text" not in delta:
            # Spec MCP dialect: argument deltas are partial objects to merge.
            merged = slot.merged_args = {**(slot.merged_args or {}), **delta}
            slot.bufs[(kind, index)] = [orjson.dumps(merged).decode()]
            return
        text = delta if isinstance(delta, str) else _text_of(delta)
        buf = slot.bufs.get((kind, index))
        if buf is None:
            slot.bufs[(kind, index)] = [text]
            # Written at once so the piece's container (a part, a logs output) takes its place in the
            # order events arrived; later deltas are only joined when a value is needed.
            PIECES[kind][1](slot.item, index, text)
        else:
            buf.append(text)

    def _on_piece_done(self, event: JSON, kind: str, index_field: str | None, value_field: str) -> None:
        slot = self._slot_for(event, kind)
        index = event.get(index_field, 0) if index_field else 0
        if isinstance(index, int):
            self._settle(slot, event, kind, index, event.get(value_field))

    def _settle(self, slot: _Slot, event: JSON, kind: str, index: int, final: Any) -> None:
        """A piece's final value arrived: check it against the deltas, then keep it."""
        if final is None:
            return
        value = _text_of(final)
        key = (kind, index)
        buf = slot.bufs.get(key)
        if buf is not None:
            streamed = "".join(buf)
            if streamed != value:
                source = "earlier done events give" if key in slot.settled else "deltas give"
                self.discrepancies.append(
                    f"{slot.label()}: {kind}[{index}] {source} {_short(streamed)}, "
                    f"{event['type']} says {_short(value)}"
                )
        slot.bufs[key] = [value]
        slot.settled.add(key)
        PIECES[kind][1](slot.item, index, value)

    # ------------------------------------------------------------------ tools
    def _on_tool_phase(self, event: JSON) -> None:
        slot = self._find(event)
        if slot is None:
            self.discrepancies.append(f"{event['type']} for an item that was never added")
            return
        if "status" in slot.item:
            slot.item["status"] = event["type"].rsplit(".", 1)[1]

    def _on_partial_image(self, event: JSON) -> None:
        slot = self._find(event)
        if slot is None:
            self.discrepancies.append(f"{event['type']} for an item that was never added")
            return
        image = event.get("partial_image_b64")
        if isinstance(image, str):
            slot.partial_image = image

    def _on_output_image(self, event: JSON) -> None:
        slot = self._slot_for(event, "code")
        outputs = slot.item.get("outputs")
        if not isinstance(outputs, list):
            outputs = slot.item["outputs"] = []
        mime = event.get("mime_type") or "image/png"
        data = event.get("base64") or event.get("delta") or ""
        outputs.append({"type": "image", "url": f"data:{mime};base64,{_text_of(data)}"})

    def _on_command_added(self, event: JSON) -> None:
        slot = self._slot_for(event, "command")
        index = event.get("command_index", 0)
        if isinstance(index, int):
            command = _text_of(event.get("command"))
            slot.bufs[("command", index)] = [command] if command else []
            _write_command(slot.item, index, command)

    def _on_shell_output_delta(self, event: JSON) -> None:
        slot = self._slot_for(event, "stdout")
        index = event.get("command_index", 0)
        delta = event.get("delta")
        if not isinstance(index, int) or not isinstance(delta, dict):
            return
        for stream in ("stdout", "stderr"):
            chunk = delta.get(stream)
            if isinstance(chunk, str):
                slot.bufs.setdefault((stream, index), []).append(chunk)

    def _on_shell_output_done(self, event: JSON) -> None:
        slot = self._slot_for(event, "stdout")
        output = event.get("output")
        if not isinstance(output, list):
            return
        for kind, index in list(slot.bufs):
            if kind in ("stdout", "stderr"):
                final = _get_part({"output": output}, "output", index, kind)
                self._settle(slot, event, kind, index, final)
                del slot.bufs[(kind, index)]
        slot.item["output"] = output


def _set_part(item: JSON, key: str, index: int, part: JSON) -> None:
    parts = item.get(key)
    if not isinstance(parts, list):
        parts = item[key] = []
    while len(parts) < index:
        parts.append({})
    if index < len(parts):
        parts[index] = part
    else:
        parts.append(part)


def _same_field(key: str, ours: Any, theirs: Any) -> bool:
    """Equal, or both opaque reasoning blobs: OpenAI re-encrypts ``encrypted_content`` in every event."""
    if ours == theirs:
        return True
    return key == "encrypted_content" and isinstance(ours, str) and isinstance(theirs, str)


def _error_object(event: JSON) -> JSON:
    nested = event.get("error")
    source = nested if isinstance(nested, dict) else event
    return {"code": source.get("code"), "message": source.get("message")}


def _ignore(acc: Accumulator, event: JSON) -> None:
    """Events that carry nothing to accumulate (keepalives)."""


Handler = Callable[[Accumulator, JSON], None]


def _delta_handler(kind: str, index_field: str | None) -> Handler:
    def handle(acc: Accumulator, event: JSON) -> None:
        acc._on_delta(event, kind, index_field)

    return handle


def _done_handler(kind: str, index_field: str | None, value_field: str) -> Handler:
    def handle(acc: Accumulator, event: JSON) -> None:
        acc._on_piece_done(event, kind, index_field, value_field)

    return handle


# Vocabulary family -> handler, for the families whose events need nothing but their family's handler.
_FAMILY_HANDLERS: dict[str, Handler] = {
    events.ITEM_ADDED: Accumulator._on_item_added,
    events.ITEM_DONE: Accumulator._on_item_done,
    events.PART_ADDED: Accumulator._on_content_part,
    events.PART_DONE: Accumulator._on_content_part_done,
    events.SUMMARY_PART_ADDED: Accumulator._on_summary_part,
    events.SUMMARY_PART_DONE: Accumulator._on_summary_part_done,
    events.ANNOTATION: Accumulator._on_annotation,
    events.TOOL_PHASE: Accumulator._on_tool_phase,
    events.PARTIAL_IMAGE: Accumulator._on_partial_image,
    events.OUTPUT_IMAGE: Accumulator._on_output_image,
    events.COMMAND_ADDED: Accumulator._on_command_added,
    events.SHELL_OUTPUT_DELTA: Accumulator._on_shell_output_delta,
    events.SHELL_OUTPUT_DONE: Accumulator._on_shell_output_done,
    events.ERROR: Accumulator._on_error,
    events.KEEPALIVE: _ignore,
}


def _handler(event: events.EventType) -> Handler:
    if event.family == events.LIFECYCLE:
        return Accumulator._on_terminal if event.terminal else Accumulator._on_lifecycle
    piece = event.piece
    if piece is not None and event.family == events.DELTA:
        return _delta_handler(piece.name, piece.index_field)
    if piece is not None and event.family == events.DONE:
        return _done_handler(piece.name, piece.index_field, event.field)
    return _FAMILY_HANDLERS[event.family]


# Event type -> handler: every spelling of the vocabulary (legacy ones included), in one table built once.
HANDLERS: dict[str, Handler] = {name: _handler(event) for name, event in events.SPELLINGS.items()}


def accumulate(events: Iterable[JSON], *, ended: bool = True) -> Accumulator:
    """Feed a whole stream to a new :class:`Accumulator` (marked ended unless told otherwise)."""
    acc = Accumulator().feed_all(events)
    if ended:
        acc.end()
    return acc
