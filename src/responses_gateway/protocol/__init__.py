"""The Responses event protocol, sans-IO: no sockets, no asyncio, no framework imports.

``StreamBuilder`` emits events from semantic calls; ``Accumulator`` turns any event stream back into
a Response; ``SSEDecoder``/``encode_event`` are the incremental wire codec; ``check`` validates a
stream against the rules real clients enforce.
"""

from .accumulator import Accumulator, accumulate
from .builder import TERMINAL_EVENTS, BuilderError, Item, StreamBuilder, error_event
from .checker import StreamChecker, Violation, check
from .response import ECHOED_DEFAULTS, empty_usage, make_usage, new_id, new_response
from .sse import (
    DONE,
    EventStreamDecoder,
    SSEComment,
    SSEDecoder,
    SSEMessage,
    SSEPayloadError,
    decode_event,
    decode_events,
    encode_comment,
    encode_event,
)

__all__ = [
    "DONE",
    "ECHOED_DEFAULTS",
    "TERMINAL_EVENTS",
    "Accumulator",
    "BuilderError",
    "EventStreamDecoder",
    "Item",
    "SSEComment",
    "SSEDecoder",
    "SSEMessage",
    "SSEPayloadError",
    "StreamBuilder",
    "StreamChecker",
    "Violation",
    "accumulate",
    "check",
    "decode_event",
    "decode_events",
    "empty_usage",
    "encode_comment",
    "encode_event",
    "error_event",
    "make_usage",
    "new_id",
    "new_response",
]
