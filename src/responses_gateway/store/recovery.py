"""Closing a stream that a crash cut short, so its stored replay is a valid stream.

A gateway that dies mid-response leaves items open (``output_item.added`` without ``done``), maybe a
content or summary part half streamed. Recovery appends, after the last stored event, what a live
stream that fails emits (``StreamBuilder.fail``): each open part's ``.done`` events with the text it
had, each open item's ``output_item.done`` with status ``incomplete``, then ``error`` and
``response.failed`` (added by the caller). The values come from the stored deltas (the accumulator),
so the done events say exactly what was streamed.
"""

from __future__ import annotations

from typing import Any

from ..protocol.accumulator import Accumulator

__all__ = ["close_open_items"]

JSON = dict[str, Any]

_TEXT_DONE = {
    "response.output_text.done",
    "response.refusal.done",
    "response.reasoning_text.done",
    "response.reasoning.done",
}
_ARGS_DONE = {
    "response.function_call_arguments.done",
    "response.custom_tool_call_input.done",
    "response.mcp_call_arguments.done",
}


class _Open:
    __slots__ = ("args_done", "index", "kind", "parts", "raw", "summaries", "summary_done", "text_done")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind
        self.parts: dict[int, str] = {}
        self.summaries: set[int] = set()
        self.text_done: set[int] = set()
        self.summary_done: set[int] = set()
        self.raw: dict[int, str] = {}
        self.args_done = False


def close_open_items(events: list[JSON], next_seq: int) -> tuple[list[JSON], list[JSON]]:
    """``(closing events, output)``: events that close every open item, numbered from ``next_seq``,
    and the output the failed response reports (every done item, the closed ones included)."""
    open_items: dict[str, _Open] = {}
    done: dict[int, JSON] = {}
    for event in events:
        kind = event.get("type")
        item_id = event.get("item_id")
        state = open_items.get(item_id) if isinstance(item_id, str) else None
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            if isinstance(item.get("id"), str):
                open_items[item["id"]] = _Open(int(event.get("output_index", 0)), str(item.get("type")))
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            open_items.pop(str(item.get("id")), None)
            done[int(event.get("output_index", 0))] = item
        elif state is None:
            continue
        elif kind == "response.content_part.added":
            state.parts[int(event.get("content_index", 0))] = str((event.get("part") or {}).get("type"))
        elif kind == "response.content_part.done":
            state.parts.pop(int(event.get("content_index", 0)), None)
        elif kind == "response.reasoning_summary_part.added":
            state.summaries.add(int(event.get("summary_index", 0)))
        elif kind == "response.reasoning_summary_part.done":
            state.summaries.discard(int(event.get("summary_index", 0)))
        elif kind == "response.reasoning_summary_text.done":
            state.summary_done.add(int(event.get("summary_index", 0)))
        elif kind in _TEXT_DONE:
            state.text_done.add(int(event.get("content_index", 0)))
        elif kind in ("response.reasoning_text.delta", "response.reasoning.delta"):
            state.raw[int(event.get("content_index", 0))] = str(kind).rsplit(".", 1)[0]
        elif kind in _ARGS_DONE:
            state.args_done = True
    if not open_items:
        return [], [done[i] for i in sorted(done)]

    built = {item.get("id"): item for item in Accumulator().feed_all(events).items}
    tail: list[JSON] = []

    def emit(event: JSON) -> None:
        event["sequence_number"] = next_seq + len(tail)
        tail.append(event)

    for item_id, state in sorted(open_items.items(), key=lambda pair: pair[1].index):
        item = dict(built.get(item_id) or {"id": item_id, "type": state.kind})
        base = {"item_id": item_id, "output_index": state.index}
        content: list[Any] = item["content"] if isinstance(item.get("content"), list) else []
        for index in sorted(state.parts):
            part = dict(content[index]) if index < len(content) and isinstance(content[index], dict) else {}
            ptype = state.parts[index]
            if index not in state.text_done:
                if ptype == "output_text":
                    text = str(part.get("text", ""))
                    emit(
                        {
                            "type": "response.output_text.done",
                            **base,
                            "content_index": index,
                            "text": text,
                            "logprobs": part.get("logprobs") or [],
                        }
                    )
                elif ptype == "refusal":
                    refusal = str(part.get("refusal", ""))
                    emit(
                        {"type": "response.refusal.done", **base, "content_index": index, "refusal": refusal}
                    )
                else:
                    family = state.raw.get(index, "response.reasoning_text")
                    emit(
                        {
                            "type": f"{family}.done",
                            **base,
                            "content_index": index,
                            "text": str(part.get("text", "")),
                        }
                    )
            emit(
                {
                    "type": "response.content_part.done",
                    **base,
                    "content_index": index,
                    "part": part or {"type": ptype},
                }
            )
        summary: list[Any] = item["summary"] if isinstance(item.get("summary"), list) else []
        for index in sorted(state.summaries):
            text = (
                str(summary[index].get("text", ""))
                if index < len(summary) and isinstance(summary[index], dict)
                else ""
            )
            if index not in state.summary_done:
                emit(
                    {
                        "type": "response.reasoning_summary_text.done",
                        **base,
                        "summary_index": index,
                        "text": text,
                    }
                )
            emit(
                {
                    "type": "response.reasoning_summary_part.done",
                    **base,
                    "summary_index": index,
                    "part": {"type": "summary_text", "text": text},
                }
            )
        if not state.args_done:
            if state.kind == "function_call":
                # As StreamBuilder.close_function_call: no arguments streamed reads as "{}".
                arguments = str(item.get("arguments") or "{}")
                item["arguments"] = arguments
                emit(
                    {
                        "type": "response.function_call_arguments.done",
                        **base,
                        "name": item.get("name"),
                        "arguments": arguments,
                    }
                )
            elif state.kind == "custom_tool_call":
                emit(
                    {
                        "type": "response.custom_tool_call_input.done",
                        **base,
                        "input": str(item.get("input") or ""),
                    }
                )
        if "status" in item:
            item["status"] = "incomplete"
        emit({"type": "response.output_item.done", "output_index": state.index, "item": item})
        done[state.index] = item
    return tail, [done[i] for i in sorted(done)]
