"""The engine's turn loop: a back end produces one model turn; the engine runs hosted tools between
turns and finishes the Response.

:class:`Engine` wraps a back end and is itself a :class:`Provider`, so every way a Response is sent
(SSE, JSON, background, stored) drives it unchanged. With ``builder.defer_finish`` set, the back end's
``complete()``/``incomplete()`` ends its turn instead of the Response; the builder has shown each call
to a hosted function as the tool's item (``StreamBuilder.hosted``), left open. The engine then runs
those calls (``interpreting`` … ``completed``), appends the turn's output and the calls' results to the
input, and asks the back end for the next turn, until a turn calls no hosted tool. Usage is summed over
turns; ``max_output_tokens`` bounds the whole Response, ``max_tool_calls`` the hosted calls run.

A turn that also calls the client's own functions ends the Response after its hosted calls ran: the
model is waiting for the client's outputs, which come with the next request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..protocol.response import make_usage
from ..providers.base import Provider, Wrapper
from .hosted import Plan, RunContext

__all__ = ["MAX_TURNS", "Engine"]

JSON = dict[str, Any]

# Model turns one Response may take; past it the hosted tools are no longer offered (the model answers).
MAX_TURNS = 16
# Items that end the Response after their turn: the model waits for the client (its own functions'
# outputs, or an approval of an MCP call).
_CLIENT_CALLS = frozenset({"function_call", "custom_tool_call", "mcp_approval_request"})
UNFINISHED = "The model stopped before finishing the response."


class Engine(Wrapper):
    """``inner`` driven turn by turn, with the hosted tools of ``plan`` run between turns."""

    def __init__(self, inner: Provider, plan: Plan, ctx: RunContext) -> None:
        super().__init__(inner)
        self.plan = plan
        self.ctx = ctx

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        plan = self.plan
        plan.install(builder)
        totals: list[int] = [0, 0, 0, 0, 0]
        limit = request.max_output_tokens
        calls_left = request.max_tool_calls
        turns = 0
        try:
            # Before the first turn: each use's own work (an MCP server's tools listed, calls the
            # client approved run); what the model must read of it joins the input.
            extra: list[JSON] = []
            for use in list(plan.all_uses):
                async with contextlib.aclosing(use.prepare(builder, self.ctx, extra)) as steps:
                    async for _ in steps:
                        yield
            plan.refresh()
            plan.install(builder)
            tools = plan.retool(request.tools)
            if extra or tools is not None:
                request = dataclasses.replace(
                    request, input=[*request.input, *extra], tools=request.tools if tools is None else tools
                )
            while True:
                turns += 1
                builder.defer_finish = True
                builder.turn_status = None
                builder.response.pop("usage", None)  # each turn reports its own
                first = len(builder.items)
                inner = self.inner.stream(request, builder)
                timeline = self.ctx.timeline
                turn_started = time.monotonic()
                try:
                    async for _ in inner:
                        yield
                finally:
                    close = getattr(inner, "aclose", None)
                    if close is not None:
                        await close()
                    if timeline is not None:
                        ended = builder.turn_status[0] if builder.turn_status else "unfinished"
                        turn_name = builder.served_by or request.model
                        timeline.append(("turn", turn_name, turn_started, time.monotonic(), ended))
                if builder.finished:
                    return  # the back end failed the Response
                if builder.turn_status is None:
                    builder.fail("server_error", UNFINISHED)
                    yield
                    return
                _add_usage(totals, builder.response.get("usage"))
                status, reason = builder.turn_status
                made = builder.items[first:]
                ran = 0
                for item in builder.hosted_pending():
                    call = item.call
                    assert call is not None
                    use = plan.uses[call.name]
                    if status == "incomplete":
                        # The turn was cut (output limit, filter): its calls are not run.
                        use.skip(call, item, builder, "Not run: the model's turn was cut short.")
                        continue
                    if (calls_left is not None and calls_left <= 0) or turns >= MAX_TURNS:
                        use.skip(call, item, builder, "Not run: the limit on tool calls was reached.")
                        continue
                    if calls_left is not None:
                        calls_left -= 1
                    ran += 1
                    tool_started = time.monotonic()
                    try:
                        async with contextlib.aclosing(use.run(call, item, builder, self.ctx)) as steps:
                            async for _ in steps:
                                yield
                    finally:
                        if timeline is not None:
                            outcome = str(item.data.get("status") or "unknown")
                            timeline.append(("tool", use.tool.type, tool_started, time.monotonic(), outcome))
                client_calls = any(it.kind in _CLIENT_CALLS for it in made)
                if status == "incomplete" or not ran or client_calls or turns >= MAX_TURNS:
                    break
                if limit is not None and totals[1] >= limit:
                    status, reason = "incomplete", "max_output_tokens"
                    break
                request = self._next(request, [it.data for it in made], totals, turns, calls_left)
        finally:
            builder.defer_finish = False
            await plan.aclose()
        _set_usage(builder, totals)
        if status == "incomplete":
            builder.incomplete(reason or "max_output_tokens")
        else:
            builder.complete()
        yield

    def _next(
        self,
        request: ResponseRequest,
        output: list[JSON],
        totals: list[int],
        turns: int,
        calls_left: int | None,
    ) -> ResponseRequest:
        """The request for the next turn: the turn's output (hosted calls as calls and outputs) appended."""
        plan = self.plan
        # Output items are valid input items as they are (each copied: the next turn must not share them).
        history = plan.history([dict(item) for item in output], self.ctx.owner)
        limit = request.max_output_tokens
        nxt = dataclasses.replace(
            request,
            input=[*request.input, *history],
            tool_choice=plan.later_choice,
            max_output_tokens=None if limit is None else max(1, limit - totals[1]),
        )
        if turns + 1 >= MAX_TURNS or (calls_left is not None and calls_left <= 0):
            # The last turn, or the budget is spent: the model answers without the tool.
            nxt = plan.without_tools(nxt)
        return nxt


def _add_usage(totals: list[int], usage: JSON | None) -> None:
    if not usage:
        return
    totals[0] += int(usage.get("input_tokens") or 0)
    totals[1] += int(usage.get("output_tokens") or 0)
    totals[2] += int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    totals[3] += int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
    totals[4] += int((usage.get("input_tokens_details") or {}).get("cache_write_tokens") or 0)


def _set_usage(builder: StreamBuilder, totals: list[int]) -> None:
    if not any(totals) and not builder.response.get("usage"):
        return
    builder.response["usage"] = make_usage(
        totals[0],
        totals[1],
        cached_tokens=totals[2],
        reasoning_tokens=totals[3],
        cache_write_tokens=totals[4],
    )
