"""A finished response's text stored once: events keep references into its output items.

A streamed answer repeats its text: in the deltas, in ``output_text.done``, ``content_part.done``,
``output_item.done``, in the terminal event's Response, in the stored Response and in its output items.
Once a response has finished, :func:`compact` rewrites its stored events so that every such copy is
a reference into the final Response instead (a path, and for a delta the slice it was); the stored
Response itself keeps its output only in the output items. :func:`expand` puts the values back, in
place, so a replayed event is the event the client got, key for key.

Nothing is elided unless it is equal to what the reference points at: an upstream whose deltas do
not add up to the final text (or any event shape this module does not know) keeps its events whole.

A reference replaces the value where it stood, as ``{"rg$": path}`` (``"s"``/``"e"``: a delta's
slice); an event holding one carries ``"rg$": 1`` at its end so readers skip the others at a glance.
No Responses event or item has a field named ``rg$``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MARK", "compact", "expand", "has_refs"]

JSON = dict[str, Any]
Path = tuple[str | int, ...]
MARK = "rg$"

# Fields that hold text an output item also holds, by the event's indexes (see _candidates).
_TEXT_FIELDS = ("text", "arguments", "refusal", "input", "code", "delta")
_TARGETS = ("text", "arguments", "refusal", "input", "code")


def _resolve(root: Any, path: Path) -> Any:
    value = root
    for key in path:
        if isinstance(key, int):
            if not isinstance(value, list) or not 0 <= key < len(value):
                return _MISSING
        elif not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


_MISSING = object()


def _indexes(event: JSON) -> tuple[int | None, int | None, int | None]:
    def pick(name: str) -> int | None:
        value = event.get(name)
        return value if type(value) is int else None

    return pick("output_index"), pick("content_index"), pick("summary_index")


def _candidates(event: JSON, target: str) -> list[Path]:
    """Where in the final Response a text field of ``event`` may come from."""
    oi, ci, si = _indexes(event)
    if oi is None:
        return []
    out: list[Path] = [("output", oi, target)]
    if ci is not None:
        out.append(("output", oi, "content", ci, target))
    if si is not None:
        out.append(("output", oi, "summary", si, target))
    return out


def _ref(path: Path) -> JSON:
    return {MARK: list(path)}


def compact(events: list[JSON], response: JSON) -> dict[int, JSON]:
    """The compacted form of each event of a finished ``response`` that has one, by position."""
    changed: dict[int, JSON] = {}

    def replace(index: int, field: str, value: Any) -> None:
        event = changed.get(index) or dict(events[index])
        event[field] = value
        event.pop(MARK, None)
        event[MARK] = 1
        changed[index] = event

    # Deltas: grouped by what they extend; compacted when the group adds up to a final field.
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, event in enumerate(events):
        kind = event.get("type")
        if isinstance(kind, str) and kind.endswith(".delta") and isinstance(event.get("delta"), str):
            groups.setdefault((kind, *_indexes(event)), []).append(index)
    for (_kind, *_), members in groups.items():
        text = "".join(events[i]["delta"] for i in members)
        first = events[members[0]]
        path = next(
            (p for t in _TARGETS for p in _candidates(first, t) if _resolve(response, p) == text),
            None,
        )
        if path is None:
            continue
        start = 0
        for i in members:
            end = start + len(events[i]["delta"])
            replace(i, "delta", {MARK: list(path), "s": start, "e": end})
            start = end

    for index, event in enumerate(events):
        kind = event.get("type")
        if not isinstance(kind, str) or kind.endswith(".delta"):
            continue
        oi, ci, si = _indexes(event)
        if isinstance(event.get("response"), dict) and event["response"] == response:
            replace(index, "response", _ref(()))
        item = event.get("item")
        if oi is not None and isinstance(item, dict) and _resolve(response, ("output", oi)) == item:
            replace(index, "item", _ref(("output", oi)))
        part = event.get("part")
        if oi is not None and isinstance(part, dict):
            for container, at in (("content", ci), ("summary", si)):
                if at is not None and _resolve(response, ("output", oi, container, at)) == part:
                    replace(index, "part", _ref(("output", oi, container, at)))
                    break
        for field in _TEXT_FIELDS[:-1]:
            value = event.get(field)
            if isinstance(value, str) and value:
                paths = (p for t in (field, "text") for p in _candidates(event, t))
                found = next((p for p in paths if _resolve(response, p) == value), None)
                if found is not None:
                    replace(index, field, _ref(found))
    return changed


def has_refs(event: JSON) -> bool:
    return event.get(MARK) == 1


def expand(event: JSON, response: JSON) -> JSON:
    """``event`` with every reference replaced by the value it points at in ``response``."""
    out: JSON = {}
    for key, value in event.items():
        if key == MARK:
            continue
        if isinstance(value, dict) and MARK in value:
            resolved = _resolve(response, tuple(value[MARK]))
            if resolved is _MISSING:
                raise ValueError(f"a stored event refers to {value[MARK]}, which the response does not have")
            if "s" in value:
                resolved = resolved[value["s"] : value["e"]]
            out[key] = resolved
        else:
            out[key] = value
    return out
