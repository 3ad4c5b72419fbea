"""GBNF grammars for the local model: JSON schemas, tool calls, and the text-or-call choice.

The model writes a function call as ``<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>``
(several calls are separated by a newline). The wrapper has no optional whitespace, so the stream parser
(:class:`CallParser`) can read it exactly, and each tool's ``arguments`` follow that tool's JSON
schema. In ``auto`` mode the grammar offers either the call syntax or an answer that does not begin
with the call marker; the model's own first tokens choose the branch.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from llama_cpp import llama_grammar

# llama-cpp-python ships this converter untyped.
_SchemaConverter: Any = llama_grammar.SchemaConverter

JSON = dict[str, Any]

__all__ = ["CALL_CLOSE", "CALL_OPEN", "CallParser", "GrammarSpec", "build_grammar", "schema_rule"]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_HEAD = '{"name": "'
CALL_ARGS = '", "arguments": '

# Any Unicode scalar value: the free-text tail after the answer has diverged from the call marker.
_ANY = "[\\U00000001-\\U0010FFFF]"


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What the output may be: free text, one JSON schema, and/or calls to some tools."""

    tools: tuple[JSON, ...] = ()
    # None: free text; otherwise the JSON schema every text answer must follow.
    text_schema: JSON | None = None
    # Whether a text answer is allowed at all (False: at least one call is required).
    allow_text: bool = True
    # Upper bound on calls in one answer; None means no bound.
    max_calls: int | None = 1


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _gbnf_literal(text: str) -> str:
    # GBNF string literals use C-like escapes; json.dumps gives exactly those for our ASCII markers.
    return _literal(text)


def schema_rule(converter: Any, schema: JSON, name: str) -> str:
    """Add the rules for ``schema`` under ``name`` and return the rule to reference."""
    own = copy.deepcopy(schema)
    # $refs are registered by URL; a distinct one per schema keeps two tools' "#/$defs/X" apart.
    own = converter.resolve_refs(own, f"schema-{name}")
    return str(converter.visit(own, name))


def _not_prefix_of(marker: str) -> str:
    """Strings that start like no prefix of ``marker`` (then anything), as one GBNF alternative list."""
    alternatives = []
    for i, ch in enumerate(marker):
        escaped = ch.replace("\\", "\\\\").replace("]", "\\]").replace("^", "\\^").replace("-", "\\-")
        head = _gbnf_literal(marker[:i]) + " " if i else ""
        alternatives.append(f"{head}[^{escaped}] any*")
    return " | ".join(f"( {alt} )" for alt in alternatives)


def build_grammar(spec: GrammarSpec) -> str | None:
    """The GBNF for ``spec``, or None when the output is unconstrained free text."""
    if not spec.tools and spec.text_schema is None:
        return None
    converter = _SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    branches: list[str] = []
    if spec.tools:
        alts = []
        for i, tool in enumerate(spec.tools):
            params = tool.get("parameters") or {"type": "object"}
            args = schema_rule(converter, params, f"tool{i}-args")
            alts.append(f"{_gbnf_literal(CALL_HEAD + tool['name'] + CALL_ARGS)} {args}")
        converter._add_rule(
            "call",
            f"{_gbnf_literal(CALL_OPEN)} ( {' | '.join(alts)} ) {_gbnf_literal('}' + CALL_CLOSE)}",
        )
        if spec.max_calls is None:
            more = '( "\\n" call )*'
        elif spec.max_calls > 1:
            more = f'( "\\n" call ){{0,{spec.max_calls - 1}}}'
        else:
            more = ""
        branches.append(f"call {more}".strip())
    if spec.allow_text:
        if spec.text_schema is not None:
            # A JSON answer begins with "{" or "[", never with the call marker: no ambiguity.
            branches.append(schema_rule(converter, spec.text_schema, "answer"))
        else:
            converter._add_rule("any", _ANY)
            branches.append(_not_prefix_of(CALL_OPEN) if spec.tools else "any*")
    converter._add_rule("root", " | ".join(f"( {b} )" for b in branches))
    return str(converter.format_grammar())


class CallParser:
    """Reads the call syntax incrementally and reports name and argument pieces as they complete.

    :meth:`feed` returns events: ``("name", name)`` once a call's name is known, ``("args", piece)``
    for argument text, ``("end", "")`` when a call's arguments are complete. The grammar guarantees
    the syntax, so anything unexpected is a bug and raises ValueError.
    """

    __slots__ = ("_buf", "_depth", "_escape", "_in_string", "_state")

    def __init__(self) -> None:
        self._state = "open"  # open -> head -> name -> sep -> args -> close -> between -> open ...
        self._buf = ""
        self._depth = 0
        self._in_string = False
        self._escape = False

    @property
    def in_call(self) -> bool:
        return self._state in ("name", "sep", "args")

    def feed(self, text: str) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        self._buf += text
        while self._buf:
            state = self._state
            if state == "close" and self._buf[0] == " ":
                # The schema grammar may end the arguments with one optional space.
                self._buf = self._buf[1:]
                continue
            if state in ("open", "head", "sep", "close", "between"):
                expected = {
                    "open": CALL_OPEN,
                    "head": CALL_HEAD,
                    "sep": CALL_ARGS,
                    "close": "}" + CALL_CLOSE,
                    "between": "\n",
                }[state]
                take = min(len(expected), len(self._buf))
                if self._buf[:take] != expected[:take]:
                    raise ValueError(f"unexpected tool call text {self._buf!r} (expected {expected!r})")
                if take < len(expected):
                    return events
                self._buf = self._buf[take:]
                if state == "sep":
                    self._state = "args"
                elif state == "close":
                    events.append(("end", ""))
                    self._state = "between"
                else:
                    self._state = {"open": "head", "head": "name", "between": "open"}[state]
            elif state == "name":
                end = self._buf.find('"')
                if end < 0:
                    return events
                events.append(("name", self._buf[:end]))
                self._buf = self._buf[end:]
                self._state = "sep"
            else:
                n, done = self._scan_args(self._buf)
                if n > 0:
                    events.append(("args", self._buf[:n]))
                self._buf = self._buf[n:]
                if done:
                    self._state = "close"
        return events

    def _scan_args(self, text: str) -> tuple[int, bool]:
        """How many characters of ``text`` belong to the arguments value, and whether it ended."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1, True
        return len(text), False
