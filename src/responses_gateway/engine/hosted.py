"""Hosted tools: tools the gateway runs itself, for any model, between model turns.

A hosted tool (``code_interpreter`` today) is offered to a back end that cannot run it as a plain
function with an exact JSON schema. The model's call to that function is shown to the client as the
tool's own item (``code_interpreter_call``) by the builder (``StreamBuilder.hosted``); the engine
(``engine/turns.py``) runs it and gives the model its result in the next turn. A back end that runs
the tool itself (the OpenAI passthrough) gets the request untouched: native tools stay native.

:func:`plan_hosted` does the request side before anything is sent (so every mistake is a plain 400):
the tools and ``tool_choice`` the back end gets, and the history rewritten so that earlier hosted calls
reach it as function calls with their outputs, a form every back end accepts.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol.builder import HostedCall, HostedSpec, Item, StreamBuilder
from ..protocol.request import RequestError, ResponseRequest
from .results import ResultLog

__all__ = ["HostedTool", "HostedUse", "Phase", "Plan", "RunContext", "plan_hosted"]

JSON = dict[str, Any]

# Configs of one tool type in a request, for tools that take several (MCP servers).
MAX_USES = 16


@dataclass(slots=True)
class RunContext:
    """What a hosted tool knows about the request it runs for."""

    owner: str | None
    include: frozenset[str]
    # Set by the server for its metrics and traces: the engine appends one ``Phase`` per model turn
    # (``"turn"``, the model that answered it) and per hosted call run (``"tool"``, the tool type).
    timeline: list[Phase] | None = None


# (kind: "turn" or "tool", name, started, ended (time.monotonic()), status: the turn's or the call's)
Phase = tuple[str, str, float, float, str]


class HostedUse(ABC):
    """One hosted tool as one request configured it (a container chosen, say): opens items, runs calls."""

    tool: HostedTool

    @abstractmethod
    def spec(self) -> HostedSpec:
        """How the builder shows this tool's calls (item type, its opening fields, the streamed argument)."""

    def specs(self) -> dict[str, HostedSpec]:
        """Every function this use offers, by name, and how its calls are shown. One by default; a use
        that stands for several tools (an MCP server's) offers one function per tool."""
        return {self.tool.function_name: self.spec()}

    def functions(self) -> list[JSON]:
        """The function tools the model is offered for this use (in ``specs()``'s names)."""
        return [self.tool.function({})]

    def claims(self, name: str) -> bool:
        """Whether a client's function named ``name`` would collide with this use's functions."""
        return name == self.tool.function_name

    def identity(self) -> str:
        """What two uses of one tool in a request must not share (an MCP server's label)."""
        return self.tool.type

    async def prepare(
        self, builder: StreamBuilder, ctx: RunContext, extra: list[JSON]
    ) -> AsyncGenerator[None, None]:
        """Work before the first model turn (an MCP server's tools listed, approved calls run),
        yielding when ``builder`` has events; history items the model must read go to ``extra``."""
        return
        yield

    @abstractmethod
    def run(
        self, call: HostedCall, item: Item, builder: StreamBuilder, ctx: RunContext
    ) -> AsyncIterator[None]:
        """Run one call and close ``item`` with its results, yielding whenever ``builder`` has events
        to send (``interpreting`` before the work, say). Never raises for what the call's own input
        does: a failure is the item's result."""

    def citations(self, text: str) -> list[JSON]:
        """Annotations for an answer's ``text`` (the files this use made, where the text names them)."""
        return []

    @abstractmethod
    def skip(self, call: HostedCall, item: Item, builder: StreamBuilder, why: str) -> None:
        """Close ``item`` as not run (``incomplete``); the model is told ``why``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release what the request held."""


class HostedTool(ABC):
    """A kind of hosted tool (one instance per gateway)."""

    type: str  # the tool type in ``tools`` ("code_interpreter")
    kind: str  # the output item type ("code_interpreter_call")
    function_name: str  # the function the model is offered
    # Every item type this tool owns in a history (an MCP server's calls, tool lists, approvals).
    kinds: tuple[str, ...] = ()
    # Several configs of this tool in one request (MCP servers, one per label); else one at most.
    several = False
    # Unavailable by the operator's choice (nothing configured), not by a fault: not warned about.
    optional = False
    # What this tool's calls told the model, for later turns on any instance (engine/results.py).
    results: ResultLog | None = None

    def item_kinds(self) -> tuple[str, ...]:
        return self.kinds or (self.kind,)

    def declared(self, items: list[JSON]) -> list[JSON]:
        """Functions declared (not callable) for a history with this tool's calls and no config."""
        return [self.function({})] if any(item.get("type") == self.kind for item in items) else []

    @abstractmethod
    def function(self, config: JSON) -> JSON:
        """The function tool the model is offered instead of ``config``."""

    def refuse(self, config: JSON, param: str) -> RequestError | None:
        """A setting of ``config`` this gateway cannot honour (None: fine). Unlike a bad config it is
        left out with ``--drop-unsupported-tool``, as a back end's refusal would be."""
        return None

    def choice(self, choice: JSON) -> str | JSON:
        """``tool_choice`` naming this tool, as the back end gets it."""
        return {"type": "function", "name": self.function_name}

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why this tool cannot run on this gateway (a 400 says it), or None."""

    @abstractmethod
    async def use(self, config: JSON, *, param: str, history: list[JSON], ctx: RunContext) -> HostedUse:
        """This request's use of the tool; raise RequestError (naming ``param``) for a bad config."""

    async def recall(self, items: list[JSON], owner: str | None) -> None:
        """Fetch what :meth:`history` will need for these items of this tool's kind (results kept by
        another instance, or before a restart) before it is called."""
        if self.results is not None:
            await self.results.recall(owner, [i["id"] for i in items if isinstance(i.get("id"), str)])

    @abstractmethod
    def history(self, item: JSON, owner: str | None, items: list[JSON]) -> tuple[JSON, JSON] | None:
        """One of this tool's items (from an earlier turn or response) as input a back end accepts:
        the function call the model made and its output, or None when the back end need not see it
        (``items``: the whole history it is part of). Raises RequestError for a malformed item."""


@dataclass(slots=True)
class Plan:
    """The hosted tools of one request and the request as its back end gets it."""

    uses: dict[str, HostedUse] = field(default_factory=dict)  # function name -> use
    kinds: dict[str, HostedTool] = field(default_factory=dict)  # item type -> tool, for history
    # What tool_choice becomes after a turn that called a hosted tool (a forced choice is honoured
    # once, then the model decides).
    later_choice: str | JSON = "auto"
    # The request's tools in order, a hosted tool's config standing as its use (see ``tools``).
    layout: list[JSON | HostedUse] = field(default_factory=list)
    all_uses: list[HostedUse] = field(default_factory=list)
    # The hosted functions the request was planned with (an MCP server's are only known once listed).
    offered: set[str] = field(default_factory=set)

    def add(self, use: HostedUse) -> None:
        self.all_uses.append(use)
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the function name -> use table (a use's functions may change in ``prepare``)."""
        self.uses = {name: use for use in self.all_uses for name in use.specs()}

    def tools(self) -> list[JSON]:
        """The request's tools as the back end gets them: each hosted tool as its functions."""
        out: list[JSON] = []
        for entry in self.layout:
            out.extend(entry.functions() if isinstance(entry, HostedUse) else [entry])
        return out

    def retool(self, tools: list[JSON]) -> list[JSON] | None:
        """``tools`` (as the server left them: namespaces flattened, unsupported tools dropped) with
        the hosted functions as they stand after ``prepare``, or None when they did not change."""
        now = [f for use in self.all_uses for f in use.functions()]
        if {str(f["name"]) for f in now} == self.offered:
            return None
        kept = [t for t in tools if not (t.get("type") == "function" and t.get("name") in self.offered)]
        self.offered = {str(f["name"]) for f in now}
        return kept + now

    def install(self, builder: StreamBuilder) -> None:
        builder.hosted = {name: spec for use in self.all_uses for name, spec in use.specs().items()}
        if self.all_uses:
            builder.annotate_text = self.citations

    def citations(self, text: str) -> list[JSON]:
        return [a for use in self.all_uses for a in use.citations(text)]

    def history(self, items: list[JSON], owner: str | None) -> list[JSON]:
        """``items`` with every hosted item rewritten as its function call and output. A run of
        hosted items (parallel calls of one turn) gives all its calls, then all its outputs, so the
        back end sees one assistant turn."""
        out: list[JSON] = []
        calls: list[JSON] = []
        outputs: list[JSON] = []
        for i, item in enumerate(items):
            tool = self.kinds.get(item.get("type", ""))
            if tool is None:
                out.extend(calls)
                out.extend(outputs)
                calls, outputs = [], []
                out.append(item)
                continue
            try:
                pair = tool.history(item, owner, items)
            except RequestError as exc:
                raise RequestError(exc.message, param=f"input[{i}]{exc.param or ''}") from None
            if pair is not None:
                calls.append(pair[0])
                outputs.append(pair[1])
        out.extend(calls)
        out.extend(outputs)
        return out

    def without_tools(self, request: ResponseRequest) -> ResponseRequest:
        """``request`` for a last turn that answers without calling (max_tool_calls reached, too many
        turns): the tools stay declared (a history with tool calls needs them on some back ends,
        Anthropic's among them) and ``tool_choice`` is ``none``."""
        return dataclasses.replace(request, tool_choice="none")

    async def aclose(self) -> None:
        for use in self.all_uses:
            await use.aclose()


async def plan_hosted(
    request: ResponseRequest,
    *,
    native: Collection[str],
    tools: Mapping[str, HostedTool],
    ctx: RunContext,
    drop: Collection[str] = (),
) -> Plan | None:
    """Rewrite ``request`` in place for a back end that runs the tool types ``native`` itself.

    Returns None when nothing is hosted (no hosted tool offered, no hosted item in the history).
    Raises RequestError (400) for a hosted tool this gateway cannot run or a bad configuration. A tool
    that cannot run here but whose type is in ``drop`` (``serve --drop-unsupported-tool``) is left in
    the request for the server to drop.
    """
    if not request.tools and all(item.get("type") == "message" for item in request.input):
        # The common request: no tool offered and only messages in the history, which holds no
        # hosted call (every hosted tool's items are its calls and outputs, never "message").
        return None
    hosted = {t: tool for t, tool in tools.items() if t not in native}
    if not hosted:
        return None
    offered = [(i, t) for i, t in enumerate(request.tools) if t.get("type") in hosted]
    kinds = {kind: tool for tool in hosted.values() for kind in tool.item_kinds()}
    in_history = any(item.get("type") in kinds for item in request.input)
    if not offered and not in_history:
        return None
    plan = Plan(kinds=kinds)
    original = request.input
    if in_history:
        for tool in hosted.values():
            await tool.recall([item for item in request.input if item.get("type") == tool.kind], ctx.owner)
        request.input = plan.history(request.input, ctx.owner)
        if not offered and not request.tools:
            # Tool calls in the history need a declared tool on some back ends (Anthropic refuses
            # tool_use blocks without ``tools``): declared, not callable.
            request.tools = [f for tool in hosted.values() for f in tool.declared(original)]
            request.tool_choice = "none"
    names = {str(t.get("name")) for t in request.tools if t.get("type") == "function"}
    for t in request.tools:  # a namespace's members reach back ends as flat functions (ns__name)
        if t.get("type") == "namespace":
            ns = str(t.get("name"))
            for member in t.get("tools") or []:
                names.update({f"{ns}{member.get('name')}", f"{ns}__{member.get('name')}"})
    replaced: dict[int, HostedUse] = {}
    types_used: set[str] = set()
    try:
        for i, config in offered:
            tool = hosted[config["type"]]
            why = tool.unavailable()
            if why is not None and (tool.type in drop or config["type"] in drop):
                continue
            if why is not None and tool.optional:
                # Not configured: refused as any tool the model lacks, saying how to configure it.
                raise RequestError(
                    f"Unsupported parameter: 'tools[{i}].type' ({config['type']}) is not supported with "
                    f"this model ({why}).",
                    param=f"tools[{i}].type",
                )
            if why is not None:
                raise RequestError(
                    f"The {tool.type} tool is not available on this gateway: {why}", param=f"tools[{i}]"
                )
            refused = tool.refuse(config, f"tools[{i}]")
            if refused is not None and (tool.type in drop or config["type"] in drop):
                continue
            if refused is not None:
                raise refused
            if tool.type in types_used and not tool.several:
                raise RequestError(f"Only one {tool.type} tool may be given.", param=f"tools[{i}]")
            if sum(1 for u in plan.all_uses if u.tool is tool) >= MAX_USES:
                raise RequestError(f"At most {MAX_USES} {tool.type} tools may be given.", param=f"tools[{i}]")
            use = await tool.use(config, param=f"tools[{i}]", history=original, ctx=ctx)
            twin = next((u for u in plan.all_uses if u.tool is tool and u.identity() == use.identity()), None)
            plan.add(use)
            if twin is not None:
                raise RequestError(f"{use.identity()} is given twice.", param=f"tools[{i}]")
            types_used.add(tool.type)
            replaced[i] = use
            clash = next((n for n in sorted(names) if use.claims(n)), None)
            if clash is not None:
                raise RequestError(
                    f"A function tool is named {clash!r}, a name the {tool.type} tool is offered to the "
                    "model under; rename the function.",
                    param=f"tools[{i}]",
                )
    except BaseException:
        await plan.aclose()
        raise
    plan.layout = [replaced.get(i, t) for i, t in enumerate(request.tools)]
    request.tools = plan.tools()
    plan.offered = {str(f["name"]) for use in plan.all_uses for f in use.functions()}
    choice = request.tool_choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in hosted
        and (not hosted[choice["type"]].optional or hosted[choice["type"]].unavailable() is None)
    ):
        tool = hosted[choice["type"]]
        if tool.type not in types_used and tool.type in drop:
            return plan if plan.all_uses or in_history else None
        if tool.type not in types_used:
            await plan.aclose()
            raise RequestError(
                f"tool_choice names {tool.type}, which is not among the tools.", param="tool_choice"
            )
        request.tool_choice = tool.choice(choice)
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed: list[JSON] = []
        for t in choice.get("tools", []):
            used = t.get("type") in hosted and hosted[t["type"]].type in types_used
            mapped = hosted[t["type"]].choice(t) if used else t
            if isinstance(mapped, dict):  # (an MCP server named without a tool stands for no function)
                allowed.append(mapped)
        request.tool_choice = {**choice, "tools": allowed}
    # A forced choice is honoured for the first turn; after a hosted call the model decides (else it
    # would be forced to call again, turn after turn). A list of allowed tools stays.
    later = request.tool_choice
    if later == "required" or (isinstance(later, dict) and later.get("type") != "allowed_tools"):
        later = "auto"
    plan.later_choice = later
    if not plan.all_uses and not in_history:
        return None  # every hosted tool was left for the server to drop
    return plan
