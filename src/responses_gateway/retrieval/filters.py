"""Attribute filters (``filters`` of a search or a file_search tool), as OpenAI defines them:
comparisons ``eq ne gt gte lt lte in nin`` on a key, compounds ``and`` / ``or``."""

from __future__ import annotations

from typing import Any

__all__ = ["FilterError", "check_filter", "matches"]

_COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")
_MAX_DEPTH = 8
_MAX_NODES = 200


class FilterError(ValueError):
    """An invalid filter; the message names the problem."""


def check_filter(value: Any, path: str = "filters", depth: int = 0, count: list[int] | None = None) -> None:
    count = count if count is not None else [0]
    count[0] += 1
    if depth > _MAX_DEPTH or count[0] > _MAX_NODES:
        raise FilterError(f"'{path}' is nested too deep or has too many parts.")
    if not isinstance(value, dict):
        raise FilterError(f"'{path}' must be an object.")
    kind = value.get("type")
    if kind in ("and", "or"):
        filters = value.get("filters")
        if not isinstance(filters, list) or not filters:
            raise FilterError(f"'{path}.filters' must be a non-empty array.")
        for i, part in enumerate(filters):
            check_filter(part, f"{path}.filters[{i}]", depth + 1, count)
        return
    if kind not in _COMPARISONS:
        raise FilterError(f"'{path}.type' must be one of: " + ", ".join((*_COMPARISONS, "and", "or")) + ".")
    if not isinstance(value.get("key"), str):
        raise FilterError(f"'{path}.key' must be a string.")
    target = value.get("value")
    if kind in ("in", "nin"):
        if not isinstance(target, list) or not all(isinstance(v, (str, int, float)) for v in target):
            raise FilterError(f"'{path}.value' must be an array of strings or numbers.")
    elif not isinstance(target, (str, int, float, bool)):
        raise FilterError(f"'{path}.value' must be a string, number or boolean.")


def matches(node: dict[str, Any], attributes: dict[str, Any]) -> bool:
    """Whether a file's ``attributes`` pass a checked filter (a missing key fails a comparison)."""
    kind = node["type"]
    if kind == "and":
        return all(matches(part, attributes) for part in node["filters"])
    if kind == "or":
        return any(matches(part, attributes) for part in node["filters"])
    if node["key"] not in attributes:
        return kind in ("ne", "nin")
    have, want = attributes[node["key"]], node["value"]
    if kind == "eq":
        return bool(have == want)
    if kind == "ne":
        return bool(have != want)
    if kind == "in":
        return have in want
    if kind == "nin":
        return have not in want
    numeric = isinstance(have, (int, float)) and isinstance(want, (int, float))
    textual = isinstance(have, str) and isinstance(want, str)
    if not (numeric or textual):
        return False
    if kind == "gt":
        return bool(have > want)
    if kind == "gte":
        return bool(have >= want)
    if kind == "lt":
        return bool(have < want)
    return bool(have <= want)
