"""The create-response request as the gateway understands it, after validation at the edge.

``parse_request`` (in this module) turns the JSON body into a :class:`ResponseRequest` once; nothing
downstream re-validates. Input is normalized: a plain string becomes one user message, every message's
``content`` becomes a list of typed parts, and role-only messages get ``type: "message"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass(slots=True)
class ResponseRequest:
    model: str
    input: list[JSON] = field(default_factory=list)
    instructions: str | None = None
    tools: list[JSON] = field(default_factory=list)
    tool_choice: str | JSON = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    text: JSON = field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: JSON | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    conversation: str | JSON | None = None
    include: list[str] = field(default_factory=list)
    metadata: JSON | None = None
    truncation: str | None = None
    user: str | None = None
    top_logprobs: int | None = None
    # The body exactly as received, for passthrough providers.
    raw: JSON = field(default_factory=dict)
