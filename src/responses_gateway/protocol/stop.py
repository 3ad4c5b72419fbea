"""Stop sequences enforced on streamed text: the output is cut before the first occurrence of any of
them, across deltas.

Sans-IO. :class:`StopScanner` is given the text of one output part a delta at a time and returns what
may be sent now: everything except the tail that could still be the beginning of a stop sequence
(held back until the next delta decides it, or :meth:`StopScanner.flush` at the end of the part).
Once a sequence is found, :attr:`StopScanner.matched` names it and everything after it is dropped.

The :class:`~responses_gateway.protocol.builder.StreamBuilder` applies it to ``output_text`` deltas
when a scanner is set on it (``builder.stop``: the engine's ``StopSequences`` does so for a request
with stop sequences); the front ends validate the sequences with :func:`check_stop`.
"""

from __future__ import annotations

from typing import Any

from .request import RequestError

__all__ = ["MAX_STOP_LENGTH", "StopScanner", "check_stop"]

# The longest stop sequence accepted (characters): the scanner holds back at most this much less one.
MAX_STOP_LENGTH = 1024


def check_stop(value: Any, param: str, *, limit: int, allow_string: bool) -> tuple[str, ...]:
    """A dialect's stop sequences (``stop``: a string or an array; ``stop_sequences``: an array),
    validated: at most ``limit``, each a non-empty string of at most :data:`MAX_STOP_LENGTH`
    characters; duplicates dropped. RequestError (OpenAI's message and param) otherwise."""
    if value is None:
        return ()
    if isinstance(value, str) and allow_string:
        value = [value]
    if not isinstance(value, list):
        expected = "a string or an array of strings" if allow_string else "an array of strings"
        got = type(value).__name__
        raise RequestError(
            f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
            param=param,
            code="invalid_type",
        )
    if len(value) > limit:
        raise RequestError(
            f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, but got "
            f"an array with length {len(value)} instead.",
            param=param,
            code="array_above_max_length",
        )
    out: list[str] = []
    for i, seq in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(seq, str):
            got = "null" if seq is None else type(seq).__name__
            raise RequestError(
                f"Invalid type for '{where}': expected a string, but got {got} instead.",
                param=where,
                code="invalid_type",
            )
        if not seq:
            raise RequestError(f"Invalid '{where}': empty string.", param=where, code="empty_string")
        if len(seq) > MAX_STOP_LENGTH:
            raise RequestError(
                f"Invalid '{where}': string too long. Expected a string with maximum length "
                f"{MAX_STOP_LENGTH}, but got a string with length {len(seq)} instead.",
                param=where,
                code="string_above_max_length",
            )
        if seq not in out:
            out.append(seq)
    return tuple(out)


class StopScanner:
    """Finds the first of ``sequences`` in text that arrives in pieces (see the module docstring)."""

    __slots__ = ("_held", "matched", "sequences")

    def __init__(self, sequences: tuple[str, ...] | list[str]) -> None:
        self.sequences = tuple(s for s in sequences if s)
        self.matched: str | None = None
        self._held = ""

    @property
    def held(self) -> str:
        """The text held back: it may still begin a stop sequence."""
        return self._held

    def feed(self, delta: str) -> str:
        """The part of ``held + delta`` that may be sent now; after a match, the text before it."""
        if self.matched is not None:
            return ""
        text = self._held + delta
        # The earliest occurrence of any sequence (the longest first where two start at one place).
        first: tuple[int, int, str] | None = None
        for seq in self.sequences:
            at = text.find(seq)
            if at >= 0 and (first is None or (at, -len(seq)) < (first[0], first[1])):
                first = (at, -len(seq), seq)
        if first is not None:
            self.matched = first[2]
            self._held = ""
            return text[: first[0]]
        keep = self._partial(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _partial(self, text: str) -> int:
        """How many characters at the end of ``text`` are a proper prefix of some sequence."""
        best = 0
        for seq in self.sequences:
            for size in range(min(len(seq) - 1, len(text)), best, -1):
                if text.endswith(seq[:size]):
                    best = size
                    break
        return best

    def flush(self) -> str:
        """The end of the part: what was held back is text after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def reset(self) -> None:
        """A new part begins (the match, if any, stands)."""
        self._held = ""
