"""What every fault-injection case asserts, whatever broke: the stream a client saw is sound.

- ``assert_sound_stream(events)``: exactly one terminal event (``response.completed``, ``.incomplete``
  or ``.failed``) and it is the last, sequence numbers contiguous from 0, and the stream passes the
  checker's ``openai`` profile.
- ``assert_no_secret(secrets, *outputs)``: none of ``secrets`` appears in any output (bytes, str or
  JSON-able values), also not in its JSON-escaped form.
- ``terminal_status(events)``: the status the terminal event's Response carries, to compare with what
  the store reads back.
"""

from __future__ import annotations

from typing import Any

import orjson

from responses_gateway.protocol import TERMINAL_EVENTS
from responses_gateway.protocol.checker import check


def assert_sound_stream(events: list[dict[str, Any]]) -> None:
    assert events, "the stream had no events"
    terminals = [i for i, e in enumerate(events) if e.get("type") in TERMINAL_EVENTS]
    assert len(terminals) == 1, f"expected one terminal event, got {[events[i]['type'] for i in terminals]}"
    assert terminals[0] == len(events) - 1, f"events after the terminal: {events[terminals[0] + 1 :]}"
    numbers = [e.get("sequence_number") for e in events]
    assert numbers == list(range(len(events))), f"sequence numbers not contiguous from 0: {numbers}"
    violations = check(events, profile="openai")
    assert not violations, "\n".join(str(v) for v in violations)


def terminal_status(events: list[dict[str, Any]]) -> str:
    status: str = events[-1]["response"]["status"]
    return status


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value, default=str)


def assert_no_secret(secrets: list[str], *outputs: Any) -> None:
    for output in outputs:
        blob = _as_bytes(output)
        for secret in secrets:
            for form in (secret.encode(), orjson.dumps(secret)[1:-1]):
                assert form not in blob, f"a secret reached an output: …{blob[:200]!r}…"
