"""A declarative router: paths with ``{name}`` segments, handlers by method.

Every API registers its routes in one place (``ResponsesAPI.register``, …)::

    router.add("/v1/containers/{container_id}/files/{file_id}", GET=self._file, DELETE=self._delete_file)

A handler is called as ``handler(scope, receive, send, **params)`` with the path's named segments.
A last segment ``{name:path}`` takes the rest of the path, slashes included (model names such as
``openai/gpt-4o``). Exact paths (``POST /v1/responses``, the hot path) are one dict lookup and win
over patterns (``/v1/responses/compact`` over ``/v1/responses/{response_id}``); patterns are tried in
the order they were added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["Handler", "Match", "Router"]

Handler = Callable[..., Awaitable[None]]  # (scope, receive, send, **params)
Methods = dict[str, Handler]
# (handlers by method, path parameters, the route's pattern: ``/v1/responses/{rid}``, a metrics label).
Match = tuple[Methods, dict[str, str], str]


class Router:
    """Path -> handlers by method, with path parameters."""

    def __init__(self) -> None:
        self._exact: dict[str, Methods] = {}
        self._patterns: list[tuple[list[str | None], list[str], bool, Methods, str]] = []

    def add(self, pattern: str, **methods: Handler) -> None:
        """Route ``pattern`` (``/v1/things/{thing_id}``) to ``methods`` (``GET=…, DELETE=…``)."""
        if not pattern.startswith("/") or not methods:
            raise ValueError(f"a route needs an absolute path and at least one method: {pattern!r}")
        segments = pattern.split("/")[1:]
        rest = bool(segments) and segments[-1].endswith(":path}")
        if rest:
            segments[-1] = segments[-1].removesuffix(":path}") + "}"
        names = [s[1:-1] for s in segments if s.startswith("{") and s.endswith("}")]
        if not names:
            if pattern in self._exact:
                raise ValueError(f"{pattern} is routed twice")
            self._exact[pattern] = dict(methods)
            return
        literals: list[str | None] = [None if s.startswith("{") else s for s in segments]
        self._patterns.append((literals, names, rest, dict(methods), pattern))

    def match(self, path: str) -> Match | None:
        """The handlers for ``path``, its parameters and the route's pattern, or None (a 404)."""
        exact = self._exact.get(path)
        if exact is not None:
            return exact, {}, path
        parts = path.split("/")[1:]
        for literals, names, rest, methods, pattern in self._patterns:
            n = len(literals)
            if len(parts) < n or (len(parts) > n and not rest):
                continue
            segments = parts if len(parts) == n else [*parts[: n - 1], "/".join(parts[n - 1 :])]
            values: list[str] = []
            for literal, segment in zip(literals, segments, strict=True):
                if literal is None:
                    if not segment:
                        break
                    values.append(segment)
                elif literal != segment:
                    break
            else:
                return methods, dict(zip(names, values, strict=True)), pattern
        return None
