"""Namespace tools for back ends that only know plain function tools.

A ``namespace`` tool only groups function tools under a name (Codex 0.169 sends one, ``multi_agent_v1``,
by default); the model calls a member as ``{"type": "function_call", "namespace": NS, "name": NAME}``.
Nothing in it needs the upstream's help, so for a back end without namespaces the gateway flattens
them: each member goes upstream as a plain tool named ``NS__NAME`` (``NSNAME`` when ``NS`` already ends
in ``_``, as Codex's ``mcp__server__`` namespaces do), earlier calls in ``input`` are renamed the same
way, and a call the model makes to a flattened name is streamed back as ``namespace`` + ``name``.

The same pass drops, when the server is configured to (``serve --drop-unsupported-tool TYPE``), an
offered hosted tool the back end cannot run, unless ``tool_choice`` forces or lists it: Codex offers
``web_search`` on every request, and without the option that request is refused with a 400.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, TypeVar

from ..protocol.request import RequestError, ResponseRequest
from ..providers.base import ProviderError

__all__ = ["Flattening", "adapt_tools", "flat_name", "flatten_namespaces"]

JSON = dict[str, Any]
_E = TypeVar("_E", RequestError, ProviderError)


def flat_name(namespace: str, name: str) -> str:
    """The plain tool name a namespace member goes upstream as."""
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


class Flattening:
    """What :func:`flatten_namespaces` did: the names to report calls under, and where each tool the
    back end was given stands in the client's request (so a refusal names the client's ``tools[i]``)."""

    _PARAM = re.compile(r"tools\[(\d+)\]")

    def __init__(
        self,
        names: dict[str, tuple[str, str]],
        params: list[str],
        dropped: list[int] | None = None,
        droppable: frozenset[str] = frozenset(),
    ) -> None:
        self.names = names
        self._params = params
        self.dropped = dropped or []  # indexes of the client's tools left out for the back end
        self._droppable = droppable

    def drop_refused(self, request: ResponseRequest, exc: RequestError | ProviderError) -> bool:
        """Leave out the tool ``exc`` refuses (``tools[i]…``) if its type may be dropped; True if it was.

        For refusals of a tool's settings (Anthropic's live-only search refuses
        ``tools[i].external_web_access``), which only the back end's own check knows about.
        """
        match = self._PARAM.match(exc.param or "")
        if match is None or not self._droppable:
            return False
        index = int(match.group(1))
        if index >= len(request.tools) or request.tools[index]["type"] not in self._droppable:
            return False
        client = self._PARAM.fullmatch(self._params[index])
        assert client is not None  # a droppable tool is never a namespace member
        self.dropped.append(int(client.group(1)))
        del self._params[index]
        request.tools = [tool for i, tool in enumerate(request.tools) if i != index]
        return True

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
    return adapt_tools(request, supported=())


def adapt_tools(
    request: ResponseRequest, *, supported: Collection[str], drop: Collection[str] = ()
) -> Flattening:
    """Fit ``request``'s tools to a back end that runs the tool types ``supported``: namespaces are
    flattened unless supported; offered tools whose type is in ``drop`` and not supported are left
    out unless ``tool_choice`` names their type (one the back end's own check refuses later goes
    through :meth:`Flattening.drop_refused`). The request gets new lists; the caller's are kept."""
    flatten = "namespace" not in supported
    chosen = _chosen_types(request.tool_choice)
    droppable = frozenset(t for t in drop if t not in chosen)
    if not droppable and not (flatten and any(t["type"] == "namespace" for t in request.tools)):
        return Flattening({}, [])
    names: dict[str, tuple[str, str]] = {}
    params: list[str] = []
    tools: list[JSON] = []
    dropped: list[int] = []
    for i, tool in enumerate(request.tools):
        if tool["type"] in droppable and tool["type"] not in supported:
            dropped.append(i)
            continue
        if not flatten or tool["type"] != "namespace":
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
    if names:
        request.input = [_flat_call(item) for item in request.input]
    choice = request.tool_choice
    if flatten and isinstance(choice, dict) and isinstance(choice.get("namespace"), str) and "name" in choice:
        request.tool_choice = {k: v for k, v in choice.items() if k != "namespace"} | {
            "name": flat_name(choice["namespace"], choice["name"])
        }
    return Flattening(names, params, dropped, droppable)


def _chosen_types(choice: Any) -> set[str]:
    """The tool types ``tool_choice`` forces (``{"type": T}``) or lists (``allowed_tools``)."""
    if not isinstance(choice, dict):
        return set()
    if choice.get("type") == "allowed_tools":
        return {str(t.get("type")) for t in choice.get("tools") or [] if isinstance(t, dict)}
    return {str(choice.get("type"))}


def _flat_call(item: JSON) -> JSON:
    namespace = item.get("namespace")
    if item.get("type") not in ("function_call", "custom_tool_call") or not isinstance(namespace, str):
        return item
    out = {k: v for k, v in item.items() if k != "namespace"}
    out["name"] = flat_name(namespace, str(item.get("name", "")))
    return out
