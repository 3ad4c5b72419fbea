"""Namespace tools for back ends that only know plain function tools.

A ``namespace`` tool only groups function tools under a name (Codex 0.169 sends one, ``multi_agent_v1``,
by default); the model calls a member as ``{"type": "function_call", "namespace": NS, "name": NAME}``.
Nothing in it needs the upstream's help, so for a back end without namespaces the gateway flattens
them: each member goes upstream as a plain tool named ``NS__NAME`` (``NSNAME`` when ``NS`` already ends
in ``_``, as Codex's ``mcp__server__`` namespaces do), earlier calls in ``input`` are renamed the same
way, and a call the model makes to a flattened name is streamed back as ``namespace`` + ``name``.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from ..protocol.request import RequestError, ResponseRequest
from ..providers.base import ProviderError

__all__ = ["Flattening", "flat_name", "flatten_namespaces"]

JSON = dict[str, Any]
_E = TypeVar("_E", RequestError, ProviderError)


def flat_name(namespace: str, name: str) -> str:
    """The plain tool name a namespace member goes upstream as."""
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


class Flattening:
    """What :func:`flatten_namespaces` did: the names to report calls under, and where each tool the
    back end was given stands in the client's request (so a refusal names the client's ``tools[i]``)."""

    _PARAM = re.compile(r"tools\[(\d+)\]")

    def __init__(self, names: dict[str, tuple[str, str]], params: list[str]) -> None:
        self.names = names
        self._params = params

    def client_param(self, text: str) -> str:
        """``text`` (a param or a message) with the back end's ``tools[i]`` as the client's tool."""
        if not self._params:
            return text
        return self._PARAM.sub(lambda m: self._where(int(m.group(1))), text)

    def _where(self, index: int) -> str:
        return self._params[index] if index < len(self._params) else f"tools[{index}]"

    def client_error(self, exc: _E) -> _E:
        """``exc`` (a RequestError or ProviderError) with its param and message in the client's terms."""
        if self._params and exc.param and exc.param.startswith("tools["):
            exc.message = self.client_param(exc.message)
            exc.args = (exc.message,)
            exc.param = self.client_param(exc.param)
        return exc


def flatten_namespaces(request: ResponseRequest) -> Flattening:
    """Replace ``request``'s namespace tools by their members under flat names (new lists, the
    caller's items are not changed); the result maps flat names to (namespace, name) for the builder."""
    if not any(tool["type"] == "namespace" for tool in request.tools):
        return Flattening({}, [])
    names: dict[str, tuple[str, str]] = {}
    params: list[str] = []
    tools: list[JSON] = []
    for i, tool in enumerate(request.tools):
        if tool["type"] != "namespace":
            tools.append(tool)
            params.append(f"tools[{i}]")
            continue
        namespace = tool["name"]
        for j, member in enumerate(tool.get("tools") or []):
            flat = flat_name(namespace, member["name"])
            names[flat] = (namespace, member["name"])
            tools.append({**member, "name": flat})
            params.append(f"tools[{i}].tools[{j}]")
    request.tools = tools
    request.input = [_flat_call(item) for item in request.input]
    choice = request.tool_choice
    if isinstance(choice, dict) and isinstance(choice.get("namespace"), str) and "name" in choice:
        request.tool_choice = {k: v for k, v in choice.items() if k != "namespace"} | {
            "name": flat_name(choice["namespace"], choice["name"])
        }
    return Flattening(names, params)


def _flat_call(item: JSON) -> JSON:
    namespace = item.get("namespace")
    if item.get("type") not in ("function_call", "custom_tool_call") or not isinstance(namespace, str):
        return item
    out = {k: v for k, v in item.items() if k != "namespace"}
    out["name"] = flat_name(namespace, str(item.get("name", "")))
    return out
