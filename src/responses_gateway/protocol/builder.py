"""StreamBuilder: the only code that emits Responses streaming events.

Providers and tools drive it through semantic calls (open a message, text delta, start a function
call, reasoning delta, finish). It alone assigns ``sequence_number``, item ids, ``output_index``,
``content_index`` and ``summary_index``; it emits every ``added`` before the deltas and every ``done``
with the full accumulated value, and keeps the Response snapshot that lifecycle events carry.

It is sans-IO: events are plain dicts appended to a pending list that the caller drains with
:meth:`StreamBuilder.take` and sends however it likes. Misuse raises :class:`BuilderError` at once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from . import events
from .events import TERMINAL_EVENTS
from .json_field import StringFieldStream
from .native import mypyc_attr
from .response import ID_PREFIXES, JSON, make_usage, new_id
from .sse import text_delta_frame, text_delta_middle
from .stop import StopScanner

__all__ = [
    "TERMINAL_EVENTS",
    "BuilderError",
    "HostedCall",
    "HostedSpec",
    "Item",
    "StreamBuilder",
    "error_event",
]

RawReasoningSpelling = Literal["reasoning_text", "reasoning"]
KeepaliveMode = Literal["in_progress", "ping"]

# Built-in tool call items and the progress phases each may report between ``in_progress`` (emitted by
# open_tool_call) and ``completed`` (or, for MCP, ``failed``; emitted by close_tool_call). Events are
# named ``response.<kind>.<phase>``; the phases are declared in the vocabulary (events.TOOL_CALLS).
TOOL_PHASES: dict[str, tuple[str, ...]] = {kind: call.progress for kind, call in events.TOOL_CALLS.items()}

# Events whose meaning only the builder may produce (see StreamBuilder.passthrough).
_OWNED_FAMILIES = frozenset(
    {
        events.LIFECYCLE,
        events.ITEM_ADDED,
        events.ITEM_DONE,
        events.PART_ADDED,
        events.PART_DONE,
        events.SUMMARY_PART_ADDED,
        events.SUMMARY_PART_DONE,
        events.ERROR,
    }
)
_OWNED_EVENTS = frozenset(
    name for name, event in events.EVENT_TYPES.items() if event.family in _OWNED_FAMILIES
)


@mypyc_attr(native_class=False)
class BuilderError(RuntimeError):
    """A provider drove the builder in a way that would emit an invalid stream."""


@dataclass(frozen=True, slots=True)
class HostedSpec:
    """How a function the gateway runs itself is shown to the client (``StreamBuilder.hosted``).

    ``kind``: the item type (``code_interpreter_call``); ``fields``: the item's fields when it opens;
    ``stream_key``: the argument (a JSON string) whose text streams as the item's code, if any.
    """

    kind: str
    fields: JSON = field(default_factory=dict)
    stream_key: str | None = None


class HostedCall:
    """A model's call to a hosted tool, as the builder saw it: the engine runs it between turns."""

    __slots__ = ("arguments", "buf", "call_id", "name", "ready", "stream")

    def __init__(self, name: str, call_id: str, stream_key: str | None) -> None:
        self.name = name
        self.call_id = call_id
        self.buf: list[str] = []
        self.arguments = ""
        # The arguments are complete (the model closed the call): the engine may run it.
        self.ready = False
        self.stream = StringFieldStream(stream_key) if stream_key is not None else None


class Item:
    """One output item being built. Providers hold it as a handle and pass it back."""

    __slots__ = (
        "buf",
        "call",
        "content_index",
        "data",
        "id",
        "kind",
        "open",
        "output_index",
        "part_kind",
        "summary_index",
        "summary_open",
    )

    def __init__(self, kind: str, item_id: str, output_index: int, data: JSON) -> None:
        self.kind = kind
        self.id = item_id
        self.output_index = output_index
        self.data = data
        self.open = True
        # The content part (message/reasoning text) or summary part being streamed, if any.
        self.part_kind: str | None = None
        self.content_index = -1
        self.summary_index = -1
        self.summary_open = False
        self.buf: list[str] = []
        # Set on a hosted tool's item opened from a model's function call (see StreamBuilder.hosted).
        self.call: HostedCall | None = None

    def __repr__(self) -> str:
        state = "open" if self.open else "done"
        return f"<Item {self.kind} {self.id} #{self.output_index} {state}>"


class StreamBuilder:
    """Builds one Response's event stream from semantic calls."""

    def __init__(
        self,
        response: JSON,
        *,
        raw_reasoning: RawReasoningSpelling = "reasoning_text",
        id_factory: Callable[[str], str] = new_id,
        error_event_on_failure: bool = True,
    ) -> None:
        self.response = response
        self._raw_reasoning = raw_reasoning
        self._new_id = id_factory
        self._error_event_on_failure = error_event_on_failure
        self._seq = 0
        self._pending: list[JSON] = []
        # The last event :meth:`text_delta_json` made and its SSE frame; the frame's middle for the
        # content part it was in.
        self.frame: tuple[JSON, bytes] | None = None
        self._frame_part: tuple[Item | None, int, bytes] = (None, -1, b"")
        self._items: list[Item] = []
        self._open: dict[str, Item] = {}
        self._started = False
        self._finished = False
        # Flat tool name -> (namespace, name), for back ends that got namespace members as plain tools
        # (server/namespaces.py): a call to such a name is reported under its namespace.
        self.tool_namespaces: dict[str, tuple[str, str]] = {}
        # Set by whoever sends this stream (the server, for a streamed response): a provider may call
        # it instead of yielding, from an I/O callback, when events are ready. It returns None, or an
        # awaitable the provider should let finish before it reads more (the client is slow).
        self.push: Callable[[], Awaitable[None] | None] | None = None
        # Set by the server: applied to every failure message before it is emitted (the gateway's
        # secrets never reach a client or the store through an upstream's error text).
        self.redact: Callable[[str], str] | None = None
        # Set by a back end that chooses among several (a fallback chain): the model that produced this
        # Response. The server sends it in the x-gateway-model header; ``model`` stays the one asked for.
        self.served_by: str | None = None
        # Set by a fallback chain: the attempts that failed before the one that answered, as
        # ``(model, HTTP status, error code)`` (the server's metrics count them as upstream errors).
        self.failed_attempts: list[tuple[str, int, str | None]] = []
        # When the first output item opened (time.monotonic()): the server's per-request log line
        # reports it as the time to first token.
        self.first_output_at: float | None = None
        # Set by the engine (engine/turns.py), which runs hosted tools between model turns:
        # ``hosted`` maps a function name offered to the model to the hosted tool item its calls are
        # shown as (the function call itself never reaches the client); with ``defer_finish`` a back
        # end's complete()/incomplete() ends one model turn (``turn_status``) instead of the Response.
        self.hosted: dict[str, HostedSpec] = {}
        # Set by the engine: annotations for an output_text part's final text (the files a hosted tool
        # made, cited where the answer names them), added before ``output_text.done``.
        self.annotate_text: Callable[[str], list[JSON]] | None = None
        self.defer_finish = False
        self.turn_status: tuple[str, str | None] | None = None
        # Set by the engine (engine/stop.py) for a request with stop sequences: ``output_text`` is cut
        # before the first occurrence (protocol/stop.py); once one is found, later text is dropped.
        self.stop: StopScanner | None = None
        # The stop sequence that ended the output: the one ``stop`` found, or the one a back end that
        # takes stop sequences natively reported (Anthropic does). The front ends read it.
        self.stopped_by: str | None = None
        self._held_logprobs: list[JSON] = []

    # ------------------------------------------------------------------ draining
    def take(self) -> list[JSON]:
        """Return the events emitted since the last call, oldest first."""
        pending = self._pending
        self._pending = []
        return pending

    @property
    def sequence_number(self) -> int:
        """The sequence number the next event will get."""
        return self._seq

    @property
    def started(self) -> bool:
        return self._started

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def items(self) -> list[Item]:
        return list(self._items)

    @property
    def open_items(self) -> list[Item]:
        return list(self._open.values())

    def hosted_pending(self) -> list[Item]:
        """Hosted tool items a model turn left open for the engine to run, in output order."""
        return [it for it in self._open.values() if it.call is not None]

    def _emit(self, event: JSON) -> JSON:
        event["sequence_number"] = self._seq
        self._seq += 1
        self._pending.append(event)
        return event

    def snapshot(self) -> JSON:
        """A copy of the Response as it stands: finished items only, in output order."""
        snap = dict(self.response)
        snap["output"] = [it.data for it in self._items if not it.open]
        return snap

    def _lifecycle(self, event_type: str) -> JSON:
        return self._emit({"type": event_type, "sequence_number": 0, "response": self.snapshot()})

    # ------------------------------------------------------------------ lifecycle
    def start(self, *, queued: bool = False) -> None:
        """Emit ``response.created`` then ``response.in_progress`` (or ``response.queued``)."""
        if self._started:
            raise BuilderError("start() called twice")
        self._started = True
        self.response["status"] = "queued" if queued else "in_progress"
        self._lifecycle("response.created")
        self._lifecycle("response.queued" if queued else "response.in_progress")

    def mark_in_progress(self) -> None:
        """Move a queued response to ``in_progress`` (background mode picks it up)."""
        self._check_running()
        if self.response["status"] != "in_progress":
            self.response["status"] = "in_progress"
            self._lifecycle("response.in_progress")

    def keepalive(self, mode: KeepaliveMode = "in_progress") -> JSON:
        """An event that proves the stream is alive without changing its meaning.

        ``in_progress`` repeats the lifecycle snapshot (resets Codex's idle timer, valid for every
        client); ``ping`` is the ``{"type":"ping"}`` event some servers send.
        """
        self._check_running()
        if mode == "in_progress":
            # A queued response repeats ``response.queued``: an in_progress event must not say "queued".
            queued = self.response["status"] == "queued"
            return self._lifecycle("response.queued" if queued else "response.in_progress")
        return self._emit({"type": "ping", "sequence_number": 0})

    def _check_running(self) -> None:
        if not self._started:
            raise BuilderError("start() must come first")
        if self._finished:
            raise BuilderError("the response is already finished")

    # ------------------------------------------------------------------ items
    def _open_item(self, kind: str, data: JSON, item_id: str | None) -> Item:
        self._check_running()
        iid = item_id or self._new_id(ID_PREFIXES.get(kind, kind))
        if iid in self._open:
            raise BuilderError(f"item id {iid!r} is already open")
        data["id"] = iid
        # ``id`` first, then ``type``, then the rest, as OpenAI orders them.
        ordered: JSON = {"id": iid, "type": kind}
        ordered.update(data)
        item = Item(kind, iid, len(self._items), ordered)
        if not self._items:
            self.first_output_at = time.monotonic()
        self._items.append(item)
        self._open[iid] = item
        self._emit(
            {
                "type": "response.output_item.added",
                "sequence_number": 0,
                "output_index": item.output_index,
                "item": _copy_item(ordered),
            }
        )
        return item

    def _live(self, item: Item, kind: str | tuple[str, ...]) -> None:
        if not item.open:
            raise BuilderError(f"{item!r} is already done")
        if self._open.get(item.id) is not item:
            raise BuilderError(f"{item!r} does not belong to this response")
        if (item.kind != kind) if isinstance(kind, str) else (item.kind not in kind):
            raise BuilderError(f"{item!r} is not a {kind}")

    def _close_item(self, item: Item, status: str | None) -> None:
        if status is not None and "status" in item.data:
            item.data["status"] = status
        item.open = False
        del self._open[item.id]
        self._emit(
            {
                "type": "response.output_item.done",
                "sequence_number": 0,
                "output_index": item.output_index,
                "item": item.data,
            }
        )

    def open_item(self, kind: str, data: JSON | None = None, *, item_id: str | None = None) -> Item:
        """Open an item of a type no semantic call covers (``apply_patch_call``, ``shell_call``…).

        Its ``data`` may be updated in place while it is open; finish it with :meth:`close_item`.
        """
        fields = {k: v for k, v in (data or {}).items() if k not in ("id", "type")}
        return self._open_item(kind, fields, item_id)

    def passthrough(self, event: JSON, item: Item | None = None) -> JSON:
        """Emit a relayed event the builder has no call for, with our ``sequence_number``.

        With ``item``, the event's ``item_id`` and ``output_index`` become that open item's. Events whose
        meaning the builder owns (lifecycle, item and part boundaries, errors) are refused: relaying them
        raw would contradict the state the builder keeps.
        """
        self._check_running()
        etype = event.get("type")
        if not isinstance(etype, str) or not etype or etype in _OWNED_EVENTS:
            # (An event without a type name is no event a client can read: refused as well.)
            raise BuilderError(f"{etype!r} cannot be passed through; use the builder's own call")
        out = dict(event)
        if item is not None:
            self._live(item, item.kind)
            if "item_id" in out:
                out["item_id"] = item.id
            if "output_index" in out:
                out["output_index"] = item.output_index
        out["sequence_number"] = 0
        return self._emit(out)

    def add_item(self, item: JSON) -> Item:
        """Emit a complete item at once (``added`` then ``done``), e.g. a non-streamed tool result."""
        data = {k: v for k, v in item.items() if k not in ("id", "type")}
        final_status = data.get("status")
        if "status" in data:
            data["status"] = "in_progress"
        handle = self._open_item(item["type"], data, item.get("id"))
        self._close_item(handle, final_status)
        return handle

    # ------------------------------------------------------------------ messages
    def open_message(
        self, *, role: str = "assistant", phase: str | None = None, item_id: str | None = None
    ) -> Item:
        data: JSON = {"status": "in_progress", "role": role, "content": []}
        if phase is not None:
            data["phase"] = phase
        return self._open_item("message", data, item_id)

    def _part_base(self, item: Item) -> JSON:
        return {
            "type": "",
            "sequence_number": 0,
            "item_id": item.id,
            "output_index": item.output_index,
            "content_index": item.content_index,
        }

    def _open_part(self, item: Item, part_kind: str) -> None:
        if item.part_kind is not None:
            self._close_part(item)
        item.part_kind = part_kind
        item.content_index += 1
        item.buf = []
        part: JSON
        if part_kind == "output_text":
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        elif part_kind == "refusal":
            part = {"type": "refusal", "refusal": ""}
        else:
            part = {"type": "reasoning_text", "text": ""}
        item.data["content"].append(part)
        ev = self._part_base(item)
        ev["type"] = "response.content_part.added"
        ev["part"] = dict(part, annotations=[]) if part_kind == "output_text" else dict(part)
        self._emit(ev)

    def _close_part(self, item: Item) -> None:
        kind = item.part_kind
        if kind is None:
            return
        if kind == "output_text" and self.stop is not None:
            # The part ends: text held back as a possible stop sequence's beginning was not one.
            held, logprobs, self._held_logprobs = self.stop.flush(), self._held_logprobs, []
            if held:
                self._emit_text(item, held, logprobs)
        text = "".join(item.buf)
        if kind == "output_text" and self.annotate_text is not None:
            for annotation in self.annotate_text(text):
                self.annotation(item, annotation)
        item.buf = []
        part = item.data["content"][item.content_index]
        ev = self._part_base(item)
        if kind == "output_text":
            part["text"] = text
            ev["type"] = "response.output_text.done"
            ev["text"] = text
            ev["logprobs"] = part["logprobs"]
        elif kind == "refusal":
            part["refusal"] = text
            ev["type"] = "response.refusal.done"
            ev["refusal"] = text
        else:
            part["text"] = text
            ev["type"] = f"response.{self._raw_reasoning}.done"
            ev["text"] = text
        self._emit(ev)
        done = self._part_base(item)
        done["type"] = "response.content_part.done"
        done["part"] = _copy_part(part)
        self._emit(done)
        item.part_kind = None

    def open_text(self, item: Item) -> None:
        """Start a new ``output_text`` part (text_delta does this itself when none is open)."""
        self._live(item, "message")
        self._open_part(item, "output_text")

    def text_delta(self, item: Item, delta: str, logprobs: list[JSON] | None = None) -> None:
        if (
            item.part_kind == "output_text"
            and item.open
            and self.stop is None
            and not logprobs
            and item.kind == "message"
            and self._open.get(item.id) is item
        ):
            # Most deltas of a stream: text into the open output_text part of a live message, no stop
            # sequence to watch. The checks below would pass: straight to the event.
            self._emit_text(item, delta, None)
            return
        self._live(item, "message")
        if self.stop is not None:
            self._stop_text_delta(item, delta, logprobs)
            return
        if item.part_kind != "output_text":
            self._open_part(item, "output_text")
        self._emit_text(item, delta, logprobs)

    def text_delta_json(self, item: Item, text: str, text_json: bytes) -> None:
        """:meth:`text_delta` (no logprobs) of text the caller also has as its JSON string, as
        ``orjson.dumps(text)`` writes it (``text_json``, quotes included). When the delta goes out at
        once, the event's SSE frame is made from those bytes and kept in :attr:`frame` with the event:
        a client of Responses SSE sends it instead of serializing the event again."""
        pending = self._pending
        before = len(pending)
        self.text_delta(item, text)
        # Without a stop sequence, one event more is the delta of ``text`` itself into the open part
        # (a part it had to open first would have come before it).
        if self.stop is None and len(pending) == before + 1:
            part = self._frame_part
            if part[0] is not item or part[1] != item.content_index:
                middle = text_delta_middle(item.id, item.output_index, item.content_index)
                part = self._frame_part = (item, item.content_index, middle)
            self.frame = (pending[-1], text_delta_frame(self._seq - 1, part[2], text_json))

    def _stop_text_delta(self, item: Item, delta: str, logprobs: list[JSON] | None) -> None:
        # Kept out of :meth:`text_delta` so a request without stop sequences pays one test per delta.
        stop = self.stop
        assert stop is not None
        # (A local, not `stop.matched` itself: mypy would narrow `stop.matched` to None for the test after
        # `feed` below, and mypyc-compiled code trusts that narrowing — a TypeError once it matched.)
        already = stop.matched
        if already is not None:
            return  # past a stop sequence: nothing more is output
        if item.part_kind != "output_text":
            self._open_part(item, "output_text")
        delta = stop.feed(delta)
        if stop.matched is not None:
            self.stopped_by = stop.matched
        if logprobs:
            self._held_logprobs.extend(logprobs)
        if not delta:
            return
        logprobs, self._held_logprobs = self._held_logprobs, []
        self._emit_text(item, delta, logprobs)

    @property
    def held_text(self) -> str:
        """Output text given to :meth:`text_delta` but not sent yet: it may begin a stop sequence."""
        return self.stop.held if self.stop is not None else ""

    def _emit_text(self, item: Item, delta: str, logprobs: list[JSON] | None) -> None:
        item.buf.append(delta)
        if logprobs:
            item.data["content"][item.content_index]["logprobs"].extend(logprobs)
        # :meth:`_emit`, inline: most events of a stream are these.
        self._pending.append(
            {
                "type": "response.output_text.delta",
                "sequence_number": self._seq,
                "item_id": item.id,
                "output_index": item.output_index,
                "content_index": item.content_index,
                "delta": delta,
                "logprobs": logprobs or [],
            }
        )
        self._seq += 1

    def annotation(self, item: Item, annotation: JSON) -> None:
        """Attach an annotation (``url_citation``, ``file_citation``…) to the current text part."""
        self._live(item, "message")
        if item.part_kind != "output_text":
            self._open_part(item, "output_text")
        annotations = item.data["content"][item.content_index]["annotations"]
        annotations.append(annotation)
        ev = self._part_base(item)
        ev["type"] = "response.output_text.annotation.added"
        ev["annotation_index"] = len(annotations) - 1
        ev["annotation"] = annotation
        self._emit(ev)

    def refusal_delta(self, item: Item, delta: str) -> None:
        self._live(item, "message")
        if item.part_kind != "refusal":
            self._open_part(item, "refusal")
        item.buf.append(delta)
        ev = self._part_base(item)
        ev["type"] = "response.refusal.delta"
        ev["delta"] = delta
        self._emit(ev)

    def close_message(self, item: Item, *, status: str = "completed") -> None:
        self._live(item, "message")
        self._close_part(item)
        self._close_item(item, status)

    def message(self, text: str, *, phase: str | None = None) -> Item:
        """A whole assistant message in one call: added, one delta, done."""
        item = self.open_message(phase=phase)
        self.text_delta(item, text)
        self.close_message(item)
        return item

    # ------------------------------------------------------------------ reasoning
    def open_reasoning(self, *, encrypted_content: str | None = None, item_id: str | None = None) -> Item:
        # ``summary`` must be present even in ``.added`` (Codex drops the item otherwise).
        data: JSON = {"summary": []}
        if encrypted_content is not None:
            data["encrypted_content"] = encrypted_content
        return self._open_item("reasoning", data, item_id)

    def _summary_base(self, item: Item) -> JSON:
        return {
            "type": "",
            "sequence_number": 0,
            "item_id": item.id,
            "output_index": item.output_index,
            "summary_index": item.summary_index,
        }

    def open_summary_part(self, item: Item) -> None:
        """Start a new summary part (summary_delta does this itself when none is open)."""
        self._live(item, "reasoning")
        if item.part_kind is not None:
            self._close_part(item)
        if item.summary_open:
            self.close_summary_part(item)
        item.summary_index += 1
        item.summary_open = True
        item.buf = []
        item.data["summary"].append({"type": "summary_text", "text": ""})
        ev = self._summary_base(item)
        ev["type"] = "response.reasoning_summary_part.added"
        ev["part"] = {"type": "summary_text", "text": ""}
        self._emit(ev)

    def summary_delta(self, item: Item, delta: str) -> None:
        self._live(item, "reasoning")
        if not item.summary_open:
            self.open_summary_part(item)
        item.buf.append(delta)
        ev = self._summary_base(item)
        ev["type"] = "response.reasoning_summary_text.delta"
        ev["delta"] = delta
        self._emit(ev)

    def close_summary_part(self, item: Item) -> None:
        self._live(item, "reasoning")
        if not item.summary_open:
            raise BuilderError(f"{item!r} has no open summary part")
        text = "".join(item.buf)
        item.buf = []
        item.summary_open = False
        item.data["summary"][item.summary_index]["text"] = text
        ev = self._summary_base(item)
        ev["type"] = "response.reasoning_summary_text.done"
        ev["text"] = text
        self._emit(ev)
        done = self._summary_base(item)
        done["type"] = "response.reasoning_summary_part.done"
        done["part"] = {"type": "summary_text", "text": text}
        self._emit(done)

    def reasoning_delta(self, item: Item, delta: str) -> None:
        """Raw reasoning text (``response.reasoning_text.delta``, or the spec's ``reasoning.delta``)."""
        self._live(item, "reasoning")
        if item.summary_open:
            self.close_summary_part(item)
        if item.part_kind != "reasoning_text":
            item.data.setdefault("content", [])
            self._open_part(item, "reasoning_text")
        item.buf.append(delta)
        ev = self._part_base(item)
        ev["type"] = f"response.{self._raw_reasoning}.delta"
        ev["delta"] = delta
        self._emit(ev)

    def set_encrypted_content(self, item: Item, value: str) -> None:
        """Attach opaque reasoning state (e.g. a thinking signature) to be sent back next turn."""
        self._live(item, "reasoning")
        item.data["encrypted_content"] = value

    def close_reasoning(self, item: Item) -> None:
        self._live(item, "reasoning")
        if item.summary_open:
            self.close_summary_part(item)
        self._close_part(item)
        self._close_item(item, None)

    # ------------------------------------------------------------------ function & custom calls
    def open_function_call(
        self,
        name: str,
        *,
        call_id: str | None = None,
        namespace: str | None = None,
        item_id: str | None = None,
    ) -> Item:
        if namespace is None and name in self.tool_namespaces:
            namespace, name = self.tool_namespaces[name]
        spec = self.hosted.get(name) if namespace is None else None
        if spec is not None:
            if spec.kind in TOOL_PHASES:
                hosted = self.open_tool_call(spec.kind, **spec.fields)
            else:  # an item with no phases (``mcp_approval_request``): shown whole when it closes
                hosted = self._open_item(spec.kind, dict(spec.fields), None)
            hosted.call = HostedCall(name, call_id or self._new_id("call"), spec.stream_key)
            return hosted
        data: JSON = {
            "status": "in_progress",
            "arguments": "",
            "call_id": call_id or self._new_id("call"),
            "name": name,
        }
        if namespace is not None:
            data["namespace"] = namespace
        item = self._open_item("function_call", data, item_id)
        item.buf = []
        return item

    def arguments_delta(self, item: Item, delta: str) -> None:
        if item.call is not None:
            self._hosted_arguments(item, item.call, delta)
            return
        self._live(item, ("function_call", "mcp_call"))
        if not delta:
            return
        item.buf.append(delta)
        family = "function_call_arguments" if item.kind == "function_call" else "mcp_call_arguments"
        self._emit(
            {
                "type": f"response.{family}.delta",
                "sequence_number": 0,
                "item_id": item.id,
                "output_index": item.output_index,
                "delta": delta,
            }
        )

    def _hosted_arguments(self, item: Item, call: HostedCall, delta: str) -> None:
        self._live(item, item.kind)
        if call.ready:
            raise BuilderError(f"{item!r}: arguments after the call was closed")
        if not delta:
            return
        call.buf.append(delta)
        if item.kind == "mcp_call":  # the arguments stream as they are, as the MCP call's own
            item.buf.append(delta)
            self._emit(
                {
                    "type": "response.mcp_call_arguments.delta",
                    "sequence_number": 0,
                    "item_id": item.id,
                    "output_index": item.output_index,
                    "delta": delta,
                }
            )
        elif call.stream is not None:
            text = call.stream.feed(delta)
            if text:
                self.code_delta(item, text)

    def _close_hosted(self, item: Item, call: HostedCall, status: str) -> None:
        """The model finished writing a hosted call. Complete arguments whose streamed field holds a
        string make it ready: the item stays open for the engine to run and close. Anything else (cut
        at the output limit, malformed) is closed ``incomplete`` here and never runs."""
        self._live(item, item.kind)
        if call.ready:
            raise BuilderError(f"{item!r}: the call was already closed")
        call.arguments = "".join(call.buf) or "{}"
        if item.kind not in TOOL_PHASES:
            # Not run by the engine (an approval request): the item is complete as the model wrote it.
            item.data["arguments"] = call.arguments
            self._close_item(item, None)
            return
        if item.kind == "mcp_call":
            item.buf = []
            item.data["arguments"] = call.arguments
            self._emit(
                {
                    "type": "response.mcp_call_arguments.done",
                    "sequence_number": 0,
                    "item_id": item.id,
                    "output_index": item.output_index,
                    "arguments": call.arguments,
                }
            )
        value: str | None = None
        if call.stream is not None:
            value, rest = call.stream.finish(call.arguments)
            if rest:
                self.code_delta(item, rest)
            if item.part_kind != "code":
                item.part_kind, item.buf = "code", []
            self._close_code(item)  # ``code.done`` always, with what the client saw
        if status == "completed" and (call.stream is None or value is not None):
            call.ready = True
            return
        self.close_tool_call(item, status="incomplete")

    def close_function_call(self, item: Item, *, status: str = "completed") -> None:
        """Finish a call; empty arguments become ``"{}"`` (a call with no arguments)."""
        if item.call is not None:
            self._close_hosted(item, item.call, status)
            return
        self._live(item, "function_call")
        arguments = "".join(item.buf) or "{}"
        item.data["arguments"] = arguments
        self._emit(
            {
                "type": "response.function_call_arguments.done",
                "sequence_number": 0,
                "item_id": item.id,
                "output_index": item.output_index,
                "name": item.data["name"],
                "arguments": arguments,
            }
        )
        self._close_item(item, status)

    def function_call(self, name: str, arguments: str, *, call_id: str | None = None) -> Item:
        """A whole function call in one go (for upstreams that deliver calls unstreamed)."""
        item = self.open_function_call(name, call_id=call_id)
        self.arguments_delta(item, arguments)
        self.close_function_call(item)
        return item

    def open_custom_tool_call(
        self, name: str, *, call_id: str | None = None, item_id: str | None = None
    ) -> Item:
        data: JSON = {
            "status": "in_progress",
            "call_id": call_id or self._new_id("call"),
            "input": "",
            "name": name,
        }
        return self._open_item("custom_tool_call", data, item_id)

    def custom_input_delta(self, item: Item, delta: str) -> None:
        self._live(item, "custom_tool_call")
        if not delta:
            return
        item.buf.append(delta)
        self._emit(
            {
                "type": "response.custom_tool_call_input.delta",
                "sequence_number": 0,
                "item_id": item.id,
                "output_index": item.output_index,
                "delta": delta,
            }
        )

    def close_custom_tool_call(self, item: Item, *, status: str = "completed") -> None:
        self._live(item, "custom_tool_call")
        text = "".join(item.buf)
        item.data["input"] = text
        self._emit(
            {
                "type": "response.custom_tool_call_input.done",
                "sequence_number": 0,
                "item_id": item.id,
                "output_index": item.output_index,
                "input": text,
            }
        )
        self._close_item(item, status)

    # ------------------------------------------------------------------ built-in tool calls
    def open_tool_call(
        self, kind: str, *, item_id: str | None = None, with_status: bool = True, **fields: Any
    ) -> Item:
        """Open a built-in tool call item (``web_search_call``, ``code_interpreter_call``…).

        Emits ``output_item.added`` and the ``<kind>.in_progress`` event. ``with_status=False`` for an
        item type without a ``status`` field (``mcp_list_tools``).
        """
        if kind not in TOOL_PHASES:
            raise BuilderError(f"unknown built-in tool call type {kind!r}")
        data: JSON = {"status": "in_progress"} if with_status else {}
        data.update(fields)
        item = self._open_item(kind, data, item_id)
        self._tool_event(item, "in_progress")
        return item

    def _tool_event(self, item: Item, phase: str, **extra: Any) -> None:
        ev: JSON = {
            "type": f"response.{item.kind}.{phase}",
            "sequence_number": 0,
            "item_id": item.id,
            "output_index": item.output_index,
        }
        ev.update(extra)
        self._emit(ev)

    def tool_progress(self, item: Item, phase: str) -> None:
        """A progress event such as ``searching``, ``interpreting`` or ``generating``."""
        self._live(item, tuple(TOOL_PHASES))
        if phase not in TOOL_PHASES[item.kind]:
            raise BuilderError(f"{item.kind} has no progress phase {phase!r}")
        if item.kind == "code_interpreter_call" and item.part_kind == "code":
            self._close_code(item)
        self._tool_event(item, phase)

    def code_delta(self, item: Item, delta: str) -> None:
        """Stream code into a ``code_interpreter_call``."""
        self._live(item, "code_interpreter_call")
        if item.part_kind != "code":
            item.part_kind = "code"
            code = item.data.get("code")
            item.buf = [code if isinstance(code, str) else ""]
        item.buf.append(delta)
        ev: JSON = {
            "type": "response.code_interpreter_call_code.delta",
            "sequence_number": 0,
            "item_id": item.id,
            "output_index": item.output_index,
            "delta": delta,
        }
        self._emit(ev)

    def _close_code(self, item: Item) -> None:
        code = "".join(item.buf)
        item.buf = []
        item.part_kind = None
        item.data["code"] = code
        self._emit(
            {
                "type": "response.code_interpreter_call_code.done",
                "sequence_number": 0,
                "item_id": item.id,
                "output_index": item.output_index,
                "code": code,
            }
        )

    def partial_image(self, item: Item, b64: str, index: int) -> None:
        self._live(item, "image_generation_call")
        self._tool_event(item, "partial_image", partial_image_b64=b64, partial_image_index=index)

    def close_tool_call(self, item: Item, *, status: str = "completed", **fields: Any) -> None:
        """Finish a built-in tool call; ``fields`` are its results (``action``, ``outputs``, ``result``…)."""
        self._live(item, tuple(TOOL_PHASES))
        if item.part_kind == "code":
            self._close_code(item)
        if item.kind == "mcp_call" and item.buf:
            arguments = "".join(item.buf)
            item.data["arguments"] = arguments
            self._emit(
                {
                    "type": "response.mcp_call_arguments.done",
                    "sequence_number": 0,
                    "item_id": item.id,
                    "output_index": item.output_index,
                    "arguments": arguments,
                }
            )
        item.data.update(fields)
        phase = "failed" if status == "failed" and item.kind.startswith("mcp") else "completed"
        self._tool_event(item, phase)
        self._close_item(item, status)

    # ------------------------------------------------------------------ finishing
    def close_item(self, item: Item, *, status: str = "completed") -> None:
        """Close any open item the right way for its kind."""
        if item.kind == "message":
            self.close_message(item, status=status)
        elif item.kind == "reasoning":
            self.close_reasoning(item)
        elif item.kind == "function_call":
            self.close_function_call(item, status=status)
        elif item.kind == "custom_tool_call":
            self.close_custom_tool_call(item, status=status)
        elif item.kind in TOOL_PHASES:
            self.close_tool_call(item, status=status)
        else:
            self._live(item, item.kind)
            self._close_item(item, status)

    def _close_all(self, status: str) -> None:
        for item in list(self._open.values()):
            if item.call is not None:
                if item.call.ready and self.defer_finish:
                    continue  # the engine runs it and closes it
                if item.kind not in TOOL_PHASES:  # an approval request cut short: never approvable
                    item.data["arguments"] = "".join(item.call.buf)
                    self._close_item(item, None)
                    continue
                # A hosted call never finished (or never run): it did not complete.
                self.close_tool_call(item, status="incomplete")
                continue
            self.close_item(item, status=status)

    def set_usage(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        self.response["usage"] = make_usage(
            input_tokens,
            output_tokens,
            cached_tokens=cached_tokens,
            reasoning_tokens=reasoning_tokens,
            cache_write_tokens=cache_write_tokens,
        )

    def _finish(self, status: str, event_type: str) -> JSON:
        self._check_running()
        self._finished = True
        self.response["status"] = status
        if status == "completed":
            self.response["completed_at"] = int(time.time())
        self.response["output"] = [it.data for it in self._items]
        return self._lifecycle(event_type)

    def complete(self) -> JSON:
        """Close what is open and emit ``response.completed`` (with ``defer_finish``: end the turn)."""
        self._check_running()
        self._close_all("completed")
        if self.defer_finish:
            self.turn_status = ("completed", None)
            return self.response
        return self._finish("completed", "response.completed")

    def incomplete(self, reason: str) -> JSON:
        """Close what is open as ``incomplete`` and emit ``response.incomplete`` with ``reason``
        (with ``defer_finish``: end the turn, the engine decides)."""
        self._check_running()
        self._close_all("incomplete")
        if self.defer_finish:
            self.turn_status = ("incomplete", reason)
            return self.response
        self.response["incomplete_details"] = {"reason": reason}
        return self._finish("incomplete", "response.incomplete")

    def fail(self, code: str, message: str, *, param: str | None = None) -> JSON:
        """End with ``response.failed`` (after an ``error`` event, which clients show to the user)."""
        self._check_running()
        self.defer_finish = False  # a failure ends the Response whoever is driving turns
        self._close_all("incomplete")
        if self.redact is not None:
            message = self.redact(message)
        if self._error_event_on_failure:
            self._emit(error_event(code, message, param))
        self.response["error"] = {"code": code, "message": message}
        return self._finish("failed", "response.failed")


def error_event(
    code: str | None, message: str, param: str | None = None, etype: str = "server_error"
) -> JSON:
    """An ``error`` event in both the top-level and nested forms every client accepts."""
    return {
        "type": "error",
        "sequence_number": 0,
        "code": code,
        "message": message,
        "param": param,
        "error": {"type": etype, "code": code, "message": message, "param": param},
    }


def _copy_item(data: JSON) -> JSON:
    """The ``added`` view of an item: containers copied so later mutation does not leak into it."""
    out = dict(data)
    for key in ("content", "summary"):
        if key in out:
            out[key] = [dict(p) for p in out[key]]
    return out


def _copy_part(part: JSON) -> JSON:
    out = dict(part)
    if "annotations" in out:
        out["annotations"] = list(out["annotations"])
    return out
