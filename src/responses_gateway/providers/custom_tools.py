"""Custom tools on back ends that only know functions (Chat Completions, Gemini, the local model).

A Responses ``custom`` tool (Codex's freeform ``apply_patch``) takes one string, not JSON arguments.
Those back ends get it as a function with a single string parameter ``input``; the tool's description
is kept and its ``format`` grammar (lark or regex), which they cannot enforce, is appended to it. The
model's call comes back as a ``custom_tool_call`` whose ``input`` is that string argument.

:class:`InputStream` reads the string out of argument JSON as it streams in (``{"input": "*** Be``...),
so ``response.custom_tool_call_input.delta`` events follow the upstream's argument deltas.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

JSON = dict[str, Any]

__all__ = [
    "INPUT_KEY",
    "InputStream",
    "custom_arguments",
    "custom_description",
    "custom_input",
    "custom_parameters",
    "custom_tool_names",
]

# The one parameter of the function a custom tool becomes.
INPUT_KEY = "input"

_INPUT_SCHEMA_DESCRIPTION = "The raw input for the tool, as one string."


def custom_description(tool: JSON) -> str:
    """The function description: the tool's own, then its grammar (guidance the model must follow)."""
    texts = [str(tool.get("description") or "")]
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax = fmt.get("syntax") or "lark"
        texts.append(f"The input must match this {syntax} grammar:\n{fmt.get('definition', '')}".rstrip())
    return "\n\n".join(t for t in texts if t)


def custom_parameters() -> JSON:
    """The JSON schema of the function's arguments: one required string, ``input``."""
    return {
        "type": "object",
        "properties": {INPUT_KEY: {"type": "string", "description": _INPUT_SCHEMA_DESCRIPTION}},
        "required": [INPUT_KEY],
        "additionalProperties": False,
    }


def custom_tool_names(tools: list[JSON]) -> frozenset[str]:
    """The names of the request's custom tools."""
    return frozenset(str(t["name"]) for t in tools if t.get("type") == "custom" and t.get("name"))


def custom_arguments(text: Any) -> str:
    """A ``custom_tool_call``'s input as the function arguments it was called with (JSON text)."""
    return orjson.dumps({INPUT_KEY: text if isinstance(text, str) else ""}).decode()


def custom_input(arguments: Any) -> str:
    """The custom tool input in a function call's arguments (JSON text or an already parsed object).

    ``{"input": "..."}`` gives the string; a model that named the one parameter differently, or wrote
    a bare JSON string, still gives its string; anything else is passed on as the arguments text.
    """
    value = arguments
    if isinstance(arguments, str):
        if not arguments.strip():
            return ""
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        text = value.get(INPUT_KEY)
        if isinstance(text, str):
            return text
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and len(strings) == 1:
            return strings[0]
        if not value:
            return ""
    return arguments if isinstance(arguments, str) else orjson.dumps(value).decode()


_SPECIAL = re.compile(r'["\\]')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WHITESPACE = " \t\r\n"
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


class InputStream:
    """The ``input`` string of streamed argument JSON, decoded as the fragments arrive.

    :meth:`feed` returns the newly decoded text (possibly empty: a key, an escape split across
    fragments); :meth:`finish` returns what is still missing once the arguments are complete, so the
    deltas add up to :func:`custom_input` of the whole arguments. Text streams only while the
    arguments start ``{"input": "``; any other shape is read whole at the end.
    """

    __slots__ = ("_buf", "_emitted", "_raw", "_state")

    def __init__(self) -> None:
        self._raw: list[str] = []
        self._buf = ""  # undecided text (whitespace, a key, an incomplete escape)
        self._state = "start"  # start -> key -> colon -> value -> string -> done | off
        self._emitted: list[str] = []

    def feed(self, fragment: str) -> str:
        if not fragment:
            return ""
        self._raw.append(fragment)
        if self._state in ("done", "off"):
            return ""
        self._buf += fragment
        out: list[str] = []
        while self._buf and self._state not in ("done", "off"):
            if not self._step(out):
                break
        text = "".join(out)
        if text:
            self._emitted.append(text)
        return text

    def _step(self, out: list[str]) -> bool:
        """Consume what can be consumed in the current state; False when more text is needed."""
        state, buf = self._state, self._buf
        if state == "string":
            return self._string(out)
        stripped = buf.lstrip(_WHITESPACE)
        if not stripped:
            self._buf = ""
            return False
        if state == "start":
            self._expect(stripped, "{", "key")
        elif state == "colon":
            self._expect(stripped, ":", "value")
        elif state == "value":
            self._expect(stripped, '"', "string")
        else:  # key
            if stripped[0] != '"':
                self._state = "off"
                return False
            end = _string_end(stripped)
            if end < 0:
                self._buf = stripped
                return False
            try:
                key = orjson.loads(stripped[: end + 1])
            except orjson.JSONDecodeError:
                key = None
            self._buf = stripped[end + 1 :]
            self._state = "colon" if key == INPUT_KEY else "off"
        return True

    def _expect(self, text: str, char: str, then: str) -> None:
        if text[0] == char:
            self._buf = text[1:]
            self._state = then
        else:
            self._state = "off"

    def _string(self, out: list[str]) -> bool:
        buf = self._buf
        match = _SPECIAL.search(buf)
        if match is None:
            out.append(buf)
            self._buf = ""
            return False
        at = match.start()
        if at:
            out.append(buf[:at])
        if buf[at] == '"':
            self._buf = ""
            self._state = "done"
            return False
        escape = buf[at:]
        if len(escape) < 2:
            self._buf = escape
            return False
        kind = escape[1]
        if kind != "u":
            out.append(_ESCAPES.get(kind, kind))
            self._buf = escape[2:]
            return True
        if len(escape) < 6:
            self._buf = escape
            return False
        code = _hex(escape[2:6])
        if code is None:
            out.append(escape[:6])
            self._buf = escape[6:]
            return True
        if 0xD800 <= code < 0xDC00:
            # A high surrogate: its pair follows as a second \\u escape.
            tail = escape[6:12]
            if "\\u".startswith(tail[:2]) and len(tail) < 6:
                self._buf = escape
                return False
            low = _hex(tail[2:]) if tail[:2] == "\\u" else None
            if low is not None and 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                self._buf = escape[12:]
                return True
            out.append("\ufffd")
            self._buf = escape[6:]
            return True
        out.append("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))
        self._buf = escape[6:]
        return True

    @property
    def text(self) -> str:
        """The input decoded so far."""
        return "".join(self._emitted)

    def finish(self) -> str:
        """The rest of the input once the arguments are complete (all of it if nothing streamed)."""
        emitted = self.text
        final = custom_input("".join(self._raw))
        if final.startswith(emitted):
            rest = final[len(emitted) :]
        elif self._emitted:
            # Arguments that are not valid JSON (a raw newline in the string): what streamed stands.
            rest = ""
        else:
            rest = final
        if rest:
            self._emitted.append(rest)
        self._state = "done"
        return rest


def _string_end(text: str) -> int:
    """The index of the quote closing the JSON string that starts at ``text[0]``, or -1."""
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i
        i += 1
    return -1


def _hex(text: str) -> int | None:
    return int(text, 16) if _HEX4.fullmatch(text) else None
