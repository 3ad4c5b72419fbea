"""A JSON document's bytes in which only some string values change, matched without parsing.

The text chunks of a Chat Completions stream differ in one string: ``"delta":{"content":"…"}``
(OpenAI's also in its ``obfuscation`` string); the bytes around it repeat. :class:`StringHoles` is
learnt from one such chunk, parsed once, and then takes each following chunk's bytes apart with a few
byte searches: the text comes out without parsing the chunk, and its JSON string, as it is on the wire,
can go into the client's event as it is (``sse.text_delta_frame``).

Why that is the parse's answer, not a guess: a match is the learnt bytes, unchanged, with each hole
holding a string token written without a quote, a backslash or a control character, in valid UTF-8.
Such a token is one JSON string whatever it holds, so the document has the learnt document's
structure with other strings in the holes; and :meth:`StringHoles.learn` checks, by parsing the
learnt bytes with marker strings in the holes, that each hole is the value it stands for. Anything
else (an escape, another field, a finish reason, a changed number) is not a match, and the caller
parses the chunk as before.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["StringHoles"]

# What a string token's bytes between its quotes must not hold to be taken as they are.
_ESCAPED = re.compile(rb'["\\\x00-\x1f]')


def _get(doc: Any, path: Sequence[str | int]) -> Any:
    """``doc`` at ``path``; None if the path is not there."""
    for key in path:
        if isinstance(key, int) and isinstance(doc, list) and 0 <= key < len(doc):
            doc = doc[key]
        elif isinstance(key, str) and isinstance(doc, dict):
            doc = doc.get(key)
        else:
            return None
    return doc


def _set(doc: Any, path: Sequence[str | int], value: str) -> bool:
    """The string at ``path`` in ``doc`` replaced by ``value``; False if there is none."""
    parent = _get(doc, path[:-1])
    last = path[-1]
    if not isinstance(last, str) or not isinstance(parent, dict) or not isinstance(parent.get(last), str):
        return False
    parent[last] = value
    return True


class StringHoles:
    """The bytes of one JSON document with holes where string values may change.

    ``match(data)`` gives the first hole's string (the text) and its JSON token, quotes included,
    when ``data`` is the learnt document with other strings (written without escapes) in its holes;
    None otherwise.
    """

    __slots__ = ("_head", "_tails", "_text_hole")

    def __init__(self, head: bytes, tails: tuple[bytes, ...], text_hole: int) -> None:
        # ``head`` runs to the first hole's opening quote (included); ``tails[i]`` from hole i's
        # closing quote to the next hole's opening quote (included), the last one to the end.
        self._head = head
        self._tails = tails
        self._text_hole = text_hole

    @classmethod
    def learn(
        cls, data: bytes, text_path: Sequence[str | int], others: Sequence[Sequence[str | int]] = ()
    ) -> StringHoles | None:
        """Holes at the string value at ``text_path`` and at each of ``others`` that ``data`` has, or
        None when that cannot be done exactly: ``data`` is not JSON, the text is empty, escaped, or its
        token also appears elsewhere in the bytes, or a marker check fails.

        A hole is found by its token: the value's compact JSON (``orjson.dumps``), preceded by its
        key's for ``others``; it must occur once. The result is then checked: the bytes with a marker
        string in each hole must parse to the document with those markers at those paths.
        """
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        # Each hole: (start, end) of its string between the quotes, its path, whether it is the text's.
        found: list[tuple[int, int, Sequence[str | int], bool]] = []
        for number, path in enumerate((text_path, *others)):
            is_text = number == 0
            value = _get(doc, path)
            token = orjson.dumps(value) if isinstance(value, str) and value else b""
            anchor = token if is_text or not token else orjson.dumps(path[-1]) + b":" + token
            if not token or _ESCAPED.search(token, 1, len(token) - 1) is not None or data.count(anchor) != 1:
                if is_text:
                    return None
                continue
            end = data.find(anchor) + len(anchor) - 1  # the closing quote
            found.append((end - len(token) + 2, end, path, is_text))
        found.sort(key=lambda hole: hole[0])
        for before, after in itertools.pairwise(found):
            if after[0] <= before[1]:
                return None
        starts = [hole[0] for hole in found[1:]] + [len(data)]
        tails = tuple(data[hole[1] : start] for hole, start in zip(found, starts, strict=True))
        text_hole = next(i for i, hole in enumerate(found) if hole[3])
        holes = cls(data[: found[0][0]], tails, text_hole)
        # The parsed document, its holes' values swapped for the markers, is what the probe must parse to.
        markers = [f"\x7fhole{i}" for i in range(len(found))]
        for marker, hole in zip(markers, found, strict=True):
            if not _set(doc, hole[2], marker):
                return None
        try:
            probe = orjson.loads(holes.fill(markers))
        except orjson.JSONDecodeError:
            return None
        return holes if probe == doc else None

    def fill(self, strings: Sequence[str]) -> bytes:
        """The learnt bytes with ``strings`` (written without escapes) in the holes, in order."""
        parts = [self._head]
        for string, tail in zip(strings, self._tails, strict=True):
            parts.append(string.encode())
            parts.append(tail)
        return b"".join(parts)

    def match(self, data: bytes) -> tuple[str, bytes] | None:
        """``data``'s text and the text's JSON token (quotes included), if ``data`` is the learnt
        document with strings written without escapes in its holes (the text not empty)."""
        head = self._head
        if not data.startswith(head):
            return None
        position = len(head)
        text_hole = self._text_hole
        text_span = (0, 0)
        for index, tail in enumerate(self._tails):
            end = data.find(b'"', position)  # a hole holds no quote: the first one closes it
            if end < 0 or not data.startswith(tail, end) or _ESCAPED.search(data, position, end) is not None:
                return None
            if index == text_hole:
                text_span = (position, end)
            elif not data.isascii():
                try:
                    data[position:end].decode()
                except UnicodeDecodeError:
                    return None
            position = end + len(tail)
        start, end = text_span
        if position != len(data) or start == end:
            return None
        try:
            text = data[start:end].decode()
        except UnicodeDecodeError:
            return None
        return text, data[start - 1 : end + 1]
