"""One string field of a JSON object, decoded while the object streams in.

A hosted tool is offered to a model as a function; the model writes its arguments as JSON, a few
characters at a time (``{"code": "import numpy as np\\nprint(`` …). The client must see the *code*
stream (``response.code_interpreter_call_code.delta``), not the JSON around it, so
:class:`StringFieldStream` pulls the decoded text of one field out of the argument deltas as they
arrive: escapes are decoded once complete (a ``\\u`` escape or a surrogate pair split across deltas is
held back), the closing quote ends it.

Streaming starts only when the field is the object's first key (what models write when the schema has
one required property); otherwise nothing streams and :meth:`StringFieldStream.finish` gives the
whole value from the complete arguments. Either way the concatenated deltas equal the final value.
"""

from __future__ import annotations

import json
import re

__all__ = ["StringFieldStream", "clean_text"]


class StringFieldStream:
    """Feed argument deltas; get back the newly decoded text of field ``key`` (a JSON string)."""

    __slots__ = ("_buf", "_done", "_emitted", "_head", "_pos", "_start", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self._head = re.compile(r'\s*\{\s*"' + re.escape(key) + r'"\s*:\s*"')
        self._buf = ""
        self._start = -1  # index in _buf where the value's characters begin (-1: not found yet)
        self._pos = 0  # index in _buf up to which the value has been decoded
        self._done = False  # the closing quote was seen
        self._emitted: list[str] = []

    @property
    def streamed(self) -> str:
        """Everything returned by :meth:`feed` so far."""
        return "".join(self._emitted)

    def feed(self, delta: str) -> str:
        """The text of the field decoded from ``delta`` (may be empty)."""
        if self._done:
            return ""
        self._buf += delta
        if self._start < 0:
            match = self._head.match(self._buf)
            if match is None:
                if len(self._buf) > len(self.key) + 64 or self._buf.lstrip()[1:].lstrip()[:1] not in (
                    '"',
                    "",
                ):
                    self._done = True  # not the first key: nothing streams (finish() gives it whole)
                    self._buf = ""
                return ""
            self._start = self._pos = match.end()
        text = self._decode()
        # Only the undecoded tail is kept (a long value must not be copied per delta).
        self._buf, self._pos = self._buf[self._pos :], 0
        if self._done:
            self._buf = ""
        return text

    def _decode(self) -> str:
        raw = self._buf
        i = self._pos
        end = len(raw)
        while i < end:
            c = raw[i]
            if c == '"':
                self._done = True
                break
            if c == "\\":
                if i + 1 >= end:
                    break
                if raw[i + 1] == "u":
                    if i + 6 > end:
                        break
                    code = int(raw[i + 2 : i + 6], 16) if _is_hex(raw[i + 2 : i + 6]) else -1
                    if 0xD800 <= code < 0xDC00 and raw[i + 6 : i + 7] in ("\\", ""):
                        # A high surrogate followed by an escape (or nothing yet): its low half may follow.
                        if i + 12 > end:
                            break
                        i += 12 if raw[i + 7 : i + 8] == "u" else 6
                        continue
                    i += 6
                    continue
                i += 2
                continue
            i += 1
        segment = raw[self._pos : i]
        if not segment:
            return ""
        try:
            text: str = json.loads(f'"{segment}"', strict=False)
        except ValueError:
            # A malformed escape: stop streaming; finish() reports whatever the JSON turns out to hold.
            self._done = True
            return ""
        self._pos = i
        text = clean_text(text)
        self._emitted.append(text)
        return text

    def finish(self, arguments: str) -> tuple[str | None, str]:
        """The field's whole value from the complete ``arguments`` (None if absent or not a string)
        and the part of it not streamed yet ("" when the stream already gave it all)."""
        try:
            parsed = json.loads(arguments, strict=False)
        except ValueError:
            return None, ""
        value = parsed.get(self.key) if isinstance(parsed, dict) else None
        if not isinstance(value, str):
            return None, ""
        value = clean_text(value)
        streamed = self.streamed
        return value, value[len(streamed) :] if value.startswith(streamed) else ""


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (from ``\\ud800`` escapes, say) replaced: they cannot be encoded
    as UTF-8, so one in an event would break the stream."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _is_hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)
