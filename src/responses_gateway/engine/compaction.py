"""Compaction (``POST /v1/responses/compact``) for back ends that cannot compact themselves.

OpenAI's compaction returns the conversation's user messages followed by one ``compaction`` item whose
``encrypted_content`` stands for everything else; sent back as input, it is expanded into real context.
The gateway does the same for any model:

- :func:`compact` asks the back end for one turn that summarizes the conversation (tools declared but
  not callable, so a history with tool calls stays valid everywhere), keeps the user messages, and seals
  the summary into the ``compaction`` item (AES-GCM, bound to the owner: tamper-evident, unreadable to
  the client, useless to another API key).
- :func:`expand` turns such an item, when a later request sends it, back into context: a developer
  message carrying the summary, which every back end accepts.

A back end that compacts natively (the OpenAI passthrough) is asked directly; its compaction items are
its own and pass through untouched.

Server-side compaction (``context_management: [{"type": "compaction", "compact_threshold": N}]`` on a
create request) is :class:`ContextCompaction`: when the request's context is estimated past ``N``
tokens, the same summarising turn runs before the model's turn, the Response's first output item is
the ``compaction`` item, and the turn reads the compacted window instead of the whole history. That
item stands for everything before it (the user messages and the tool results still awaited are
sealed into it verbatim), so when a later request sends it back, whatever precedes it is dropped:
a client may append output items as usual, or prune them, as OpenAI's guide says.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import RequestError, ResponseRequest
from ..protocol.response import empty_usage, new_id, new_response
from ..providers.base import Provider, ProviderError, Wrapper
from ..sealing import Sealer, SealError

__all__ = ["SUMMARY_INSTRUCTIONS", "ContextCompaction", "compact", "estimate_tokens", "expand"]

JSON = dict[str, Any]

_CONTEXT = "compaction:"
# The summary turn's own output budget (a summary, not an answer).
SUMMARY_TOKENS = 2048
SUMMARY_INSTRUCTIONS = (
    "You are compacting a conversation so that it can continue in a smaller context. Write a concise, "
    "complete summary of everything so far that the assistant needs to continue: the user's goals and "
    "constraints, decisions made, what was done (tool calls and their results, files changed, commands "
    "run), open questions and the next steps. Write it as notes for yourself; do not address the user."
)
_ASK = "Summarize the conversation so far, as your instructions say."
SUMMARY_PREFIX = "Summary of the earlier part of this conversation (compacted):\n\n"


def _is_user_message(item: JSON) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _as_output(item: JSON) -> JSON:
    """A user message as OpenAI lists it in a compacted window: an item with id, status and parts."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {
        "id": item.get("id") or new_id("msg"),
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": parts,
    }


class _Summary:
    """What a summarising turn wrote, once :func:`_summarizing` has run to its end."""

    text = ""
    usage: JSON | None = None


async def _summarize(provider: Provider, request: ResponseRequest) -> tuple[str, JSON]:
    """One summarising turn of ``provider`` over ``request``'s conversation: the summary and its usage."""
    out = _Summary()
    async for _ in _summarizing(provider, request, out):
        pass
    return out.text, out.usage or empty_usage()


async def _summarizing(provider: Provider, request: ResponseRequest, out: _Summary) -> AsyncIterator[None]:
    """The summarising turn, yielding whenever the back end does (so a caller streaming a Response can
    let its first events and keepalives out meanwhile); the result lands in ``out``."""
    summary_request = dataclasses.replace(
        request,
        instructions=SUMMARY_INSTRUCTIONS,
        input=[
            *request.input,
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": _ASK}]},
        ],
        tool_choice="none" if request.tools else "auto",
        text={"format": {"type": "text"}},
        max_output_tokens=SUMMARY_TOKENS,
        stream=False,
        store=False,
        background=False,
        previous_response_id=None,
        conversation=None,
        compact_threshold=None,
    )
    builder = StreamBuilder(new_response(request.model))
    builder.start()
    steps = provider.stream(summary_request, builder)
    try:
        async for _ in steps:
            builder.take()
            yield
    finally:
        close = getattr(steps, "aclose", None)
        if close is not None:
            await close()
    response = builder.response
    if response.get("status") == "failed":
        error = response.get("error") or {}
        raise ProviderError(
            f"The model could not summarize the conversation: {error.get('message', 'it failed')}",
            status=502,
            code=error.get("code") or "server_error",
        )
    summary = "".join(
        part.get("text", "")
        for item in response.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    ).strip()
    if not summary:
        raise ProviderError("The model gave no summary of the conversation.", status=502, code="server_error")
    out.text, out.usage = summary, response.get("usage") or empty_usage()


async def compact(provider: Provider, request: ResponseRequest, sealer: Sealer, owner: str) -> JSON:
    """The compacted window of ``request``'s conversation (a ``response.compaction`` object)."""
    summary, usage = await _summarize(provider, request)
    kept = [_as_output(item) for item in request.input if _is_user_message(item)]
    sealed = sealer.seal({"v": 1, "summary": summary}, context=_CONTEXT + owner)
    item = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": sealed}
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*kept, item],
        "usage": usage,
    }


def estimate_tokens(request: ResponseRequest) -> int:
    """The context's size in tokens, estimated at 4 bytes of JSON per token (instructions, tools and
    input): what a ``compact_threshold`` is compared with, for every back end alike."""
    size = len(orjson.dumps(request.input)) + len((request.instructions or "").encode())
    if request.tools:
        size += len(orjson.dumps(request.tools))
    return size // 4


_OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}


def _awaited(items: list[JSON]) -> list[JSON]:
    """The tool results the model has not answered yet (the trailing outputs) and their calls, in
    order: a compacted window keeps them verbatim so the turn can go on from them."""
    start = len(items)
    while start > 0 and items[start - 1].get("type") in _OUTPUTS:
        start -= 1
    outputs = items[start:]
    wanted = {(_OUTPUTS[str(o.get("type"))], o.get("call_id")) for o in outputs}
    calls = [i for i in items[:start] if (i.get("type"), i.get("call_id")) in wanted]
    return [*calls, *outputs]


def _summary_message(summary: str) -> JSON:
    text = SUMMARY_PREFIX + summary
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}


class ContextCompaction(Wrapper):
    """``inner``, compacting the context first when it is estimated past ``threshold`` tokens; with
    ``answer=False`` (a ``compaction_trigger`` item), compacting always and answering with the
    compaction item alone."""

    def __init__(
        self, inner: Provider, threshold: int, sealer: Sealer, owner: str, *, answer: bool = True
    ) -> None:
        super().__init__(inner)
        self.threshold = threshold
        self.answer = answer
        self.sealer = sealer
        self.owner = owner

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        if not self.answer or estimate_tokens(request) > self.threshold:
            # Each step of the summarising turn is a step of this Response: once the back end has
            # accepted the turn (its first yield; a refusal before it is still a plain HTTP error),
            # response.created goes out and keepalives follow, so a slow summary does not leave the
            # client (or a proxy's read timeout) without a byte until it is written.
            out = _Summary()
            async for _ in _summarizing(self.inner, request, out):
                yield
            summary = out.text
            kept = [_as_output(item) for item in request.input if _is_user_message(item)]
            awaited = _awaited(request.input)
            payload = {"v": 1, "summary": summary, "kept": kept, "awaited": awaited, "window": True}
            sealed = self.sealer.seal(payload, context=_CONTEXT + self.owner)
            builder.add_item({"id": new_id("cmp"), "type": "compaction", "encrypted_content": sealed})
            if not self.answer:
                builder.complete()
                yield
                return
            yield
            request = dataclasses.replace(request, input=[*kept, _summary_message(summary), *awaited])
        async for _ in self.inner.stream(request, builder):
            yield


def expand(items: list[JSON], sealer: Sealer, owner: str) -> list[JSON] | None:
    """``items`` with this gateway's compaction items turned back into context (a developer message
    with the summary); None if there are none. An altered item, or another owner's, is a RequestError
    naming it; a compaction item another server made is left as it is (for a back end that knows it)."""
    if not any(isinstance(i, dict) and i.get("type") == "compaction" for i in items):
        return None
    out: list[JSON] = []
    for index, item in enumerate(items):
        content = item.get("encrypted_content") if item.get("type") == "compaction" else None
        if not isinstance(content, str) or not sealer.is_sealed(content):
            out.append(item)
            continue
        try:
            payload = sealer.unseal(content, context=_CONTEXT + owner)
        except SealError as exc:
            raise RequestError(
                f"Invalid 'encrypted_content': {exc}.",
                param=f"input[{index}].encrypted_content",
                code="invalid_encrypted_content",
            ) from None
        summary = payload.get("summary") if isinstance(payload, dict) else None
        if not isinstance(summary, str):
            raise RequestError(
                "Invalid 'encrypted_content'.",
                param=f"input[{index}].encrypted_content",
                code="invalid_encrypted_content",
            )
        if isinstance(payload, dict) and payload.get("window"):
            # Server-side compaction: the item stands for everything before it.
            kept = [i for i in payload.get("kept") or [] if isinstance(i, dict)]
            awaited = [i for i in payload.get("awaited") or [] if isinstance(i, dict)]
            out = [*kept, _summary_message(summary), *awaited]
        else:
            out.append(_summary_message(summary))
    return out
