"""Server-sent events, incrementally: bytes in, messages out; event dicts in, bytes out.

The decoder follows the WHATWG EventSource parsing rules
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation) and accepts
input split at any byte. Line ends are CR, LF or CRLF; because none of them can occur inside a UTF-8
multibyte sequence, lines are cut as bytes and only field values are decoded, so a chunk boundary inside
a character needs no special care.

The encoder writes the frames our server sends: ``event: <type>\\ndata: <one-line JSON>\\n\\n``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

__all__ = [
    "DONE",
    "EventStreamDecoder",
    "SSEComment",
    "SSEDecoder",
    "SSEEventTooLarge",
    "SSEMessage",
    "SSEPayloadError",
    "decode_event",
    "decode_events",
    "encode_comment",
    "encode_event",
    "text_delta_frame",
    "text_delta_middle",
]

DONE = b"data: [DONE]\n\n"
_DONE_DATA = "[DONE]"
_BOM = b"\xef\xbb\xbf"


class SSEMessage:
    """One dispatched event: its type (default ``message``), data, last event id and retry."""

    __slots__ = ("data", "event", "id", "retry")

    def __init__(self, event: str, data: str, id: str | None = None, retry: int | None = None) -> None:
        self.event = event
        self.data = data
        # The last event ID as the spec defines it: it persists across events until an ``id`` field
        # changes it, so this is not only the id given inside this event's block.
        self.id = id
        # The ``retry`` value given inside this event's block, if any.
        self.retry = retry

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SSEMessage):
            return NotImplemented
        return (
            type(self) is type(other)
            and self.event == other.event
            and self.data == other.data
            and self.id == other.id
            and self.retry == other.retry
        )

    def __hash__(self) -> int:
        return hash((type(self), self.event, self.data, self.id, self.retry))

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(event={self.event!r}, data={self.data!r}, id={self.id!r}, retry={self.retry!r})"


class SSEComment(SSEMessage):
    """A comment line (``: text``), reported in stream order only when the decoder is asked to."""

    __slots__ = ()

    def __init__(self, text: str) -> None:
        super().__init__("", text)


class SSEDecoder:
    """Incremental EventSource parser: ``feed(bytes) -> [SSEMessage]``, then ``flush()`` at end of stream.

    With ``comments=True`` comment lines come back as :class:`SSEComment` (useful to see keepalives).
    After :meth:`flush`, :attr:`truncated` tells whether the stream stopped inside an event (a field
    or a partial line without its terminating blank line), which the spec silently discards.
    """

    __slots__ = (
        "_bom_checked",
        "_comments",
        "_data",
        "_data_size",
        "_event",
        "_has_fields",
        "_limit",
        "_retry",
        "_skip_lf",
        "_tail",
        "_tail_size",
        "_too_large",
        "last_event_id",
        "retry",
        "truncated",
    )

    def __init__(
        self,
        comments: bool = False,
        *,
        max_event_bytes: int | None = None,
        too_large: Callable[[int], BaseException] | None = None,
    ) -> None:
        """``max_event_bytes`` bounds one event still being received (its data lines and the line in
        progress): past it, ``feed`` raises ``too_large(limit)`` (default :class:`SSEEventTooLarge`),
        so an endless line cannot take the process's memory."""
        self._comments = comments
        self._limit = max_event_bytes
        self._too_large = too_large or SSEEventTooLarge.for_limit
        self._tail_size = 0
        self._data_size = 0
        # Pieces of the current, not yet terminated line.
        self._tail: list[bytes] = []
        self._bom_checked = False
        # A chunk ended in CR: the line is complete, but an LF starting the next chunk belongs to it.
        self._skip_lf = False
        self._data: list[bytes] = []
        self._event = b""
        self._retry: int | None = None
        self._has_fields = False
        self.last_event_id: str | None = None
        # The reconnection time most recently announced by a ``retry`` field, in milliseconds.
        self.retry: int | None = None
        self.truncated = False

    def feed(self, data: bytes) -> list[SSEMessage]:
        """Consume a chunk of the stream and return the events it completes.

        Byte searches here use ``find``, not ``in``: on CPython 3.11 ``bytes.__contains__`` first tries
        its argument as an integer, raising and clearing a formatted TypeError every time.
        """
        if not data:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if data[0] == 0x0A:
                data = data[1:]
                if not data:
                    return []
        if not self._bom_checked:
            data = b"".join(self._tail) + data
            self._tail = []
            if len(data) < 3 and _BOM.startswith(data):
                self._tail.append(data)
                return []
            self._bom_checked = True
            if data.startswith(_BOM):
                data = data[3:]
        if data.find(b"\n") < 0 and data.find(b"\r") < 0:
            # Still inside one line (a long JSON payload arriving in many chunks): keep the pieces and
            # join once, so a multi-megabyte line costs linear time, not quadratic.
            self._tail.append(data)
            self._tail_size += len(data)
            if self._limit is not None and self._tail_size + self._data_size > self._limit:
                raise self._too_large(self._limit)
            return []
        if self._tail:
            self._tail.append(data)
            buf = b"".join(self._tail)
        else:
            buf = data
        if buf.find(b"\r") >= 0:
            if buf[-1] == 0x0D:
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        # At an event boundary (the usual case: a chunk holds whole events), a block that is one
        # ``data: `` line, or an ``event: `` line and a ``data: `` line, is the whole event; anything
        # else, and whatever follows the last blank line, goes through the field-by-field path.
        if self._data or self._has_fields:
            blocks, rest = [], buf
        else:
            blocks = buf.split(b"\n\n")
            rest = blocks.pop()
        out: list[SSEMessage] = []
        for block in blocks:
            if block[:6] == b"data: " and block.find(b"\n") < 0:
                out.append(SSEMessage("message", block[6:].decode("utf-8", "replace"), self.last_event_id))
                continue
            if block[:7] == b"event: ":
                end = block.find(b"\n")
                if end > 7 and block[end + 1 : end + 7] == b"data: " and block.find(b"\n", end + 1) < 0:
                    out.append(
                        SSEMessage(
                            block[7:end].decode("utf-8", "replace"),
                            block[end + 7 :].decode("utf-8", "replace"),
                            self.last_event_id,
                        )
                    )
                    continue
            lines = block.split(b"\n")
            lines.append(b"")
            out += self._lines(lines)
        lines = rest.split(b"\n")
        last = lines.pop()
        self._tail = [last] if last else []
        self._tail_size = len(last)
        if lines:
            out += self._lines(lines)
        if self._limit is not None and self._tail_size + self._data_size > self._limit:
            raise self._too_large(self._limit)
        return out

    def single(self, data: bytes) -> tuple[bytes, bytes] | None:
        """``data`` as ``(event name, data)`` when it is exactly one whole event and the decoder is
        between events; None otherwise, and then :meth:`feed` must take it. Nothing is consumed.

        The usual upstream read at a model's pace is one event: a ``data:`` line, or an ``event:``
        line and a ``data:`` line, then a blank line (LF only). A caller that can act on the raw
        payload skips the message object and the text decode (the event name is ``b""`` when there
        is no ``event:`` line); the outcome is the one :meth:`feed` would give for these bytes.
        """
        if self._tail or self._data or self._has_fields or self._skip_lf or not self._bom_checked:
            return None
        if not data.endswith(b"\n\n") or data.find(b"\r") >= 0:
            return None
        if data.startswith(b"data: "):
            event = b""
            body = data[6:-2]
        elif data.startswith(b"event: "):
            end = data.find(b"\n")
            if not data.startswith(b"data: ", end + 1):
                return None
            event = data[7:end]
            body = data[end + 7 : -2]
        else:
            return None
        if body.find(b"\n") >= 0 or (self._limit is not None and len(body) > self._limit):
            return None
        return event, body

    def flush(self, dispatch_incomplete: bool = False) -> list[SSEMessage]:
        """Signal end of stream; return events it completes (none, per spec, unless asked otherwise).

        A partial last line and an event without its blank line are discarded by the spec;
        ``dispatch_incomplete=True`` dispatches them anyway, as lenient clients do. Either way
        :attr:`truncated` records that they were there. The decoder is then ready for a new stream.
        """
        buf = b"".join(self._tail)
        self._tail = []
        self._tail_size = 0
        self._skip_lf = False
        out: list[SSEMessage] = []
        if not self._bom_checked:
            self._bom_checked = True
            if buf.startswith(_BOM):
                buf = buf[3:]
        self.truncated = bool(buf) or self._has_fields
        if dispatch_incomplete:
            out = self._lines([buf, b""] if buf else [b""])
        self._reset_event()
        self._bom_checked = False
        return out

    def _reset_event(self) -> None:
        self._data = []
        self._data_size = 0
        self._event = b""
        self._retry = None
        self._has_fields = False

    def _lines(self, lines: list[bytes]) -> list[SSEMessage]:
        out: list[SSEMessage] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    text = b"\n".join(data).decode("utf-8", "replace")
                    event = self._event.decode("utf-8", "replace") if self._event else "message"
                    out.append(SSEMessage(event, text, self.last_event_id, self._retry))
                    data = self._data = []
                    self._data_size = 0
                # The spec resets the event type and data buffers even when nothing is dispatched.
                self._event = b""
                self._retry = None
                self._has_fields = False
                continue
            if line[0] == 0x3A:
                if self._comments:
                    value = line[2:] if line[1:2] == b" " else line[1:]
                    out.append(SSEComment(value.decode("utf-8", "replace")))
                continue
            self._has_fields = True
            colon = line.find(b":")
            if colon < 0:
                field, value = line, b""
            else:
                field = line[:colon]
                value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
            if field == b"data":
                data.append(value)
                self._data_size += len(value)
            elif field == b"event":
                self._event = value
            elif field == b"id" and b"\x00" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
            elif field == b"retry" and value.isdigit():
                # bytes.isdigit() is ASCII-only and False for b"", exactly the spec's rule.
                self._retry = self.retry = int(value)
        return out


class SSEEventTooLarge(ValueError):
    """An event grew past the decoder's ``max_event_bytes`` before it ended."""

    @classmethod
    def for_limit(cls, limit: int) -> SSEEventTooLarge:
        return cls(f"an event is larger than {limit} bytes")


class SSEPayloadError(ValueError):
    """An event's data is not the JSON object the Responses protocol requires."""


def decode_event(message: SSEMessage) -> dict[str, Any] | None:
    """Parse one message's JSON data into an event dict; ``None`` for comments, ``[DONE]`` and empty pings.

    When the JSON has no ``type`` the SSE event name stands in for it (some servers only put the
    type in ``event:``).
    """
    data = message.data
    if not data or data == _DONE_DATA or isinstance(message, SSEComment):
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SSEPayloadError(f"event {message.event!r}: data is not JSON: {exc}: {data[:200]!r}") from None
    if not isinstance(value, dict):
        raise SSEPayloadError(f"event {message.event!r}: data is not a JSON object: {data[:200]!r}")
    if "type" not in value and message.event != "message":
        value["type"] = message.event
    return value


def decode_events(messages: Iterable[SSEMessage]) -> list[dict[str, Any]]:
    """Parse many messages (see :func:`decode_event`), skipping the ones that carry no event."""
    out: list[dict[str, Any]] = []
    for message in messages:
        event = decode_event(message)
        if event is not None:
            out.append(event)
    return out


class EventStreamDecoder:
    """Bytes to event dicts in one step: an :class:`SSEDecoder` plus :func:`decode_event`.

    :attr:`done` is set once a ``data: [DONE]`` sentinel arrives; :attr:`comments` counts comment
    lines (keepalives) seen so far.
    """

    __slots__ = ("_sse", "comments", "done")

    def __init__(self) -> None:
        self._sse = SSEDecoder(comments=True)
        self.done = False
        self.comments = 0

    @property
    def truncated(self) -> bool:
        """Whether the stream ended inside an event (known after :meth:`flush`)."""
        return self._sse.truncated

    @property
    def last_event_id(self) -> str | None:
        """The last event id the stream set."""
        return self._sse.last_event_id

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Consume a chunk and return the events it completes."""
        return self._events(self._sse.feed(data))

    def flush(self, dispatch_incomplete: bool = False) -> list[dict[str, Any]]:
        """Signal end of stream; an unterminated final event is discarded unless asked otherwise."""
        return self._events(self._sse.flush(dispatch_incomplete))

    def _events(self, messages: list[SSEMessage]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for message in messages:
            if isinstance(message, SSEComment):
                self.comments += 1
                continue
            if message.data == _DONE_DATA:
                self.done = True
                continue
            event = decode_event(message)
            if event is not None:
                out.append(event)
        return out


_PREFIXES: dict[str, bytes] = {}


def encode_event(event: dict[str, Any]) -> bytes:
    """One SSE frame: ``event: <type>``, ``data: <JSON on one line>``, blank line (LF only, no id)."""
    kind: str = event["type"]
    prefix = _PREFIXES.get(kind)
    if prefix is None:
        if "\n" in kind or "\r" in kind:
            raise ValueError(f"event type contains a line break: {kind!r}")
        prefix = b"event: " + kind.encode() + b"\ndata: "
        # Bounded so that a stream of made-up event types cannot grow the cache without limit.
        if len(_PREFIXES) < 512:
            _PREFIXES[kind] = prefix
    return b"".join((prefix, orjson.dumps(event), b"\n\n"))


_TEXT_DELTA_HEAD = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
)


def text_delta_middle(item_id: str, output_index: int, content_index: int) -> bytes:
    """What a ``response.output_text.delta`` frame holds between its sequence number and its text
    (the same for every delta of one content part): see :func:`text_delta_frame`."""
    return b',"item_id":%b,"output_index":%d,"content_index":%d,"delta":' % (
        orjson.dumps(item_id),
        output_index,
        content_index,
    )


def text_delta_frame(sequence_number: int, middle: bytes, text_json: bytes) -> bytes:
    """The frame :func:`encode_event` makes of the builder's ``response.output_text.delta`` event
    without logprobs, from the text's JSON string as ``orjson.dumps`` writes it (``text_json``,
    quotes included) and the part's :func:`text_delta_middle`: the event is not serialized again."""
    return b'%b%d%b%b,"logprobs":[]}\n\n' % (_TEXT_DELTA_HEAD, sequence_number, middle, text_json)


def encode_comment(text: str = "") -> bytes:
    """An SSE comment frame (every line prefixed with ``:``), e.g. a keepalive."""
    if not text:
        return b":\n\n"
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "".join(f": {line}\n" for line in lines).encode() + b"\n"
