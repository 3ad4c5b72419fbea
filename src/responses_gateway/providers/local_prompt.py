"""Gemma's chat template: a Responses request rendered as the prompt text the model continues.

Gemma has two roles, ``user`` and ``model``, in ``<start_of_turn>ROLE\\n…<end_of_turn>\\n`` blocks, and
no system role: instructions, system and developer text go at the top of the first user turn, as
Gemma's own template does. Turns of the same role are merged because the model was trained on strict
alternation. Function calls are written in the syntax the grammar makes the model produce (see
``local_grammar``) so the history teaches the format; their outputs come back in a user turn.
Reasoning items carry nothing this model can use (encrypted or summaries of another model's thinking)
and are skipped, as are built-in tool items, which this back end cannot run.
"""

from __future__ import annotations

import json
from typing import Any

from .local_grammar import CALL_ARGS, CALL_CLOSE, CALL_HEAD, CALL_OPEN

JSON = dict[str, Any]

__all__ = [
    "END_OF_TURN",
    "START_OF_TURN",
    "Turn",
    "conversation",
    "merge_turns",
    "render_prompt",
    "tool_preamble",
]

# ("user" | "model", text): one turn of the conversation, in Gemma's role names.
Turn = tuple[str, str]

START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"


def call_text(name: str, arguments: str) -> str:
    """A call in the exact syntax the grammar produces."""
    args = arguments.strip() or "{}"
    return f"{CALL_OPEN}{CALL_HEAD}{name}{CALL_ARGS}{args}}}{CALL_CLOSE}"


def tool_preamble(tools: list[JSON], *, required: bool) -> str:
    """The text that tells the model which functions exist and how to call them."""
    lines = ["You can call these functions:"]
    for tool in tools:
        spec = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        lines.append(json.dumps(spec, ensure_ascii=False))
    example = call_text("NAME", '{"ARG": "VALUE"}')
    lines.append(f"To call a function, reply with only {example} (one line per call).")
    if not required:
        lines.append("If no function is needed, answer in plain text.")
    return "\n".join(lines)


def _parts_text(content: list[JSON]) -> str:
    out = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            out.append(part["text"])
        elif kind == "refusal":
            out.append(part["refusal"])
    return "".join(out)


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _parts_text([p for p in output if isinstance(p, dict)])
    return json.dumps(output, ensure_ascii=False)


def _turns(items: list[JSON]) -> tuple[list[str], list[Turn]]:
    """System texts and (role, text) turns from the input items, in order."""
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    names: dict[str, str] = {}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item["role"]
            text = _parts_text(item["content"])
            if role in ("system", "developer"):
                if turns:
                    # Mid-conversation instructions stay where they were given.
                    turns.append(("user", text))
                else:
                    system.append(text)
            else:
                turns.append(("model" if role == "assistant" else "user", text))
        elif kind == "function_call":
            names[item["call_id"]] = item["name"]
            turns.append(("model", call_text(item["name"], item.get("arguments") or "")))
        elif kind == "custom_tool_call":
            names[item["call_id"]] = item["name"]
            turns.append(("model", call_text(item["name"], json.dumps({"input": item.get("input", "")}))))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            name = names.get(item["call_id"], "the function")
            result = _output_text(item["output"])
            turns.append(("user", f"Result of {name}:\n```tool_output\n{result}\n```"))
    return system, turns


def conversation(
    items: list[JSON], *, instructions: str | None = None, preamble: str | None = None
) -> tuple[str, list[Turn]]:
    """The system text (instructions, leading system/developer messages, the tool preamble) and the
    turns, as every prompt format sees them."""
    system, turns = _turns(items)
    return "\n\n".join(t for t in (instructions, *system, preamble) if t), turns


def merge_turns(turns: list[Turn]) -> tuple[list[str], list[list[str]]]:
    """Consecutive turns of one role as one: the roles in order, and each one's texts."""
    roles: list[str] = []
    merged: list[list[str]] = []
    for role, text in turns:
        if roles and roles[-1] == role:
            merged[-1].append(text)
        else:
            roles.append(role)
            merged.append([text])
    return roles, merged


def render_prompt(items: list[JSON], *, instructions: str | None = None, preamble: str | None = None) -> str:
    """Gemma's format: the prompt text (without BOS) ending with an open model turn."""
    system, turns = conversation(items, instructions=instructions, preamble=preamble)
    head = [system] if system else []
    roles, merged = merge_turns(turns)
    if not roles or roles[0] != "user":
        roles.insert(0, "user")
        merged.insert(0, [])
    if head:
        merged[0] = ["\n\n".join(head), *merged[0]]
    out = []
    for role, texts in zip(roles, merged, strict=True):
        body = "\n".join(texts) if role == "model" else "\n\n".join(texts)
        out.append(f"{START_OF_TURN}{role}\n{body}{END_OF_TURN}\n")
    out.append(f"{START_OF_TURN}model\n")
    return "".join(out)
