"""Namespace tools for back ends that only know plain function tools.

A ``namespace`` tool only groups function tools under a name (Codex 0.169 sends one, ``multi_agent_v1``,
by default); the model calls a member as ``{"type": "function_call", "namespace": NS, "name": NAME}``.
Nothing in it needs the upstream's help, so for a back end without namespaces the gateway flattens
them: each member goes upstream as a plain tool named ``NS__NAME`` (``NSNAME`` when ``NS`` already ends
in ``_``, as Codex's ``mcp__server__`` namespaces do), earlier calls in ``input`` are renamed the same
way, and a call the model makes to a flattened name is streamed back as ``namespace`` + ``name``.
"""

from __future__ import annotations

from typing import Any

from ..protocol.request import ResponseRequest

__all__ = ["flat_name", "flatten_namespaces"]

JSON = dict[str, Any]


def flat_name(namespace: str, name: str) -> str:
    """The plain tool name a namespace member goes upstream as."""
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def flatten_namespaces(request: ResponseRequest) -> dict[str, tuple[str, str]]:
    """Replace ``request``'s namespace tools by their members under flat names (new lists, the
    caller's items are not changed); returns flat name -> (namespace, name) for the builder."""
    if not any(tool["type"] == "namespace" for tool in request.tools):
        return {}
    names: dict[str, tuple[str, str]] = {}
    tools: list[JSON] = []
    for tool in request.tools:
        if tool["type"] != "namespace":
            tools.append(tool)
            continue
        namespace = tool["name"]
        for member in tool.get("tools") or []:
            flat = flat_name(namespace, member["name"])
            names[flat] = (namespace, member["name"])
            tools.append({**member, "name": flat})
    request.tools = tools
    request.input = [_flat_call(item) for item in request.input]
    choice = request.tool_choice
    if isinstance(choice, dict) and isinstance(choice.get("namespace"), str) and "name" in choice:
        request.tool_choice = {k: v for k, v in choice.items() if k != "namespace"} | {
            "name": flat_name(choice["namespace"], choice["name"])
        }
    return names


def _flat_call(item: JSON) -> JSON:
    namespace = item.get("namespace")
    if item.get("type") not in ("function_call", "custom_tool_call") or not isinstance(namespace, str):
        return item
    out = {k: v for k, v in item.items() if k != "namespace"}
    out["name"] = flat_name(namespace, str(item.get("name", "")))
    return out
