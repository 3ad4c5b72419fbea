"""OpenAI Responses passthrough: OpenAI itself, or any server that speaks ``POST /v1/responses``.

The request goes upstream almost as the client sent it (``model`` replaced, ``stream`` forced, the
gateway's own state fields removed: see :func:`build_responses_body`). The upstream's events are not
forwarded verbatim: :class:`ResponsesRelay` replays each one as the equivalent :class:`StreamBuilder`
call, so the client sees our response id and one gapless sequence of sequence numbers, and the
lifecycle rules hold even when the upstream breaks them (GitHub Copilot rotates item ids mid-item;
some servers send ``output_text.done`` without deltas). Upstream items keep their ids (a client may
send them back to a ``store: true`` upstream), their ``encrypted_content`` is kept byte for byte, and
events the builder has no call for are passed through with our sequence number. The upstream stream
is also fed to an incremental :class:`StreamChecker`; what it finds is logged, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from ..protocol.builder import TOOL_PHASES, BuilderError, Item, StreamBuilder
from ..protocol.checker import StreamChecker
from ..protocol.native import mypyc_attr
from ..protocol.request import JSON, TOOL_TYPES, ResponseRequest
from ..protocol.sse import SSEMessage
from .base import Capabilities, ProviderError
from .http_base import HTTPProvider
from .transport import Timeouts, Transport
from .upstream_errors import from_error_payload, malformed_event, translate

__all__ = ["GATEWAY_FIELDS", "OpenAIResponsesProvider", "ResponsesRelay", "build_responses_body"]

log = logging.getLogger("responses_gateway.openai_responses")

# Request fields that name the gateway's own state or transport: the gateway resolves them itself
# (stored context is already expanded into ``input``), so the upstream must not see them.
GATEWAY_FIELDS = frozenset({"previous_response_id", "conversation", "background", "stream", "stream_options"})

ALL_TOOL_TYPES = frozenset(TOOL_TYPES)
# What POST /v1/responses/compact takes of a create body.
_COMPACT_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_retention",
        "service_tier",
    }
)
# What POST /v1/responses/input_tokens takes of a create body.
_COUNT_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "truncation",
        "conversation",
        "previous_response_id",
    }
)


def build_responses_body(request: ResponseRequest, *, upstream_model: str | None = None) -> JSON:
    """The upstream request body: the client's own, with the model, stream and input settled."""
    body = {k: v for k, v in request.raw.items() if k not in GATEWAY_FIELDS}
    body["model"] = upstream_model or request.model
    body["input"] = request.input
    body["stream"] = True
    return body


def _fields(item: JSON, *drop: str) -> JSON:
    dropped = ("id", "type", *drop)  # (not inline: mypyc cannot compile `in` of a starred tuple display)
    return {k: v for k, v in item.items() if k not in dropped}


@mypyc_attr(allow_interpreted_subclasses=True)
class ResponsesRelay:
    """Upstream Responses events in, StreamBuilder calls out (sans-IO)."""

    def __init__(self, builder: StreamBuilder, *, check: bool = True) -> None:
        self.b = builder
        self._by_index: dict[int, Item] = {}
        self._by_id: dict[str, Item] = {}
        self._used_ids: set[str] = set()
        self._pending_refusal: set[tuple[str, int]] = set()
        self.checker = StreamChecker("openai", keep=False) if check else None
        self._reported: set[str] = set()
        # The delta :meth:`fast` applied and the checker has not seen yet (see :meth:`check_later`).
        self._unchecked: JSON | None = None
        self.error_event: JSON | None = None  # an upstream ``error`` event (its terminal event follows)
        # Read by HTTPProvider: failures come as events here, so ``error`` stays None.
        self.error: ProviderError | None = None
        self.done = False  # a terminal event arrived
        self.dirty = False

    # ------------------------------------------------------------------ dispatch
    def on_event(self, event: JSON) -> None:
        """Apply one upstream event."""
        if self.done:
            return
        self._check(event)
        etype = event.get("type")
        if not isinstance(etype, str):
            return
        handler = _HANDLERS.get(etype)
        if handler is not None:
            handler(self, event)
        elif etype.startswith("response.") and etype.rsplit(".", 1)[-1] in _TOOL_EVENT_PHASES:
            self._tool_phase(event, etype)
        elif etype == "ping" or etype == "keepalive":
            return
        else:
            self._passthrough(event)

    def fast(self, event: bytes, data: bytes) -> bool:
        """One whole upstream event (``SSEDecoder.single``) that is an output text delta: applied
        here, as ``_dispatch`` and ``on_event`` would, and True. False, with nothing changed, for
        anything else: the general path takes it then.

        Most events of a stream are these; this skips the message object, the text decode and the
        dispatch layers. The checker sees the delta in :meth:`check_later`, once the event it made has
        gone to the client (``HTTPProvider.after_push``): its verdict is only logged, so whether it
        comes before or after the builder's step changes no event.
        """
        if self.done:
            return False
        if event:
            if event != _TEXT_DELTA_NAME:
                return False
        elif not data.startswith(_TEXT_DELTA_HEAD):
            return False
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if type(payload) is not dict or payload.get("type") != "response.output_text.delta":
            return False
        index = payload.get("output_index")
        item = self._by_index.get(index) if isinstance(index, int) else None
        delta = payload.get("delta")
        try:
            if item is not None and item.open and item.kind == "message" and isinstance(delta, str):
                # :meth:`_text_delta` for a delta whose item its output index finds (the usual case),
                # without its two calls.
                logprobs = payload.get("logprobs")
                self.b.text_delta(item, delta, logprobs if isinstance(logprobs, list) else None)
                self.dirty = True
            else:
                self._text_delta(payload)
        except ProviderError:
            raise
        except BuilderError as exc:
            log.warning("dropping upstream %s: %s", payload.get("type"), exc)
        except Exception as exc:
            raise malformed_event(exc) from None
        if self.checker is not None:
            self._unchecked = payload
        return True

    def check_later(self) -> None:
        """Feed the checker the delta :meth:`fast` applied, if there is one: its fast rule, else the
        full rules, as ``on_event`` does (called after the client's write, before the next event)."""
        payload = self._unchecked
        if payload is None:
            return
        self._unchecked = None
        checker = self.checker
        try:
            if checker is not None and not checker.feed_delta(payload):
                self._check(payload)
        except Exception as exc:
            raise malformed_event(exc) from None

    def _check(self, event: JSON) -> None:
        if self.checker is None:
            return
        for violation in self.checker.feed(event):
            # Once per rule: a broken upstream would otherwise log on every delta.
            if violation.rule not in self._reported:
                self._reported.add(violation.rule)
                log.warning("upstream stream violates %s", violation)

    def _item(self, event: JSON) -> Item | None:
        index = event.get("output_index")
        item = self._by_index.get(index) if isinstance(index, int) else None
        if item is None and isinstance(event.get("item_id"), str):
            item = self._by_id.get(event["item_id"])
        return item if item is not None and item.open else None

    def _passthrough(self, event: JSON) -> None:
        item = self._item(event) if ("output_index" in event or "item_id" in event) else None
        if item is None and ("output_index" in event or "item_id" in event):
            log.debug("dropping %s for an item that is not open", event.get("type"))
            return
        self.b.passthrough(event, item)
        self.dirty = True

    # ------------------------------------------------------------------ items
    def _item_id(self, upstream_id: Any) -> str | None:
        if isinstance(upstream_id, str) and upstream_id and upstream_id not in self._used_ids:
            self._used_ids.add(upstream_id)
            return upstream_id
        return None

    def _added(self, event: JSON) -> None:
        data = event.get("item")
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return
        item = self.open_item(data)
        index = event.get("output_index")
        if isinstance(index, int):
            self._by_index[index] = item
        if isinstance(data.get("id"), str):
            self._by_id[data["id"]] = item
        self.dirty = True

    def open_item(self, data: JSON) -> Item:
        """Open our item for an upstream item (as ``output_item.added`` shows it)."""
        kind = data["type"]
        item_id = self._item_id(data.get("id"))
        b = self.b
        if kind == "message":
            return b.open_message(
                role=str(data.get("role") or "assistant"), phase=data.get("phase"), item_id=item_id
            )
        if kind == "reasoning":
            enc = data.get("encrypted_content")
            return b.open_reasoning(encrypted_content=enc if isinstance(enc, str) else None, item_id=item_id)
        if kind == "function_call":
            return b.open_function_call(
                str(data.get("name", "")),
                call_id=data.get("call_id"),
                namespace=data.get("namespace"),
                item_id=item_id,
            )
        if kind == "custom_tool_call":
            return b.open_custom_tool_call(
                str(data.get("name", "")), call_id=data.get("call_id"), item_id=item_id
            )
        if kind in TOOL_PHASES:
            return b.open_tool_call(kind, item_id=item_id, **_fields(data, "status"))
        return b.open_item(kind, data, item_id=item_id)

    def _done(self, event: JSON) -> None:
        data = event.get("item")
        item = self._item(event)
        if not isinstance(data, dict):
            return
        if item is None:
            if isinstance(data.get("type"), str) and not self._seen(data):
                # A done without its added: the item is still real, so it is sent whole.
                self.replay_item(data)
            return
        self.close_item(item, data)
        self.dirty = True

    def _seen(self, data: JSON) -> bool:
        return isinstance(data.get("id"), str) and data["id"] in self._by_id

    def close_item(self, item: Item, data: JSON) -> None:
        """Close ``item`` with the upstream's final version of it."""
        b = self.b
        status = str(data["status"]) if isinstance(data.get("status"), str) else "completed"
        kind = item.kind
        for key, value in data.items():
            # Fields the builder does not model (a reasoning item's status, vendor extras) are kept.
            if key not in item.data:
                item.data[key] = value
        if kind == "message":
            content = _list(data.get("content"))
            self._fill_message(item, content)
            b.close_message(item, status=status)
        elif kind == "reasoning":
            self._fill_reasoning(item, data)
            enc = data.get("encrypted_content")
            if isinstance(enc, str):
                b.set_encrypted_content(item, enc)
            b.close_reasoning(item)
        elif kind == "function_call":
            self._fill_buffer(item, data.get("arguments"), b.arguments_delta)
            b.close_function_call(item, status=status)
        elif kind == "custom_tool_call":
            self._fill_buffer(item, data.get("input"), b.custom_input_delta)
            b.close_custom_tool_call(item, status=status)
        elif kind in TOOL_PHASES:
            if "status" not in data:
                # Some call items (mcp_list_tools) have no status; the builder must not invent one.
                item.data.pop("status", None)
            b.close_tool_call(item, status=status, **_fields(data, "status"))
        else:
            for key, value in _fields(data).items():
                item.data[key] = value
            b.close_item(item, status=status)

    def _fill_buffer(self, item: Item, final: Any, delta: Any, held: str = "") -> None:
        """Send what the upstream's final value has beyond what was streamed (done without deltas;
        ``held``: text given to the builder but held back by its stop sequence scanner)."""
        if not isinstance(final, str):
            return
        streamed = "".join(item.buf) + held
        if final.startswith(streamed) and len(final) > len(streamed):
            delta(item, final[len(streamed) :])
        elif not final.startswith(streamed):
            log.warning("upstream %s final value differs from its deltas; the deltas are kept", item.kind)

    def _fill_message(self, item: Item, content: list[Any]) -> None:
        """Parts the upstream finished without streaming them (images of text, done-only parts)."""
        have = len(item.data["content"])
        open_part = item.part_kind is not None
        for index, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            if index < have - 1 or (index == have - 1 and not open_part):
                continue
            kind = part.get("type")
            if index >= have:
                if kind == "output_text":
                    self.b.open_text(item)
                elif kind != "refusal":
                    continue
            if kind == "output_text":
                self._fill_buffer(item, part.get("text"), self.b.text_delta, self.b.held_text)
                for annotation in _list(part.get("annotations")):
                    if not isinstance(annotation, dict):
                        continue  # not an annotation: dropped, as a streamed one would be
                    if annotation not in item.data["content"][item.content_index]["annotations"]:
                        self.b.annotation(item, annotation)
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                if item.part_kind != "refusal" and part["refusal"]:
                    self.b.refusal_delta(item, part["refusal"])
                elif item.part_kind == "refusal":
                    self._fill_buffer(item, part["refusal"], self.b.refusal_delta)

    def _fill_reasoning(self, item: Item, data: JSON) -> None:
        summary = _list(data.get("summary"))
        for index, part in enumerate(summary):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                continue
            if index > item.summary_index:
                self.b.open_summary_part(item)
                if text:
                    self.b.summary_delta(item, text)
            elif index == item.summary_index and item.summary_open:
                self._fill_buffer(item, text, self.b.summary_delta)
        content = _list(data.get("content"))
        have = len(item.data.get("content") or [])
        for index, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                continue
            if index == have - 1 and item.part_kind == "reasoning_text":
                self._fill_buffer(item, text, self.b.reasoning_delta)
            elif index >= have and text:
                self.b.reasoning_delta(item, text)

    def replay_item(self, data: JSON) -> Item:
        """Send a whole upstream item (non-streamed bodies, done-only items) through the builder."""
        item = self.open_item(data)
        if isinstance(data.get("id"), str):
            self._by_id[data["id"]] = item
        self.close_item(item, data)
        self.dirty = True
        return item

    # ------------------------------------------------------------------ content events
    def _part_added(self, event: JSON) -> None:
        item = self._item(event)
        part = event.get("part")
        if item is None or not isinstance(part, dict):
            return
        if item.kind == "message" and part.get("type") == "output_text":
            self.b.open_text(item)
            self.dirty = True
        elif item.kind == "message" and part.get("type") == "refusal":
            self._pending_refusal.add((item.id, _int(event.get("content_index"))))

    def _text_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "message" and isinstance(event.get("delta"), str):
            logprobs = event.get("logprobs")
            self.b.text_delta(item, event["delta"], logprobs if isinstance(logprobs, list) else None)
            self.dirty = True

    def _text_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "message" and item.part_kind == "output_text":
            self._fill_buffer(item, event.get("text"), self.b.text_delta, self.b.held_text)
            self.dirty = True

    def _annotation(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "message" and isinstance(event.get("annotation"), dict):
            self.b.annotation(item, event["annotation"])
            self.dirty = True

    def _refusal_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "message" and isinstance(event.get("delta"), str):
            self.b.refusal_delta(item, event["delta"])
            self.dirty = True

    def _refusal_done(self, event: JSON) -> None:
        item = self._item(event)
        refusal = event.get("refusal")
        if item is None or item.kind != "message" or not isinstance(refusal, str):
            return
        if item.part_kind == "refusal":
            self._fill_buffer(item, refusal, self.b.refusal_delta)
        elif refusal:
            self.b.refusal_delta(item, refusal)
        self.dirty = True

    def _summary_added(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "reasoning":
            self.b.open_summary_part(item)
            self.dirty = True

    def _summary_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "reasoning" and isinstance(event.get("delta"), str):
            self.b.summary_delta(item, event["delta"])
            self.dirty = True

    def _summary_text_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "reasoning" and item.summary_open:
            self._fill_buffer(item, event.get("text"), self.b.summary_delta)
            self.dirty = True

    def _summary_part_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "reasoning" and item.summary_open:
            self.b.close_summary_part(item)
            self.dirty = True

    def _reasoning_text_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "reasoning" and isinstance(event.get("delta"), str):
            self.b.reasoning_delta(item, event["delta"])
            self.dirty = True

    def _reasoning_text_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is None or item.kind != "reasoning" or not isinstance(event.get("text"), str):
            return
        if item.part_kind == "reasoning_text":
            self._fill_buffer(item, event["text"], self.b.reasoning_delta)
        elif event["text"]:
            self.b.reasoning_delta(item, event["text"])
        self.dirty = True

    def _arguments_delta(self, event: JSON) -> None:
        item = self._item(event)
        if (
            item is not None
            and item.kind in ("function_call", "mcp_call")
            and isinstance(event.get("delta"), str)
        ):
            self.b.arguments_delta(item, event["delta"])
            self.dirty = True

    def _arguments_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "function_call":
            self._fill_buffer(item, event.get("arguments"), self.b.arguments_delta)
            self.dirty = True

    def _custom_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "custom_tool_call" and isinstance(event.get("delta"), str):
            self.b.custom_input_delta(item, event["delta"])
            self.dirty = True

    def _custom_done(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "custom_tool_call":
            self._fill_buffer(item, event.get("input"), self.b.custom_input_delta)
            self.dirty = True

    def _code_delta(self, event: JSON) -> None:
        item = self._item(event)
        if item is not None and item.kind == "code_interpreter_call" and isinstance(event.get("delta"), str):
            self.b.code_delta(item, event["delta"])
            self.dirty = True

    def _partial_image(self, event: JSON) -> None:
        item = self._item(event)
        b64 = event.get("partial_image_b64")
        if item is not None and item.kind == "image_generation_call" and isinstance(b64, str):
            self.b.partial_image(item, b64, _int(event.get("partial_image_index")))
            self.dirty = True

    def _tool_phase(self, event: JSON, etype: str) -> None:
        kind, phase = etype.removeprefix("response.").rsplit(".", 1)
        item = self._item(event)
        if kind not in TOOL_PHASES:
            self._passthrough(event)
            return
        if item is None or item.kind != kind:
            return
        # in_progress and completed/failed are emitted by open_tool_call/close_tool_call themselves.
        if phase in TOOL_PHASES[kind]:
            self.b.tool_progress(item, phase)
            self.dirty = True

    def _ignore(self, event: JSON) -> None:
        """Events the builder emits on its own (at open/close) or that carry nothing new."""

    # ------------------------------------------------------------------ terminal
    def _error(self, event: JSON) -> None:
        self.error_event = event

    def _usage(self, response: JSON) -> None:
        usage = response.get("usage")
        if not isinstance(usage, dict):
            return
        input_details = usage.get("input_tokens_details") or {}
        output_details = usage.get("output_tokens_details") or {}
        self.b.set_usage(
            _int(usage.get("input_tokens")),
            _int(usage.get("output_tokens")),
            cached_tokens=_int(input_details.get("cached_tokens")),
            reasoning_tokens=_int(output_details.get("reasoning_tokens")),
            cache_write_tokens=_int(input_details.get("cache_write_tokens")),
        )

    def _terminal(self, event: JSON) -> None:
        response = _obj(event.get("response"))
        self._usage(response)
        for index, data in enumerate(response.get("output") or []):
            # Items the stream never showed (a non-streamed body, or an upstream that skipped them).
            known = index in self._by_index or (isinstance(data, dict) and self._seen(data))
            if isinstance(data, dict) and isinstance(data.get("type"), str) and not known:
                self.replay_item(data)
        etype = event["type"]
        if etype == "response.completed":
            self.b.complete()
        elif etype == "response.incomplete":
            details = response.get("incomplete_details") or {}
            self.b.incomplete(str(details.get("reason") or "max_output_tokens"))
        else:
            error = response.get("error") if isinstance(response.get("error"), dict) else None
            upstream = self.error_event
            if error is None and upstream is not None:
                error = upstream.get("error") if isinstance(upstream.get("error"), dict) else upstream
            error = error or {}
            self.b.fail(
                str(error.get("code") or "server_error"), str(error.get("message") or "The upstream failed.")
            )
        self.done = True
        self.dirty = True

    def finish(self) -> None:
        """The upstream body ended: finish the response if the upstream did not."""
        if self.done:
            return
        upstream = self.error_event
        if upstream is not None:
            exc = from_error_payload(upstream if "error" in upstream else {"error": upstream})
            self.fail(exc)
        else:
            self.fail(
                ProviderError("The upstream stream ended before the response was finished.", status=502)
            )

    def fail(self, exc: ProviderError) -> None:
        if not self.done:
            self.b.fail(exc.code or "server_error", exc.message)
            self.done = True
            self.dirty = True


def _obj(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_TOOL_EVENT_PHASES = frozenset(
    {"in_progress", "completed", "failed", *(p for ps in TOOL_PHASES.values() for p in ps)}
)

# How an output text delta begins (ResponsesRelay.fast): its SSE event name, or its JSON data when the
# upstream sends no ``event:`` line (OpenAI puts ``type`` first).
_TEXT_DELTA_NAME = b"response.output_text.delta"
_TEXT_DELTA_HEAD = b'{"type":"response.output_text.delta"'

_HANDLERS: dict[str, Callable[[ResponsesRelay, JSON], None]] = {
    "response.created": ResponsesRelay._ignore,
    "response.in_progress": ResponsesRelay._ignore,
    "response.queued": ResponsesRelay._ignore,
    "response.output_item.added": ResponsesRelay._added,
    "response.output_item.done": ResponsesRelay._done,
    "response.content_part.added": ResponsesRelay._part_added,
    "response.content_part.done": ResponsesRelay._ignore,
    "response.output_text.delta": ResponsesRelay._text_delta,
    "response.output_text.done": ResponsesRelay._text_done,
    "response.output_text.annotation.added": ResponsesRelay._annotation,
    "response.refusal.delta": ResponsesRelay._refusal_delta,
    "response.refusal.done": ResponsesRelay._refusal_done,
    "response.reasoning_summary_part.added": ResponsesRelay._summary_added,
    "response.reasoning_summary_part.done": ResponsesRelay._summary_part_done,
    "response.reasoning_summary_text.delta": ResponsesRelay._summary_delta,
    "response.reasoning_summary_text.done": ResponsesRelay._summary_text_done,
    "response.reasoning_text.delta": ResponsesRelay._reasoning_text_delta,
    "response.reasoning_text.done": ResponsesRelay._reasoning_text_done,
    "response.reasoning.delta": ResponsesRelay._reasoning_text_delta,
    "response.reasoning.done": ResponsesRelay._reasoning_text_done,
    "response.function_call_arguments.delta": ResponsesRelay._arguments_delta,
    "response.function_call_arguments.done": ResponsesRelay._arguments_done,
    "response.mcp_call_arguments.delta": ResponsesRelay._arguments_delta,
    "response.mcp_call_arguments.done": ResponsesRelay._ignore,
    "response.custom_tool_call_input.delta": ResponsesRelay._custom_delta,
    "response.custom_tool_call_input.done": ResponsesRelay._custom_done,
    "response.code_interpreter_call_code.delta": ResponsesRelay._code_delta,
    "response.code_interpreter_call_code.done": ResponsesRelay._ignore,
    "response.image_generation_call.partial_image": ResponsesRelay._partial_image,
    "response.completed": ResponsesRelay._terminal,
    "response.incomplete": ResponsesRelay._terminal,
    "response.failed": ResponsesRelay._terminal,
    "error": ResponsesRelay._error,
}


# ---------------------------------------------------------------------------------------- provider
# (Compiled, its methods refuse instances of interpreted subclasses: configure an instance instead, as
# ``server.model_process.local_model_client`` does.)
@mypyc_attr(native_class=False)
class OpenAIResponsesProvider(HTTPProvider[ResponsesRelay]):
    """A model behind OpenAI's Responses API (or a compatible server), relayed through the builder."""

    name = "openai"
    capabilities = Capabilities(
        streaming=True,
        tools=True,
        parallel_tool_calls=True,
        reasoning=True,
        structured_output=True,
        images=True,
        tool_types=ALL_TOOL_TYPES,
        file_inputs="native",
    )
    push_relay = True

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        upstream_model: str | None = None,
        transport: Transport | None = None,
        timeouts: Timeouts | None = None,
        extra_headers: dict[str, str] | None = None,
        check_upstream: bool = True,
        upstream_name: str = "OpenAI",
        relay: type[ResponsesRelay] = ResponsesRelay,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            upstream_model=upstream_model,
            transport=transport,
            timeouts=timeouts,
            extra_headers=extra_headers,
            upstream_name=upstream_name,
        )
        self._check_upstream = check_upstream
        self._relay = relay

    @property
    def url(self) -> str:
        base = self.base_url
        return base if base.endswith("/responses") else base + "/responses"

    def endpoint(self, request: ResponseRequest) -> str:
        return self.url

    compacts = True

    async def compact(self, request: ResponseRequest) -> JSON | None:
        """OpenAI compacts natively: its own ``/v1/responses/compact``, answered as it comes."""
        body = {k: v for k, v in self.build_body(request).items() if k in _COMPACT_FIELDS}
        resp = await self.open(self.url + "/compact", body)
        try:
            answer = await resp.json()
        finally:
            await resp.aclose()
        if not isinstance(answer, dict) or answer.get("object") != "response.compaction":
            raise ProviderError("OpenAI's compaction answer is not a response.compaction.", status=502)
        return answer

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """OpenAI's own ``/v1/responses/input_tokens`` on the body a request would send."""
        body = {k: v for k, v in self.build_body(request).items() if k in _COUNT_FIELDS}
        return await self.count_with(self.url + "/input_tokens", body, "input_tokens")

    def headers(self) -> dict[str, str]:
        """Request headers (the key among them: never log this)."""
        out = {"accept": "text/event-stream"}
        if self._api_key:
            out["authorization"] = f"Bearer {self._api_key}"
        out.update(self._extra_headers)
        return out

    def build_body(self, request: ResponseRequest) -> JSON:
        """The upstream request body."""
        return build_responses_body(request, upstream_model=self.upstream_model)

    def translator(self, request: ResponseRequest, builder: StreamBuilder) -> ResponsesRelay:
        return self._relay(builder, check=self._check_upstream)

    def replay(self, turn: ResponsesRelay, body: Any) -> None:
        # A server that ignored ``stream: true`` answered with the whole Response.
        replay_response(turn, body)

    def dispatcher(self) -> Callable[[ResponsesRelay, SSEMessage], None]:
        return _dispatch

    def fast_path(self, turn: ResponsesRelay) -> Callable[[bytes, bytes], bool] | None:
        return turn.fast

    def after_push(self, turn: ResponsesRelay) -> Callable[[], None] | None:
        return turn.check_later if turn.checker is not None else None


def replay_response(relay: ResponsesRelay, body: Any) -> None:
    """Drive the relay from a non-streamed Response body."""
    if isinstance(body, dict) and body.get("object") != "response" and body.get("error") is not None:
        raise from_error_payload(body)
    if not isinstance(body, dict) or body.get("object") != "response":
        raise ProviderError("The upstream answered with an unexpected JSON body.", status=502)
    status = body.get("status")
    terminal = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
        str(status), "response.failed"
    )
    relay.on_event({"type": terminal, "response": body})


def _dispatch(relay: ResponsesRelay, msg: SSEMessage) -> None:
    data = msg.data
    if data.strip() == "[DONE]":
        return
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        log.debug("ignoring an upstream event that is not JSON")
        return
    if not isinstance(payload, dict):
        return
    try:
        translate(relay.on_event, payload, let_through=(BuilderError,))
    except BuilderError as exc:
        # An upstream event that contradicts the stream so far (e.g. a delta for a finished part) is
        # dropped: the client keeps a valid stream, the upstream's fault is logged.
        log.warning("dropping upstream %s: %s", payload.get("type"), exc)
