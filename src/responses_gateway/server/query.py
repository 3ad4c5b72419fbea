"""The query string of a list request (``after``, ``limit``, ``order``), checked with OpenAI's wording.

Shared by the APIs that list things (conversation items, containers, container files).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from .errors import HTTPError
from .types import Scope

__all__ = ["ORDERS", "ListQuery", "invalid"]

ORDERS = ("asc", "desc")


def invalid(message: str, param: str, code: str) -> HTTPError:
    """A 400 naming ``param``, with OpenAI's error ``code``."""
    return HTTPError(400, message, param=param, code=code)


class ListQuery:
    """A list or retrieve request's query string."""

    def __init__(self, scope: Scope) -> None:
        raw: bytes = scope.get("query_string", b"")
        self.pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)

    def last(self, name: str) -> str | None:
        found = [v for k, v in self.pairs if k == name]
        return found[-1] if found else None

    def limit(self, default: int = 20, maximum: int = 100) -> int:
        text = self.last("limit")
        if text is None or text == "":
            return default
        try:
            value = int(text)
        except ValueError:
            raise invalid(
                f"Invalid type for 'limit': expected an integer, but got a string ('{text[:40]}') instead.",
                "limit",
                "invalid_type",
            ) from None
        if value < 1:
            raise invalid(
                "Invalid 'limit': integer below minimum value. Expected a value >= 1, "
                f"but got {value} instead.",
                "limit",
                "integer_below_min_value",
            )
        if value > maximum:
            raise invalid(
                f"Invalid 'limit': integer above maximum value. Expected a value <= {maximum}, "
                f"but got {value} instead.",
                "limit",
                "integer_above_max_value",
            )
        return value

    def order(self) -> str:
        value = self.last("order") or "desc"
        if value not in ORDERS:
            raise invalid(
                f"Invalid value: '{value[:40]}'. Supported values are: 'asc' and 'desc'.",
                "order",
                "invalid_value",
            )
        return value

    def after(self) -> str | None:
        return self.last("after") or None
