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
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..protocol.builder import StreamBuilder
from ..protocol.request import RequestError, ResponseRequest
from ..protocol.response import empty_usage, new_id, new_response
from ..providers.base import Provider, ProviderError
from ..sealing import Sealer, SealError

__all__ = ["SUMMARY_INSTRUCTIONS", "compact", "expand"]

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


async def compact(provider: Provider, request: ResponseRequest, sealer: Sealer, owner: str) -> JSON:
    """The compacted window of ``request``'s conversation (a ``response.compaction`` object)."""
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
    )
    builder = StreamBuilder(new_response(request.model))
    builder.start()
    steps = provider.stream(summary_request, builder)
    try:
        async for _ in steps:
            builder.take()
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
    kept = [_as_output(item) for item in request.input if _is_user_message(item)]
    sealed = sealer.seal({"v": 1, "summary": summary}, context=_CONTEXT + owner)
    item = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": sealed}
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*kept, item],
        "usage": response.get("usage") or empty_usage(),
    }


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
        text = SUMMARY_PREFIX + summary
        out.append(
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}
        )
    return out
